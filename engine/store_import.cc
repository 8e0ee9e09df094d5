// ImportOptionsFor: expert names from weights.h's ExpertNames, the rest dense.
#include "engine/store_import.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/weights.h"

namespace moe::engine {

absl::StatusOr<store::ImportOptions> ImportOptionsFor(const ModelConfig& config,
                                                      const store::Checkpoint& checkpoint) {
  store::ImportOptions o;
  absl::flat_hash_set<std::string> expert_tensors;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (!config.IsSparseLayer(l)) continue;
    for (int64_t e = 0; e < config.num_experts; ++e) {
      store::ExpertTensorNames names = ExpertNames(config, l, e);
      expert_tensors.insert({names.gate, names.up, names.down});
      o.experts.push_back(std::move(names));
    }
  }
  if (o.experts.empty()) {
    return absl::InvalidArgumentError("config.json describes no sparse layers: nothing to import");
  }
  for (const auto& [name, info] : checkpoint.tensors()) {
    if (!expert_tensors.contains(name)) o.dense_tensors.push_back(name);
  }
  // The embedding is a table rows are gathered from, not a matrix product: it keeps its dtype
  // (the CUDA gather reads dense tables only), and so does a lm head tied to it.
  o.dense_full_precision.push_back("model.embed_tokens.weight");
  // Routers stay in full precision when dense weights are quantized (ARCHITECTURE.md: formats).
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string block = absl::StrCat("model.layers.", l, ".", config.arch.moe_block, ".");
    o.dense_full_precision.push_back(block + "gate.weight");
    o.dense_full_precision.push_back(block + "shared_expert_gate.weight");
  }
  return o;
}

}  // namespace moe::engine
