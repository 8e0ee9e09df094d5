// Offsets of KV tiles in the storage buffer.
#include "engine/kv_storage.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {

absl::Status CheckCacheFormat(kernels::KvFormat format) {
  switch (format) {
    case kernels::KvFormat::kTqProd1:
    case kernels::KvFormat::kTqProd2:
    case kernels::KvFormat::kTqProd3:
    case kernels::KvFormat::kTqProd4:
      return absl::InvalidArgumentError(absl::StrCat(
          "KV format ", kernels::KvFormatName(format), " is a keys-only test mode, not a KV cache ",
          "format; the cache takes bf16, fp8_e4m3, tq4, tq3.5, tq3, tq2.5 or tq2"));
    default:
      return absl::OkStatus();
  }
}

absl::StatusOr<kernels::KvFormat> ParseCacheFormat(absl::string_view name) {
  MOE_ASSIGN_OR_RETURN(const kernels::KvFormat format, kernels::ParseKvFormat(name));
  MOE_RETURN_IF_ERROR(CheckCacheFormat(format));
  return format;
}

absl::StatusOr<KvStorage> KvStorage::Create(kernels::KvFormat format, int num_layers,
                                            int num_kv_heads, int head_dim, int block_size,
                                            int32_t num_blocks) {
  if (num_layers <= 0 || num_kv_heads <= 0 || block_size <= 0 || num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV storage needs positive sizes: num_layers ", num_layers, ", num_kv_heads ",
                     num_kv_heads, ", block_size ", block_size, ", num_blocks ", num_blocks));
  }
  MOE_ASSIGN_OR_RETURN(const int64_t per_vector, kernels::KvBytesPerVector(format, head_dim));
  KvStorage storage;
  storage.num_layers_ = num_layers;
  storage.num_kv_heads_ = num_kv_heads;
  storage.num_blocks_ = num_blocks;
  storage.tile_bytes_ = per_vector * block_size;
  return storage;
}

int64_t KvStorage::TileOffset(int layer, int32_t block, int kv_head, kernels::KvRole role) const {
  MOE_CHECK(layer >= 0 && layer < num_layers_ && block >= 0 && block < num_blocks_ &&
            kv_head >= 0 && kv_head < num_kv_heads_)
      << "tile (layer " << layer << ", block " << block << ", kv-head " << kv_head << ")";
  const int64_t tile = ((int64_t{layer} * num_blocks_ + block) * num_kv_heads_ + kv_head) * 2 +
                       (role == kernels::KvRole::kValue ? 1 : 0);
  return tile * tile_bytes_;
}

}  // namespace moe::engine
