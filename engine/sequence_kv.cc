// SequenceKv: per-layer fp32 key and value buffers of one sequence.
#include "engine/sequence_kv.h"

#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {

absl::StatusOr<std::unique_ptr<SequenceKv>> SequenceKv::Create(const ModelConfig& c,
                                                               kernels::Backend& backend,
                                                               int64_t capacity) {
  auto kv = std::unique_ptr<SequenceKv>(new SequenceKv());
  kv->capacity_ = capacity;
  const size_t bytes = static_cast<size_t>(capacity * c.num_key_value_heads * c.head_dim) * 4;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kv->k_.emplace_back();
    kv->v_.emplace_back();
    if (c.KvLayerIndex(l) < 0) continue;  // no KV: a recurrent or conv state instead
    MOE_ASSIGN_OR_RETURN(kv->k_.back(), backend.Allocate(bytes));
    MOE_ASSIGN_OR_RETURN(kv->v_.back(), backend.Allocate(bytes));
  }
  int64_t state_floats = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    state_floats += c.StateFloats(l);
  }
  if (state_floats > 0) {
    MOE_ASSIGN_OR_RETURN(kv->state_, backend.Allocate(state_floats * sizeof(float)));
    backend.Zero(kv->state_.data(), kv->state_.bytes());
  }
  return kv;
}

int64_t SequenceKv::BytesPerToken(const ModelConfig& c) {
  return 2 * c.NumKvLayers() * c.num_key_value_heads * c.head_dim *
         static_cast<int64_t>(sizeof(float));
}

void SequenceKv::Advance(int64_t n) {
  MOE_CHECK(n >= 0 && length_ + n <= capacity_)
      << "SequenceKv::Advance: " << length_ << " + " << n << " > capacity " << capacity_;
  length_ += n;
}

}  // namespace moe::engine
