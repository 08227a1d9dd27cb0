// The GPT CUDA model's cuBLAS arguments (gpt/gpt_gemm.hpp), checked on the CPU: each mapping,
// run through a reference column-major SGEMM with cuBLAS's semantics, must compute the row-major
// product it stands for, on random data of odd sizes. This is how the GPU model's matrix
// products are checked in every build, with or without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpt/gpt_gemm.hpp"

namespace zero::gpt {
namespace {

using gemm::Gemm;
using Vec = std::vector<float>;

// cuBLAS's cublasSgemmStridedBatched with alpha 1, beta 0, column-major, in double.
void reference_sgemm(const Gemm& g, const Vec& a, const Vec& b, Vec& c) {
  for (int i = 0; i < g.count; ++i) {
    const float* A = a.data() + i * g.stride_a;
    const float* B = b.data() + i * g.stride_b;
    float* C = c.data() + i * g.stride_c;
    for (int col = 0; col < g.n; ++col) {
      for (int row = 0; row < g.m; ++row) {
        double sum = 0.0;
        for (int l = 0; l < g.k; ++l) {
          const float x = g.trans_a ? A[l + static_cast<long>(row) * g.lda]
                                    : A[row + static_cast<long>(l) * g.lda];
          const float y = g.trans_b ? B[col + static_cast<long>(l) * g.ldb]
                                    : B[l + static_cast<long>(col) * g.ldb];
          sum += static_cast<double>(x) * y;
        }
        C[row + static_cast<long>(col) * g.ldc] = static_cast<float>(sum);
      }
    }
  }
}

Vec random(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_close(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << what << " element " << i;
  }
}

TEST(GptGemm, LinearLayerProductsMatchTheirRowMajorDefinitions) {
  std::mt19937 rng(1);
  const int M = 7, OC = 5, IC = 3;
  const Vec inp = random(M * IC, rng), w = random(OC * IC, rng), dout = random(M * OC, rng);
  {  // out[m][oc] = sum_ic inp[m][ic] W[oc][ic]
    Vec got(M * OC, NAN), want(M * OC);
    reference_sgemm(gemm::linear_forward(M, OC, IC), w, inp, got);
    for (int m = 0; m < M; ++m)
      for (int o = 0; o < OC; ++o) {
        double s = 0;
        for (int i = 0; i < IC; ++i) s += static_cast<double>(inp[m * IC + i]) * w[o * IC + i];
        want[m * OC + o] = static_cast<float>(s);
      }
    expect_close(got, want, "linear forward");
  }
  {  // dinp[m][ic] = sum_oc dout[m][oc] W[oc][ic]
    Vec got(M * IC, NAN), want(M * IC);
    reference_sgemm(gemm::linear_input_grad(M, OC, IC), w, dout, got);
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < IC; ++i) {
        double s = 0;
        for (int o = 0; o < OC; ++o) s += static_cast<double>(dout[m * OC + o]) * w[o * IC + i];
        want[m * IC + i] = static_cast<float>(s);
      }
    expect_close(got, want, "linear input gradient");
  }
  {  // dW[oc][ic] = sum_m dout[m][oc] inp[m][ic]
    Vec got(OC * IC, NAN), want(OC * IC);
    reference_sgemm(gemm::linear_weight_grad(M, OC, IC), inp, dout, got);
    for (int o = 0; o < OC; ++o)
      for (int i = 0; i < IC; ++i) {
        double s = 0;
        for (int m = 0; m < M; ++m) s += static_cast<double>(dout[m * OC + o]) * inp[m * IC + i];
        want[o * IC + i] = static_cast<float>(s);
      }
    expect_close(got, want, "linear weight gradient");
  }
}

TEST(GptGemm, AttentionProductsMatchTheirPerHeadDefinitions) {
  std::mt19937 rng(2);
  const int BH = 3, T = 5, hd = 4;
  const int thd = T * hd, tt = T * T;
  // Head-major tensors: x[h][t][d] at h*thd + t*hd + d; probabilities p[h][t][s] at h*tt + t*T + s.
  const Vec q = random(BH * thd, rng), k = random(BH * thd, rng), v = random(BH * thd, rng);
  const Vec att = random(BH * tt, rng), dvacc = random(BH * thd, rng), dpre = random(BH * tt, rng);
  auto X = [&](const Vec& x, int h, int t, int d) {
    return static_cast<double>(x[h * thd + t * hd + d]);
  };
  auto P = [&](const Vec& p, int h, int t, int s) {
    return static_cast<double>(p[h * tt + t * T + s]);
  };
  struct Case {
    const char* name;
    Gemm g;
    const Vec& a;
    const Vec& b;
    int rows, cols;  // of each head's row-major result
    std::function<double(int, int, int)> want;
  };
  const Case cases[] = {
      {"scores = q k^T", gemm::scores(BH, T, hd), k, q, T, T,
       [&](int h, int t, int s) {
         double r = 0;
         for (int d = 0; d < hd; ++d) r += X(q, h, t, d) * X(k, h, s, d);
         return r;
       }},
      {"vacc = att v", gemm::att_v(BH, T, hd), v, att, T, hd,
       [&](int h, int t, int d) {
         double r = 0;
         for (int s = 0; s < T; ++s) r += P(att, h, t, s) * X(v, h, s, d);
         return r;
       }},
      {"datt = dvacc v^T", gemm::datt(BH, T, hd), v, dvacc, T, T,
       [&](int h, int t, int s) {
         double r = 0;
         for (int d = 0; d < hd; ++d) r += X(dvacc, h, t, d) * X(v, h, s, d);
         return r;
       }},
      {"dv = att^T dvacc", gemm::dv(BH, T, hd), dvacc, att, T, hd,
       [&](int h, int s, int d) {
         double r = 0;
         for (int t = 0; t < T; ++t) r += P(att, h, t, s) * X(dvacc, h, t, d);
         return r;
       }},
      {"dq = dpre k", gemm::dq(BH, T, hd), k, dpre, T, hd,
       [&](int h, int t, int d) {
         double r = 0;
         for (int s = 0; s < T; ++s) r += P(dpre, h, t, s) * X(k, h, s, d);
         return r;
       }},
      {"dk = dpre^T q", gemm::dk(BH, T, hd), q, dpre, T, hd,
       [&](int h, int s, int d) {
         double r = 0;
         for (int t = 0; t < T; ++t) r += P(dpre, h, t, s) * X(q, h, t, d);
         return r;
       }},
  };
  for (const Case& c : cases) {
    const int per_head = c.rows * c.cols;
    Vec got(static_cast<std::size_t>(BH * per_head), NAN), want(got.size());
    reference_sgemm(c.g, c.a, c.b, got);
    for (int h = 0; h < BH; ++h)
      for (int r = 0; r < c.rows; ++r)
        for (int col = 0; col < c.cols; ++col)
          want[h * per_head + r * c.cols + col] = static_cast<float>(c.want(h, r, col));
    expect_close(got, want, c.name);
  }
}

}  // namespace
}  // namespace zero::gpt
