#include "comm/rendezvous.hpp"

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
#include <vector>

#include "comm/ordered_worker.hpp"
#include "zero/core/error.hpp"

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

// Rank 0 listens on the first free port of [port, port + kPortCandidates): under torchrun the
// agent's own store already holds MASTER_PORT. Every rank scans the same range.
constexpr int kPortCandidates = 16;
// How long a rank waits on one candidate for rank 0's greeting before trying the next (a silent
// listener such as torchrun's store speaks only when asked).
constexpr int kCandidateMs = 300;

std::string header_for(const std::string& token, const std::string& blob) {
  std::string m(kMagic, sizeof(kMagic));
  const std::uint32_t tl = static_cast<std::uint32_t>(token.size());
  const std::uint32_t bl = static_cast<std::uint32_t>(blob.size());
  m.append(reinterpret_cast<const char*>(&tl), sizeof(tl));
  m += token;
  m.append(reinterpret_cast<const char*>(&bl), sizeof(bl));
  return m + blob;
}

Fd listen_on(int port) {
  Fd listener(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const bool v6 = listener.get() >= 0;
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
  if (rc != 0 || ::listen(listener.get(), 128) != 0) return Fd();
  return listener;
}

// Greets every connection with magic, token and blob (rank 0 speaks first, so a rank that
// reached some other service never sends it anything), and counts the ranks that acknowledge.
std::string serve(int port, int size, const std::string& blob, const std::string& token,
                  Clock::time_point deadline, double timeout_s) {
  Fd listener;
  int bound = -1;
  for (int k = 0; k < kPortCandidates && port + k < 65536; ++k) {
    listener = listen_on(port + k);
    if (listener.get() >= 0) {
      bound = port + k;
      break;
    }
  }
  ZERO_CHECK(bound > 0, kCommunication, "rendezvous: rank 0 cannot listen on any port of ", port,
             "..", port + kPortCandidates - 1, " (MASTER_PORT and the next ones are in use)");
  const std::string message = header_for(token, blob);
  std::vector<Fd> peers;
  std::vector<char> acked(static_cast<std::size_t>(size), 0);
  int n_acked = 0;
  while (n_acked < size - 1) {
    std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
    for (const Fd& p : peers) fds.push_back({p.get(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), ms_left(deadline));
    ZERO_CHECK(rc > 0 || (rc < 0 && errno == EINTR), kTimeout, "rendezvous: rank 0 on port ", bound,
               ": only ", n_acked, " of ", size - 1, " ranks connected within ", timeout_s, " s");
    std::vector<Fd> keep;
    for (std::size_t k = 1; k < fds.size(); ++k) {
      Fd& peer = peers[k - 1];
      if (fds[k].revents == 0) {
        keep.push_back(std::move(peer));
        continue;
      }
      char ack[sizeof(kMagic) + sizeof(std::int32_t)];
      try {
        recv_all(peer.get(), ack, sizeof(ack), Clock::now() + std::chrono::milliseconds(200),
                 "a rank");
      } catch (const Error&) {
        continue;  // not one of ours, or gone: drop it
      }
      std::int32_t r = -1;
      std::memcpy(&r, ack + sizeof(kMagic), sizeof(r));
      if (std::memcmp(ack, kMagic, sizeof(kMagic)) == 0 && r > 0 && r < size && !acked[r]) {
        acked[r] = 1;
        ++n_acked;
      }
    }
    peers = std::move(keep);
    if (fds[0].revents != 0) {
      Fd peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (peer.get() >= 0) {
        try {
          send_all(peer.get(), message.data(), message.size(),
                   Clock::now() + std::chrono::milliseconds(kCandidateMs), "a rank");
          peers.push_back(std::move(peer));
        } catch (const Error&) {
        }
      }
    }
  }
  return blob;
}

// Connects to host:port within `deadline`; an invalid Fd and `error` set otherwise.
Fd connect_to(const addrinfo* ai, Clock::time_point deadline, std::string& error) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (fd.get() < 0) {
    error = std::strerror(errno);
    return Fd();
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS || !wait_fd(fd.get(), POLLOUT, deadline)) {
      error = errno == EINPROGRESS ? "connect timed out" : std::strerror(errno);
      return Fd();
    }
    int so = 0;
    socklen_t len = sizeof(so);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
    if (so != 0) {
      error = std::strerror(so);
      return Fd();
    }
  }
  return fd;
}

