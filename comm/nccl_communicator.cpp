// The NCCL backend: one GPU per rank; buffers are device pointers of this rank's GPU.
//
// Every collective is enqueued on the communicator's own stream after an event recorded on the
// caller's compute stream (CommOptions::cuda_stream; the legacy default stream when null), so it
// sees the compute that produced its input and overlaps with compute issued later. The handle
// holds an event recorded after the collective; wait() polls that event and
// ncclCommGetAsyncError, and on the deadline calls ncclCommAbort (the communicator is then broken
// and every later collective fails with kRemoteFailure).
//
// The communicator is created non-blocking (ncclConfig_t::blocking = 0), so that a peer that
// never arrives makes initialisation time out instead of hanging. Bootstrap of the unique id:
// through MPI under mpirun / srun (when built with MPI), else a TCP rendezvous at
// MASTER_ADDR:MASTER_PORT (torchrun; rank 0 listens on the first free port from MASTER_PORT
// up, since torchrun's agent holds MASTER_PORT with its own store), else a shared file
// (CommOptions::rendezvous_file or ZERO_NCCL_ID_FILE).
//
// 16-bit reductions are NCCL's own (ncclFloat16 / ncclBfloat16 kernels); avg is ncclAvg.
//
// Collective timestamps (Communicator::events()): the host does not see the GPU's timing, so
// started is when the collective was enqueued on the stream and finished is when a test() or
// wait() on its handle first found the done event complete.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/backends.hpp"
#include "comm/event_log.hpp"
#include "comm/fingerprint.hpp"
#include "comm/ordered_worker.hpp"
#include "comm/rendezvous.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/log.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

