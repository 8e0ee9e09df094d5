// The built-in default model that moe-worker and moe-generate serve when --model is left at its
// default: a small Qwen3-MoE trained by the project on the King James Bible
// (tests/default_model/README.md tells how, and how well). Its files, committed in
// engine/default_model/, are compiled into the binaries that link moe_trained_model, so a
// fresh machine or a container serves it with no download and no source tree.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace moe::engine {

// Writes config.json, generation_config.json, model.safetensors, tokenizer.json and
// tokenizer_config.json into `dir` (created if needed); config.json last, so a directory with
// it is complete. Internal on a write failure.
absl::Status WriteTrainedModel(const std::string& dir);

}  // namespace moe::engine
