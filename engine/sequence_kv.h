// SequenceKv: one sequence's keys and values in fp32, contiguous per layer (the golden tests and
// tools; the engine uses the paged cache, engine/paged_kv.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "kernels/backend.h"

namespace moe::engine {

// Keys and values of one sequence for every layer, positions [0, length()), contiguous.
class SequenceKv {
 public:
  // ResourceExhausted when the backend cannot hold `capacity` positions.
  static absl::StatusOr<std::unique_ptr<SequenceKv>> Create(const ModelConfig& config,
                                                           kernels::Backend& backend,
                                                           int64_t capacity);
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  // Bytes one position takes in every layer (keys and values).
  static int64_t BytesPerToken(const ModelConfig& config);

  // Backend memory of `layer`: [capacity, NKV, D] keys, values.
  float* keys(int64_t layer) const { return k_[layer].f32(); }
  float* values(int64_t layer) const { return v_[layer].f32(); }
  // The sequence's recurrent state (ForwardItem::state), zeroed at creation; null when the model
  // has no linear-attention layers.
  float* state() const { return state_.f32(); }
  // Counts n more positions as cached: the model calls it once a step's KV write succeeded.
  void Advance(int64_t n);

 private:
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  std::vector<kernels::Buffer> k_, v_;  // per layer [capacity, NKV, D]
  kernels::Buffer state_;
};

}  // namespace moe::engine
