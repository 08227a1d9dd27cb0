// gpt/gpt_gemm.hpp — the GPT model's matrix products as cuBLAS calls: the arguments of each
// column-major SGEMM (strided-batched for attention) that computes one row-major product of the
// model. Plain C++ (no CUDA types), so that a CPU test (tests/engine/gpt_gemm_test.cpp) checks
// every mapping against the row-major definition with a reference column-major SGEMM, and the
// CUDA model (gpt_cuda.cpp) hands the same arguments to cuBLAS.
//
// cuBLAS is column-major: a row-major (r x c) matrix X with leading dimension c is, to cuBLAS,
// the column-major X^T (c x r). So a row-major product Z = X Y is computed as the column-major
// Z^T = Y^T X^T, and each operand's op() is read off from which of X or X^T the product needs.
// Weights are (out, in) row-major, as declared (nn.Linear, llm.c). Attention tensors are
// head-major (B*H, T, hd) and (B*H, T, T), one SGEMM per head.
//
// Thread safety: pure functions.
#pragma once

namespace zero::gpt::gemm {

// C_i = op(A_i) op(B_i) for i < count, column-major; A_i = A + i * stride_a, and so on.
struct Gemm {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int count = 1;
};

// out (M x OC) = inp (M x IC) W^T, W (OC x IC).
//   out^T (OC x M) = W (OC x IC) inp^T (IC x M);
//   A = W, stored as W^T (IC x OC, ld IC): op T;  B = inp, stored as inp^T (IC x M, ld IC): op N;
//   C = out^T (OC x M, ld OC).
inline Gemm linear_forward(int M, int OC, int IC) { return {true, false, OC, M, IC, IC, IC, OC}; }
// dinp (M x IC) = dout (M x OC) W (OC x IC).
//   dinp^T (IC x M) = W^T (IC x OC) dout^T (OC x M);
//   A = W stored as W^T (IC x OC, ld IC): op N;  B = dout stored as dout^T (OC x M, ld OC): op N;
//   C = dinp^T (IC x M, ld IC).
inline Gemm linear_input_grad(int M, int OC, int IC) {
  return {false, false, IC, M, OC, IC, OC, IC};
}
// dW (OC x IC) = dout^T (OC x M) inp (M x IC).
//   dW^T (IC x OC) = inp^T (IC x M) dout (M x OC);
//   A = inp stored as inp^T (IC x M, ld IC): op N;  B = dout stored as dout^T (OC x M, ld OC):
//   op T;  C = dW^T (IC x OC, ld IC), i.e. dW row-major.
inline Gemm linear_weight_grad(int M, int OC, int IC) {
  return {false, true, IC, OC, M, IC, OC, IC};
}

// Per head: scores (T x T) = q (T x hd) k^T.  scores^T = k q^T;
//   A = k stored as k^T (hd x T, ld hd): op T;  B = q stored as q^T (hd x T, ld hd): op N;
//   C = scores^T (T x T, ld T).
inline Gemm scores(int BH, int T, int hd) {
  const long long thd = static_cast<long long>(T) * hd, tt = static_cast<long long>(T) * T;
  return {true, false, T, T, hd, hd, hd, T, thd, thd, tt, BH};
}
// vacc (T x hd) = att (T x T) v (T x hd).  vacc^T = v^T att^T;
//   A = v stored as v^T (hd x T, ld hd): op N;  B = att stored as att^T (T x T, ld T): op N;
//   C = vacc^T (hd x T, ld hd).
inline Gemm att_v(int BH, int T, int hd) {
  const long long thd = static_cast<long long>(T) * hd, tt = static_cast<long long>(T) * T;
  return {false, false, hd, T, T, hd, T, hd, thd, tt, thd, BH};
}
// datt (T x T) = dvacc (T x hd) v^T.  datt^T = v dvacc^T;
//   A = v stored as v^T (hd x T, ld hd): op T;  B = dvacc stored as dvacc^T (hd x T, ld hd):
//   op N;  C = datt^T (T x T, ld T).
inline Gemm datt(int BH, int T, int hd) {
  const long long thd = static_cast<long long>(T) * hd, tt = static_cast<long long>(T) * T;
  return {true, false, T, T, hd, hd, hd, T, thd, thd, tt, BH};
}
// dv (T x hd) = att^T (T x T) dvacc (T x hd).  dv^T = dvacc^T att;
//   A = dvacc stored as dvacc^T (hd x T, ld hd): op N;  B = att stored as att^T (T x T, ld T):
//   op T;  C = dv^T (hd x T, ld hd).
inline Gemm dv(int BH, int T, int hd) {
  const long long thd = static_cast<long long>(T) * hd, tt = static_cast<long long>(T) * T;
  return {false, true, hd, T, T, hd, T, hd, thd, tt, thd, BH};
}
// dq (T x hd) = dpre (T x T) k (T x hd).  dq^T = k^T dpre^T;
//   A = k stored as k^T (hd x T, ld hd): op N;  B = dpre stored as dpre^T (T x T, ld T): op N;
//   C = dq^T (hd x T, ld hd).
inline Gemm dq(int BH, int T, int hd) { return att_v(BH, T, hd); }
// dk (T x hd) = dpre^T (T x T) q (T x hd).  dk^T = q^T dpre;
//   A = q stored as q^T (hd x T, ld hd): op N;  B = dpre stored as dpre^T (T x T, ld T): op T;
//   C = dk^T (hd x T, ld hd).
inline Gemm dk(int BH, int T, int hd) { return dv(BH, T, hd); }

}  // namespace zero::gpt::gemm
