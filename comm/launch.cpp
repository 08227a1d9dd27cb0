// Launch detection (which rank of how many, from which launcher) and make_communicator().
#include <charconv>
#include <cstdlib>
#include <optional>

#include "comm/backends.hpp"
#include "zero/comm/comm.hpp"
#include "zero/core/log.hpp"
#include "zero/device/detail/cuda_runtime.hpp"

namespace zero {

namespace {

// One launcher's variables.
struct Source {
  const char* name;
  const char* rank_var;
  const char* size_var;
  const char* local_var;
  const char* local_size_var;  // ranks on this node
  bool mpi;                    // MPI can bootstrap from this launcher
};

constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", true},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", true},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", true},
};

std::optional<int> parse_int(const char* var, const char* text) {
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  ZERO_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(), kConfig, var, "='", s,
             "' is not an integer");
  return value;
}

// One value (rank, size or local rank) and where it came from, merged across sources.
struct Merged {
  explicit Merged(const char* w) : what(w) {}
  const char* what;
  std::optional<int> value;
  std::string from;  // "RANK=3" of the first source that set it

  void add(const char* var, std::optional<int> v) {
    if (!v) return;
    if (!value) {
      value = v;
      from = detail::cat(var, "=", *v);
      return;
    }
    ZERO_CHECK(*value == *v, kConfig, "conflicting ", what, ": ", from, " but ", var, "=", *v);
  }
};

}  // namespace

LaunchInfo detect_launch(const CommOptions& options,
                         const std::function<const char*(const char*)>& getenv) {
  auto env = [&](const char* name) -> const char* {
    return getenv ? getenv(name) : std::getenv(name);
  };
  Merged rank{"rank"};
  Merged size{"world size"};
  Merged local{"local rank"};
  Merged local_size{"ranks per node"};
  LaunchInfo info;
  std::string sources;
  auto note = [&](const char* name) { sources += detail::cat(sources.empty() ? "" : ",", name); };

  if (options.rank >= 0 || options.size >= 0 || options.local_rank >= 0) {
    ZERO_CHECK((options.rank >= 0) == (options.size >= 0), kConfig,
               "explicit CommOptions need both rank and size (rank=", options.rank,
               ", size=", options.size, ")");
    rank.add("CommOptions::rank", options.rank >= 0 ? std::optional(options.rank) : std::nullopt);
    size.add("CommOptions::size", options.size >= 0 ? std::optional(options.size) : std::nullopt);
    local.add("CommOptions::local_rank",
              options.local_rank >= 0 ? std::optional(options.local_rank) : std::nullopt);
    note("explicit");
  }
  for (const Source& s : kSources) {
    const std::optional<int> r = parse_int(s.rank_var, env(s.rank_var));
    const std::optional<int> n = parse_int(s.size_var, env(s.size_var));
    if (!r) continue;  // a size alone (e.g. inside an allocation) does not place this process
    ZERO_CHECK(n.has_value(), kConfig, s.rank_var, "=", *r, " is set but ", s.size_var, " is not");
    rank.add(s.rank_var, r);
    size.add(s.size_var, n);
    local.add(s.local_var, parse_int(s.local_var, env(s.local_var)));
    local_size.add(s.local_size_var, parse_int(s.local_size_var, env(s.local_size_var)));
    info.mpi_launcher = info.mpi_launcher || s.mpi;
    note(s.name);
  }
  if (sources.empty()) return info;  // a single process
  info.rank = *rank.value;
  info.size = *size.value;
  info.local_rank = local.value.value_or(0);
  info.local_size = local_size.value.value_or(0);
  info.local_size_from = local_size.from;
  info.source = sources;
  ZERO_CHECK(info.size >= 1, kConfig, "world size must be >= 1: ", size.from);
  ZERO_CHECK(info.rank >= 0 && info.rank < info.size, kConfig, "rank out of range: ", rank.from,
             " with ", size.from);
  ZERO_CHECK(info.local_rank >= 0 && info.local_rank < info.size, kConfig,
             "local rank out of range: ", local.from, " with ", size.from);
  ZERO_CHECK(info.local_size == 0 || (info.local_size >= 1 && info.local_size <= info.size &&
                                      info.local_rank < info.local_size),
             kConfig, "ranks per node out of range: ", local_size.from, " with ", size.from,
             local.value ? detail::cat(" and ", local.from) : std::string());
  return info;
}

namespace {

std::unique_ptr<Communicator> make_backend(const CommOptions& options) {
  std::string backend = options.backend.empty() ? "auto" : options.backend;
  ZERO_CHECK(backend == "auto" || backend == "thread" || backend == "mpi" || backend == "nccl",
             kConfig, "comm backend '", backend,
             "' (CommOptions::backend / comm_backend) is not one of auto, thread, mpi, nccl");
  const double timeout = options.timeout_s;
  ZERO_CHECK(timeout > 0, kInvalidArgument, "CommOptions::timeout_s must be > 0 s, got ", timeout);
  const LaunchInfo launch = detect_launch(options);
  if (backend == "auto") {
    if (options.device_buffers && detail::cuda::device_count() > 0) {
      backend = "nccl";
    } else if (launch.mpi_launcher && ZERO_WITH_MPI) {
      backend = "mpi";
    } else if (launch.size == 1) {
      backend = "thread";
    } else {
      ZERO_THROW(kConfig, "comm_backend auto: world size ", launch.size, " (from ", launch.source,
                 ") needs MPI or NCCL, but ",
                 ZERO_WITH_MPI ? "this is not an MPI launch (mpirun / srun)"
                               : "zero was built without MPI",
                 options.device_buffers ? "" : " and the buffers are not on a GPU",
                 "; set comm_backend or run under mpirun");
    }
    ZERO_LOG(kInfo, "comm backend ", backend, " for rank ", launch.rank, " of ", launch.size, " (",
             launch.source, ")");
  }
  if (backend == "thread") {
    ZERO_CHECK(launch.size == 1, kConfig, "comm_backend thread runs ranks as threads of one ",
               "process: use ThreadGroup::run; this process is rank ", launch.rank, " of ",
               launch.size, " (", launch.source, ")");
    return ThreadGroup(1, timeout).communicator(0);
  }
  if (backend == "mpi") {
#if ZERO_WITH_MPI
    return detail::make_mpi_communicator(launch, timeout);
#else
    ZERO_THROW(kConfig, "comm_backend mpi: zero was built without MPI (ZERO_WITH_MPI=OFF)");
#endif
  }
#if ZERO_WITH_CUDA
  return detail::make_nccl_communicator(launch, options, timeout);
#else
  ZERO_THROW(kConfig, "comm_backend nccl: zero was built without CUDA (ZERO_WITH_CUDA=OFF)");
#endif
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommOptions& options) {
  std::unique_ptr<Communicator> comm = make_backend(options);
  comm->set_debug(options.debug);
  comm->set_flight_recorder(options.flight_recorder, options.flight_dir);
  return comm;
}

}  // namespace zero
