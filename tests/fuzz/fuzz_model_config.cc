// Fuzz target: config.json and generation_config.json (split at a NUL byte) through
// engine::ParseModelConfig. An accepted config must be usable: every layer answers
// IsSparseLayer and SlidingWindow, and the fields the forward pass divides by are positive.
#include <cstdint>

#include "engine/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  const std::vector<std::string> parts = fuzz::SplitInput(data, size, 2);
  auto c = engine::ParseModelConfig(parts[0], parts[1]);
  if (!c.ok()) return 0;
  MOE_FUZZ_CHECK(c->num_hidden_layers > 0 && c->num_attention_heads > 0 && c->head_dim > 0);
  MOE_FUZZ_CHECK(c->num_key_value_heads > 0 &&
                 c->num_attention_heads % c->num_key_value_heads == 0);
  MOE_FUZZ_CHECK(c->num_experts_per_tok >= 1 && c->num_experts_per_tok <= c->num_experts);
  MOE_FUZZ_CHECK(static_cast<int64_t>(c->layer_types.size()) == c->num_hidden_layers);
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    MOE_FUZZ_CHECK(c->SlidingWindow(l) >= 0);
    (void)c->IsSparseLayer(l);
  }
  return 0;
}
