// The random-weight test model: a small Qwen3-MoE-architecture checkpoint with random weights and
// a byte-level BPE tokenizer trained on a built-in corpus, written in Hugging Face format, for
// tests and benchmarks that need a model of a given shape with no download. Deterministic from
// the seed. (The product's default is the trained model: engine/trained_model.h.)
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace moe::engine {

// Writes config.json, generation_config.json, model.safetensors (bf16), tokenizer.json and
// tokenizer_config.json into `dir` (created if needed). The weights are random: the text it
// generates is fluent only in the tokenizer's sense. Internal on a write failure. head_dim other
// than the default 32 makes a variant (kv-quality uses 128 for the split TurboQuant formats).
absl::Status WriteDefaultModel(const std::string& dir, uint64_t seed = 20261121, int head_dim = 32);

// The same shape as a Qwen3.5-MoE hybrid (layers 0 and 2 GatedDeltaNet, 1 and 3 gated full
// attention, a shared expert), written the way real Qwen3.5 checkpoints are: a composite
// config.json with text_config, tensors under model.language_model., fused 3-D experts, and a
// vision-tower and an MTP tensor that the engine skips. For tests of the recurrent state.
absl::Status WriteHybridModel(const std::string& dir, uint64_t seed = 20261127);

// The same shape as an LFM2-MoE short-conv hybrid (layers 0 and 2 short convolutions, 1 and 3
// full attention, layer 0 a dense FFN, sigmoid routing with a random expert_bias, tied
// embeddings), with lfm2_moe's config keys and tensor names. For tests of the conv state.
absl::Status WriteLfm2Model(const std::string& dir, uint64_t seed = 20261128);

// The default model's tokenizer alone (tokenizer.json, tokenizer_config.json: about 1,000 tokens,
// ChatML), for a model of another shape written elsewhere (moe-bench --serve_dir). A model whose
// vocabulary is larger can still be served: ids past the tokenizer's decode to no text.
absl::Status WriteDefaultTokenizer(const std::string& dir);

// The same model with weights constructed so that greedy decoding emits `script` and then
// <|im_end|>, for any prompt whose last token is not a piece of the script (tests that need a known output, e.g. a tool call). The script's pieces
// become added tokens of the tokenizer. InvalidArgument when the script is empty or too long
// (more than ~250 pieces of 4+ bytes).
absl::Status WriteScriptedModel(const std::string& dir, const std::string& script);

}  // namespace moe::engine
