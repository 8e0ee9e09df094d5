// Tokenizer construction from a TokenizerSpec, and the encode/decode pipelines.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/normalize.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/unicode.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {
namespace {

enum IdKind : uint8_t { kUnused = 0, kNormal = 1, kAdded = 2, kSpecial = 3 };

// A vocab entry in tokenizer.json spells bytes with GPT-2's byte-level characters. Entries with
// other characters cannot be produced by the byte-level pre-tokenizer; they keep their UTF-8.
std::string ByteLevelToBytes(absl::string_view token) {
  absl::StatusOr<std::u32string> cps = DecodeUtf8(token);
  if (!cps.ok()) return std::string(token);
  std::string bytes;
  for (char32_t cp : *cps) {
    std::optional<uint8_t> b = CharToByte(cp);
    if (!b) return std::string(token);
    bytes.push_back(static_cast<char>(*b));
  }
  return bytes;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& tokenizer_json) {
  MOE_ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(tokenizer_json));
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->nfc_ = spec.nfc;
  tok->split_ = spec.split;
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : spec.added_tokens) max_id = std::max(max_id, t.id);
  tok->token_bytes_.resize(max_id + 1);
  tok->id_kind_.assign(max_id + 1, kUnused);

  std::vector<std::pair<std::string, int32_t>> byte_vocab;
  byte_vocab.reserve(spec.vocab.size());
  for (const auto& [token, id] : spec.vocab) {
    if (tok->id_kind_[id] != kUnused) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: vocab id ", id, " repeated"));
    }
    tok->id_kind_[id] = kNormal;
    tok->token_bytes_[id] = ByteLevelToBytes(token);
    tok->token_ids_.emplace(token, id);
    byte_vocab.emplace_back(tok->token_bytes_[id], id);
  }
  std::vector<std::pair<std::string, std::string>> byte_merges;
  byte_merges.reserve(spec.merges.size());
  for (const auto& [left, right] : spec.merges) {
    byte_merges.emplace_back(ByteLevelToBytes(left), ByteLevelToBytes(right));
  }
  MOE_ASSIGN_OR_RETURN(tok->bpe_, BpeModel::Create(byte_vocab, byte_merges, spec.ignore_merges));

  // Added tokens decode to their literal content, even when they share an id with the vocab.
  for (const AddedToken& t : spec.added_tokens) {
    tok->id_kind_[t.id] = t.special ? kSpecial : kAdded;
    tok->token_bytes_[t.id] = t.content;
    tok->token_ids_[t.content] = t.id;
    tok->added_first_byte_[static_cast<uint8_t>(t.content[0])] = true;
  }
  tok->added_tokens_ = std::move(spec.added_tokens);
  std::stable_sort(
      tok->added_tokens_.begin(), tok->added_tokens_.end(),
      [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  // The built-in template parses (a unit test renders it), so this cannot fail.
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Compile(std::string(ChatMlTemplate()), "", "");
  MOE_CHECK(chat.ok());
  tok->chat_template_ = *std::move(chat);
  return tok;
}

size_t Tokenizer::MatchAddedToken(absl::string_view text, bool allow_special, int32_t* id) const {
  if (!added_first_byte_[static_cast<uint8_t>(text[0])]) return 0;
  for (const AddedToken& t : added_tokens_) {  // longest first, so the first hit is the longest
    if ((allow_special || !t.special) && absl::StartsWith(text, t.content)) {
      *id = t.id;
      return t.content.size();
    }
  }
  return 0;
}

absl::Status Tokenizer::EncodeText(absl::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return absl::OkStatus();
  MOE_ASSIGN_OR_RETURN(std::u32string cps, DecodeUtf8(text));
  if (nfc_) cps = ToNfc(cps);
  for (const std::string& word : PreTokenize(cps, split_)) bpe_->EncodeWord(word, ids);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t segment_start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t id = 0;
    size_t n = MatchAddedToken(text.substr(i), allow_special, &id);
    if (n == 0) {
      ++i;
      continue;
    }
    MOE_RETURN_IF_ERROR(EncodeText(text.substr(segment_start, i - segment_start), &ids));
    ids.push_back(id);
    i += n;
    segment_start = i;
  }
  MOE_RETURN_IF_ERROR(EncodeText(text.substr(segment_start), &ids));
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    std::optional<absl::string_view> token = TokenBytes(id);
    if (!token) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary (",
                                                     "vocab_size ", vocab_size(), ")"));
    }
    if (skip_special && IsSpecial(id)) continue;
    bytes.append(token->data(), token->size());
  }
  return Utf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  auto it = token_ids_.find(token);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<absl::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || id_kind_[id] == kUnused) return std::nullopt;
  return absl::string_view(token_bytes_[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_kind_[id] == kSpecial;
}

}  // namespace moe::engine