namespace zero::detail {

namespace {

#define ZERO_CUDA_CHECK(call, what)                                                         \
  do {                                                                                      \
    const cudaError_t zero_cuda_rc_ = (call);                                               \
    if (zero_cuda_rc_ != cudaSuccess) [[unlikely]] {                                        \
      ZERO_THROW(kCuda, what, ": ", #call, " failed: ", cudaGetErrorString(zero_cuda_rc_)); \
    }                                                                                       \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp o) {
  switch (o) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Shared by the communicator and its outstanding handles.
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaStream_t compute = nullptr;  // the caller's stream (null: legacy default)
  int device = 0;
  float* scratch = nullptr;  // one float on the device: barrier
  // CommDebug::kDetail: the group's fingerprints, pinned host and device (size + 1 each: the
  // last is this rank's), allocated on first use.
  Fingerprint* fp_host = nullptr;
  Fingerprint* fp_dev = nullptr;
  std::mutex mu;
  bool broken = false;
  bool aborted = false;
  std::string broken_reason;

  void check_usable(const std::string& what) {
    std::lock_guard lock(mu);
    ZERO_CHECK(!broken, kRemoteFailure, what, ": the communicator is broken: ", broken_reason);
  }
  // Aborts the NCCL communicator once (kernels in flight are torn down) and records why.
  void abort_comm(std::string why) {
    std::lock_guard lock(mu);
    if (!broken) broken_reason = std::move(why);
    broken = true;
    if (!aborted && comm != nullptr) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
  // Throws when NCCL reports an asynchronous error (a peer failed, a network error).
  void check_async(const std::string& what) {
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard lock(mu);
      if (aborted)
        ZERO_THROW(kRemoteFailure, what, ": the communicator was aborted: ", broken_reason);
      ncclCommGetAsyncError(comm, &async);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string why = detail::cat(what, ": NCCL reported ", ncclGetErrorString(async), " (",
                                          ncclGetLastError(comm), ")");
      abort_comm(why);
      ZERO_THROW(kRemoteFailure, why);
    }
  }
  // With a non-blocking communicator a call may return ncclInProgress: poll until it settles.
  void settle(ncclResult_t rc, const std::string& what, Clock::time_point deadline) {
    if (rc == ncclSuccess) return;
    if (rc != ncclInProgress) {
      ZERO_THROW(kCommunication, what, ": ", ncclGetErrorString(rc), " (", ncclGetLastError(comm),
                 ")");
    }
    for (;;) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) {
        ZERO_THROW(kCommunication, what, ": ", ncclGetErrorString(async), " (",
                   ncclGetLastError(comm), ")");
      }
      if (Clock::now() > deadline) {
        const std::string why = detail::cat(what, ": NCCL still in progress at the deadline");
        abort_comm(why);
        ZERO_THROW(kTimeout, why);
      }
      std::this_thread::yield();
    }
  }
};

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclState> st, cudaEvent_t done, std::string what, double timeout_s,
              EventProbe probe)
      : st_(std::move(st)),
        done_(done),
        what_(std::move(what)),
        timeout_s_(timeout_s),
        probe_(std::move(probe)) {}
  ~NcclRequest() override {
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  bool test() override {
    st_->check_async(what_);
    const cudaError_t rc = cudaEventQuery(done_);
    if (rc == cudaSuccess) {
      probe_.finished();  // the host observed completion (the GPU's time is not known here)
      return true;
    }
    ZERO_CHECK(rc == cudaErrorNotReady, kCuda, what_,
               ": cudaEventQuery failed: ", cudaGetErrorString(rc));
    return false;
  }

  void wait() override {
    const auto deadline = deadline_after(timeout_s_);
    int spins = 0;
    while (!test()) {
      if (Clock::now() > deadline) {
        const std::string why = detail::cat(what_, ": timed out after ", timeout_s_,
                                            " s (a peer has not joined, has failed, or is far "
                                            "behind); the NCCL communicator was aborted");
        st_->abort_comm(why);
        ZERO_THROW(kTimeout, why);
      }
      // Spin briefly (short collectives), then back off so a waiting rank does not burn a core.
      if (++spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

 private:
  std::shared_ptr<NcclState> st_;
  cudaEvent_t done_;
  std::string what_;
  double timeout_s_;
  EventProbe probe_;
};

ncclComm_t init_comm(const ncclUniqueId& id, int rank, int size, double timeout_s,
                     const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    ZERO_THROW(kCommunication, what, ": ncclCommInitRankConfig: ", ncclGetErrorString(rc));
  }
  const auto deadline = deadline_after(timeout_s);
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async == ncclSuccess) return comm;
    if (async != ncclInProgress) {
      ncclCommAbort(comm);
      ZERO_THROW(kCommunication, what, ": NCCL initialisation failed: ", ncclGetErrorString(async));
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      ZERO_THROW(kTimeout, what, ": NCCL initialisation of rank ", rank, " of ", size,
                 " did not finish within ", timeout_s, " s (a rank has not joined)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> st, int rank, int size, std::vector<int> world_ranks,
                   double timeout_s)
      : Communicator(rank, size, std::move(world_ranks), timeout_s), st_(std::move(st)) {}

  ~NcclCommunicator() override {
    cudaSetDevice(st_->device);
    bool aborted;
    {
      std::lock_guard lock(st_->mu);
      aborted = st_->aborted;
    }
    if (!aborted) {
      cudaStreamSynchronize(st_->stream);
      ncclCommFinalize(st_->comm);
      // Non-blocking communicator: finalize may be in progress; destroy waits for it.
      ncclResult_t async = ncclInProgress;
      for (int i = 0; i < 100000 && async == ncclInProgress; ++i) {
        ncclCommGetAsyncError(st_->comm, &async);
        if (async == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      ncclCommDestroy(st_->comm);
    }
    cudaFree(st_->scratch);
    cudaFree(st_->fp_dev);
    cudaFreeHost(st_->fp_host);
    cudaStreamDestroy(st_->stream);
  }

  std::string_view backend() const noexcept override { return "nccl"; }

  static std::shared_ptr<NcclState> make_state(ncclComm_t comm, int device, void* compute) {
    auto st = std::make_shared<NcclState>();
    st->comm = comm;
    st->device = device;
    st->compute = static_cast<cudaStream_t>(compute);
    ZERO_CUDA_CHECK(cudaSetDevice(device), "NCCL communicator");
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking),
                    "NCCL communicator");
    ZERO_CUDA_CHECK(cudaMalloc(&st->scratch, sizeof(float)), "NCCL communicator");
    return st;
  }

 protected:
  CommHandle start(const CollectiveArgs& a) override {
    const std::string what = describe(a);
    st_->check_usable(what);
    st_->check_async(what);
    ZERO_CUDA_CHECK(cudaSetDevice(st_->device), what);
    // Order after the caller's compute.
    cudaEvent_t ready = nullptr;
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
    const cudaError_t rec = cudaEventRecord(ready, st_->compute);
    const cudaError_t dep = rec == cudaSuccess ? cudaStreamWaitEvent(st_->stream, ready, 0) : rec;
    cudaEventDestroy(ready);
    ZERO_CUDA_CHECK(dep, what);

    const auto deadline = deadline_after(timeout_s());
    if (a.verify) verify_same_call(a, what, deadline);
    const ncclDataType_t type = nccl_type(a.dtype);
    ncclResult_t rc = ncclSuccess;
    switch (a.kind) {
      case Collective::kAllReduce:
        rc = ncclAllReduce(a.send, a.recv, a.count, type, nccl_op(a.op), st_->comm, st_->stream);
        break;
      case Collective::kReduceScatter:
        rc =
            ncclReduceScatter(a.send, a.recv, a.count, type, nccl_op(a.op), st_->comm, st_->stream);
        break;
      case Collective::kAllGather:
        rc = ncclAllGather(a.send, a.recv, a.count, type, st_->comm, st_->stream);
        break;
      case Collective::kBroadcast:
        rc = ncclBroadcast(a.send != nullptr ? a.send : a.recv, a.recv, a.count, type, a.root,
                           st_->comm, st_->stream);
        break;
      case Collective::kAllToAll: {  // NCCL has none: a send and a receive per peer, grouped
        const std::size_t bytes = a.count * dtype_size(a.dtype);
        rc = ncclGroupStart();
        for (int q = 0; q < size() && rc == ncclSuccess; ++q) {
          rc = ncclSend(static_cast<const char*>(a.send) + q * bytes, a.count, type, q, st_->comm,
                        st_->stream);
          if (rc == ncclSuccess) {
            rc = ncclRecv(static_cast<char*>(a.recv) + q * bytes, a.count, type, q, st_->comm,
                          st_->stream);
          }
        }
        const ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess) rc = end;
        break;
      }
      case Collective::kBarrier:  // NCCL has none: a one-element all-reduce on the stream
        rc = ncclAllReduce(st_->scratch, st_->scratch, 1, ncclFloat32, ncclSum, st_->comm,
                           st_->stream);
        break;
    }
    st_->settle(rc, what, deadline);
    EventProbe probe = take_event_probe();
    probe.started();  // enqueued: the GPU's start is not known on the host
    cudaEvent_t done = nullptr;
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    const cudaError_t rec_done = cudaEventRecord(done, st_->stream);
    if (rec_done != cudaSuccess) {
      cudaEventDestroy(done);
      ZERO_CUDA_CHECK(rec_done, what);
    }
    return CommHandle(
        std::make_unique<NcclRequest>(st_, done, what, timeout_s(), std::move(probe)));
  }

  // CommDebug::kDetail: every rank's fingerprint of this collective, all-gathered on the
  // collectives' stream before it and checked on the host by the one rule (fingerprint.hpp).
  // The host waits for the stream here (up to the deadline): the check costs a synchronisation
  // per collective, which is why it is a debug level.
  void verify_same_call(const CollectiveArgs& a, const std::string& what,
                        Clock::time_point deadline) {
    const auto n = static_cast<std::size_t>(size());
    const std::size_t bytes = sizeof(Fingerprint) * (n + 1);
    if (st_->fp_dev == nullptr) {
      ZERO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st_->fp_dev), bytes), what);
      ZERO_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st_->fp_host), bytes), what);
    }
    st_->fp_host[n] = fingerprint_of(a);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(st_->fp_dev + n, st_->fp_host + n, sizeof(Fingerprint),
                                    cudaMemcpyHostToDevice, st_->stream),
                    what);
    st_->settle(ncclAllGather(st_->fp_dev + n, st_->fp_dev, sizeof(Fingerprint), ncclUint8,
                              st_->comm, st_->stream),
                what, deadline);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(st_->fp_host, st_->fp_dev, sizeof(Fingerprint) * n,
                                    cudaMemcpyDeviceToHost, st_->stream),
                    what);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(st_->stream);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) ZERO_CUDA_CHECK(q, what);
      st_->check_async(what);
      if (Clock::now() > deadline) {
        const std::string why = detail::cat(what, ": timed out after ", timeout_s(),
                                            " s in the fingerprint check (comm_debug detail)");
        st_->abort_comm(why);
        ZERO_THROW(kTimeout, why);
      }
      std::this_thread::yield();
    }
    check_same_call(std::vector<Fingerprint>(st_->fp_host, st_->fp_host + n), world_ranks(), what);
  }

  std::unique_ptr<Communicator> split_impl(int color, int key) override {
    const std::string what = detail::cat("split(color ", color, ", key ", key, ")");
    st_->check_usable(what);
    ZERO_CUDA_CHECK(cudaSetDevice(st_->device), what);
    ZERO_CUDA_CHECK(cudaStreamSynchronize(st_->stream), what);  // ordered after pending work
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const auto deadline = deadline_after(timeout_s());
    st_->settle(ncclCommSplit(st_->comm, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key,
                              &child, &config),
                what, deadline);
    if (child == nullptr) return nullptr;
    int r = 0, n = 0;
    ncclCommUserRank(child, &r);
    ncclCommCount(child, &n);
    auto st = make_state(child, st_->device, st_->compute);
    // The child's world ranks: all-gather each member's world rank over the child.
    int* dev = nullptr;
    ZERO_CUDA_CHECK(cudaMalloc(&dev, sizeof(int) * (n + 1)), what);
    std::vector<int> ranks(n);
    const int me = world_ranks()[rank()];
    cudaError_t crc = cudaMemcpy(dev + n, &me, sizeof(int), cudaMemcpyHostToDevice);
    if (crc == cudaSuccess) {
      try {
        st->settle(ncclAllGather(dev + n, dev, 1, ncclInt32, st->comm, st->stream), what, deadline);
      } catch (...) {
        cudaFree(dev);
        throw;
      }
      crc = cudaStreamSynchronize(st->stream);
      if (crc == cudaSuccess) {
        crc = cudaMemcpy(ranks.data(), dev, sizeof(int) * n, cudaMemcpyDeviceToHost);
      }
    }
    cudaFree(dev);
    ZERO_CUDA_CHECK(crc, what);
    return std::make_unique<NcclCommunicator>(std::move(st), r, n, std::move(ranks), timeout_s());
  }

 private:
  std::shared_ptr<NcclState> st_;
};

