// Byte-level BPE training: count pre-tokenized words once, then repeatedly merge the most
// frequent adjacent pair. Recounting every round is O(merges * corpus) -- fine for a few KB.
#include "engine/tokenizer/bpe_trainer.h"

#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/normalize.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/unicode.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {
using nlohmann::ordered_json;

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

std::string ByteLevel(absl::string_view bytes) {
  std::string out;
  for (char b : bytes) AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &out);
  return out;
}

ordered_json ByteLevelJson() {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", false},
          {"use_regex", false}};
}

void MergeInto(Word* word, int32_t left, int32_t right, int32_t merged) {
  std::vector<int32_t>& s = word->symbols;
  size_t out = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
      s[out++] = merged;
      ++i;
    } else {
      s[out++] = s[i];
    }
  }
  s.resize(out);
}

absl::Status CheckSpecials(const std::vector<std::string>& special_tokens) {
  std::set<std::string> seen;
  for (const std::string& t : special_tokens) {
    if (t.empty()) return absl::InvalidArgumentError("special token is empty");
    if (!DecodeUtf8(t).ok()) return absl::InvalidArgumentError("special token is not UTF-8");
    if (!seen.insert(t).second) {
      return absl::InvalidArgumentError(absl::StrCat("special token '", t, "' repeated"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> TrainTokenizerJson(absl::string_view corpus, int vocab_size,
                                               const std::vector<std::string>& special_tokens) {
  MOE_RETURN_IF_ERROR(CheckSpecials(special_tokens));
  const int64_t min_size = 256 + static_cast<int64_t>(special_tokens.size());
  if (vocab_size < min_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size, " < 256 bytes + ",
                                                   special_tokens.size(), " specials"));
  }
  absl::StatusOr<std::u32string> text = DecodeUtf8(corpus);
  if (!text.ok()) return base::Annotate(text.status(), "training corpus");

  std::map<std::string, int64_t> counts;  // ordered: word order must not depend on hashing
  for (std::string& w : PreTokenize(ToNfc(*text), SplitPattern::kQwen2)) ++counts[std::move(w)];
  std::vector<Word> words;
  for (const auto& [w, n] : counts) {
    Word word{{}, n};
    for (char b : w) word.symbols.push_back(static_cast<uint8_t>(b));
    words.push_back(std::move(word));
  }
  std::vector<std::string> tokens;
  std::map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    ids[tokens.back()] = b;
  }
  std::vector<std::pair<int32_t, int32_t>> merges;
  const int64_t max_learned = vocab_size - special_tokens.size();
  while (static_cast<int64_t>(tokens.size()) < max_learned) {
    absl::flat_hash_map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i)
        pairs[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    }
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 1;  // a pair seen once teaches nothing
    for (const auto& [pair, n] : pairs) {
      auto key = [&](std::pair<int32_t, int32_t> p) {
        return std::tie(tokens[p.first], tokens[p.second]);
      };
      if (n > best_count || (n == best_count && best.first >= 0 && key(pair) < key(best))) {
        best = pair;
        best_count = n;
      }
    }
    if (best.first < 0) break;
    std::string merged = tokens[best.first] + tokens[best.second];
    auto [it, added] = ids.emplace(merged, static_cast<int32_t>(tokens.size()));
    if (added) tokens.push_back(merged);  // the same bytes can arise from two merge paths
    merges.push_back(best);
    for (Word& w : words) MergeInto(&w, best.first, best.second, it->second);
  }

  try {
    ordered_json vocab = ordered_json::object();
    for (size_t id = 0; id < tokens.size(); ++id) vocab[ByteLevel(tokens[id])] = id;
    ordered_json merge_list = ordered_json::array();
    for (const auto& [l, r] : merges)
      merge_list.push_back({ByteLevel(tokens[l]), ByteLevel(tokens[r])});
    ordered_json added = ordered_json::array();
    for (size_t i = 0; i < special_tokens.size(); ++i) {
      added.push_back({{"id", tokens.size() + i},
                       {"content", special_tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    ordered_json split = {{"type", "Split"},
                          {"pattern", {{"Regex", SplitPatternRegex(SplitPattern::kQwen2)}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
    ordered_json root = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, ByteLevelJson()}}}},
        {"post_processor", ByteLevelJson()},
        {"decoder", ByteLevelJson()},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", ""},
          {"end_of_word_suffix", ""},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", merge_list}}}};
    return root.dump(1);
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(absl::StrCat("writing tokenizer.json: ", e.what()));
  }
}

std::string ChatMlTokenizerConfigJson(absl::string_view eos_token, absl::string_view pad_token) {
  ordered_json config = {{"add_bos_token", false},
                         {"bos_token", nullptr},
                         {"eos_token", std::string(eos_token)},
                         {"pad_token", std::string(pad_token)},
                         {"chat_template", std::string(ChatMlTemplate())},
                         {"clean_up_tokenization_spaces", false},
                         {"tokenizer_class", "PreTrainedTokenizerFast"}};
  // dump() throws only on invalid UTF-8; replace such bytes rather than fail.
  return config.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace moe::engine
