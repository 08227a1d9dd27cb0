// The backend-independent front end of zero::Communicator: argument checks, byte counters,
// collective timestamps, blocking forms, handles.
#include <cstdint>
#include <limits>
#include <utility>

#include "comm/event_log.hpp"
#include "comm/fingerprint.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/log.hpp"

namespace zero {

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

std::string_view to_string(CommDebug d) noexcept {
  switch (d) {
    case CommDebug::kOff: return "off";
    case CommDebug::kDetail: return "detail";
  }
  return "unknown";
}

std::string_view to_string(Collective c) noexcept {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kAllToAll: return "all_to_all";
  }
  return "unknown";
}

std::uint64_t CommStats::bytes_sent() const {
  std::uint64_t total = 0;
  for (const auto& c : by_op) total += c.bytes_sent;
  return total;
}

std::uint64_t CommStats::bytes_received() const {
  std::uint64_t total = 0;
  for (const auto& c : by_op) total += c.bytes_received;
  return total;
}

// ---------------------------------------------------------------------------------------------
// CommHandle

CommHandle::CommHandle(std::unique_ptr<detail::CommRequest> request)
    : request_(std::move(request)) {}
CommHandle::CommHandle(CommHandle&&) noexcept = default;

CommHandle& CommHandle::operator=(CommHandle&& other) noexcept {
  if (this != &other) {
    // The collective this handle held must still complete before its buffers are reused.
    CommHandle dropped(std::move(*this));
    request_ = std::move(other.request_);
    log_ = std::move(other.log_);
    kind_ = other.kind_;
    bytes_ = other.bytes_;
    seq_ = other.seq_;
    tag_ = other.tag_;
  }
  return *this;
}

CommHandle::~CommHandle() {
  if (!request_) return;
  try {
    request_->wait();
  } catch (const std::exception& e) {
    ZERO_LOG(kError, "collective dropped without wait() failed: ", e.what());
  }
}

void CommHandle::wait() {
  if (!request_) return;
  std::unique_ptr<detail::CommRequest> request = std::move(request_);
  if (!log_) {
    request->wait();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    request->wait();
  } catch (const std::exception& e) {
    log_->failed(seq_, e.what());
    throw;
  }
  log_->waited(kind_, bytes_, seq_, tag_, t0, std::chrono::steady_clock::now());
}

bool CommHandle::test() {
  if (!request_) return true;
  bool done = false;
  try {
    done = request_->test();
  } catch (...) {
    request_.reset();
    throw;
  }
  if (done) request_.reset();
  return done;
}

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator::Communicator(int rank, int size, std::vector<int> world_ranks, double timeout_s)
    : rank_(rank),
      size_(size),
      world_ranks_(std::move(world_ranks)),
      timeout_s_(timeout_s),
      event_log_(std::make_shared<detail::EventLog>()) {
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size, kInvalidArgument, "communicator rank ", rank,
             " of size ", size, " is out of range");
  ZERO_CHECK(timeout_s > 0, kInvalidArgument, "comm_timeout_s must be > 0, got ", timeout_s);
  if (world_ranks_.empty()) {
    for (int r = 0; r < size; ++r) world_ranks_.push_back(r);
  }
  ZERO_CHECK(static_cast<int>(world_ranks_.size()) == size, kInternal, "world rank map of ",
             world_ranks_.size(), " entries for a group of ", size);
}

Communicator::~Communicator() = default;

void Communicator::set_timeout_s(double seconds) {
  ZERO_CHECK(seconds > 0, kInvalidArgument, "comm timeout must be > 0 s, got ", seconds);
  timeout_s_.store(seconds, std::memory_order_relaxed);
}

