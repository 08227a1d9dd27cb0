// CpuOptimizer: argument checks, ISA choice and the oneTBB split of a shard into blocks.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "optim/cpu_kernels.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/optimizer.hpp"

namespace zero {

namespace {

using detail::optim::BlockArgs;
using detail::optim::BlockFn;
using detail::optim::Copy;
using detail::optim::SumsqFn;

constexpr std::size_t kDefaultBlock = 65536;  // elements; 1.8 MB of Adam traffic per task
// From this size on (~30 MB of traffic per step, the L3 of the machines we measure on) the
// 16-bit copy is written with non-temporal stores: it is not read again by this step.
constexpr std::size_t kStreamCopyElems = std::size_t{1} << 20;

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

void check_array(const void* p, DType t, const char* what) {
  ZERO_CHECK(p != nullptr, kInvalidArgument, "optimizer step: ", what, " is null");
  ZERO_CHECK(aligned(p, dtype_size(t)), kInvalidArgument, "optimizer step: ", what, " (", p,
             ") is not aligned to its element size ", dtype_size(t));
}

// int8 state arrays hold 4-byte absmax words: aligned to 4.
void check_state(const void* p, MomentDType t, const char* what) {
  ZERO_CHECK(p != nullptr, kInvalidArgument, "optimizer step: ", what, " is null");
  const std::size_t a = t == MomentDType::kBF16 ? 2 : 4;
  ZERO_CHECK(aligned(p, a), kInvalidArgument, "optimizer step: ", what, " (", p,
             ") is not aligned to ", a, " bytes (", to_string(t), " state)");
}

}  // namespace

struct CpuOptimizer::Impl {
  Isa isa = Isa::kScalar;
  bool native_bf16 = false;
  int threads = 0;
  std::size_t block = kDefaultBlock;
  std::unique_ptr<tbb::task_arena> arena;

  static Copy check_shard(const OptimizerParams& params, const ShardRef& shard);
  static BlockArgs args_of(const OptimizerParams& params, const ShardRef& shard);

  // Runs fn(begin, end) over [0, n) in blocks of `block`, one oneTBB task per block (simple
  // partitioner, grain 1: an idle thread steals blocks from a busy one).
  // `multiple`: tasks start at multiples of it (the int8 moments' blocks); the task size is
  // rounded up to one.
  template <typename Fn>
  void for_blocks(std::size_t n, const Fn& fn, std::size_t multiple = 1) const {
    const std::size_t block = (this->block + multiple - 1) / multiple * multiple;
    const std::size_t nblocks = (n + block - 1) / block;
    if (nblocks <= 1) {
      fn(std::size_t{0}, n);
      return;
    }
    auto work = [&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, nblocks, 1),
          [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t b = r.begin(); b != r.end(); ++b) {
              const std::size_t begin = b * block;
              fn(begin, begin + block < n ? begin + block : n);
            }
          },
          tbb::simple_partitioner());
    };
    if (arena) {
      arena->execute(work);
    } else {
      work();
    }
  }
};

CpuOptimizer::CpuOptimizer(CpuExecOptions options) : impl_(std::make_unique<Impl>()) {
  const Isa isa = options.isa ? *options.isa : best_isa();
  ZERO_CHECK(isa_supported(isa), kInvalidArgument, "CpuOptimizer: ISA ", to_string(isa),
             " is not supported by this CPU");
  ZERO_CHECK(options.threads >= 0, kInvalidArgument, "CpuOptimizer: threads = ", options.threads,
             " must be >= 0 (0: the caller's arena)");
  ZERO_CHECK(options.block_elems % 64 == 0, kInvalidArgument,
             "CpuOptimizer: block_elems = ", options.block_elems,
             " must be a multiple of 64 (0: default)");
  impl_->isa = isa;
  impl_->native_bf16 = isa == Isa::kAvx512 && cpu_features().avx512_bf16;
  impl_->threads = options.threads;
  impl_->block = options.block_elems == 0 ? kDefaultBlock : options.block_elems;
  if (options.threads > 0) {
    impl_->arena = std::make_unique<tbb::task_arena>(options.threads);
  }
}

CpuOptimizer::~CpuOptimizer() = default;
CpuOptimizer::CpuOptimizer(CpuOptimizer&&) noexcept = default;
CpuOptimizer& CpuOptimizer::operator=(CpuOptimizer&&) noexcept = default;

Isa CpuOptimizer::isa() const noexcept { return impl_->isa; }
int CpuOptimizer::threads() const noexcept { return impl_->threads; }
std::size_t CpuOptimizer::block_elems() const noexcept { return impl_->block; }

namespace {

// The state arrays' element type for the f32 / bf16 block functions.
DType plain_state(MomentDType t) { return t == MomentDType::kBF16 ? DType::kBF16 : DType::kF32; }

}  // namespace

