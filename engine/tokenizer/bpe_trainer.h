// A small deterministic byte-level BPE trainer for the project's built-in default model.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::engine {

// Trains byte-level BPE on `corpus` and returns a complete Hugging Face tokenizer.json: NFC
// normalizer, the Qwen2 Split + ByteLevel pre-tokenizer, a BPE model whose ids 0..255 are the
// single bytes followed by learned merges, `special_tokens` as special added tokens after them,
// and the ByteLevel decoder. Tokenizer::FromJson loads it, and so does HF tokenizers.
//
// `vocab_size` counts bytes, merges and special tokens. Training stops earlier when no pair occurs
// twice, so the result may be smaller. Ties between equally frequent pairs go to the pair whose
// (left bytes, right bytes) sort first, so the output depends only on the inputs.
// InvalidArgument: corpus or a special token not UTF-8, an empty or repeated special token, or
// vocab_size < 256 + special_tokens.size().
absl::StatusOr<std::string> TrainTokenizerJson(absl::string_view corpus, int vocab_size,
                                               const std::vector<std::string>& special_tokens);

// A tokenizer_config.json with a ChatML chat_template (system/user/assistant turns and the
// generation prompt), `eos_token` and `pad_token`, and no BOS.
std::string ChatMlTokenizerConfigJson(absl::string_view eos_token = "<|im_end|>",
                                      absl::string_view pad_token = "<|endoftext|>");

// A few KB of English prose and code written for this project, to train the default tokenizer.
absl::string_view DefaultCorpus();

}  // namespace moe::engine
