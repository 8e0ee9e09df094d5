// Test helper: small hand-made tokenizer.json documents (all 256 byte tokens plus given merges).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace moe::engine::testing {

// Byte-level spelling of raw bytes, as tokenizer.json writes tokens.
inline std::string ByteLevelText(const std::string& bytes) {
  std::string out;
  for (char b : bytes) AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &out);
  return out;
}

struct TinyAdded {
  std::string content;
  bool special;
};

// Ids: 0..255 are the bytes, then one token per merge (in order), then the added tokens.
// Merges are written as [a, b] pairs when `pair_form`, else as "a b" strings.
inline nlohmann::json TinyTokenizerJson(
    const std::vector<std::pair<std::string, std::string>>& merges,
    const std::vector<TinyAdded>& added = {}, bool pair_form = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelText(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  int next_id = 256;
  for (const auto& [l, r] : merges) {
    std::string lt = ByteLevelText(l), rt = ByteLevelText(r);
    if (!vocab.contains(lt + rt)) vocab[lt + rt] = next_id++;
    if (pair_form) {
      merge_list.push_back({lt, rt});
    } else {
      merge_list.push_back(lt + " " + rt);
    }
  }
  nlohmann::json added_list = nlohmann::json::array();
  for (const TinyAdded& a : added) {
    added_list.push_back({{"id", next_id++},
                          {"content", a.content},
                          {"special", a.special},
                          {"normalized", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"single_word", false}});
  }
  nlohmann::json byte_level = {{"type", "ByteLevel"},
                               {"add_prefix_space", false},
                               {"trim_offsets", false},
                               {"use_regex", false}};
  return {
      {"version", "1.0"},
      {"added_tokens", added_list},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", SplitPatternRegex(SplitPattern::kQwen2)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}}},
      {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
  };
}

}  // namespace moe::engine::testing
