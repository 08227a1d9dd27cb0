// gpt/gpt_cuda.cpp — the GPT decoder's forward and backward on a CUDA device (see gpt_cuda.hpp).
// The structure mirrors gpt_model.cpp's run(), block_forward() and block_backward() line by
// line; the matmuls are cuBLAS SGEMMs, the rest the kernels of gpt_cuda_kernels.cu.
#include "gpt/gpt_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "gpt/gpt_block.hpp"
#include "gpt/gpt_cuda_kernels.hpp"
#include "gpt/gpt_gemm.hpp"
#include "kernels/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/device/detail/kernels.hpp"

namespace zero::gpt {
namespace {

using zero::detail::kernels::cuda_check;

constexpr int kBlockParams = 12;
// Every tensor of the workspace starts on a 64-byte boundary. The parameters and gradients are
// always copied into it (even in f32) so that cuBLAS sees the same pointer alignment whatever
// the stage's buffers look like: its kernel choice, and so the bits, may depend on alignment.
constexpr std::size_t kAlignFloats = 16;

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    ZERO_THROW(kCuda, "GptCudaModel: ", what, ": ", cublasGetStatusName(s), ": ",
               cublasGetStatusString(s));
  }
}

// Hands out 64-byte aligned slices of one allocation; with a null base it only measures.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(std::size_t floats) {
    float* p = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += round_up(floats, kAlignFloats);
    return p;
  }
  std::size_t bytes() const { return used_ * sizeof(float); }

 private:
  float* base_;
  std::size_t used_ = 0;
};

struct Shape {
  int B, T, C, H, V, L, seq_rows;
  int hd() const { return C / H; }
  int M() const { return B * T; }
  std::size_t mc() const { return static_cast<std::size_t>(M()) * static_cast<std::size_t>(C); }
  std::size_t bhtt() const {
    return static_cast<std::size_t>(B) * static_cast<std::size_t>(H) * static_cast<std::size_t>(T) *
           static_cast<std::size_t>(T);
  }
};

Shape shape_of(const GptConfig& c, int rows, int seq) {
  return {rows, seq, c.dim, c.heads, c.vocab, c.layers, c.seq};
}

// Floats of the largest unit's parameters, each rounded up to the alignment (as load_params
// lays them out).
std::size_t max_unit_floats(const GptConfig& cfg) {
  const std::size_t C = static_cast<std::size_t>(cfg.dim);
  auto a = [](std::size_t n) { return round_up(n, kAlignFloats); };
  const std::size_t embedding =
      a(static_cast<std::size_t>(cfg.vocab) * C) + a(static_cast<std::size_t>(cfg.seq) * C);
  const std::size_t block = a(C) * 2 + a(3 * C * C) + a(3 * C) + a(C * C) + a(C) + a(C) * 2 +
                            a(4 * C * C) + a(4 * C) + a(C * 4 * C) + a(C);
  return std::max({embedding, block, 2 * a(C)});
}

// The persistent workspace (kOther) for one batch shape.
struct Scratch {
  float *params, *grads;        // f32 copies of one unit's parameters / its f32 gradients
  float *qkv, *vacc, *tmp;      // forward: QKV projection (M, 3C), attention heads, branch out
  float *dx_a, *dx_b;           // the residual stream's gradient (ping-pong)
  float *dmid, *d4, *dc, *dq3;  // block backward: (M, C), (M, 4C), (M, C), (M, 3C)
  float *dqkvr, *datt, *dvacc;  // attention backward: dq dk dv (B,H,T,hd), (B,H,T,T), (B,H,T,hd)
  float* row_loss;              // (M)

  std::size_t layout(float* base, std::size_t max_unit, const Shape& s) {
    Carver c(base);
    const std::size_t mc = s.mc();
    params = c.take(max_unit);
    grads = c.take(max_unit);
    qkv = c.take(3 * mc);
    vacc = c.take(mc);
    tmp = c.take(mc);
    dx_a = c.take(mc);
    dx_b = c.take(mc);
    dmid = c.take(mc);
    d4 = c.take(4 * mc);
    dc = c.take(mc);
    dq3 = c.take(3 * mc);
    dqkvr = c.take(3 * mc);
    datt = c.take(s.bhtt());
    dvacc = c.take(mc);
    row_loss = c.take(static_cast<std::size_t>(s.M()));
    return c.bytes();
  }
};