// Checks the shard's arrays and the copy; returns the copy kind.
Copy CpuOptimizer::Impl::check_shard(const OptimizerParams& params, const ShardRef& shard) {
  check_array(shard.master, DType::kF32, "master");
  check_array(shard.grad, shard.grad_dtype, "grad");
  const MomentDType st = params.state_dtype();
  for (int k = 0; k < params.num_states(); ++k) {
    check_state(shard.state[k], st, k == 0 ? "state[0]" : "state[1]");
  }
  if (shard.param_copy == nullptr) return Copy::kNone;
  ZERO_CHECK(shard.param_copy_dtype != DType::kF32, kInvalidArgument,
             "optimizer step: param_copy_dtype must be bf16 or f16 (the f32 master is the "
             "f32 copy)");
  check_array(shard.param_copy, shard.param_copy_dtype, "param_copy");
  return shard.param_copy_dtype == DType::kBF16 ? Copy::kBF16 : Copy::kF16;
}

BlockArgs CpuOptimizer::Impl::args_of(const OptimizerParams& params, const ShardRef& shard) {
  const int ns = params.num_states();
  BlockArgs args;
  args.p = shard.master;
  args.copy = shard.param_copy;
  args.g = shard.grad;
  args.s0 = ns > 0 ? shard.state[0] : nullptr;
  args.s1 = ns > 1 ? shard.state[1] : nullptr;
  args.stream_copy = shard.count >= kStreamCopyElems;
  return args;
}

void CpuOptimizer::step(const OptimizerParams& params, const ShardRef& shard, std::int64_t step,
                        float grad_scale) const {
  if (params.state_dtype() == MomentDType::kInt8) {
    const StepRun run{0, shard.count, 0};
    this->step(&params, 1, shard, &run, 1, step, grad_scale);
    return;
  }
  const detail::optim::StepScalars sc = detail::optim::make_step_scalars(params, step, grad_scale);
  if (shard.count == 0) return;
  const Copy copy = impl_->check_shard(params, shard);
  const DType st = plain_state(params.state_dtype());
  const detail::optim::Rule rule = detail::optim::rule_of(params);
  BlockFn fn = nullptr;
  switch (impl_->isa) {
    case Isa::kAvx512:
      fn = detail::optim::select_avx512(rule, shard.grad_dtype, st, copy, impl_->native_bf16);
      break;
    case Isa::kAvx2: fn = detail::optim::select_avx2(rule, shard.grad_dtype, st, copy); break;
    case Isa::kScalar: fn = detail::optim::select_scalar(rule, shard.grad_dtype, st, copy); break;
  }
  ZERO_CHECK(fn != nullptr, kInternal, "optimizer step: no block function for ",
             to_string(params.type), " grad ", to_string(shard.grad_dtype), " state ",
             to_string(st));
  BlockArgs args = Impl::args_of(params, shard);
  args.sc = sc;
  impl_->for_blocks(shard.count, [&](std::size_t begin, std::size_t end) { fn(args, begin, end); });
}

