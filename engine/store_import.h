// What moe-import needs from the engine: the tensor names of every expert of a model (from its
// architecture row and config) and which tensors are dense. The importer knows no architecture.
#pragma once

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "expertstore/importer.h"
#include "expertstore/safetensors.h"

namespace moe::engine {

// Import options naming every expert of every sparse layer and every other tensor of `checkpoint`
// as dense; routers (and qwen2_moe's shared-expert gate) stay in full precision.
// InvalidArgument when the config has no sparse layer.
absl::StatusOr<store::ImportOptions> ImportOptionsFor(const ModelConfig& config,
                                                      const store::Checkpoint& checkpoint);

}  // namespace moe::engine