// Hands rank 0's unique id to every rank.
ncclUniqueId bootstrap(const LaunchInfo& launch, const CommOptions& options, double timeout_s) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (launch.rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    ZERO_CHECK(rc == ncclSuccess, kCommunication, "ncclGetUniqueId: ", ncclGetErrorString(rc));
  }
  if (launch.size == 1) return id;
  std::string blob(reinterpret_cast<const char*>(&id), sizeof(id));
#if ZERO_WITH_MPI
  if (launch.mpi_launcher) {
    // Through a host communicator: broadcast is a byte copy, the dtype only sets the unit.
    auto host = make_mpi_communicator(launch, timeout_s);
    static_assert(sizeof(ncclUniqueId) % 2 == 0);
    host->broadcast(&id, &id, sizeof(id) / 2, DType::kBF16, 0);
    return id;
  }
#endif
  const char* env_file = std::getenv("ZERO_NCCL_ID_FILE");
  const std::string file = !options.rendezvous_file.empty() ? options.rendezvous_file
                           : env_file != nullptr            ? std::string(env_file)
                                                            : std::string();
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!file.empty()) {
    blob = file_broadcast(file, launch.rank, blob, timeout_s);
  } else if (addr != nullptr && port != nullptr) {
    int p = 0;
    try {
      p = std::stoi(port);
    } catch (const std::exception&) {
      ZERO_THROW(kConfig, "MASTER_PORT='", port, "' is not a port number");
    }
    // The job's name, so that no rank takes another job's (or an earlier restart's) rank 0 on
    // the same ports for its own: torchrun's run id and restart count, the world size.
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const std::string token = detail::cat(run_id != nullptr ? run_id : "", "/",
                                          restart != nullptr ? restart : "", "/", launch.size);
    blob = tcp_broadcast(addr, p, launch.rank, launch.size, blob, timeout_s, token);
  } else {
    ZERO_THROW(kConfig, "NCCL with ", launch.size, " ranks (", launch.source,
               ") needs a bootstrap: run under mpirun / srun (with MPI built in), set MASTER_ADDR "
               "and MASTER_PORT (torchrun), or ZERO_NCCL_ID_FILE / CommOptions::rendezvous_file");
  }
  ZERO_CHECK(blob.size() == sizeof(id), kCorruption, "NCCL unique id of ", blob.size(),
             " bytes received, expected ", sizeof(id));
  std::memcpy(&id, blob.data(), sizeof(id));
  return id;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchInfo& launch,
                                                     const CommOptions& options, double timeout_s) {
  const int devices = cuda::device_count();
  ZERO_CHECK(devices > 0, kCuda, "comm_backend nccl: no CUDA device: ", cuda::unavailable_reason());
  const int device = options.device >= 0 ? options.device : launch.local_rank;
  ZERO_CHECK(device < devices, kConfig, "NCCL rank ", launch.rank, " wants cuda:", device,
             " (local rank ", launch.local_rank, ") but this node has ", devices, " device(s)");
  ZERO_CUDA_CHECK(cudaSetDevice(device), "NCCL communicator");
  const ncclUniqueId id = bootstrap(launch, options, timeout_s);
  const std::string what = detail::cat("NCCL communicator rank ", launch.rank, " of ", launch.size);
  ncclComm_t comm = init_comm(id, launch.rank, launch.size, timeout_s, what);
  std::shared_ptr<NcclState> st;
  try {
    st = NcclCommunicator::make_state(comm, device, options.cuda_stream);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
  return std::make_unique<NcclCommunicator>(std::move(st), launch.rank, launch.size,
                                            std::vector<int>{}, timeout_s);
}

}  // namespace zero::detail