void CpuOptimizer::step(const OptimizerParams* group_ptr, std::size_t num_groups,
                        const ShardRef& shard, const StepRun* run_ptr, std::size_t num_runs,
                        std::int64_t step, float grad_scale) const {
  ZERO_CHECK(group_ptr != nullptr && num_groups > 0, kInvalidArgument,
             "optimizer step: no parameter groups");
  ZERO_CHECK(run_ptr != nullptr || num_runs == 0, kInvalidArgument, "optimizer step: runs is null");
  const std::span<const OptimizerParams> groups(group_ptr, num_groups);
  const std::span<const StepRun> runs(run_ptr, num_runs);
  // Every group's scalars (and validation) first: an error leaves the shard untouched.
  std::vector<detail::optim::StepScalars> sc;
  sc.reserve(groups.size());
  for (const OptimizerParams& g : groups) {
    sc.push_back(detail::optim::make_step_scalars(g, step, grad_scale));
    ZERO_CHECK(g.type == groups[0].type && g.state_dtype() == groups[0].state_dtype() &&
                   g.num_states() == groups[0].num_states(),
               kInvalidArgument,
               "optimizer step: parameter groups differ in rule or state layout (",
               to_string(g.type), " ", to_string(g.state_dtype()), " vs ",
               to_string(groups[0].type), " ", to_string(groups[0].state_dtype()), ")");
  }
  std::size_t at = 0;
  for (const StepRun& r : runs) {
    ZERO_CHECK(r.at == at && r.count <= shard.count - at && r.group >= 0 &&
                   static_cast<std::size_t>(r.group) < groups.size(),
               kInvalidArgument, "optimizer step: run [", r.at, ", ", r.at + r.count, ") of group ",
               r.group, " does not continue the runs at ", at, " of a shard of ", shard.count,
               " elements with ", groups.size(), " group(s)");
    at += r.count;
  }
  ZERO_CHECK(at == shard.count, kInvalidArgument, "optimizer step: the runs cover ", at,
             " of the shard's ", shard.count, " elements");
  if (shard.count == 0) return;
  const OptimizerParams& first = groups[0];
  if (first.state_dtype() != MomentDType::kInt8) {
    for (const StepRun& r : runs) {
      if (r.count == 0) continue;
      this->step(groups[static_cast<std::size_t>(r.group)],
                 shard.part(r.at, r.count, first.state_dtype()), step, grad_scale);
    }
    return;
  }
  const Copy copy = impl_->check_shard(first, shard);
  BlockFn fn = nullptr;
  switch (impl_->isa) {
    case Isa::kAvx512:
      fn = detail::optim::select_q8_avx512(shard.grad_dtype, copy, impl_->native_bf16);
      break;
    case Isa::kAvx2: fn = detail::optim::select_q8_avx2(shard.grad_dtype, copy); break;
    case Isa::kScalar: fn = detail::optim::select_q8_scalar(shard.grad_dtype, copy); break;
  }
  ZERO_CHECK(fn != nullptr, kInternal, "optimizer step: no int8-moment block function for grad ",
             to_string(shard.grad_dtype));
  std::vector<detail::optim::MomentRun> mruns;
  mruns.reserve(runs.size());
  for (const StepRun& r : runs) {
    if (r.count == 0) continue;
    mruns.push_back({r.at + r.count, sc[static_cast<std::size_t>(r.group)]});
  }
  BlockArgs args = Impl::args_of(first, shard);
  args.runs = mruns.data();
  args.num_runs = mruns.size();
  // Tasks start on quantization blocks.
  impl_->for_blocks(
      shard.count, [&](std::size_t begin, std::size_t end) { fn(args, begin, end); },
      kInt8MomentBlock);
}

void CpuOptimizer::init_state(const OptimizerParams& params, const ShardRef& shard) const {
  params.validate();
  if (shard.count == 0) return;
  const MomentDType st = params.state_dtype();
  const int ns = params.num_states();
  for (int k = 0; k < ns; ++k) {
    check_state(shard.state[k], st, k == 0 ? "state[0]" : "state[1]");
  }
  // All-zero bytes are zero moments in every layout (int8: absmax 0, code 0).
  impl_->for_blocks(
      shard.count,
      [&](std::size_t begin, std::size_t end) {
        const std::size_t at = state_bytes(st, begin), bytes = state_bytes(st, end) - at;
        for (int k = 0; k < ns; ++k) std::memset(static_cast<char*>(shard.state[k]) + at, 0, bytes);
      },
      state_block(st));
}

GradStats CpuOptimizer::grad_stats(const void* grad, DType dtype, std::size_t count) const {
  GradStats out;
  if (count == 0) return out;
  ZERO_CHECK(grad != nullptr, kInvalidArgument, "grad_stats: grad is null for ", count,
             " elements");
  ZERO_CHECK(aligned(grad, dtype_size(dtype)), kInvalidArgument, "grad_stats: grad (", grad,
             ") is not aligned to its element size ", dtype_size(dtype));
  SumsqFn fn = nullptr;
  switch (impl_->isa) {
    case Isa::kAvx512: fn = detail::optim::sumsq_avx512(dtype); break;
    case Isa::kAvx2: fn = detail::optim::sumsq_avx2(dtype); break;
    case Isa::kScalar: fn = detail::optim::sumsq_scalar(dtype); break;
  }
  ZERO_CHECK(fn != nullptr, kInvalidArgument, "grad_stats: unsupported dtype");
  const std::size_t block = impl_->block;
  const std::size_t nblocks = (count + block - 1) / block;
  auto block_sum = [&](std::size_t b) {
    const std::size_t begin = b * block;
    return fn(grad, begin, begin + block < count ? begin + block : count);
  };
  double sum = 0.0;
  if (nblocks <= 1) {
    sum = block_sum(0);
  } else {
    // Deterministic reduce: the split tree depends only on nblocks, so the sum does not depend
    // on the thread count or on which thread ran which block.
    auto work = [&] {
      return tbb::parallel_deterministic_reduce(
          tbb::blocked_range<std::size_t>(0, nblocks, 1), 0.0,
          [&](const tbb::blocked_range<std::size_t>& r, double acc) {
            for (std::size_t b = r.begin(); b != r.end(); ++b) acc += block_sum(b);
            return acc;
          },
          [](double a, double b) { return a + b; }, tbb::simple_partitioner());
    };
    sum = impl_->arena ? impl_->arena->execute(work) : work();
  }
  out.sum_squares = sum;
  out.non_finite = !std::isfinite(sum);
  return out;
}

}  // namespace zero