// One block's saved activations (gpt_model.cpp BlockActs; qkvr holds q, k, v head-major).
struct BlockActs {
  float *ln1_mean, *ln1_rstd, *h1, *qkvr, *att, *y, *x_mid, *ln2_mean, *ln2_rstd, *h2, *u, *g;
};

// What one block keeps from forward for backward (kActivations): a copy of its input (as the
// CPU model keeps one) and its BlockActs. A slot of the model's pool.
struct LayerActs {
  float* input;
  BlockActs a;

  std::size_t layout(float* base, const Shape& s) {
    Carver c(base);
    const std::size_t M = static_cast<std::size_t>(s.M()), mc = s.mc();
    input = c.take(mc);
    a.ln1_mean = c.take(M);
    a.ln1_rstd = c.take(M);
    a.h1 = c.take(mc);
    a.qkvr = c.take(3 * mc);
    a.att = c.take(s.bhtt());
    a.y = c.take(mc);
    a.x_mid = c.take(mc);
    a.ln2_mean = c.take(M);
    a.ln2_rstd = c.take(M);
    a.h2 = c.take(mc);
    a.u = c.take(4 * mc);
    a.g = c.take(4 * mc);
    return c.bytes();
  }
};

// The activations outside the blocks (kActivations): the embedding's output (the first block's
// input), the last block's output, the final LayerNorm and the logits.
struct Acts {
  float *x0, *x_last, *lnf_mean, *lnf_rstd, *xf, *logits;

  std::size_t layout(float* base, const Shape& s) {
    Carver c(base);
    const std::size_t M = static_cast<std::size_t>(s.M()), mc = s.mc();
    x0 = c.take(mc);
    x_last = c.take(mc);
    lnf_mean = c.take(M);
    lnf_rstd = c.take(M);
    xf = c.take(mc);
    logits = c.take(M * static_cast<std::size_t>(s.V));
    return c.bytes();
  }
};

using BlockParams = BlockTensors;

// ---------------------------------------------------------------------------------------------
// The matmuls: cuBLAS SGEMMs with the arguments of gpt_gemm.hpp (the column-major mapping of each
// row-major product, derived and checked on the CPU there).

struct Gpu {
  cublasHandle_t blas;
  void* stream;
};

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// c = op(a) op(b) with the arguments of gpt_gemm.hpp (each derived and checked on the CPU there).
void run_gemm(const Gpu& g, const gemm::Gemm& m, const float* a, const float* b, float* c,
              const char* what) {
  const cublasOperation_t ta = m.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = m.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (m.count == 1) {
    cublas_check(
        cublasSgemm(g.blas, ta, tb, m.m, m.n, m.k, &kOne, a, m.lda, b, m.ldb, &kZero, c, m.ldc),
        what);
  } else {
    cublas_check(
        cublasSgemmStridedBatched(g.blas, ta, tb, m.m, m.n, m.k, &kOne, a, m.lda, m.stride_a, b,
                                  m.ldb, m.stride_b, &kZero, c, m.ldc, m.stride_c, m.count),
        what);
  }
}

// out (M x OC) = inp (M x IC) W^T (+ bias), W (OC x IC).
void linear_forward(const Gpu& g, float* out, const float* inp, const float* w, const float* bias,
                    int M, int OC, int IC) {
  run_gemm(g, gemm::linear_forward(M, OC, IC), w, inp, out, "cublasSgemm (linear forward)");
  if (bias != nullptr) kernels::bias_add(out, bias, M, OC, g.stream);
}

// dinp (M x IC) = dout W [skipped when dinp is null]; dW (OC x IC) = dout^T inp, overwritten
// [skipped when dw is null]; db (OC) = column sums of dout [skipped when db is null].
void linear_backward(const Gpu& g, float* dinp, float* dw, float* db, const float* dout,
                     const float* inp, const float* w, int M, int OC, int IC) {
  if (dw != nullptr) {
    run_gemm(g, gemm::linear_weight_grad(M, OC, IC), inp, dout, dw,
             "cublasSgemm (linear backward, weight)");
  }
  if (db != nullptr) kernels::column_sum(db, dout, M, OC, g.stream);
  if (dinp != nullptr) {
    run_gemm(g, gemm::linear_input_grad(M, OC, IC), w, dout, dinp,
             "cublasSgemm (linear backward, input)");
  }
}