CommStats Communicator::stats() const {
  CommStats s;
  for (std::size_t i = 0; i < kNumCollectives; ++i) {
    s.by_op[i].calls = stats_[i][0].load(std::memory_order_relaxed);
    s.by_op[i].bytes_sent = stats_[i][1].load(std::memory_order_relaxed);
    s.by_op[i].bytes_received = stats_[i][2].load(std::memory_order_relaxed);
  }
  s.busy_ns = event_log_->busy_ns();
  s.wait_ns = event_log_->wait_ns();
  s.resets = resets_.load(std::memory_order_relaxed);
  return s;
}

void Communicator::reset_stats() {
  for (auto& op : stats_) {
    for (auto& c : op) c.store(0, std::memory_order_relaxed);
  }
  event_log_->reset_times();
  resets_.fetch_add(1, std::memory_order_relaxed);
}

void Communicator::set_tracer(Tracer* tracer) {
  tracer_ = tracer;
  event_log_->set_tracer(tracer);
}

void Communicator::set_event_capacity(std::size_t n) {
  event_capacity_ = n;
  event_pending_ = false;  // one opened by a collective that failed to start
  event_log_->set_capacity(n);
}

std::vector<CollectiveEvent> Communicator::events() const { return event_log_->snapshot(); }

void Communicator::set_flight_recorder(std::size_t capacity, const std::string& dir) {
  flight_capacity_ = capacity;
  flight_dir_ = dir;
  event_log_->flight().configure(capacity, world_ranks_[rank_], world_ranks_, backend());
  if (capacity > 0) detail::register_flight_recorder(event_log_, &event_log_->flight(), dir);
}

void Communicator::set_phase(const char* phase, std::int64_t unit) noexcept {
  event_log_->flight().set_phase(phase, unit);
}

void Communicator::open_event(detail::CollectiveArgs& a) {
  pending_event_ =
      CollectiveEvent{a.kind, a.count, a.dtype, seq_, std::chrono::steady_clock::now()};
  pending_event_.tag = std::exchange(next_tag_, -1);
  event_pending_ = true;
  a.seq = seq_;
  a.tag = pending_event_.tag;
  a.tag_layout = std::exchange(next_layout_, TagLayout{});
  a.verify = debug_ == CommDebug::kDetail && size_ > 1;
  if (event_log_->flight().on()) event_log_->flight().issued(detail::fingerprint_of(a));
}

detail::EventProbe Communicator::take_event_probe() {
  if (!event_pending_) return {};
  event_pending_ = false;
  return detail::EventProbe(event_log_, pending_event_);
}

std::string Communicator::describe(const detail::CollectiveArgs& a) const {
  // Built for every collective (errors need it after the fact): plain appends, no streams.
  std::string s(to_string(a.kind));
  s.reserve(64 + 4 * world_ranks_.size());
  if (a.kind != Collective::kBarrier) {
    s += '(';
    s += std::to_string(a.count);
    s += " x ";
    s += to_string(a.dtype);
    if (a.kind == Collective::kAllReduce || a.kind == Collective::kReduceScatter) {
      s += ", ";
      s += to_string(a.op);
    }
    if (a.kind == Collective::kBroadcast) {
      s += ", root ";
      s += std::to_string(a.root);
    }
    s += ')';
  }
  s += " on ranks {";
  for (int r = 0; r < size_; ++r) {
    if (r > 0) s += ',';
    s += std::to_string(world_ranks_[r]);
  }
  s += "}, rank ";
  s += std::to_string(world_ranks_[rank_]);
  return s;
}

namespace {

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

const char* at(const void* p, std::size_t bytes) { return static_cast<const char*>(p) + bytes; }

}  // namespace

void Communicator::count(const detail::CollectiveArgs& a) {
  const std::uint64_t n = static_cast<std::uint64_t>(size_);
  const std::uint64_t bytes = a.count * dtype_size(a.dtype);
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  switch (a.kind) {
    case Collective::kAllReduce: sent = received = 2 * (n - 1) * bytes / n; break;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll: sent = received = (n - 1) * bytes; break;
    case Collective::kBroadcast:
      if (n > 1) (a.root == rank_ ? sent : received) = bytes;
      break;
    case Collective::kBarrier: break;
  }
  auto& c = stats_[static_cast<std::size_t>(a.kind)];
  c[0].fetch_add(1, std::memory_order_relaxed);
  c[1].fetch_add(sent, std::memory_order_relaxed);
  c[2].fetch_add(received, std::memory_order_relaxed);
}

