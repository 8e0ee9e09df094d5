// quant.h: round-trip error within the stated bound for every element, and the CPU matmul on
// quantized weights against the matmul on their dequantized fp32 copy.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace moe::kernels {
namespace {

std::vector<float> RandomMatrix(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  DType dtype;
  int32_t group;
  int64_t rows, cols;
};

class QuantTest : public ::testing::TestWithParam<Case> {};

// Every element within its format's bound, with a little slack for the fp32 arithmetic of
// dequantization. Integer codes (quant.h): s/2 + 2^-11 (|lo| + hi - lo) of its group. kF8:
// s = max|w| / 448 a group and codes the nearest e4m3 of w / s, so half an e4m3 step of w / s
// (2^-4 relative, or 2^-10 s among the subnormals), and an exact zero stays zero.
TEST_P(QuantTest, RoundTripWithinBound) {
  const Case c = GetParam();
  std::vector<float> w = RandomMatrix(c.rows * c.cols, 7);
  w[0] = 0.f;
  const TensorView src = View(w.data(), DType::kF32, {c.rows, c.cols});
  std::vector<uint8_t> bytes(QuantizedBytes(c.dtype, c.rows, c.cols, c.group));
  absl::StatusOr<TensorView> q = Quantize(src, c.dtype, c.group, bytes.data());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->bytes(), bytes.size());
  std::vector<float> back(w.size());
  Dequantize(*q, back.data());
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t g0 = 0; g0 < c.cols; g0 += c.group) {
      const int64_t g1 = std::min(c.cols, g0 + c.group);
      float lo = w[r * c.cols + g0], hi = lo, amax = 0.f;
      for (int64_t k = g0; k < g1; ++k) {
        lo = std::min(lo, w[r * c.cols + k]);
        hi = std::max(hi, w[r * c.cols + k]);
        amax = std::max(amax, std::fabs(w[r * c.cols + k]));
      }
      for (int64_t k = g0; k < g1; ++k) {
        const double v = w[r * c.cols + k];
        double bound;
        if (c.dtype == DType::kF8) {
          const double s = amax / 448.0;
          bound = std::max(std::fabs(v) * std::ldexp(1.0, -4), std::ldexp(s, -10)) * 1.0001;
        } else {
          const float s = F16ToF32(F32ToF16((hi - lo) / ((1 << QuantBits(c.dtype)) - 1)));
          bound = 0.5 * s * 1.0001 + std::ldexp(1.0, -11) * (std::fabs(lo) + hi - lo) + 1e-7;
        }
        ASSERT_LE(std::fabs(back[r * c.cols + k] - v), bound)
            << "row " << r << " col " << k << " w " << v << " back " << back[r * c.cols + k];
      }
    }
  }
  if (c.dtype == DType::kF8) {
    EXPECT_EQ(back[0], 0.f);
  }
}

// CPU MatMul with quantized weights == MatMul with the dequantized fp32 weights, up to fp32
// reassociation (relative to sum |x||w|).
TEST_P(QuantTest, MatMulMatchesDequantizedReference) {
  const Case c = GetParam();
  std::vector<float> w = RandomMatrix(c.rows * c.cols, 11);
  std::vector<uint8_t> bytes(QuantizedBytes(c.dtype, c.rows, c.cols, c.group));
  absl::StatusOr<TensorView> q =
      Quantize(View(w.data(), DType::kF32, {c.rows, c.cols}), c.dtype, c.group, bytes.data());
  ASSERT_TRUE(q.ok()) << q.status();
  std::vector<float> deq(w.size());
  Dequantize(*q, deq.data());
  const int64_t T = 3;
  std::vector<float> x = RandomMatrix(T * c.cols, 13);
  auto backend = MakeBackend(BackendKind::kCpu, {.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  std::vector<float> got(T * c.rows), want(T * c.rows);
  (*backend)->MatMul(got.data(), x.data(), T, *q, nullptr);
  (*backend)->MatMul(want.data(), x.data(), T, View(deq.data(), DType::kF32, {c.rows, c.cols}),
                     nullptr);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < c.rows; ++n) {
      double mag = 0;
      for (int64_t k = 0; k < c.cols; ++k)
        mag += std::fabs(x[t * c.cols + k] * deq[n * c.cols + k]);
      ASSERT_NEAR(got[t * c.rows + n], want[t * c.rows + n], 1e-5 * mag + 1e-7)
          << "token " << t << " row " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantTest,
    ::testing::Values(Case{DType::kQ8, 64, 7, 128}, Case{DType::kQ8, 128, 5, 733},
                      Case{DType::kQ4, 64, 7, 128}, Case{DType::kQ4, 128, 3, 733},
                      Case{DType::kQ4, 64, 1, 1}, Case{DType::kQ2, 64, 9, 130},
                      Case{DType::kQ2, 128, 2, 7}, Case{DType::kQ4, 32, 33, 96},
                      Case{DType::kF8, 128, 7, 300}, Case{DType::kF8, 64, 3, 7}),
    [](const auto& p) {
      return std::string(DTypeName(p.param.dtype)) + "_g" + std::to_string(p.param.group) + "_" +
             std::to_string(p.param.rows) + "x" + std::to_string(p.param.cols);
    });

TEST(QuantFormat, RejectsBadGroupAndDenseDtype) {
  EXPECT_EQ(ValidateQuantFormat(DType::kQ4, 48).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateQuantFormat(DType::kBF16, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateQuantFormat(DType::kQ2, 128).ok());
  EXPECT_EQ(ParseWeightFormat("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantFormat, OverflowingGroupIsAnError) {
  std::vector<float> w = {-1e6f, 1e6f, 0.f, 1.f};
  std::vector<uint8_t> bytes(QuantizedBytes(DType::kQ8, 1, 4, 32));
  auto q = Quantize(View(w.data(), DType::kF32, {1, 4}), DType::kQ8, 32, bytes.data());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("row 0 group 0"), std::string::npos) << q.status();
}

// The dense paths are untouched: bf16 weights give the same bits as before (fp32 reference of
// the same values).
TEST(QuantFormat, DenseBf16MatMulUnchanged) {
  std::vector<float> w = RandomMatrix(4 * 9, 3);
  std::vector<uint16_t> wb(w.size());
  ConvertDense(View(w.data(), DType::kF32, {4, 9}), DType::kBF16, wb.data());
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToF32(wb[i]);
  std::vector<float> x = RandomMatrix(9, 5), a(4), b(4);
  auto backend = MakeBackend(BackendKind::kCpu, {.num_threads = 1});
  ASSERT_TRUE(backend.ok());
  (*backend)->MatMul(a.data(), x.data(), 1, View(wb.data(), DType::kBF16, {4, 9}), nullptr);
  (*backend)->MatMul(b.data(), x.data(), 1, View(wf.data(), DType::kF32, {4, 9}), nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(a[i], b[i]);
}

}  // namespace
}  // namespace moe::kernels
