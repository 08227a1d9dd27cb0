#include "zero/comm/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "zero/comm/ordered_worker.hpp"
#include "zero/error.hpp"

namespace zero::detail {

namespace {

// Every message starts with this, so a rank that reached some other service fails clearly.
constexpr char kMagic[8] = {'z', 'e', 'r', 'o', 'r', 'd', 'v', '1'};
constexpr std::uint32_t kMaxBlob = 1 << 20;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd; false on deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

void send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline,
              const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ZERO_CHECK(wait_fd(fd, POLLOUT, deadline), kTimeout, "rendezvous: sending to ", peer,
               " timed out");
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ZERO_CHECK(k > 0, kCommunication, "rendezvous: send to ", peer, ": ", std::strerror(errno));
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline,
              const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ZERO_CHECK(wait_fd(fd, POLLIN, deadline), kTimeout, "rendezvous: receiving from ", peer,
               " timed out");
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ZERO_CHECK(k != 0, kCorruption, "rendezvous: ", peer, " closed the connection early");
    ZERO_CHECK(k > 0, kCommunication, "rendezvous: recv from ", peer, ": ", std::strerror(errno));
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

std::string serve(int port, int size, const std::string& blob, Clock::time_point deadline,
                  double timeout_s) {
  Fd listener(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  bool v6 = listener.get() >= 0;
  if (!v6) listener = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ZERO_CHECK(listener.get() >= 0, kCommunication, "rendezvous: socket: ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    const int zero = 0;  // dual stack: IPv4 peers too
    ::setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  ZERO_CHECK(rc == 0, kCommunication, "rendezvous: rank 0 cannot listen on port ", port, ": ",
             std::strerror(errno), " (MASTER_PORT in use?)");
  ZERO_CHECK(::listen(listener.get(), size) == 0, kCommunication,
             "rendezvous: listen: ", std::strerror(errno));
  const std::uint32_t len = static_cast<std::uint32_t>(blob.size());
  std::string message(kMagic, sizeof(kMagic));
  message.append(reinterpret_cast<const char*>(&len), sizeof(len));
  message += blob;
  for (int served = 0; served < size - 1; ++served) {
    ZERO_CHECK(wait_fd(listener.get(), POLLIN, deadline), kTimeout, "rendezvous on port ", port,
               ": only ", served, " of ", size - 1, " ranks connected within ", timeout_s, " s");
    Fd peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.get() < 0) {
      --served;
      continue;
    }
    send_all(peer.get(), message.data(), message.size(), deadline, "a rank");
  }
  return blob;
}

std::string fetch(const std::string& host, int port, Clock::time_point deadline, double timeout_s) {
  const std::string where = detail::cat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo* found = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    ZERO_CHECK(gai == 0, kCommunication, "rendezvous: cannot resolve MASTER_ADDR '", host,
               "': ", ::gai_strerror(gai));
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (fd.get() < 0) continue;
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      ::freeaddrinfo(found);
      char magic[sizeof(kMagic)];
      std::uint32_t len = 0;
      recv_all(fd.get(), magic, sizeof(magic), deadline, where);
      ZERO_CHECK(std::memcmp(magic, kMagic, sizeof(kMagic)) == 0, kCorruption,
                 "rendezvous: ", where, " is not a zero rendezvous (wrong magic)");
      recv_all(fd.get(), &len, sizeof(len), deadline, where);
      ZERO_CHECK(len <= kMaxBlob, kCorruption, "rendezvous: ", where, " announced ", len, " bytes");
      std::string blob(len, '\0');
      recv_all(fd.get(), blob.data(), len, deadline, where);
      return blob;
    }
    ::freeaddrinfo(found);
    ZERO_CHECK(Clock::now() < deadline, kTimeout, "rendezvous: rank 0 at ", where,
               " did not accept within ", timeout_s, " s (last error: ", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string tcp_broadcast(const std::string& host, int port, int rank, int size,
                          const std::string& blob, double timeout_s) {
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size, kInvalidArgument, "rendezvous: rank ", rank,
             " of size ", size);
  ZERO_CHECK(port > 0 && port < 65536, kConfig, "MASTER_PORT ", port, " is not a TCP port");
  ZERO_CHECK(blob.size() <= kMaxBlob, kInvalidArgument, "rendezvous blob of ", blob.size(),
             " bytes");
  const auto deadline = deadline_after(timeout_s);
  if (size == 1) return blob;
  return rank == 0 ? serve(port, size, blob, deadline, timeout_s)
                   : fetch(host, port, deadline, timeout_s);
}

std::string file_broadcast(const std::string& path, int rank, const std::string& blob,
                           double timeout_s) {
  ZERO_CHECK(!path.empty(), kConfig, "rendezvous file path is empty");
  const std::size_t header = sizeof(kMagic) + sizeof(std::uint32_t);
  if (rank == 0) {
    struct stat st {};
    ZERO_CHECK(::stat(path.c_str(), &st) != 0, kConfig, "rendezvous file ", path,
               " already exists (left by an earlier job?); remove it or use a fresh path");
    const std::string tmp = detail::cat(path, ".tmp.", ::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      ZERO_CHECK(out.good(), kIO, "rendezvous: cannot create ", tmp, ": ", std::strerror(errno));
      const std::uint32_t len = static_cast<std::uint32_t>(blob.size());
      out.write(kMagic, sizeof(kMagic));
      out.write(reinterpret_cast<const char*>(&len), sizeof(len));
      out.write(blob.data(), static_cast<std::streamsize>(blob.size()));
      out.flush();
      ZERO_CHECK(out.good(), kIO, "rendezvous: cannot write ", tmp);
    }
    ZERO_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, kIO, "rendezvous: rename ", tmp, " -> ",
               path, ": ", std::strerror(errno));
    return blob;
  }
  const auto deadline = deadline_after(timeout_s);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in.good()) {
      std::ostringstream all;
      all << in.rdbuf();
      const std::string s = all.str();
      ZERO_CHECK(s.size() >= header && std::memcmp(s.data(), kMagic, sizeof(kMagic)) == 0,
                 kCorruption, "rendezvous file ", path, " is not a zero rendezvous file");
      std::uint32_t len = 0;
      std::memcpy(&len, s.data() + sizeof(kMagic), sizeof(len));
      ZERO_CHECK(s.size() == header + len, kCorruption, "rendezvous file ", path, " holds ",
                 s.size() - header, " bytes, announced ", len);
      return s.substr(header);
    }
    ZERO_CHECK(Clock::now() < deadline, kTimeout, "rendezvous: rank 0 did not write ", path,
               " within ", timeout_s, " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace zero::detail