// Causal self-attention (gpt_model.cpp attention_forward). qkv (M, 3C) -> q, k, v head-major
// in qkvr; att (B, H, T, T) the probabilities (kept for backward); y (M, C) the output.
void attention_forward(const Gpu& g, float* y, float* qkvr, float* att, float* vacc,
                       const float* qkv, const Shape& s) {
  const int T = s.T, hd = s.hd(), BH = s.B * s.H;
  float* q = qkvr;
  float* k = qkvr + s.mc();
  float* v = qkvr + 2 * s.mc();
  kernels::qkv_permute(q, k, v, qkv, s.B, T, s.H, hd, g.stream);
  // scores = q k^T, per head
  run_gemm(g, gemm::scores(BH, T, hd), k, q, att, "cublasSgemmStridedBatched (q k^T)");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  kernels::softmax_forward(att, static_cast<std::size_t>(BH) * T, T, scale, g.stream);
  // vacc = att v, per head
  run_gemm(g, gemm::att_v(BH, T, hd), v, att, vacc, "cublasSgemmStridedBatched (att v)");
  kernels::heads_to_rows(y, vacc, s.B, T, s.H, hd, g.stream);
}

// dqkv (M, 3C, overwritten) from dy (M, C) and the saved q, k, v and probabilities
// (gpt_model.cpp attention_backward). datt: (B,H,T,T) scratch; dqkvr, dvacc: head-major scratch.
void attention_backward(const Gpu& g, float* dqkv, float* dqkvr, float* datt, float* dvacc,
                        const float* dy, const float* qkvr, const float* att, const Shape& s) {
  const int T = s.T, hd = s.hd(), BH = s.B * s.H;
  const float* q = qkvr;
  const float* k = qkvr + s.mc();
  const float* v = qkvr + 2 * s.mc();
  float* dq = dqkvr;
  float* dk = dqkvr + s.mc();
  float* dv = dqkvr + 2 * s.mc();
  kernels::rows_to_heads(dvacc, dy, s.B, T, s.H, hd, g.stream);
  // datt = dvacc v^T and dv = att^T dvacc, per head
  run_gemm(g, gemm::datt(BH, T, hd), v, dvacc, datt, "cublasSgemmStridedBatched (dvacc v^T)");
  run_gemm(g, gemm::dv(BH, T, hd), dvacc, att, dv, "cublasSgemmStridedBatched (att^T dvacc)");
  // In place: datt becomes dpre, the gradient of the unscaled scores q.k (the scale folded in).
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  kernels::softmax_backward(datt, datt, att, static_cast<std::size_t>(BH) * T, T, scale, g.stream);
  const float* dpre = datt;
  // dq = dpre k and dk = dpre^T q, per head
  run_gemm(g, gemm::dq(BH, T, hd), k, dpre, dq, "cublasSgemmStridedBatched (dpre k)");
  run_gemm(g, gemm::dk(BH, T, hd), q, dpre, dk, "cublasSgemmStridedBatched (dpre^T q)");
  kernels::qkv_permute_backward(dqkv, dq, dk, dv, s.B, T, s.H, hd, g.stream);
}

// gpt_model.cpp block_forward: x_mid = x_in + proj(attn(LN1(x_in))),
// x_out = x_mid + fcproj(GELU(fc(LN2(x_mid)))).
void block_forward(const Gpu& g, const BlockParams& p, const float* x_in, float* x_out,
                   const BlockActs& a, const Scratch& w, const Shape& s) {
  const int M = s.M(), C = s.C;
  const std::size_t mc = s.mc();
  kernels::layernorm_forward(a.h1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, M, C, g.stream);
  linear_forward(g, w.qkv, a.h1, p.qkv_w, p.qkv_b, M, 3 * C, C);
  attention_forward(g, a.y, a.qkvr, a.att, w.vacc, w.qkv, s);
  linear_forward(g, w.tmp, a.y, p.proj_w, p.proj_b, M, C, C);
  kernels::add(a.x_mid, x_in, w.tmp, mc, g.stream);
  kernels::layernorm_forward(a.h2, a.ln2_mean, a.ln2_rstd, a.x_mid, p.ln2_w, p.ln2_b, M, C,
                             g.stream);
  linear_forward(g, a.u, a.h2, p.fc_w, p.fc_b, M, 4 * C, C);
  kernels::gelu_forward(a.g, a.u, 4 * mc, g.stream);
  linear_forward(g, w.tmp, a.g, p.fcproj_w, p.fcproj_b, M, C, 4 * C);
  kernels::add(x_out, a.x_mid, w.tmp, mc, g.stream);
}

