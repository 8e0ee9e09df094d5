// Tokenizer: Hugging Face tokenizer.json (byte-level BPE, NFC, Qwen2/GPT-2 splits) text <-> ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace moe::engine {

class BpeModel;

// Immutable after construction; every const method is thread-safe.
class Tokenizer {
 public:
  // Builds a tokenizer from the text of a tokenizer.json (see tokenizer_json.h for the subset).
  // InvalidArgument: malformed JSON, missing model/vocab/merges, merges naming unknown tokens,
  // duplicate ids. Unimplemented: a normalizer/pre-tokenizer/model outside the subset.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& tokenizer_json);

  // Reads <model_dir>/tokenizer.json (NotFound if absent) and, when present,
  // <model_dir>/tokenizer_config.json for chat_template, eos_token and bos_token
  // (chat_template.jinja is read when the config has no template). The template is compiled
  // here: one that does not parse fails the load (InvalidArgument naming the file, line and
  // column). Without one, the built-in ChatMlTemplate() is used.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromDir(const std::string& model_dir);

  ~Tokenizer();

  // Text -> ids, as HF `tokenizer.encode(text, add_special_tokens=False)`: added tokens are found
  // in the raw text first (leftmost, longest); the text between them is NFC-normalized, split by
  // the pre-tokenizer and BPE-encoded. No BOS/EOS is added. With allow_special false, special
  // added tokens are encoded as plain text (use it for untrusted content). InvalidArgument when
  // `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool allow_special = true) const;

  // Ids -> text. Bytes that do not form UTF-8 become U+FFFD (as HF does). InvalidArgument naming
  // the id when an id is not in the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special = false) const;

  // One past the largest id of the vocab and added tokens (ids in between may be unused).
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }

  // Id of a token written as in tokenizer.json (byte-level form, e.g. "Ġthe", or an added token
  // such as "<|im_end|>"); nullopt when unknown.
  std::optional<int32_t> TokenId(absl::string_view token) const;

  // Raw bytes `id` decodes to (possibly part of a UTF-8 character); nullopt for unknown ids.
  std::optional<absl::string_view> TokenBytes(int32_t id) const;

  // True for added tokens marked "special" (e.g. <|im_end|>), false otherwise and for bad ids.
  bool IsSpecial(int32_t id) const;

  // The model's chat template (ChatMlTemplate() when it ships none, and for FromJson).
  const ChatTemplate& chat_template() const { return *chat_template_; }
  // From tokenizer_config.json via LoadFromDir; nullopt otherwise.
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }

 private:
  Tokenizer() = default;
  absl::Status EncodeText(absl::string_view text, std::vector<int32_t>* ids) const;
  // Length of the longest added token at the start of `text`, its id in *id; 0 if none.
  size_t MatchAddedToken(absl::string_view text, bool allow_special, int32_t* id) const;

  bool nfc_ = false;
  SplitPattern split_ = SplitPattern::kQwen2;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string> token_bytes_;                 // id -> raw bytes
  std::vector<uint8_t> id_kind_;                         // id -> IdKind
  absl::flat_hash_map<std::string, int32_t> token_ids_;  // tokenizer.json spelling -> id
  std::vector<AddedToken> added_tokens_;                 // longest first
  std::array<bool, 256> added_first_byte_{};             // quick reject for MatchAddedToken
  std::optional<ChatTemplate> chat_template_;            // always set (ChatML by default)
  std::optional<std::string> eos_token_;
  std::optional<std::string> bos_token_;
};

}  // namespace moe::engine
