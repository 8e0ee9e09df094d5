// Blob layout arithmetic and verification (the format is described in blob_format.h).
#include "expertstore/blob_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace moe::store {
namespace {

uint64_t MatrixBytes(kernels::DType dtype, int32_t group, int64_t rows, int64_t cols) {
  if (kernels::IsQuantized(dtype)) return kernels::QuantizedBytes(dtype, rows, cols, group);
  return static_cast<uint64_t>(rows * cols) * kernels::DTypeSize(dtype);
}

kernels::TensorView Matrix(const void* blob, uint64_t offset, const BlobLocation& loc, int64_t rows,
                           int64_t cols) {
  kernels::TensorView v =
      kernels::View(static_cast<const uint8_t*>(blob) + offset, loc.dtype, {rows, cols});
  v.group_size = kernels::IsQuantized(loc.dtype) ? loc.group_size : 0;
  return v;
}

}  // namespace

std::string ExpertName(int32_t layer, int32_t expert) {
  return absl::StrCat("expert (layer ", layer, ", expert ", expert, ")");
}

BlobLayout ComputeBlobLayout(kernels::DType dtype, int32_t group_size, int64_t hidden_size,
                             int64_t intermediate_size) {
  const uint64_t gate = MatrixBytes(dtype, group_size, intermediate_size, hidden_size);
  const uint64_t down = MatrixBytes(dtype, group_size, hidden_size, intermediate_size);
  BlobLayout l;
  l.gate_offset = kBlobHeaderBytes;
  l.up_offset = AlignUp(l.gate_offset + gate, kTensorAlignment);
  l.down_offset = AlignUp(l.up_offset + gate, kTensorAlignment);
  l.length = AlignUp(l.down_offset + down, kBlobAlignment);
  return l;
}

kernels::ExpertWeights BlobWeights(const BlobLocation& loc, const void* blob) {
  const BlobLayout l =
      ComputeBlobLayout(loc.dtype, loc.group_size, loc.hidden_size, loc.intermediate_size);
  const int64_t H = loc.hidden_size, I = loc.intermediate_size;
  return kernels::ExpertWeights{Matrix(blob, l.gate_offset, loc, I, H),
                                Matrix(blob, l.up_offset, loc, I, H),
                                Matrix(blob, l.down_offset, loc, H, I)};
}

uint64_t BlobChecksum(const void* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

absl::Status VerifyBlob(const BlobLocation& loc, const void* blob, bool checksum) {
  const std::string where = absl::StrCat(ExpertName(loc.layer, loc.expert), ": blob in ", loc.file,
                                         " at offset ", loc.offset, " (", loc.length, " bytes)");
  const uint64_t got = checksum ? BlobChecksum(blob, loc.length) : loc.checksum;
  if (got != loc.checksum) {
    return absl::DataLossError(absl::StrFormat(
        "%s: xxh3 checksum mismatch: want 0x%016x, got 0x%016x", where, loc.checksum, got));
  }
  BlobHeader h;
  std::memcpy(&h, blob, sizeof(h));
  if (std::memcmp(h.magic, kBlobMagic, sizeof(kBlobMagic)) != 0 || h.version != loc.version ||
      h.layer != loc.layer || h.expert != loc.expert) {
    return absl::DataLossError(absl::StrCat(where, ": header names ", ExpertName(h.layer, h.expert),
                                            " version ", h.version, ", not this expert"));
  }
  return absl::OkStatus();
}

}  // namespace moe::store
