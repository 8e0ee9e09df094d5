// On-disk constants and the layout of one expert blob: the contract between the importer, which
// writes blobs, and the blob reader and store, which read them. Bump kStoreFormatVersion on any
// change here, in the index encoding (blob_index.cc) or in kernels/quant.h's layout.
//
// A blob file (blobs/NNNNNN.blob) is append-only: a sequence of blobs, each starting at a
// multiple of kBlobAlignment, so O_DIRECT (and GPUDirect Storage) can read one in a single
// request into a 4 KiB-aligned buffer. A blob is one expert:
//
//   [0, 256)             BlobHeader (magic, version, layer, expert): catches an index entry that
//                        points at the wrong blob, which a checksum alone would not
//   gate_offset          gate [I, H]  in the blob's dtype (and group size when quantized)
//   up_offset            up   [I, H]
//   down_offset          down [H, I]
//   ... zero padding to `length`, a multiple of kBlobAlignment
//
// Matrices start at multiples of kTensorAlignment. The checksum (XXH3-64) covers all `length`
// bytes, padding included, so a torn or zeroed tail is caught too.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/tensor.h"

namespace moe::store {

inline constexpr uint32_t kStoreFormatVersion = 1;
inline constexpr uint64_t kBlobAlignment = 4096;
inline constexpr uint64_t kTensorAlignment = 256;
inline constexpr uint64_t kBlobHeaderBytes = 256;
inline constexpr char kBlobMagic[8] = {'M', 'O', 'E', 'B', 'L', 'O', 'B', '1'};

inline uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

struct BlobHeader {
  char magic[8];
  uint32_t version;
  int32_t layer;
  int32_t expert;
  uint32_t reserved;
};
static_assert(sizeof(BlobHeader) <= kBlobHeaderBytes);

// Where one expert's blob lives and how to read it: the value of an index entry.
struct BlobLocation {
  int32_t layer = 0;
  int32_t expert = 0;
  std::string file;       // relative to the store directory, e.g. "blobs/000001.blob"
  uint64_t offset = 0;    // multiple of kBlobAlignment
  uint64_t length = 0;    // multiple of kBlobAlignment, padding included
  uint64_t checksum = 0;  // XXH3-64 of the `length` bytes
  uint32_t version = kStoreFormatVersion;
  kernels::DType dtype = kernels::DType::kBF16;  // of all three matrices
  int32_t group_size = 0;                        // quantized dtypes only
  int64_t hidden_size = 0;                       // H
  int64_t intermediate_size = 0;                 // I (moe_intermediate_size)
};

// Offsets of the three matrices inside a blob and its padded length.
struct BlobLayout {
  uint64_t gate_offset = 0, up_offset = 0, down_offset = 0, length = 0;
};
BlobLayout ComputeBlobLayout(kernels::DType dtype, int32_t group_size, int64_t hidden_size,
                             int64_t intermediate_size);

// Views of gate/up/down inside a blob resident at `blob` (any memory the reader can address).
kernels::ExpertWeights BlobWeights(const BlobLocation& loc, const void* blob);

// XXH3-64 of `bytes` bytes.
uint64_t BlobChecksum(const void* data, uint64_t bytes);

// Checks a blob read into memory against its index entry: the checksum (when `checksum`), then
// always the header's magic, version, layer and expert, so a zeroed or misplaced blob never
// passes. DataLoss names the expert, the file, the offset and both values.
absl::Status VerifyBlob(const BlobLocation& loc, const void* blob, bool checksum = true);

// "expert (layer L, expert E)", the prefix of every message about a blob.
std::string ExpertName(int32_t layer, int32_t expert);

}  // namespace moe::store