// gpt_model.cpp block_backward: dx_in from dx_out; the 12 gradients into gr[] (llm.c order).
void block_backward(const Gpu& g, const BlockParams& p, const BlockActs& a, const float* x_in,
                    const float* dx_out, float* dx_in, const std::vector<float*>& gr,
                    const Scratch& w, const Shape& s) {
  const int M = s.M(), C = s.C;
  // MLP branch.
  linear_backward(g, w.d4, gr[10], gr[11], dx_out, a.g, p.fcproj_w, M, C, 4 * C);
  kernels::gelu_backward(w.d4, a.u, 4 * s.mc(), g.stream);
  linear_backward(g, w.dc, gr[8], gr[9], w.d4, a.h2, p.fc_w, M, 4 * C, C);
  kernels::layernorm_backward(w.dmid, gr[6], gr[7], dx_out, w.dc, a.x_mid, a.ln2_mean, a.ln2_rstd,
                              p.ln2_w, M, C, g.stream);
  // Attention branch.
  linear_backward(g, w.dc, gr[4], gr[5], w.dmid, a.y, p.proj_w, M, C, C);
  attention_backward(g, w.dq3, w.dqkvr, w.datt, w.dvacc, w.dc, a.qkvr, a.att, s);
  linear_backward(g, w.dc, gr[2], gr[3], w.dq3, a.h1, p.qkv_w, M, 3 * C, C);
  kernels::layernorm_backward(dx_in, gr[0], gr[1], w.dmid, w.dc, x_in, a.ln1_mean, a.ln1_rstd,
                              p.ln1_w, M, C, g.stream);
}

// A unit's gradients computed in f32 in the workspace, then cast into the engine's buffers
// (working dtype) at commit(). Every gradient is written whole; the engine's zeroing is not
// relied on (the tied wte is written by the head and added to by the lookup, see run()).
class GradSink {
 public:
  GradSink(Engine& e, UnitId u, int count, float* scratch) {
    std::size_t off = 0;
    for (int i = 0; i < count; ++i) {
      views_.push_back(e.grad(u, i));
      ptrs_.push_back(scratch + off);
      off += round_up(views_.back().count, kAlignFloats);
    }
  }
  const std::vector<float*>& ptrs() const { return ptrs_; }
  float* operator[](int i) const { return ptrs_[static_cast<std::size_t>(i)]; }
  void commit(UnitId u, void* stream, const GradTap& tap) const {
    for (std::size_t i = 0; i < views_.size(); ++i) {
      const View& v = views_[i];
      detail::kernels::cast(ptrs_[i], DType::kF32, v.data, v.dtype, v.count, stream);
    }
    if (tap) {
      cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                 "GptCudaModel: cudaStreamSynchronize (before the gradient tap)");
      for (std::size_t i = 0; i < views_.size(); ++i) tap(u, static_cast<int>(i), views_[i]);
    }
  }

 private:
  std::vector<View> views_;
  std::vector<float*> ptrs_;
};

}  // namespace

// ---- the model: state

struct GptCudaModel::Impl {
  cublasHandle_t blas = nullptr;
  std::shared_ptr<DeviceOps> dev;  // the Checkpointer's device (the model's stream)
  Buffer work;                     // Scratch (device, kOther)
  Buffer acts;                     // Acts (device, kActivations)
  // LayerActs slots (device, kActivations): taken by a block's forward, given back by its drop.
  // As many as were ever live at once (every block without checkpointing; the longest segment
  // with it), kept for reuse: cudaFree would synchronise the device.
  std::vector<Buffer> slots;
  std::vector<std::size_t> free_slots;
  std::size_t slot_bytes = 0;
  std::unique_ptr<Checkpointer> ck;  // the blocks' checkpointer, for ck_elems and the policy
  std::size_t ck_elems = 0;
  std::string ck_spec;
  bool ck_cpu = false;
  Buffer tok_host;   // token staging (pinned, kOther): see stage_tokens()
  Buffer tok_dev;    // the same on the device (kOther)
  Buffer loss_host;  // per-row losses read back (pinned, kOther)

  ~Impl() {
    if (blas != nullptr) cublasDestroy(blas);
  }
};

