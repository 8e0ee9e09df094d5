// A golden fixture's reference (tests/golden/fixtures/<arch>/, written by make_fixtures.py):
// transformers' prompt, greedy continuation and fp32 logits of every position. Shared by the
// store golden test and the weight-quality tool; the including target defines MOE_SOURCE_DIR.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "expertstore/safetensors.h"
#include "nlohmann/json.hpp"

namespace moe::testing {

inline std::string FixtureDir(const std::string& arch) {
  return std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/" + arch;
}

struct Reference {
  std::vector<int32_t> tokens;  // prompt + greedy continuation
  size_t prompt_len = 0;
  std::vector<float> logits;  // [tokens, V]
  int64_t vocab = 0;
};

inline Reference LoadReference(const std::string& arch) {
  Reference r;
  std::ifstream in(FixtureDir(arch) + "/expected.json");
  const auto j = nlohmann::json::parse(in);
  r.tokens = j["prompt_ids"].get<std::vector<int32_t>>();
  r.prompt_len = r.tokens.size();
  for (int32_t t : j["greedy_ids"].get<std::vector<int32_t>>()) r.tokens.push_back(t);
  auto file = store::MappedFile::Open(FixtureDir(arch) + "/expected_logits.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, (*file)->data(), 8);
  const auto h = nlohmann::json::parse((*file)->data() + 8, (*file)->data() + 8 + header);
  r.vocab = h["logits"]["shape"][1].get<int64_t>();
  const uint64_t begin = h["logits"]["data_offsets"][0].get<uint64_t>();
  r.logits.resize(r.tokens.size() * r.vocab);
  std::memcpy(r.logits.data(), (*file)->data() + 8 + header + begin, r.logits.size() * 4);
  return r;
}

}  // namespace moe::testing
