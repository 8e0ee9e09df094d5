// PagedKv: the paged KV buffer and the codecs of each (layer, kv-head, K|V).
#include "engine/paged_kv.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {

absl::StatusOr<std::unique_ptr<PagedKv>> PagedKv::Create(const ModelConfig& c,
                                                         kernels::Backend& backend,
                                                         kernels::KvFormat format, int block_size,
                                                         int32_t num_blocks, int tail_tokens) {
  if (tail_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_tail_tokens must be >= 0, got ", tail_tokens));
  }
  const int D = static_cast<int>(c.head_dim), NKV = static_cast<int>(c.num_key_value_heads);
  // Every cache format has CUDA kernels (kernels/cuda/paged_kv_write.cu, paged_attention.cu).
  MOE_RETURN_IF_ERROR(CheckCacheFormat(format));
  MOE_ASSIGN_OR_RETURN(
      KvStorage storage,
      KvStorage::Create(format, static_cast<int>(c.NumKvLayers()), NKV, D, block_size, num_blocks));
  auto kv = std::unique_ptr<PagedKv>(new PagedKv(storage));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) kv->kv_layer_.push_back(c.KvLayerIndex(l));
  kv->format_ = format;
  kv->block_size_ = block_size;
  kv->num_blocks_ = num_blocks;
  kv->num_kv_heads_ = NKV;
  kv->head_dim_ = D;
  kv->tail_tokens_ = tail_tokens;
  MOE_ASSIGN_OR_RETURN(kv->buffer_, backend.Allocate(static_cast<size_t>(storage.total_bytes())));
  kv->codecs_.resize(c.num_hidden_layers);
  kv->codec_ptrs_.resize(c.num_hidden_layers);
  const bool split = format == kernels::KvFormat::kTq3p5 || format == kernels::KvFormat::kTq2p5;
  if (!split) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (kv->kv_layer_[l] >= 0) MOE_RETURN_IF_ERROR(kv->EnsureCodecs(l, nullptr, nullptr, 0));
    }
  }
  return kv;
}

absl::Status PagedKv::EnsureCodecs(int64_t layer, const float* k, const float* v, int64_t T) {
  if (!codecs_[layer].empty()) return absl::OkStatus();
  const bool split = format_ == kernels::KvFormat::kTq3p5 || format_ == kernels::KvFormat::kTq2p5;
  std::vector<kernels::KvCodec> codecs;
  std::vector<float> sample(split ? T * head_dim_ : 0);
  for (int h = 0; h < num_kv_heads_; ++h) {
    for (int role = 0; role < 2; ++role) {
      kernels::KvCodecOptions o;
      o.format = format_;
      o.head_dim = head_dim_;
      o.role = role == 0 ? kernels::KvRole::kKey : kernels::KvRole::kValue;
      o.layer = static_cast<int>(layer);
      o.kv_head = h;
      if (split) {
        const float* x = role == 0 ? k : v;
        for (int64_t t = 0; t < T; ++t) {
          std::copy_n(x + (t * num_kv_heads_ + h) * head_dim_, head_dim_,
                      sample.data() + t * head_dim_);
        }
        o.outlier_channels = kernels::SelectOutlierChannels(sample.data(), T, head_dim_, 32);
      }
      MOE_ASSIGN_OR_RETURN(kernels::KvCodec codec, kernels::KvCodec::Create(o));
      codecs.push_back(std::move(codec));
    }
  }
  codecs_[layer] = std::move(codecs);
  codec_ptrs_[layer].clear();
  for (const kernels::KvCodec& codec : codecs_[layer]) codec_ptrs_[layer].push_back(&codec);
  return absl::OkStatus();
}

int64_t PagedKv::TailBytes(const ModelConfig& c, int tail_tokens) {
  return c.NumKvLayers() * tail_tokens * c.num_key_value_heads * 2 * c.head_dim *
         static_cast<int64_t>(sizeof(uint16_t));
}

kernels::PagedKvLayer PagedKv::Layer(int64_t layer, absl::Span<const int32_t> block_table,
                                     void* tail) const {
  kernels::PagedKvLayer kv;
  MOE_CHECK(kv_layer_[layer] >= 0) << "PagedKv::Layer: layer " << layer << " keeps no KV";
  kv.layer_base =
      static_cast<uint8_t*>(buffer_.data()) +
      storage_.TileOffset(static_cast<int>(kv_layer_[layer]), 0, 0, kernels::KvRole::kKey);
  kv.block_stride = storage_.block_bytes();
  kv.tile_bytes = storage_.tile_bytes();
  kv.block_size = block_size_;
  kv.block_table = block_table.data();
  kv.codecs = codec_ptrs_[layer].data();
  kv.num_kv_heads = num_kv_heads_;
  kv.head_dim = head_dim_;
  if (tail_tokens_ > 0) {
    MOE_CHECK(tail != nullptr) << "PagedKv::Layer: the cache has a tail and the sequence none";
    kv.tail = static_cast<uint16_t*>(tail) +
              kv_layer_[layer] * tail_tokens_ * num_kv_heads_ * 2 * head_dim_;
    kv.tail_tokens = tail_tokens_;
  }
  return kv;
}

}  // namespace moe::engine
