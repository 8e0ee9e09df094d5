// tokenizer.json -> TokenizerSpec. nlohmann-json throws; every access is inside one try block
// whose exceptions become InvalidArgument.
#include "engine/tokenizer/tokenizer_json.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {
using nlohmann::json;

// Ids above this are rejected so a hostile file cannot make us allocate huge id tables (the
// largest real vocabularies are ~260k).
constexpr int64_t kMaxTokenId = (int64_t{1} << 21) - 1;

bool IsNull(const json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: unsupported ", field, ": ", what));
}

absl::StatusOr<bool> ParseNormalizer(const json& root) {
  if (IsNull(root, "normalizer")) return false;
  const json& n = root["normalizer"];
  std::string type = TypeOf(n);
  if (type == "NFC") return true;
  if (type == "Sequence") {
    for (const json& member : n.at("normalizers")) {
      if (TypeOf(member) != "NFC") return Unsupported("normalizer", TypeOf(member));
    }
    return !n.at("normalizers").empty();
  }
  return Unsupported("normalizer", type);
}

absl::Status CheckByteLevel(const json& b, bool want_regex) {
  if (b.value("add_prefix_space", false)) return Unsupported("ByteLevel", "add_prefix_space true");
  if (b.value("use_regex", true) != want_regex) {
    return Unsupported("pre_tokenizer", want_regex ? "ByteLevel without use_regex and no Split"
                                                   : "ByteLevel use_regex true after a Split");
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitPattern> ParsePreTokenizer(const json& root) {
  if (IsNull(root, "pre_tokenizer")) return Unsupported("pre_tokenizer", "null");
  const json& p = root["pre_tokenizer"];
  if (TypeOf(p) == "ByteLevel") {
    MOE_RETURN_IF_ERROR(CheckByteLevel(p, /*want_regex=*/true));
    return SplitPattern::kGpt2;
  }
  if (TypeOf(p) != "Sequence") return Unsupported("pre_tokenizer", TypeOf(p));
  const json& seq = p.at("pretokenizers");
  if (seq.size() != 2 || TypeOf(seq[0]) != "Split" || TypeOf(seq[1]) != "ByteLevel") {
    return Unsupported("pre_tokenizer", "Sequence other than [Split, ByteLevel]");
  }
  const json& split = seq[0];
  const json& pattern = split.at("pattern");
  std::string regex = pattern.contains("Regex") ? pattern["Regex"].get<std::string>() : "";
  if (regex != SplitPatternRegex(SplitPattern::kQwen2)) {
    return Unsupported("Split pattern", regex.empty() ? pattern.dump() : regex);
  }
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    return Unsupported("Split", "behavior other than Isolated, or invert");
  }
  MOE_RETURN_IF_ERROR(CheckByteLevel(seq[1], /*want_regex=*/false));
  return SplitPattern::kQwen2;
}

absl::Status ParseModel(const json& root, TokenizerSpec* spec) {
  if (IsNull(root, "model")) return absl::InvalidArgumentError("tokenizer.json: missing 'model'");
  const json& m = root["model"];
  if (m.contains("type") && TypeOf(m) != "BPE") return Unsupported("model type", TypeOf(m));
  if (!m.contains("vocab") || !m["vocab"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab missing or not an object");
  }
  if (!m.contains("merges") || !m["merges"].is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: model.merges missing or not an array");
  }
  if (!IsNull(m, "dropout") && m["dropout"].get<double>() != 0.0) {
    return Unsupported("model", "BPE dropout");
  }
  if (!m.value("continuing_subword_prefix", json("")).is_null() &&
      !m.value("continuing_subword_prefix", json("")).get<std::string>().empty()) {
    return Unsupported("model", "continuing_subword_prefix");
  }
  if (!m.value("end_of_word_suffix", json("")).is_null() &&
      !m.value("end_of_word_suffix", json("")).get<std::string>().empty()) {
    return Unsupported("model", "end_of_word_suffix");
  }
  spec->ignore_merges = m.value("ignore_merges", false);
  for (const auto& [token, id] : m["vocab"].items()) {
    // Not get<int64_t>(): it converts an out-of-range float with undefined behaviour
    // (fuzz_tokenizer_json). An id is an integer JSON number.
    const int64_t value = id.is_number_integer() ? id.get<int64_t>() : -1;
    if (value < 0 || value > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: vocab id ", id.dump(), " of '", token,
                       "' is not an integer in range"));
    }
    spec->vocab.emplace_back(token, static_cast<int32_t>(value));
  }
  for (const json& merge : m["merges"]) {
    if (merge.is_array()) {
      if (merge.size() != 2)
        return absl::InvalidArgumentError("tokenizer.json: merge pair size != 2");
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    std::string text = merge.get<std::string>();
    size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: bad merge '", text, "'"));
    }
    spec->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const json& root, TokenizerSpec* spec) {
  if (IsNull(root, "added_tokens")) return absl::OkStatus();
  for (const json& t : root["added_tokens"]) {
    AddedToken token;
    const json& id_value = t.at("id");
    const int64_t id = id_value.is_number_integer() ? id_value.get<int64_t>() : -1;
    if (id < 0 || id > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: added token id ", id_value.dump(), " out of range"));
    }
    token.id = static_cast<int32_t>(id);
    token.content = t.at("content").get<std::string>();
    token.special = t.value("special", false);
    if (token.content.empty())
      return absl::InvalidArgumentError("tokenizer.json: empty added token");
    if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false)) {
      return Unsupported("added token",
                         absl::StrCat(token.content, " with lstrip/rstrip/single_word"));
    }
    // normalized: true tokens would be matched after normalization in HF; for the NFC-stable
    // ASCII markers real models use, matching them on the raw text gives the same result.
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status ParseAll(const json& root, TokenizerSpec* spec) {
  MOE_ASSIGN_OR_RETURN(spec->nfc, ParseNormalizer(root));
  MOE_ASSIGN_OR_RETURN(spec->split, ParsePreTokenizer(root));
  MOE_RETURN_IF_ERROR(ParseModel(root, spec));
  MOE_RETURN_IF_ERROR(ParseAddedTokens(root, spec));
  if (!IsNull(root, "decoder") && TypeOf(root["decoder"]) != "ByteLevel") {
    return Unsupported("decoder", TypeOf(root["decoder"]));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(const std::string& tokenizer_json) {
  TokenizerSpec spec;
  try {
    json root = json::parse(tokenizer_json);
    if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
    MOE_RETURN_IF_ERROR(ParseAll(root, &spec));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  return spec;
}

}  // namespace moe::engine
