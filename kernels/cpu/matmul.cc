// MatMul on the CPU: one output row of the weight per task, fp32 accumulation.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/quant.h"

namespace moe::kernels {
namespace {

// Row n of a group-wise quantized w (quant.h): per group,
//   sum_c x[c] * (q[c] * s + m) = s * sum_c x[c] q[c] + m * sum_c x[c]
// so each group costs one multiply by s and one by m, not one per element. kReverse: the same
// sums with the groups, and the elements within each, taken last to first (ReverseSums).
template <bool kReverse>
float QuantDotRow(const float* x, const TensorView& w, int64_t n, int64_t K) {
  const int64_t N = w.dim(0), G = w.group_size, groups = QuantGroups(K, G);
  const int64_t row_bytes = QuantRowBytes(w.dtype, K);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* params =
      reinterpret_cast<const uint16_t*>(codes + QuantParamsOffset(w.dtype, N, K)) + n * groups * 2;
  float acc = 0.f;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t g = kReverse ? groups - 1 - i : i;
    const int64_t c0 = g * G, c1 = std::min(K, c0 + G);
    float xq = 0.f, xs = 0.f;
    for (int64_t j = 0; j < c1 - c0; ++j) {
      const int64_t c = kReverse ? c1 - 1 - j : c0 + j;
      xq += x[c] * static_cast<float>(QuantCode(codes, w.dtype, row_bytes, n, c));
      xs += x[c];
    }
    acc += F16ToF32(params[2 * g]) * xq + F16ToF32(params[2 * g + 1]) * xs;
  }
  return acc;
}

// Row n of a kF8 w (quant.h): per group, s * sum_c x[c] e4m3(q[c]); the scale multiplies the
// group's partial sum, as the block-scaled checkpoints' own kernels apply it. kReverse as above.
template <bool kReverse>
float F8DotRow(const float* x, const TensorView& w, int64_t n, int64_t K) {
  const int64_t N = w.dim(0), G = w.group_size, groups = QuantGroups(K, G);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales =
      reinterpret_cast<const float*>(codes + QuantParamsOffset(w.dtype, N, K)) + n * groups;
  static const std::array<float, 256> kValue = [] {  // every code's value: a load, not a branch
    std::array<float, 256> v;
    for (int b = 0; b < 256; ++b) v[b] = E4m3ToF32(static_cast<uint8_t>(b));
    return v;
  }();
  const uint8_t* row = codes + n * K;
  float acc = 0.f;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t g = kReverse ? groups - 1 - i : i;
    const int64_t c0 = g * G, c1 = std::min(K, c0 + G);
    float xq = 0.f;
    for (int64_t j = 0; j < c1 - c0; ++j) {
      const int64_t c = kReverse ? c1 - 1 - j : c0 + j;
      xq += x[c] * kValue[row[c]];
    }
    acc += scales[g] * xq;
  }
  return acc;
}

// Dot product of an fp32 vector with row `n` of w (any weight dtype), fp32 accumulation in
// four lanes so the compiler can vectorise without -ffast-math. `reverse`: quantized rows summed
// in reverse order (ReverseSums); the float rows ignore it.
float DotRow(const float* x, const TensorView& w, int64_t n, int64_t K, bool reverse) {
  float acc[4] = {0, 0, 0, 0};
  int64_t k = 0;
  switch (w.dtype) {
    case DType::kF32: {
      const float* row = static_cast<const float*>(w.data) + n * K;
      for (; k + 4 <= K; k += 4) {
        for (int j = 0; j < 4; ++j) acc[j] += x[k + j] * row[k + j];
      }
      for (; k < K; ++k) acc[0] += x[k] * row[k];
      break;
    }
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t* row = static_cast<const uint16_t*>(w.data) + n * K;
      const bool bf16 = w.dtype == DType::kBF16;
      for (; k < K; ++k) acc[k & 3] += x[k] * (bf16 ? Bf16ToF32(row[k]) : F16ToF32(row[k]));
      break;
    }
    case DType::kQ8:
    case DType::kQ4:
    case DType::kQ2:
      return reverse ? QuantDotRow<true>(x, w, n, K) : QuantDotRow<false>(x, w, n, K);
    case DType::kF8:
      return reverse ? F8DotRow<true>(x, w, n, K) : F8DotRow<false>(x, w, n, K);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace

bool ReverseSums(int64_t step_tokens) {
  static const int64_t above = [] {
    const char* env = std::getenv("MOE_CPU_REVERSE_SUMS_ABOVE");
    return env == nullptr ? std::numeric_limits<int64_t>::max() : std::atoll(env);
  }();
  return step_tokens > above;
}

void CpuBackend::MatMul(float* out, const float* x, int64_t T, const TensorView& w,
                        const TensorView* bias) {
  MatMulRows(out, x, T, w, bias, ReverseSums(T));
}

void CpuBackend::MatMulRows(float* out, const float* x, int64_t T, const TensorView& w,
                            const TensorView* bias, bool reverse_sums) {
  MOE_CHECK(w.rank == 2) << "MatMul: weight rank " << w.rank;
  MOE_CHECK(!IsQuantized(w.dtype) || w.group_size > 0)
      << "MatMul: quantized weight " << DTypeName(w.dtype) << " without a group size";
  const int64_t N = w.dim(0), K = w.dim(1);
  MOE_CHECK(bias == nullptr || bias->numel() == N) << "MatMul: bias " << bias->numel() << " vs " << N;
  // Parallel over weight rows: each weight row is read once per call, whatever T is.
  pool_.ParallelFor(N, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float b = bias ? bias->at(n) : 0.f;
      for (int64_t t = 0; t < T; ++t) out[t * N + n] = DotRow(x + t * K, w, n, K, reverse_sums) + b;
    }
  });
}

}  // namespace moe::kernels
