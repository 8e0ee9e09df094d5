// Helpers shared by the codec files (kv_quant.cc, kv_quant_attention.cc); not public API.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/base/check.h"
#include "kernels/kvcodec/kv_quant.h"
#include "kernels/tensor.h"

namespace moe::kernels::kv_internal {

enum class Kind { kBf16, kFp8, kMse, kSplit, kProd };

struct FormatInfo {
  Kind kind;
  int bits = 0;    // kMse: b; kProd: total b (MSE stage b − 1); kSplit: outlier bits
  int bits_r = 0;  // kSplit: rest bits
};

inline FormatInfo Info(KvFormat f) {
  switch (f) {
    case KvFormat::kBf16:
      return {Kind::kBf16};
    case KvFormat::kFp8E4m3:
      return {Kind::kFp8};
    case KvFormat::kTq4:
      return {Kind::kMse, 4};
    case KvFormat::kTq3:
      return {Kind::kMse, 3};
    case KvFormat::kTq2:
      return {Kind::kMse, 2};
    case KvFormat::kTq1:
      return {Kind::kMse, 1};
    case KvFormat::kTq3p5:
      return {Kind::kSplit, 4, 3};
    case KvFormat::kTq2p5:
      return {Kind::kSplit, 3, 2};
    case KvFormat::kTqProd4:
      return {Kind::kProd, 4};
    case KvFormat::kTqProd3:
      return {Kind::kProd, 3};
    case KvFormat::kTqProd2:
      return {Kind::kProd, 2};
    case KvFormat::kTqProd1:
      return {Kind::kProd, 1};
  }
  MOE_CHECK(false) << "unknown KvFormat " << static_cast<int>(f);
  return {Kind::kBf16};
}

inline constexpr int kSplitOutliers = 32;  // paper §4.3, for D = 128
inline constexpr float kFp8Max = 448.f;
inline constexpr float kF16Max = 65504.f;

inline uint32_t GetBits(const uint8_t* p, int64_t bitpos, int bits) {
  const int shift = static_cast<int>(bitpos & 7);
  uint32_t v = p[bitpos >> 3];
  if (shift + bits > 8) v |= static_cast<uint32_t>(p[(bitpos >> 3) + 1]) << 8;
  return (v >> shift) & ((1u << bits) - 1u);
}

inline float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}
}  // namespace moe::kernels::kv_internal
