// DType, element conversions and TensorView: the non-owning (pointer, dtype, shape) every op takes.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>


#include "kernels/base/check.h"

namespace moe::kernels {

// Element types of weights and activations. Quantized (group-wise) formats live in quant.h.
enum class DType : uint8_t { kF32, kF16, kBF16 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
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
uint16_t F32ToF16(float f);

// Reads element i of a buffer of dtype t as float.
inline float LoadAsF32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.f;
}

// A view of a dense row-major tensor of up to 4 dims. It owns nothing; whoever made it keeps the
// bytes alive. `data` may point to host or device memory depending on the backend that reads it.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, 4> shape{};

  int64_t dim(int i) const {
    MOE_DCHECK(i >= 0 && i < rank) << "dim " << i << " of rank " << rank;
    return shape[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  float at(size_t i) const { return LoadAsF32(data, dtype, i); }
};

inline TensorView View(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  for (int64_t d : shape) v.shape[v.rank++] = d;
  return v;
}

}  // namespace moe::kernels
