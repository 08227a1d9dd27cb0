#include "zero/engine/activation_checkpointing.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include "zero/core/error.hpp"

namespace zero {

CheckpointSpec CheckpointSpec::from_config(const ActivationCheckpointingConfig& c) {
  CheckpointSpec s;
  s.cpu_checkpointing = c.cpu_checkpointing;
  if (c.number_checkpoints > 0) {
    s.policy = CheckpointPolicy::kExplicit;
    s.boundaries.clear();
    // Filled in by segment_starts() once the layer count is known: -N marks "N segments".
    s.boundaries.push_back(-static_cast<int>(c.number_checkpoints));
  }
  return s;
}

CheckpointSpec CheckpointSpec::resolve(const std::string& text,
                                       const ActivationCheckpointingConfig& c) {
  if (text == "config") return from_config(c);
  CheckpointSpec s = parse(text);
  s.cpu_checkpointing = c.cpu_checkpointing;
  return s;
}

CheckpointSpec CheckpointSpec::parse(const std::string& text) {
  CheckpointSpec s;
  auto bad = [&](const std::string& why) {
    ZERO_THROW(kInvalidArgument, "activation checkpointing policy '", text, "': ", why,
               " (expected none, every:K, sqrt or list:L1,L2,...)");
  };
  if (text == "none" || text.empty()) return s;
  if (text == "sqrt") {
    s.policy = CheckpointPolicy::kSqrtN;
    return s;
  }
  if (text.rfind("every:", 0) == 0) {
    s.policy = CheckpointPolicy::kEveryK;
    try {
      s.every_k = std::stoi(text.substr(6));
    } catch (...) {
      bad("K is not a number");
    }
    if (s.every_k < 1) bad("K must be >= 1");
    return s;
  }
  if (text.rfind("list:", 0) == 0) {
    s.policy = CheckpointPolicy::kExplicit;
    std::stringstream in(text.substr(5));
    std::string item;
    while (std::getline(in, item, ',')) {
      try {
        s.boundaries.push_back(std::stoi(item));
      } catch (...) {
        bad("'" + item + "' is not a layer number");
      }
    }
    if (s.boundaries.empty()) bad("the list is empty");
    return s;
  }
  bad("unknown policy");
  return s;
}

std::string CheckpointSpec::to_string() const {
  switch (policy) {
    case CheckpointPolicy::kNone: return "none";
    case CheckpointPolicy::kSqrtN: return "sqrt";
    case CheckpointPolicy::kEveryK: return "every:" + std::to_string(every_k);
    case CheckpointPolicy::kExplicit: {
      // from_config's marker: -N for N segments (number_checkpoints), resolved per layer count.
      if (boundaries.size() == 1 && boundaries[0] < 0) {
        return "number_checkpoints:" + std::to_string(-boundaries[0]);
      }
      std::string s = "list:";
      for (std::size_t i = 0; i < boundaries.size(); ++i) {
        s += (i ? "," : "") + std::to_string(boundaries[i]);
      }
      return s;
    }
  }
  return "?";
}

std::vector<int> segment_starts(int n, const CheckpointSpec& spec) {
  ZERO_CHECK(n >= 1, kInvalidArgument, "activation checkpointing needs >= 1 layer, got ", n);
  std::vector<int> out;
  switch (spec.policy) {
    case CheckpointPolicy::kNone:
      out.push_back(0);  // one segment: plain training keeps every layer's activations
      break;
    case CheckpointPolicy::kEveryK:
      ZERO_CHECK(spec.every_k >= 1, kInvalidArgument, "every_k must be >= 1");
      for (int l = 0; l < n; l += spec.every_k) out.push_back(l);
      break;
    case CheckpointPolicy::kSqrtN: {
      // ceil(sqrt(n)) segments of (nearly) equal length: sqrt(n) kept inputs, and at most
      // ceil(n / segments) layers' activations live during the backward of one segment.
      const int segs = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
      for (int i = 0; i < segs; ++i) {
        const int l = static_cast<int>(static_cast<long>(i) * n / segs);
        if (out.empty() || out.back() != l) out.push_back(l);
      }
      break;
    }
    case CheckpointPolicy::kExplicit:
      if (spec.boundaries.size() == 1 && spec.boundaries[0] < 0) {
        const int segs = std::min(n, -spec.boundaries[0]);  // number_checkpoints segments
        for (int i = 0; i < segs; ++i)
          out.push_back(static_cast<int>(static_cast<long>(i) * n / segs));
        break;
      }
      out.push_back(0);
      for (int b : spec.boundaries) {
        ZERO_CHECK(b >= 0 && b < n, kInvalidArgument, "checkpoint boundary layer ", b,
                   " is out of range [0, ", n, ")");
        ZERO_CHECK(b >= out.back(), kInvalidArgument,
                   "checkpoint boundary layers must ascend; got ", b, " after ", out.back());
        if (b != out.back()) out.push_back(b);
      }
      break;
  }
  return out;
}

Checkpointer::Checkpointer(int num_layers, std::size_t act_elems, CheckpointSpec spec,
                           MemoryTracker& tracker, DeviceOps* device)
    : num_layers_(num_layers),
      act_elems_(act_elems),
      spec_(std::move(spec)),
      tracker_(tracker),
      starts_(segment_starts(num_layers, spec_)),
      inputs_(static_cast<std::size_t>(num_layers)),
      device_(device) {
  ZERO_CHECK(act_elems > 0, kInvalidArgument, "activation size must be > 0");
}

bool Checkpointer::staged() const {
  return spec_.cpu_checkpointing && device_ != nullptr && !device_->host_accessible();
}

// Activation memory where the layers compute.
Buffer Checkpointer::alloc(std::size_t bytes) {
  return device_ != nullptr ? device_->alloc(tracker_, MemCategory::kActivations, bytes)
                            : Buffer::host(tracker_, MemCategory::kActivations, bytes);
}

// One activation, on the compute lane.
void Checkpointer::copy(void* dst, const void* src) {
  if (device_ != nullptr) {
    device_->copy(dst, src, act_elems_ * sizeof(float));
  } else {
    std::memcpy(dst, src, act_elems_ * sizeof(float));
  }
}

Buffer& Checkpointer::slot(int layer) {
  Buffer& b = inputs_[static_cast<std::size_t>(layer)];
  if (b.empty()) {
    const std::size_t bytes = act_elems_ * sizeof(float);
    b = spec_.cpu_checkpointing ? Buffer::pinned(tracker_, MemCategory::kActivations, bytes)
                                : alloc(bytes);
  }
  return b;
}

// Runs layers [first, last) forward from `in`; the last output goes to `out` (or a scratch
// buffer when out is null). Between layers the activation ping-pongs through two scratch
// buffers: each layer keeps its own copy of what its backward needs.
void Checkpointer::run_forward(CheckpointedLayers& layers, int first, int last, const float* in,
                               float* out, bool drop) {
  if (scratch_a_.empty()) {
    scratch_a_ = alloc(act_elems_ * sizeof(float));
    scratch_b_ = alloc(act_elems_ * sizeof(float));
  }
  const float* cur = in;
  for (int l = first; l < last; ++l) {
    float* dst = (l + 1 == last && out != nullptr)
                     ? out
                     : ((l - first) % 2 == 0 ? scratch_a_.as<float>() : scratch_b_.as<float>());
    layers.forward(l, cur, dst);
    if (drop) layers.drop(l);
    cur = dst;
  }
}

void Checkpointer::forward(CheckpointedLayers& layers, const float* in, float* out) {
  if (spec_.policy == CheckpointPolicy::kNone) {
    run_forward(layers, 0, num_layers_, in, out, /*drop=*/false);
  } else {
    // Keep each segment's input, run the segment, drop what its layers kept.
    const float* cur = in;
    const std::size_t bytes = act_elems_ * sizeof(float);
    if (staged() && seg_in_.empty()) seg_in_ = alloc(bytes);
    for (std::size_t s = 0; s < starts_.size(); ++s) {
      const int first = starts_[s];
      const int last = s + 1 < starts_.size() ? starts_[s + 1] : num_layers_;
      float* seg_out = last == num_layers_ ? out : nullptr;
      const float* seg_in = slot(first).as<float>();
      if (staged()) {
        // The input stays on the device for the segment; its copy goes to pinned memory on the
        // copy lane while the segment computes. The next segment's input waits for that copy.
        device_->join(DeviceOps::Lane::kCompute, DeviceOps::Lane::kCopy);
        copy(seg_in_.data(), cur);
        device_->join(DeviceOps::Lane::kCopy, DeviceOps::Lane::kCompute);
        device_->copy(slot(first).data(), seg_in_.data(), bytes, DeviceOps::Lane::kCopy);
        seg_in = seg_in_.as<float>();
      } else {
        copy(slot(first).data(), cur);
      }
      run_forward(layers, first, last, seg_in, seg_out, /*drop=*/true);
      cur = last == num_layers_
                ? out
                : ((last - first - 1) % 2 == 0 ? scratch_a_.as<float>() : scratch_b_.as<float>());
    }
  }
  forward_done_ = true;
}

void Checkpointer::backward(CheckpointedLayers& layers, const float* grad_out, float* grad_in) {
  ZERO_CHECK(forward_done_, kInvalidArgument, "Checkpointer::backward without a forward");
  forward_done_ = false;
  const bool plain = spec_.policy == CheckpointPolicy::kNone;
  if (grad_a_.empty()) {
    grad_a_ = alloc(act_elems_ * sizeof(float));
    grad_b_ = alloc(act_elems_ * sizeof(float));
  }
  float* g = grad_a_.as<float>();
  float* gin = grad_b_.as<float>();
  copy(g, grad_out);
  const std::vector<int> whole{0};
  const std::vector<int>& segs = plain ? whole : starts_;
  for (int s = static_cast<int>(segs.size()) - 1; s >= 0; --s) {
    const int first = segs[static_cast<std::size_t>(s)];
    const int last =
        s + 1 < static_cast<int>(segs.size()) ? segs[static_cast<std::size_t>(s) + 1] : num_layers_;
    if (!plain) {
      // Recompute the segment from its kept input: the same layer code on the same input, so
      // the layers keep the same activations as in a plain forward.
      const float* seg_in = slot(first).as<float>();
      if (staged()) {  // back from pinned memory on the copy lane
        device_->join(DeviceOps::Lane::kCopy, DeviceOps::Lane::kCompute);
        device_->copy(seg_in_.data(), slot(first).data(), act_elems_ * sizeof(float),
                      DeviceOps::Lane::kCopy);
        device_->join(DeviceOps::Lane::kCompute, DeviceOps::Lane::kCopy);
        device_->wait(device_->record(DeviceOps::Lane::kCopy));  // before the slot is freed
        seg_in = seg_in_.as<float>();
      }
      run_forward(layers, first, last, seg_in, nullptr, /*drop=*/false);
      if (device_ != nullptr && !device_->host_accessible() && !staged()) {
        // The recompute reads the kept input on the device: free it after it has run.
        device_->wait(device_->record(DeviceOps::Lane::kCompute));
      }
      inputs_[static_cast<std::size_t>(first)].reset();
    }
    for (int l = last - 1; l >= first; --l) {
      layers.backward(l, g, gin);
      layers.drop(l);
      std::swap(g, gin);
    }
  }
  if (grad_in != nullptr) copy(grad_in, g);
}

}  // namespace zero