GptCudaModel::GptCudaModel(const GptConfig& config, MemoryTracker& tracker, int device,
                           void* stream)
    : layout_(config, tracker),
      tracker_(&tracker),
      device_(device),
      stream_(stream),
      impl_(std::make_unique<Impl>()) {
  ZERO_CHECK(device >= 0, kInvalidArgument, "GptCudaModel: device ", device,
             " is not a CUDA ordinal");
  ZERO_CHECK(config.frozen_units == 0, kInvalidArgument,
             "GptCudaModel: GptConfig.frozen_units = ", config.frozen_units,
             ": the CUDA model trains every unit (--freeze runs on the CPU model)");
  cuda_check(cudaSetDevice(device), "GptCudaModel: cudaSetDevice");
  cublas_check(cublasCreate(&impl_->blas), "cublasCreate");
  cublas_check(cublasSetStream(impl_->blas, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  // CUBLAS_DEFAULT_MATH: full f32 SGEMMs; TF32 tensor-op math only with CUBLAS_TF32_TENSOR_OP_MATH,
  // which would round the inputs to 10-bit mantissas and break the agreement with the CPU model.
  cublas_check(cublasSetMathMode(impl_->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

GptCudaModel::~GptCudaModel() = default;

void GptCudaModel::set_checkpointing(const CheckpointSpec& spec) {
  segment_starts(config().layers, spec);  // validates the policy against the layer count
  ckpt_ = spec;
}

std::size_t GptCudaModel::activation_bytes(int rows, int seq) const {
  const Shape s = shape_of(config(), rows, seq);
  Acts a;
  LayerActs la;
  // Live block slots: every block without checkpointing; with it, the longest segment
  // (recomputed in backward) — forward drops each block's slot as soon as it has run.
  const std::vector<int> starts = segment_starts(s.L, ckpt_);
  int live = s.L;
  if (ckpt_.policy != CheckpointPolicy::kNone) {
    live = 0;
    for (std::size_t i = 0; i < starts.size(); ++i) {
      const int end = i + 1 < starts.size() ? starts[i + 1] : s.L;
      live = std::max(live, end - starts[i]);
    }
  }
  // The Checkpointer: two activation and two gradient buffers between blocks, the kept segment
  // inputs (in pinned memory with cpu_checkpointing, then one more device buffer carrying the
  // segment's input).
  const std::size_t act = s.mc() * sizeof(float);
  std::size_t ck = 4 * act;
  if (ckpt_.policy != CheckpointPolicy::kNone) {
    ck += (ckpt_.cpu_checkpointing ? 1 : starts.size()) * act;
  }
  return a.layout(nullptr, s) + static_cast<std::size_t>(live) * la.layout(nullptr, s) + ck;
}

std::size_t GptCudaModel::workspace_bytes(int rows, int seq) const {
  Scratch w;
  const std::size_t tokens =
      (5 * static_cast<std::size_t>(rows) * static_cast<std::size_t>(seq) + 1) *
      sizeof(std::int32_t);
  return w.layout(nullptr, max_unit_floats(config()), shape_of(config(), rows, seq)) + tokens;
}

double GptCudaModel::forward_backward(Engine& e, const TokenBatch& batch, const GradTap& tap) {
  return run(e, batch, /*backward=*/true, tap);
}

double GptCudaModel::forward_loss(Engine& e, const TokenBatch& batch) {
  return run(e, batch, /*backward=*/false, {});
}

// ---- the model: a micro-step (gpt_model.cpp run(), without checkpointing)

double GptCudaModel::run(Engine& e, const TokenBatch& batch, bool backward, const GradTap& tap) {
  const GptConfig& cfg = config();
  ZERO_CHECK(e.num_units() > final_unit() && e.unit(final_unit()).name == "ln_f", kInvalidArgument,
             "GptCudaModel: declare() the units first");
  check_batch(cfg, batch, "GptCudaModel");
  cuda_check(cudaSetDevice(device_), "GptCudaModel: cudaSetDevice");
  const Shape s = shape_of(cfg, batch.rows, batch.seq);
  const int B = s.B, T = s.T, C = s.C, V = s.V, L = s.L, M = s.M();
  const std::size_t Mz = static_cast<std::size_t>(M);
  const Gpu g{impl_->blas, stream_};
  const auto stream = static_cast<cudaStream_t>(stream_);
  const Device dev = Device::cuda(device_);

  // ---- buffers for this shape (grown, never shrunk; the previous micro-step synchronised the
  // stream before returning, so nothing in flight uses what a regrowth frees)
  auto ensure = [&](Buffer& b, std::size_t bytes, MemCategory c, bool pinned) {
    if (b.size() >= bytes) return;
    b.reset();
    b = pinned ? Buffer::pinned(*tracker_, c, bytes) : Buffer::device(*tracker_, c, bytes, dev);
  };
  Scratch w;
  const std::size_t max_unit = max_unit_floats(cfg);
  ensure(impl_->work, w.layout(nullptr, max_unit, s), MemCategory::kOther, false);
  w.layout(impl_->work.as<float>(), max_unit, s);
  Acts a;
  ensure(impl_->acts, a.layout(nullptr, s), MemCategory::kActivations, false);
  a.layout(impl_->acts.as<float>(), s);
  {
    LayerActs la;
    const std::size_t bytes = la.layout(nullptr, s);
    if (bytes > impl_->slot_bytes) {  // a larger shape: the pool starts again at this size
      impl_->slots.clear();
      impl_->free_slots.clear();
      impl_->slot_bytes = bytes;
    }
  }
  if (impl_->dev == nullptr) {
    DeviceOpsOptions o;
    o.cuda_stream = stream_;
    impl_->dev = make_device_ops(dev, o);
  }
  const std::size_t tok_ints = 5 * Mz + 1;
  ensure(impl_->tok_host, tok_ints * sizeof(std::int32_t), MemCategory::kOther, true);
  ensure(impl_->tok_dev, tok_ints * sizeof(std::int32_t), MemCategory::kOther, false);
  ensure(impl_->loss_host, Mz * sizeof(float), MemCategory::kOther, true);

  // ---- tokens: inputs, targets, and the lookup's per-token position lists (a counting sort, as
  // the CPU model does), staged in pinned memory and uploaded in one copy. Layout (int32):
  // inputs [0, M), targets [M, 2M), positions [2M, 3M), starts [3M, 4M + 1), tokens [4M+1, 5M+1).
  int distinct = 0;
  {
    std::int32_t* h = impl_->tok_host.as<std::int32_t>();
    std::int32_t* in = h;
    std::int32_t* tgt = h + Mz;
    std::int32_t* pos = h + 2 * Mz;
    std::int32_t* start = h + 3 * Mz;
    std::int32_t* uniq = h + 4 * Mz + 1;
    for (int m = 0; m < M; ++m) {
      in[m] = batch.input(m / T, m % T);
      tgt[m] = batch.target(m / T, m % T);
    }
    std::vector<int> count(static_cast<std::size_t>(V), 0);
    for (int m = 0; m < M; ++m) ++count[static_cast<std::size_t>(in[m])];
    std::vector<int> slot(static_cast<std::size_t>(V), -1);  // token -> index among the distinct
    int at = 0;
    for (int v = 0; v < V; ++v) {
      if (count[static_cast<std::size_t>(v)] == 0) continue;
      slot[static_cast<std::size_t>(v)] = distinct;
      uniq[distinct] = v;
      start[distinct] = at;
      at += count[static_cast<std::size_t>(v)];
      ++distinct;
    }
    start[distinct] = at;
    std::vector<int> fill(start, start + distinct);
    for (int m = 0; m < M; ++m) {
      pos[fill[static_cast<std::size_t>(slot[static_cast<std::size_t>(in[m])])]++] = m;
    }
    cuda_check(cudaMemcpyAsync(impl_->tok_dev.data(), h, tok_ints * sizeof(std::int32_t),
                               cudaMemcpyHostToDevice, stream),
               "GptCudaModel: cudaMemcpyAsync (tokens)");
  }
  const std::int32_t* d_in = impl_->tok_dev.as<std::int32_t>();
  const std::int32_t* d_tgt = d_in + Mz;
  const std::int32_t* d_pos = d_in + 2 * Mz;
  const std::int32_t* d_start = d_in + 3 * Mz;
  const std::int32_t* d_uniq = d_in + 4 * Mz + 1;

  // f32 copies of the first `count` parameters of a gathered unit, in w.params.
  auto load_params = [&](const GatherGuard& guard, int count) {
    std::vector<const float*> p;
    std::size_t off = 0;
    for (int i = 0; i < count; ++i) {
      const View v = guard.param(i);
      ZERO_CHECK(v.device == dev, kInvalidArgument, "GptCudaModel: unit ", guard.unit(),
                 " parameter ", i, " lives on ", v.device.to_string(), ", the model on ",
                 dev.to_string(),
                 ": construct the Engine with EngineOptions::device = ", "Device::cuda(", device_,
                 ") and its cuda_stream");
      detail::kernels::cast(v.data, v.dtype, w.params + off, DType::kF32, v.count, stream_);
      p.push_back(w.params + off);
      off += round_up(v.count, kAlignFloats);
    }
    return p;
  };

  // ---- the blocks as CheckpointedLayers (gpt_model.cpp BlockLayers): forward takes a slot, keeps
  // a copy of its input there and runs the block; backward runs the block's backward from the
  // slot and announces its gradients; drop gives the slot back.
  struct Blocks : CheckpointedLayers {
    GptCudaModel& m;
    Impl& im;
    Engine& e;
    const Gpu& g;
    const Scratch& w;
    const Shape& s;
    const GradTap& tap;
    const std::function<std::vector<const float*>(const GatherGuard&, int)>& load;
    std::vector<std::size_t> held;  // per block: its slot, or SIZE_MAX

    Blocks(GptCudaModel& m, Impl& im, Engine& e, const Gpu& g, const Scratch& w, const Shape& s,
           const GradTap& tap,
           const std::function<std::vector<const float*>(const GatherGuard&, int)>& load)
        : m(m),
          im(im),
          e(e),
          g(g),
          w(w),
          s(s),
          tap(tap),
          load(load),
          held(static_cast<std::size_t>(s.L), SIZE_MAX) {}
    ~Blocks() override {  // a step that threw: its slots go back to the pool
      for (int l = 0; l < static_cast<int>(held.size()); ++l) drop(l);
    }
    LayerActs slot(int l) const {
      LayerActs la;
      la.layout(im.slots[held[static_cast<std::size_t>(l)]].as<float>(), s);
      return la;
    }
    void forward(int l, const float* in, float* out) override {
      std::size_t k;
      if (!im.free_slots.empty()) {
        k = im.free_slots.back();
        im.free_slots.pop_back();
      } else {
        k = im.slots.size();
        im.slots.push_back(Buffer::device(*m.tracker_, MemCategory::kActivations, im.slot_bytes,
                                          Device::cuda(m.device_)));
      }
      held[static_cast<std::size_t>(l)] = k;
      const LayerActs la = slot(l);
      cuda_check(cudaMemcpyAsync(la.input, in, s.mc() * sizeof(float), cudaMemcpyDeviceToDevice,
                                 static_cast<cudaStream_t>(g.stream)),
                 "GptCudaModel: cudaMemcpyAsync (block input)");
      GatherGuard guard = e.gather(m.block_unit(l));
      // Host regions (the kernels' enqueue) and, with a tracer, NVTX ranges for Nsight Systems.
      TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", m.block_unit(l));
      const BlockParams p(load(guard, kBlockParams));
      block_forward(g, p, la.input, out, la.a, w, s);
    }
    void backward(int l, const float* grad_out, float* grad_in) override {
      const LayerActs la = slot(l);
      GatherGuard guard = e.gather(m.block_unit(l));
      {
        TraceScope region(e.tracer(), TraceLane::kTrainer, "backward", m.block_unit(l));
        const BlockParams p(load(guard, kBlockParams));
        GradSink gs(e, m.block_unit(l), kBlockParams, w.grads);
        block_backward(g, p, la.a, la.input, grad_out, grad_in, gs.ptrs(), w, s);
        gs.commit(m.block_unit(l), g.stream, tap);
      }
      e.grads_ready(m.block_unit(l));
    }
    void drop(int l) override {
      std::size_t& k = held[static_cast<std::size_t>(l)];
      if (k == SIZE_MAX) return;
      im.free_slots.push_back(k);  // reused by a later forward on the same stream: in order
      k = SIZE_MAX;
    }
  };
  const std::function<std::vector<const float*>(const GatherGuard&, int)> load = load_params;
  Blocks blocks(*this, *impl_, e, g, w, s, tap, load);

  // ---- forward: embedding
  {
    GatherGuard guard = e.gather(embedding_unit());
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", embedding_unit());
    const auto p = load_params(guard, 2);
    kernels::embedding_forward(a.x0, d_in, p[0], p[1], B, T, C, stream_);
  }
  // ---- forward: blocks (through the Checkpointer in training, as the CPU model)
  Checkpointer* ck = nullptr;
  if (backward) {
    // Kept between micro-steps with its buffers (freeing device memory would synchronise);
    // made anew for a new activation size or policy.
    if (impl_->ck == nullptr || impl_->ck_elems != s.mc() || impl_->ck_spec != ckpt_.to_string() ||
        impl_->ck_cpu != ckpt_.cpu_checkpointing) {
      impl_->ck.reset();
      impl_->ck = std::make_unique<Checkpointer>(L, s.mc(), ckpt_, *tracker_, impl_->dev.get());
      impl_->ck_elems = s.mc();
      impl_->ck_spec = ckpt_.to_string();
      impl_->ck_cpu = ckpt_.cpu_checkpointing;
    }
    ck = impl_->ck.get();
    ck->forward(blocks, a.x0, a.x_last);
  } else {
    // A block copies its input into its slot first, so it may write where it read.
    for (int l = 0; l < L; ++l) {
      blocks.forward(l, l == 0 ? a.x0 : a.x_last, a.x_last);
      blocks.drop(l);
    }
  }
  const float* x_last = a.x_last;
  // ---- forward: final LayerNorm
  {
    GatherGuard guard = e.gather(final_unit());
    TraceScope region(e.tracer(), TraceLane::kTrainer, "forward", final_unit());
    const auto p = load_params(guard, 2);
    kernels::layernorm_forward(a.xf, a.lnf_mean, a.lnf_rstd, x_last, p[0], p[1], M, C, stream_);
  }
  // ---- the tied head, the loss and (in training) the head's backward, under one gather of the
  // embedding: logits = xf wte^T; loss = mean over tokens of -log softmax(logits)[target].
  float* dxf = w.dx_a;
  {
    GatherGuard guard = e.gather(embedding_unit());
    const float* wte = load_params(guard, 1)[0];
    linear_forward(g, a.logits, a.xf, wte, nullptr, M, V, C);
    const float dscale = static_cast<float>(e.loss_scale()) / static_cast<float>(M);
    kernels::crossentropy(a.logits, w.row_loss, d_tgt, M, V, dscale, backward, stream_);
    cuda_check(cudaMemcpyAsync(impl_->loss_host.data(), w.row_loss, Mz * sizeof(float),
                               cudaMemcpyDeviceToHost, stream),
               "GptCudaModel: cudaMemcpyAsync (losses)");
    if (backward) {
      // wte's first gradient contribution (the head), written whole into grad(); the lookup's is
      // added in the embedding's backward, into the same buffer, before its one grads_ready().
      const View gv = e.grad(embedding_unit(), 0);
      linear_backward(g, dxf, w.grads, nullptr, a.logits, a.xf, wte, M, V, C);
      detail::kernels::cast(w.grads, DType::kF32, gv.data, gv.dtype, gv.count, stream_);
    }
  }
  auto mean_loss = [&] {
    cuda_check(cudaStreamSynchronize(stream), "GptCudaModel: cudaStreamSynchronize");
    double loss = 0.0;
    const float* rl = impl_->loss_host.as<float>();
    for (std::size_t m = 0; m < Mz; ++m) loss += rl[m];  // in row order, as the CPU model
    return loss / static_cast<double>(M);
  };
  if (!backward) return mean_loss();

  // ---- backward: final LayerNorm
  float* dcur = w.dx_b;
  float* dnext = w.dx_a;
  {
    GatherGuard guard = e.gather(final_unit());
    const auto p = load_params(guard, 2);
    GradSink gs(e, final_unit(), 2, w.grads);
    kernels::layernorm_backward(dcur, gs[0], gs[1], nullptr, dxf, x_last, a.lnf_mean, a.lnf_rstd,
                                p[0], M, C, stream_);
    gs.commit(final_unit(), stream_, tap);
    e.grads_ready(final_unit());
  }
  // ---- backward: blocks, in reverse (segments recomputed by the Checkpointer)
  ck->backward(blocks, dcur, dnext);
  std::swap(dcur, dnext);
  // ---- backward: embedding. A lookup's gradient does not depend on the parameters: no gather.
  {
    const UnitId u = embedding_unit();
    const View gpe = e.grad(u, 1);
    kernels::embedding_backward_wpe(gpe.data, gpe.dtype, dcur, B, T, s.seq_rows, C, stream_);
    const View gte = e.grad(u, 0);  // the head's contribution is already in it
    kernels::embedding_backward_wte(gte.data, gte.dtype, dcur, d_uniq, d_start, d_pos, distinct, C,
                                    stream_);
    if (tap) {
      cuda_check(cudaStreamSynchronize(stream),
                 "GptCudaModel: cudaStreamSynchronize (before the gradient tap)");
      tap(u, 0, gte);
      tap(u, 1, gpe);
    }
    e.grads_ready(u);
  }
  return mean_loss();
}

}  // namespace zero::gpt
