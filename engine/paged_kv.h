// PagedKv: the paged KV cache's storage in backend memory, laid out by KvStorage, with its codecs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_storage.h"
#include "engine/model_config.h"
#include "kernels/backend.h"
#include "kernels/kvcodec/kv_quant.h"

namespace moe::engine {

// The paged KV cache's storage: one backend buffer laid out by KvStorage
// ([layer][block][kv_head][K, V] tiles in `format`, for the layers that keep KV: a hybrid's
// linear-attention layers have none) and a KvCodec per (layer, kv-head, K|V).
// Block indices come from the block manager (engine/kv_cache.h). The split formats (tq3.5,
// tq2.5) pick their outlier channels per (layer, kv-head, K|V) from the first step that writes
// the layer (its keys/values, post-RoPE), as the spec says; the other formats' codecs are made
// here. Rotation seeds use model_fingerprint "" (kv_rotation.h).
// With a 16-bit tail (tail_tokens W > 0, --kv_tail_tokens) each sequence also keeps, per KV
// layer, a ring of its newest W keys and values in bf16 (kernels/backend.h PagedKvLayer::tail),
// in the per-sequence state after the model's own (ForwardItem::state + Model::state_bytes()):
// every position is still written compressed; attention reads each query's newest W positions
// from the ring (PagedAttentionArgs).
class PagedKv {
 public:
  // InvalidArgument for a format that is no cache format (CheckCacheFormat) or that the model's
  // head_dim does not support; ResourceExhausted when the backend cannot hold num_blocks blocks.
  static absl::StatusOr<std::unique_ptr<PagedKv>> Create(const ModelConfig& config,
                                                         kernels::Backend& backend,
                                                         kernels::KvFormat format, int block_size,
                                                         int32_t num_blocks, int tail_tokens = 0);
  // Bytes of one sequence's tail rings (all KV layers) for W = tail_tokens; 0 when W is 0.
  static int64_t TailBytes(const ModelConfig& config, int tail_tokens);
  kernels::KvFormat format() const { return format_; }
  int tail_tokens() const { return tail_tokens_; }
  int block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  const KvStorage& storage() const { return storage_; }
  // The backend's view of `layer` for a sequence with `block_table` (which must outlive it).
  // The split formats' codecs exist once the layer's first step has run (empty before).
  // `tail`: the sequence's tail rings (TailBytes, backend memory) when tail_tokens() > 0.
  kernels::PagedKvLayer Layer(int64_t layer, absl::Span<const int32_t> block_table,
                              void* tail = nullptr) const;
  // True once the codecs of `layer` are made (always, but for the split formats before the
  // layer's first step).
  bool has_codecs(int64_t layer) const { return !codecs_[layer].empty(); }
  // Makes the codecs of `layer` if not yet made; k, v: [T, NKV, D] in host memory (the split
  // formats' sample). The model calls it on a layer's first step; a caller writing the cache
  // itself (moe-bench) calls it first.
  absl::Status EnsureCodecs(int64_t layer, const float* k, const float* v, int64_t T);

 private:
  explicit PagedKv(KvStorage storage) : storage_(storage) {}

  kernels::KvFormat format_ = kernels::KvFormat::kBf16;
  int block_size_ = 0;
  int32_t num_blocks_ = 0;
  int num_kv_heads_ = 0;
  int head_dim_ = 0;
  int tail_tokens_ = 0;
  KvStorage storage_;
  kernels::Buffer buffer_;
  std::vector<int64_t> kv_layer_;  // per model layer: its slot in the storage, -1: none (linear)
  // Per layer: [NKV][2] codecs (empty until made) and their pointers for the backend.
  std::vector<std::vector<kernels::KvCodec>> codecs_;
  std::vector<std::vector<const kernels::KvCodec*>> codec_ptrs_;
};

}  // namespace moe::engine
