// Group-wise quantization reference (layout in quant.h): plain loops, fp32 arithmetic.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/kvcodec/kv_quant.h"

namespace moe::kernels {
namespace {

void RowsCols(const TensorView& v, int64_t* rows, int64_t* cols) {
  *cols = v.rank == 0 ? 1 : v.shape[v.rank - 1];
  *rows = *cols == 0 ? 0 : v.numel() / *cols;
}

// kF8 from floats: s = max|w| / 448 per group (fp32), codes e4m3(w / s) rounded to nearest even
// (F32ToE4m3: the fp8 KV cache's rounding).
absl::Status QuantizeF8(const TensorView& src, int64_t rows, int64_t cols, int32_t group_size,
                        void* dst) {
  const int64_t groups = QuantGroups(cols, group_size);
  auto* codes = static_cast<uint8_t*>(dst);
  std::fill(codes, codes + QuantizedBytes(DType::kF8, rows, cols, group_size), 0);
  auto* scales = reinterpret_cast<float*>(codes + QuantParamsOffset(DType::kF8, rows, cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group_size, c1 = std::min(cols, c0 + group_size);
      float amax = 0.f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src.at(r * cols + c)));
      if (!std::isfinite(amax)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Quantize: row ", r, " group ", g, " holds a non-finite weight"));
      }
      const float s = amax / 448.f;
      scales[r * groups + g] = s;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = s > 0.f ? std::clamp(src.at(r * cols + c) / s, -448.f, 448.f) : 0.f;
        codes[r * cols + c] = F32ToE4m3(v);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQuantFormat(DType dtype, int32_t group_size) {
  if (!IsQuantized(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " is not a quantized format (Q8, Q4, Q2, F8)"));
  }
  if (group_size != 32 && group_size != 64 && group_size != 128 && group_size != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("group size ", group_size, " is not one of 32, 64, 128, 256"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseWeightFormat(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  if (name == "f32") return DType::kF32;
  if (name == "int8") return DType::kQ8;
  if (name == "int4") return DType::kQ4;
  if (name == "int2") return DType::kQ2;
  if (name == "fp8") return DType::kF8;
  return absl::InvalidArgumentError(absl::StrCat(
      "weight format '", name, "' is not one of bf16, f16, f32, int8, int4, int2, fp8"));
}

const char* WeightFormatName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF32: return "f32";
    case DType::kQ8: return "int8";
    case DType::kQ4: return "int4";
    case DType::kQ2: return "int2";
    case DType::kF8: return "fp8";
  }
  return "?";
}

size_t QuantizedBytes(DType dtype, int64_t rows, int64_t cols, int32_t group_size) {
  MOE_CHECK(IsQuantized(dtype) && group_size > 0)
      << "QuantizedBytes: dtype " << DTypeName(dtype) << " group " << group_size;
  return static_cast<size_t>(QuantParamsOffset(dtype, rows, cols) +
                             rows * QuantGroups(cols, group_size) * 4);
}

float QuantizedAt(const TensorView& q, int64_t i) {
  int64_t rows, cols;
  RowsCols(q, &rows, &cols);
  const int64_t r = i / cols, c = i % cols;
  MOE_DCHECK(r < rows) << "QuantizedAt: element " << i << " of " << rows << "x" << cols;
  const auto* base = static_cast<const uint8_t*>(q.data);
  if (q.dtype == DType::kF8) {
    float s;
    std::memcpy(&s,
                base + QuantParamsOffset(q.dtype, rows, cols) +
                    (r * QuantGroups(cols, q.group_size) + c / q.group_size) * 4,
                4);
    return E4m3ToF32(base[r * cols + c]) * s;
  }
  const auto* params =
      reinterpret_cast<const uint16_t*>(base + QuantParamsOffset(q.dtype, rows, cols)) +
      (r * QuantGroups(cols, q.group_size) + c / q.group_size) * 2;
  const uint32_t code = QuantCode(base, q.dtype, QuantRowBytes(q.dtype, cols), r, c);
  return static_cast<float>(code) * F16ToF32(params[0]) + F16ToF32(params[1]);
}

absl::StatusOr<TensorView> Quantize(const TensorView& src, DType dtype, int32_t group_size,
                                    void* dst) {
  if (absl::Status s = ValidateQuantFormat(dtype, group_size); !s.ok()) return s;
  if (IsQuantized(src.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Quantize: source is already quantized (", DTypeName(src.dtype), ")"));
  }
  int64_t rows, cols;
  RowsCols(src, &rows, &cols);
  if (dtype == DType::kF8) {
    if (absl::Status s = QuantizeF8(src, rows, cols, group_size, dst); !s.ok()) return s;
    TensorView out = src;
    out.data = dst;
    out.dtype = dtype;
    out.group_size = group_size;
    return out;
  }
  const int64_t row_bytes = QuantRowBytes(dtype, cols), groups = QuantGroups(cols, group_size);
  const uint32_t qmax = (1u << QuantBits(dtype)) - 1;
  auto* codes = static_cast<uint8_t*>(dst);
  std::fill(codes, codes + QuantizedBytes(dtype, rows, cols, group_size), 0);
  auto* params = reinterpret_cast<uint16_t*>(codes + QuantParamsOffset(dtype, rows, cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group_size, c1 = std::min(cols, c0 + group_size);
      float lo = src.at(r * cols + c0), hi = lo;
      for (int64_t c = c0; c < c1; ++c) {
        const float w = src.at(r * cols + c);
        lo = std::min(lo, w);
        hi = std::max(hi, w);
      }
      // Codes are computed against the fp16-rounded s and m, so dequantization sees exactly
      // the numbers the codes were chosen for (the bound in quant.h).
      const uint16_t s16 = F32ToF16((hi - lo) / static_cast<float>(qmax));
      const uint16_t m16 = F32ToF16(lo);
      const float s = F16ToF32(s16), m = F16ToF32(m16);
      if (!std::isfinite(s) || !std::isfinite(m) || !std::isfinite(hi - lo)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Quantize: row ", r, " group ", g, " spans [", lo, ", ", hi,
                         "], outside what fp16 scales can represent"));
      }
      params[(r * groups + g) * 2] = s16;
      params[(r * groups + g) * 2 + 1] = m16;
      uint8_t* row = codes + r * row_bytes;
      for (int64_t c = c0; c < c1; ++c) {
        float qf = s > 0.f ? std::nearbyint((src.at(r * cols + c) - m) / s) : 0.f;
        qf = std::clamp(qf, 0.f, static_cast<float>(qmax));
        const uint32_t q = static_cast<uint32_t>(qf);
        switch (dtype) {
          case DType::kQ8: row[c] = static_cast<uint8_t>(q); break;
          case DType::kQ4: row[c >> 1] |= static_cast<uint8_t>(q << ((c & 1) * 4)); break;
          case DType::kQ2: row[c >> 2] |= static_cast<uint8_t>(q << ((c & 3) * 2)); break;
          default: break;
        }
      }
    }
  }
  TensorView out = src;
  out.data = dst;
  out.dtype = dtype;
  out.group_size = group_size;
  return out;
}

void Dequantize(const TensorView& q, float* out) {
  MOE_CHECK(IsQuantized(q.dtype)) << "Dequantize: dtype " << DTypeName(q.dtype);
  const int64_t n = q.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = QuantizedAt(q, i);
}

void ConvertDense(const TensorView& src, DType dtype, void* dst) {
  MOE_CHECK(!IsQuantized(src.dtype) && !IsQuantized(dtype))
      << "ConvertDense: " << DTypeName(src.dtype) << " -> " << DTypeName(dtype);
  const int64_t n = src.numel();
  if (src.dtype == dtype) {
    std::memcpy(dst, src.data, src.bytes());
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = src.at(i);
    switch (dtype) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = F32ToF16(v); break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = F32ToBf16(v); break;
      default: break;
    }
  }
}

}  // namespace moe::kernels
