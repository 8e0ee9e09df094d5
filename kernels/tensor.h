// DType, element conversions and TensorView: the non-owning (pointer, dtype, shape) every op takes.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>


#include "kernels/base/check.h"

namespace moe::kernels {

// Element types of weights and activations. kQ8/kQ4/kQ2 are group-wise quantized weight matrices,
// kF8 e4m3 codes with an fp32 scale per group (layouts and error bounds in quant.h); a view of
// one carries its group size.
enum class DType : uint8_t { kF32, kF16, kBF16, kQ8, kQ4, kQ2, kF8 };

inline bool IsQuantized(DType t) {
  return t == DType::kQ8 || t == DType::kQ4 || t == DType::kQ2 || t == DType::kF8;
}

// Bytes per element of the dense dtypes; 0 for quantized ones, whose size is not a whole number of
// bytes per element: use TensorView::bytes().
inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8:
    case DType::kQ4:
    case DType::kQ2:
    case DType::kF8: return 0;
  }
  return 0;
}

const char* DTypeName(DType t);

// bf16 is the top half of an fp32; rounding to nearest even on the way down.
inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float F16ToF32(uint16_t h);
// An fp8 e4m3 (OCP "e4m3fn": bias 7, no infinities, S.1111.111 NaN, max 448) code as float; exact
// (also in bf16 and fp16). Subnormals: exponent field 0, value m/8 * 2^-6.
inline float E4m3ToF32(uint8_t b) {
  // The 7 magnitude bits at the top of fp32's exponent and mantissa, then 2^120 re-biases the
  // exponent (127 - 7); fp32 denormals make e4m3 subnormals exact too.
  uint32_t bits = static_cast<uint32_t>(b & 0x7fu) << 20;
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p120f;
  if ((b & 0x7fu) == 0x7fu) f = __builtin_nanf("");
  return (b & 0x80u) ? -f : f;
}
uint16_t F32ToF16(float f);

// Reads element i of a buffer of a dense dtype t as float (quantized ones need the view: at()).
inline float LoadAsF32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kQ8:
    case DType::kQ4:
    case DType::kQ2:
    case DType::kF8: break;
  }
  MOE_CHECK(false) << "LoadAsF32: " << static_cast<int>(t) << " is quantized; use TensorView::at";
  return 0.f;
}

struct TensorView;
// Defined in quant.cc: the size of a quantized matrix and one dequantized element of it.
size_t QuantizedBytes(DType dtype, int64_t rows, int64_t cols, int32_t group_size);
float QuantizedAt(const TensorView& q, int64_t i);

// A view of a dense row-major tensor of up to 4 dims. It owns nothing; whoever made it keeps the
// bytes alive. `data` may point to host or device memory depending on the backend that reads it.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, 4> shape{};
  // Quantized dtypes only: elements per scale group along the last dim (quant.h). Default: 0.
  int32_t group_size = 0;

  int64_t dim(int i) const {
    MOE_DCHECK(i >= 0 && i < rank) << "dim " << i << " of rank " << rank;
    return shape[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const {
    if (IsQuantized(dtype)) {
      const int64_t cols = rank == 0 ? 1 : shape[rank - 1];
      return QuantizedBytes(dtype, cols == 0 ? 0 : numel() / cols, cols, group_size);
    }
    return static_cast<size_t>(numel()) * DTypeSize(dtype);
  }
  float at(size_t i) const {
    if (IsQuantized(dtype)) return QuantizedAt(*this, static_cast<int64_t>(i));
    return LoadAsF32(data, dtype, i);
  }
};

inline TensorView View(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  for (int64_t d : shape) v.shape[v.rank++] = d;
  return v;
}

}  // namespace moe::kernels
