// Group-wise quantized weight matrices (kQ8, kQ4, kQ2): the byte layout and the CPU reference
// quantize/dequantize. Every backend and the expert store's blobs use exactly this layout.
//
// A matrix [rows, cols] (a view's last dim is `cols`, the others fold into `rows`) is cut, row by
// row, into groups of `group_size` consecutive elements (the last group of a row may be shorter).
// Each group has an fp16 scale s and an fp16 offset m (asymmetric quantization, because 2- and
// 4-bit codes waste a level on the sign otherwise):
//
//   w[r, c] ~= q[r, c] * s[r, g] + m[r, g],   g = c / group_size,   q unsigned in [0, 2^bits - 1]
//
// Byte layout, in this order, no header (the view carries dtype, shape and group size):
//   codes   [rows, RowBytes]  row-major; kQ8 one byte per code; kQ4 two codes per byte, even
//                             column in the low nibble; kQ2 four per byte, column c in bits
//                             2*(c%4)..2*(c%4)+1. A row is padded to whole bytes.
//   params  [rows, groups, 2] uint16 fp16 pairs {s, m}; starts at ParamsOffset (16-byte aligned).
//
// Error bound of Quantize, per element of a group with minimum lo and maximum hi:
//   |w - dequant(w)| <= s/2 + 2^-11 * (|lo| + (hi - lo))       (s = the fp16 scale stored)
// the second term being fp16 rounding of s and m. So int8 keeps ~ (hi-lo)/510, int4 (hi-lo)/30,
// int2 (hi-lo)/6 (int2 is coarse: a deliberate memory/quality trade the caller chooses).
//
// kF8 (fp8 block-scaled: published FP8 checkpoints, issue 30) has the same shape of layout, so the
// same sizes: one e4m3 code byte per element and a 4-byte parameter per group, but the parameter
// is one fp32 scale s (kept exactly as the checkpoint has it) and there is no offset:
//
//   w[r, c] = e4m3(q[r, c]) * s[r, g]      (fp32; e4m3 values are exact in bf16 and fp16)
//
//   codes   [rows, cols]      one e4m3 byte per element (E4m3ToF32 in tensor.h)
//   scales  [rows, groups]    fp32; starts at ParamsOffset (16-byte aligned)
//
// Why a scale per (row, group) and not per 128x128 block as the checkpoints store it: a weight row
// then reads its scales as an int8 row reads its {s, m} (every kernel's addressing is the int8
// one), per-channel and per-tensor scales fit the same layout, and it costs 4 bytes per 128
// weights (3%). Kernels take sum_c x[c] e4m3(q[c]) over a group, then multiply by s. Quantize
// (from floats, for moe-import --format=fp8) picks s = max|w| / 448 per group, so the error is
// e4m3 rounding: |w - dequant(w)| <= 2^-4 |w| for |w| >= 2^-6 s, and <= 2^-10 s below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace moe::kernels {

inline int QuantBits(DType t) {
  return t == DType::kQ8 || t == DType::kF8 ? 8 : t == DType::kQ4 ? 4 : t == DType::kQ2 ? 2 : 0;
}
inline int64_t QuantRowBytes(DType t, int64_t cols) { return (cols * QuantBits(t) + 7) / 8; }
inline int64_t QuantGroups(int64_t cols, int32_t group_size) {
  return (cols + group_size - 1) / group_size;
}
inline int64_t QuantParamsOffset(DType t, int64_t rows, int64_t cols) {
  return (rows * QuantRowBytes(t, cols) + 15) / 16 * 16;
}

// The code of element (r, c); `codes` points at the start of the matrix.
inline uint32_t QuantCode(const uint8_t* codes, DType t, int64_t row_bytes, int64_t r, int64_t c) {
  const uint8_t* row = codes + r * row_bytes;
  switch (t) {
    case DType::kQ8:
    case DType::kF8: return row[c];
    case DType::kQ4: return (row[c >> 1] >> ((c & 1) * 4)) & 0xfu;
    case DType::kQ2: return (row[c >> 2] >> ((c & 3) * 2)) & 0x3u;
    default: return 0;
  }
}

// InvalidArgument unless dtype is kQ8/kQ4/kQ2/kF8 and group_size is 32, 64, 128 or 256.
absl::Status ValidateQuantFormat(DType dtype, int32_t group_size);

// Parses "bf16", "f16", "f32", "int8", "int4", "int2", "fp8" (the CLI spelling). InvalidArgument
// lists them.
absl::StatusOr<DType> ParseWeightFormat(const std::string& name);
// The inverse: "bf16", ..., "fp8".
const char* WeightFormatName(DType dtype);

// Quantizes src (F32/F16/BF16, rank >= 1) into `dst`, which must hold
// QuantizedBytes(dtype, rows, cols, group_size) bytes. Returns the view of dst (same shape).
// InvalidArgument: bad format, quantized source, or a group whose scale or offset overflows fp16
// (|w| > 65504) or is not finite (the message names the row and group; kF8: a non-finite w).
absl::StatusOr<TensorView> Quantize(const TensorView& src, DType dtype, int32_t group_size,
                                    void* dst);

// out[rows * cols] = dequantized q (the reference every backend's kernels are compared against).
void Dequantize(const TensorView& q, float* out);

// Converts src (F32/F16/BF16) to a dense dtype into dst (numel * DTypeSize bytes), rounding to
// nearest even; a copy when the dtypes match.
void ConvertDense(const TensorView& src, DType dtype, void* dst);

}  // namespace moe::kernels
