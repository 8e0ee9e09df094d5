// A golden fixture's reference (tests/golden/fixtures/<arch>/, written by make_fixtures.py):
// transformers' prompt, greedy continuation and fp32 logits of every position, and how a run's
// logits compare with them. Shared by the store golden test and the weight-quality tool; the
// including target defines MOE_SOURCE_DIR.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "expertstore/safetensors.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"

namespace moe::testing {

// The backend a golden binary checks: CUDA in the *_gpu_test targets (MOE_GOLDEN_ON_CUDA), else
// the CPU.
inline kernels::BackendKind GoldenBackendKind() {
#if MOE_GOLDEN_ON_CUDA
  return kernels::BackendKind::kCuda;
#else
  return kernels::BackendKind::kCpu;
#endif
}

inline std::string FixtureDir(const std::string& arch) {
  return std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/" + arch;
}

struct Reference {
  std::vector<int32_t> tokens;  // prompt + greedy continuation
  size_t prompt_len = 0;
  std::vector<float> logits;  // [tokens, V]
  int64_t vocab = 0;
};

// `logits_file`: another reference's logits in the same format (fp8_loader/expected_logits...).
inline Reference LoadReference(const std::string& arch,
                               const std::string& logits_file = "expected_logits.safetensors") {
  Reference r;
  std::ifstream in(FixtureDir(arch) + "/expected.json");
  const auto j = nlohmann::json::parse(in);
  r.tokens = j["prompt_ids"].get<std::vector<int32_t>>();
  r.prompt_len = r.tokens.size();
  for (int32_t t : j["greedy_ids"].get<std::vector<int32_t>>()) r.tokens.push_back(t);
  auto file = store::MappedFile::Open(FixtureDir(arch) + "/" + logits_file);
  uint64_t header = 0;
  std::memcpy(&header, (*file)->data(), 8);
  const auto h = nlohmann::json::parse((*file)->data() + 8, (*file)->data() + 8 + header);
  r.vocab = h["logits"]["shape"][1].get<int64_t>();
  const uint64_t begin = h["logits"]["data_offsets"][0].get<uint64_t>();
  r.logits.resize(r.tokens.size() * r.vocab);
  std::memcpy(r.logits.data(), (*file)->data() + 8 + header + begin, r.logits.size() * 4);
  return r;
}

// Logits of one prefill of ref.tokens (every position) against the reference: the max absolute
// error over the largest reference logit, and the teacher-forced greedy agreement over the
// continuation positions.
struct PrefillMatch {
  double max_err = 0, max_ref = 0;
  bool any_nan = false;
  int agree = 0, total = 0;
  double max_rel() const { return max_err / max_ref; }
};

inline PrefillMatch ComparePrefill(const std::vector<float>& logits, const Reference& ref) {
  PrefillMatch m;
  for (size_t i = 0; i < logits.size(); ++i) {
    m.any_nan = m.any_nan || std::isnan(logits[i]);
    m.max_err = std::max(m.max_err, std::abs(double(logits[i]) - ref.logits[i]));
    m.max_ref = std::max(m.max_ref, std::abs(double(ref.logits[i])));
  }
  for (size_t p = ref.prompt_len - 1; p + 1 < ref.tokens.size(); ++p) {
    const float* row = logits.data() + p * ref.vocab;
    m.agree += std::max_element(row, row + ref.vocab) - row == ref.tokens[p + 1];
    ++m.total;
  }
  return m;
}

}  // namespace moe::testing