std::string fetch(const std::string& host, int port, int rank, const std::string& token,
                  Clock::time_point deadline, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  for (;;) {
    for (int k = 0; k < kPortCandidates && port + k < 65536; ++k) {
      const int p = port + k;
      const std::string where = detail::cat(host, ":", p);
      addrinfo* found = nullptr;
      const int gai = ::getaddrinfo(host.c_str(), std::to_string(p).c_str(), &hints, &found);
      ZERO_CHECK(gai == 0, kCommunication, "rendezvous: cannot resolve MASTER_ADDR '", host,
                 "': ", ::gai_strerror(gai));
      for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        const auto until =
            std::min(deadline, Clock::now() + std::chrono::milliseconds(kCandidateMs));
        std::string error;
        Fd fd = connect_to(ai, until, error);
        if (fd.get() < 0) {
          last_error = detail::cat(where, ": ", error);
          continue;
        }
        try {
          char magic[sizeof(kMagic)];
          std::uint32_t len = 0;
          recv_all(fd.get(), magic, sizeof(magic), until, where);
          if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
            last_error = detail::cat(where, ": not a zero rendezvous (wrong magic)");
            continue;
          }
          recv_all(fd.get(), &len, sizeof(len), until, where);
          if (len > kMaxBlob) continue;
          std::string their_token(len, '\0');
          recv_all(fd.get(), their_token.data(), len, until, where);
          if (their_token != token) {
            last_error = detail::cat(where, ": a zero rendezvous of another job (token '",
                                     their_token.substr(0, 64), "')");
            continue;
          }
          recv_all(fd.get(), &len, sizeof(len), until, where);
          ZERO_CHECK(len <= kMaxBlob, kCorruption, "rendezvous: ", where, " announced ", len,
                     " bytes");
          std::string blob(len, '\0');
          recv_all(fd.get(), blob.data(), len, deadline, where);
          char ack[sizeof(kMagic) + sizeof(std::int32_t)];
          const std::int32_t r = rank;
          std::memcpy(ack, kMagic, sizeof(kMagic));
          std::memcpy(ack + sizeof(kMagic), &r, sizeof(r));
          send_all(fd.get(), ack, sizeof(ack), deadline, where);
          ::freeaddrinfo(found);
          return blob;
        } catch (const Error& e) {
          if (e.code() == ErrorCode::kCorruption &&
              e.message().find("announced") != std::string::npos) {
            ::freeaddrinfo(found);
            throw;
          }
          last_error = detail::cat(where, ": ", e.message());
        }
      }
      ::freeaddrinfo(found);
    }
    ZERO_CHECK(Clock::now() < deadline, kTimeout, "rendezvous: no zero rank 0 answered at ", host,
               ":", port, " (MASTER_ADDR:MASTER_PORT, and ports up to ", port + kPortCandidates - 1,
               ") within ", timeout_s, " s (last: ", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string tcp_broadcast(const std::string& host, int port, int rank, int size,
                          const std::string& blob, double timeout_s, const std::string& token) {
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size, kInvalidArgument, "rendezvous: rank ", rank,
             " of size ", size);
  ZERO_CHECK(port > 0 && port < 65536, kConfig, "MASTER_PORT ", port, " is not a TCP port");
  ZERO_CHECK(blob.size() <= kMaxBlob, kInvalidArgument, "rendezvous blob of ", blob.size(),
             " bytes");
  const auto deadline = deadline_after(timeout_s);
  if (size == 1) return blob;
  ZERO_CHECK(token.size() <= kMaxBlob, kInvalidArgument, "rendezvous token of ", token.size(),
             " bytes");
  return rank == 0 ? serve(port, size, blob, token, deadline, timeout_s)
                   : fetch(host, port, rank, token, deadline, timeout_s);
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
