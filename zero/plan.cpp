// The engine's memory, predicted: the same layout, the same pools, the same prefetch rule as
// zero/engine.cpp, replayed without allocating anything.
#include "zero/plan.hpp"

#include <algorithm>

#include "offload/aio.hpp"
#include "zero/error.hpp"
#include "zero/layout.hpp"
#include "zero/optimizer.hpp"

namespace zero {

FormulaBytes zero_formula(double psi, int ranks, int stage, double w, double g, double k,
                          bool offload_optimizer, bool offload_params) {
  const double n = ranks;
  FormulaBytes f;
  f.params = w * psi / (stage >= 3 ? n : 1.0);
  f.grads = g * psi / (stage >= 2 ? n : 1.0);
  f.optimizer = k * psi / (stage >= 1 ? n : 1.0);
  if (offload_optimizer) {
    f.offloaded += f.optimizer;
    f.optimizer = 0;
    if (stage >= 2) {  // ZeRO-Offload keeps the gradient partition with the optimizer, on the host
      f.offloaded += f.grads;
      f.grads = 0;
    }
  }
  if (offload_params && stage >= 3) {
    f.offloaded += f.params;
    f.params = 0;
  }
  return f;
}

std::size_t PlanResult::model_state() const {
  std::size_t s = 0;
  for (MemCategory c : {MemCategory::kParams16, MemCategory::kMasterParams,
                        MemCategory::kOptimizerState, MemCategory::kGradients}) {
    s += at(c) - pinned[static_cast<std::size_t>(c)];
  }
  return s - in_flight_grad_bytes - gathered_param_bytes;
}

std::size_t PlanResult::total() const {
  std::size_t t = 0;
  for (std::size_t b : bytes) t += b;
  return t;
}

PlanResult plan_engine_memory(const PlanInput& in) {
  ZERO_CHECK(!in.units.empty(), kInvalidArgument, "plan: no units");
  const Config& cfg = in.config;
  const auto& z = cfg.zero_optimization;
  const int stage = z.stage;
  const detail::Layout lay = detail::make_layout(in.units, in.ranks, in.alignment);
  const DType w = working_dtype(cfg);
  const DType r = reduce_dtype_of(cfg);
  const OptimizerParams op = OptimizerParams::from_config(cfg.optimizer);
  const std::size_t ws = dtype_size(w), rs = dtype_size(r);

  PlanResult out;
  const auto nu = in.units.size();
  std::vector<bool> sharded(nu, false);
  std::size_t whole = 0, shard_params = 0, max_sharded = 0;
  for (std::size_t u = 0; u < nu; ++u) {
    const auto& ul = lay.units[u];
    out.unit_padded.push_back(ul.padded);
    for (const ParamSpec& p : in.units[u].params) out.psi += p.numel();
    sharded[u] =
        stage >= 3 && ul.numel >= static_cast<std::size_t>(z.stage3_param_persistence_threshold);
    if (sharded[u]) {
      shard_params += ul.shard;
      max_sharded = std::max(max_sharded, ul.shard);
    } else {
      whole += ul.padded;
    }
    if (ul.padded > out.largest_unit) {
      out.largest_unit = ul.padded;
      out.largest_unit_name = in.units[u].name;
    }
  }
  out.psi_padded = lay.total_padded;
  auto add = [&](MemCategory c, std::size_t b) { out.bytes[static_cast<std::size_t>(c)] += b; };
  auto pinned = [&](MemCategory c, std::size_t b) {
    add(c, b);
    out.pinned[static_cast<std::size_t>(c)] += b;
  };
  using offload::align_up;  // O_DIRECT slots and buffers (offload/nvme_swapper.hpp)
  constexpr std::size_t kAlign = offload::kDirectAlignment;
  // offload_param = nvme: each gathered buffer carries an aligned tail the prefetch reads the
  // shard into (engine.cpp gather_extra).
  const std::size_t gather_extra =
      z.offload_param.device == "nvme" ? align_up(max_sharded * ws) + kAlign : 0;
  if (z.offload_param.device == "nvme") {
    // The shards in the param swap file (a 4 KiB-aligned slot per sharded unit), one pinned
    // window of the largest shard in memory.
    for (std::size_t u = 0; u < nu; ++u) {
      if (!sharded[u]) continue;
      out.nvme[static_cast<std::size_t>(MemCategory::kParams16)] +=
          align_up(lay.units[u].shard * ws);
    }
    add(MemCategory::kParams16, whole * ws);
    pinned(MemCategory::kOffloadStaging, align_up(max_sharded * ws) + kAlign);
  } else {
    add(MemCategory::kParams16, (whole + shard_params) * ws);
    if (z.offload_param.device == "cpu") {  // the stage-3 shards in pinned host memory
      out.pinned[static_cast<std::size_t>(MemCategory::kParams16)] += shard_params * ws;
    }
  }
  const std::size_t opt = stage >= 1 ? lay.total_shard : lay.total_padded;
  // Optimizer offload (engine.cpp offloaded_step): cpu — master (also for fp32) and state in
  // pinned memory; nvme — both in the swap file, one 4 KiB-aligned slot per chunk (master, then
  // each state, each part padded), streamed through buffer_count staging slots. Either way the
  // persistent gradient (and 16-bit parameter) staging buffers of one chunk each.
  const OffloadConfig& oo = z.offload_optimizer;
  const bool offload = oo.enabled();
  const bool nvme = oo.device == "nvme";
  const std::size_t sd = dtype_size(op.state_dtype());
  const auto ns = static_cast<std::size_t>(op.num_states());
  if (!nvme) {
    if (offload) {
      pinned(MemCategory::kMasterParams, opt * 4);
      pinned(MemCategory::kOptimizerState, ns * opt * sd);
    } else {
      if (w != DType::kF32) add(MemCategory::kMasterParams, opt * 4);
      add(MemCategory::kOptimizerState, ns * opt * sd);
    }
  }
  if (offload) {
    std::size_t max_range = 0;
    for (const auto& ul : lay.units)
      max_range = std::max(max_range, stage >= 1 ? ul.shard : ul.padded);
    const auto chunk =
        std::max<std::size_t>(1, std::min(static_cast<std::size_t>(oo.buffer_size), max_range));
    const auto count = static_cast<std::size_t>(oo.buffer_count);
    // Stages 2-3 keep the gradient shards on the host: no gradient staging then.
    pinned(MemCategory::kOffloadStaging,
           count * chunk * ((stage >= 2 ? 0 : rs) + (w != DType::kF32 ? ws : 0)));
    if (nvme) {
      std::size_t max_slot = 0;
      for (const auto& ul : lay.units) {
        const std::size_t range = stage >= 1 ? ul.shard : ul.padded;
        for (std::size_t a = 0; a < range; a += chunk) {
          const std::size_t n = std::min(chunk, range - a);
          out.nvme[static_cast<std::size_t>(MemCategory::kMasterParams)] += align_up(n * 4);
          out.nvme[static_cast<std::size_t>(MemCategory::kOptimizerState)] += ns * align_up(n * sd);
          max_slot = std::max(max_slot, align_up(n * 4) + ns * align_up(n * sd));
        }
      }
      // The swapper's staging slots, each with room to align its start.
      pinned(MemCategory::kOffloadStaging, count * (max_slot + kAlign));
    }
  }
  if (offload && stage >= 2) {  // ZeRO-Offload: the gradient partition lives on the host
    pinned(MemCategory::kGradients, lay.total_shard * rs);
  } else {
    add(MemCategory::kGradients, (stage >= 2 ? lay.total_shard : lay.total_padded) * rs);
  }

  // Pools (engine.cpp): one gradient buffer per unit the trainer holds open; in stages 2-3
  // with overlap_comm one reduce-scatter stays in flight while the next unit's gradient is
  // written: its buffer is the gradient buffer itself (W == R) or a staging copy (W != R).
  const bool overlap = z.overlap_comm;
  auto grad_buffers = static_cast<std::size_t>(std::max(1, in.grads_held));
  std::size_t staging = 0;
  if (stage >= 2) {
    if (w == r) {
      grad_buffers += overlap ? 1 : 0;  // the reduce-scatter in flight holds its buffer
    } else {
      staging = overlap ? 2 : 1;
    }
  }
  out.in_flight_grad_bytes = grad_buffers * lay.max_padded * ws;
  out.staging_bytes = staging * lay.max_padded * rs;
  add(MemCategory::kGradients, out.in_flight_grad_bytes);
  add(MemCategory::kCommBuffers, out.staging_bytes);

  // Stage 3: replay gather / prefetch / release over the gather order to count the gathered
  // buffers the pool ends up with (it never shrinks).
  if (stage >= 3) {
    std::vector<UnitId> order = in.gather_order;
    if (order.empty()) {
      for (std::size_t u = 0; u < nu; ++u) order.push_back(static_cast<UnitId>(u));
      for (std::size_t u = nu; u-- > 0;) order.push_back(static_cast<UnitId>(u));
    }
    std::vector<bool> gathered(nu, false);
    std::size_t live = 0, in_use = 0, pool = 0;
    auto take = [&](UnitId u) {
      gathered[static_cast<std::size_t>(u)] = true;
      live += lay.units[static_cast<std::size_t>(u)].padded;
      ++in_use;
      pool = std::max(pool, in_use);
    };
    const auto bucket = static_cast<std::size_t>(z.stage3_prefetch_bucket_size);
    const auto max_live = static_cast<std::size_t>(z.stage3_max_live_parameters);
    // Micro-step 1 records the order without prefetching; later micro-steps prefetch.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t pos = 0; pos < order.size(); ++pos) {
        const auto u = static_cast<std::size_t>(order[pos]);
        if (sharded[u] && !gathered[u]) take(order[pos]);
        if (pass == 1) {
          std::size_t ahead = 0;
          for (std::size_t j = pos + 1; j < order.size() && ahead < bucket; ++j) {
            const auto nx = static_cast<std::size_t>(order[j]);
            if (!sharded[nx]) continue;
            ahead += lay.units[nx].padded;
            if (gathered[nx]) continue;
            if (live + lay.units[nx].padded > max_live) break;
            take(order[j]);
          }
        }
        if (sharded[u]) {  // released after use
          gathered[u] = false;
          live -= lay.units[u].padded;
          --in_use;
        }
      }
      // step(): unused prefetches are dropped.
      std::fill(gathered.begin(), gathered.end(), false);
      live = 0;
      in_use = 0;
    }
    out.gathered_param_bytes = pool * (lay.max_padded * ws + gather_extra);
    add(MemCategory::kParams16, out.gathered_param_bytes);
  }
  return out;
}

}  // namespace zero
