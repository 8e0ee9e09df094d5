// Byte layout of the paged KV storage: where the tile of (layer, block, kv-head, K|V) lives.
//
// Layout: [layer][block][kv_head][K, V] tiles, each tile block_size vectors in the format's
// structure-of-arrays layout (kernels/kvcodec/kv_quant.h). One layer's blocks are contiguous, so an
// attention kernel takes one base pointer per layer plus the block table.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kvcodec/kv_quant.h"

namespace moe::engine {

// The KV cache formats: every kernels::KvFormat but the prod ones (tq_prod1..4), which quantize
// keys only (TurboQuant_prod, spec §3.6): a test and comparison mode of the codecs, no cache.
// The one place they are refused: InvalidArgument naming the format and the cache formats.
absl::Status CheckCacheFormat(kernels::KvFormat format);
// A cache format by name (--kv_cache_dtype): kernels::ParseKvFormat, then CheckCacheFormat.
absl::StatusOr<kernels::KvFormat> ParseCacheFormat(absl::string_view name);

class KvStorage {
 public:
  // InvalidArgument for a (format, head_dim) the format does not support or non-positive sizes.
  static absl::StatusOr<KvStorage> Create(kernels::KvFormat format, int num_layers,
                                          int num_kv_heads, int head_dim, int block_size,
                                          int32_t num_blocks);

  int64_t tile_bytes() const { return tile_bytes_; }  // block_size · bytes per vector
  int64_t block_bytes() const { return tile_bytes_ * 2 * num_kv_heads_; }  // one layer
  int64_t layer_bytes() const { return block_bytes() * num_blocks_; }
  int64_t total_bytes() const { return layer_bytes() * num_layers_; }
  // Byte offset of a tile from the start of the storage buffer. Arguments must be in range
  // (MOE_CHECK): they come from the block manager, not from input.
  int64_t TileOffset(int layer, int32_t block, int kv_head, kernels::KvRole role) const;

 private:
  KvStorage() = default;
  int num_layers_ = 0;
  int num_kv_heads_ = 0;
  int32_t num_blocks_ = 0;
  int64_t tile_bytes_ = 0;
};

}  // namespace moe::engine