void Communicator::check(const detail::CollectiveArgs& a) const {
  const std::size_t es = dtype_size(a.dtype);
  const std::size_t n = static_cast<std::size_t>(size_);
  const char* name = to_string(a.kind).data();
  ZERO_CHECK(a.dtype == DType::kF32 || a.dtype == DType::kF16 || a.dtype == DType::kBF16,
             kInvalidArgument, name, ": unknown dtype ", static_cast<int>(a.dtype));
  ZERO_CHECK(a.op == ReduceOp::kSum || a.op == ReduceOp::kAvg || a.op == ReduceOp::kMax,
             kInvalidArgument, name, ": unknown reduce op ", static_cast<int>(a.op));
  ZERO_CHECK(a.count <= std::numeric_limits<std::size_t>::max() / (es * n) / 2, kInvalidArgument,
             name, ": element count ", a.count, " overflows a buffer size");
  const std::size_t bytes = a.count * es;  // the per-rank piece
  const bool has_data = a.count > 0;
  switch (a.kind) {
    case Collective::kAllReduce:
      ZERO_CHECK(!has_data || (a.send != nullptr && a.recv != nullptr), kInvalidArgument,
                 describe(a), ": null buffer (send ", a.send, ", recv ", a.recv, ")");
      ZERO_CHECK(a.send == a.recv || !overlaps(a.send, bytes, a.recv, bytes), kInvalidArgument,
                 describe(a), ": send ", a.send, " and recv ", a.recv,
                 " overlap without being equal (in-place needs recv == send)");
      break;
    case Collective::kReduceScatter:
      ZERO_CHECK(!has_data || (a.send != nullptr && a.recv != nullptr), kInvalidArgument,
                 describe(a), ": null buffer (send ", a.send, ", recv ", a.recv, ")");
      ZERO_CHECK(a.recv == at(a.send, rank_ * bytes) || !overlaps(a.send, n * bytes, a.recv, bytes),
                 kInvalidArgument, describe(a), ": recv ", a.recv, " overlaps send ", a.send,
                 " but is not the in-place position send + rank * recv_count");
      break;
    case Collective::kAllGather:
      ZERO_CHECK(!has_data || (a.send != nullptr && a.recv != nullptr), kInvalidArgument,
                 describe(a), ": null buffer (send ", a.send, ", recv ", a.recv, ")");
      ZERO_CHECK(a.send == at(a.recv, rank_ * bytes) || !overlaps(a.send, bytes, a.recv, n * bytes),
                 kInvalidArgument, describe(a), ": send ", a.send, " overlaps recv ", a.recv,
                 " but is not the in-place position recv + rank * send_count");
      break;
    case Collective::kBroadcast:
      ZERO_CHECK(a.root >= 0 && a.root < size_, kInvalidArgument, "broadcast root ", a.root,
                 " is not a rank of this group of ", size_);
      ZERO_CHECK(!has_data || a.recv != nullptr, kInvalidArgument, describe(a), ": null recv");
      if (a.root == rank_) {
        ZERO_CHECK(!has_data || a.send != nullptr, kInvalidArgument, describe(a),
                   ": null send on the root");
        ZERO_CHECK(a.send == a.recv || !overlaps(a.send, bytes, a.recv, bytes), kInvalidArgument,
                   describe(a), ": send and recv overlap without being equal");
      }
      break;
    case Collective::kAllToAll:
      ZERO_CHECK(!has_data || (a.send != nullptr && a.recv != nullptr), kInvalidArgument,
                 describe(a), ": null buffer (send ", a.send, ", recv ", a.recv, ")");
      ZERO_CHECK(!overlaps(a.send, n * bytes, a.recv, n * bytes), kInvalidArgument, describe(a),
                 ": send ", a.send, " and recv ", a.recv, " overlap (all_to_all is not in place)");
      break;
    case Collective::kBarrier: break;
  }
}

CommHandle Communicator::issue(detail::CollectiveArgs a) {
  check(a);
  open_event(a);
  const std::uint64_t seq = seq_++;  // a collective that failed to start still took its place
  CommHandle handle;
  try {
    handle = start(a);
  } catch (const std::exception& e) {
    event_log_->failed(seq, e.what());
    throw;
  }
  count(a);
  if (handle.valid()) {
    handle.log_ = event_log_;
    handle.kind_ = a.kind;
    handle.bytes_ = a.count * dtype_size(a.dtype);
    handle.seq_ = seq;
    handle.tag_ = pending_event_.tag;
  }
  return handle;
}

void Communicator::run(detail::CollectiveArgs a) {
  check(a);
  open_event(a);
  const std::uint64_t seq = seq_++;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_blocking(a);
  } catch (const std::exception& e) {
    event_log_->failed(seq, e.what());
    throw;
  }
  event_log_->waited(a.kind, a.count * dtype_size(a.dtype), seq, pending_event_.tag, t0,
                     std::chrono::steady_clock::now());
  count(a);
}

void Communicator::run_blocking(const detail::CollectiveArgs& args) { start(args).wait(); }

// ---- the public collectives: build the arguments, check, issue.

CommHandle Communicator::all_reduce_async(const void* send, void* recv, std::size_t count,
                                          DType dtype, ReduceOp op) {
  return issue({Collective::kAllReduce, send, recv, count, dtype, op, 0});
}
void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op) {
  run({Collective::kAllReduce, send, recv, count, dtype, op, 0});
}

CommHandle Communicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                              DType dtype, ReduceOp op) {
  return issue({Collective::kReduceScatter, send, recv, recv_count, dtype, op, 0});
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype,
                                  ReduceOp op) {
  run({Collective::kReduceScatter, send, recv, recv_count, dtype, op, 0});
}

CommHandle Communicator::all_gather_async(const void* send, void* recv, std::size_t send_count,
                                          DType dtype) {
  return issue({Collective::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum, 0});
}
void Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) {
  run({Collective::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum, 0});
}

CommHandle Communicator::broadcast_async(const void* send, void* recv, std::size_t count,
                                         DType dtype, int root) {
  return issue({Collective::kBroadcast, send, recv, count, dtype, ReduceOp::kSum, root});
}
void Communicator::broadcast(const void* send, void* recv, std::size_t count, DType dtype,
                             int root) {
  run({Collective::kBroadcast, send, recv, count, dtype, ReduceOp::kSum, root});
}

CommHandle Communicator::barrier_async() {
  return issue({Collective::kBarrier, nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum, 0});
}
void Communicator::barrier() {
  run({Collective::kBarrier, nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum, 0});
}

CommHandle Communicator::all_to_all_async(const void* send, void* recv, std::size_t count,
                                          DType dtype) {
  return issue({Collective::kAllToAll, send, recv, count, dtype, ReduceOp::kSum, 0});
}
void Communicator::all_to_all(const void* send, void* recv, std::size_t count, DType dtype) {
  run({Collective::kAllToAll, send, recv, count, dtype, ReduceOp::kSum, 0});
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  ZERO_CHECK(color >= 0 || color == kNoColor, kInvalidArgument, "split color ", color,
             " must be >= 0 or Communicator::kNoColor");
  std::unique_ptr<Communicator> child = split_impl(color, key);
  if (child) {
    child->set_debug(debug_);
    if (flight_capacity_ > 0) child->set_flight_recorder(flight_capacity_, flight_dir_);
  }
  return child;
}

}  // namespace zero
