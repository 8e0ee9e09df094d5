// Golden tests: a backend against transformers 5.17 on tiny random models of every supported
// architecture (fixtures made by make_fixtures.py on the GPU machine). Built twice: golden_test
// on the CPU backend (CI) and golden_gpu_test on CUDA (label gpu, run on the GPU machine).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {

std::string FixtureDir(const std::string& arch) {
  return std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/" + arch;
}

// Max |out - ref| over the tensor divided by max |ref|: relative to the logits' scale, so a
// near-zero logit does not turn rounding into a huge ratio.
double MaxRelError(const float* out, const float* ref, size_t n) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_FALSE(std::isnan(out[i])) << "NaN at " << i;
    max_err = std::max(max_err, std::abs(double(out[i]) - double(ref[i])));
    max_ref = std::max(max_ref, std::abs(double(ref[i])));
  }
  return max_err / max_ref;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#if MOE_GOLDEN_ON_CUDA
    auto backend = kernels::MakeBackend(kernels::BackendKind::kCuda, {});
#else
    auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
#endif
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto model = Model::Load(FixtureDir(GetParam()), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    std::ifstream in(FixtureDir(GetParam()) + "/expected.json");
    const auto j = nlohmann::json::parse(in);
    prompt_ = j["prompt_ids"].get<std::vector<int32_t>>();
    greedy_ = j["greedy_ids"].get<std::vector<int32_t>>();
    auto file = store::MappedFile::Open(FixtureDir(GetParam()) + "/expected_logits.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    uint64_t header = 0;
    std::memcpy(&header, (*file)->data(), 8);
    const auto h = nlohmann::json::parse((*file)->data() + 8, (*file)->data() + 8 + header);
    const auto shape = h["logits"]["shape"].template get<std::vector<int64_t>>();
    const auto offsets = h["logits"]["data_offsets"].template get<std::vector<uint64_t>>();
    ASSERT_EQ(h["logits"]["dtype"], "F32");
    vocab_ = shape[1];
    ref_logits_.resize(shape[0] * shape[1]);
    std::memcpy(ref_logits_.data(), (*file)->data() + 8 + header + offsets[0],
                ref_logits_.size() * sizeof(float));
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_, greedy_;
  std::vector<float> ref_logits_;
  int64_t vocab_ = 0;
};

// Every position of prompt + continuation in one prefill: max relative logit error < 1e-4.
TEST_P(GoldenTest, PrefillLogitsMatchTransformers) {
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), greedy_.begin(), greedy_.end());
  auto kv = SequenceKv::Create(model_->config(), *backend_, static_cast<int64_t>(all.size()));
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  const ForwardItem item{all, kv->get()};
  ASSERT_TRUE(model_->Forward({&item, 1}, /*all_positions=*/true, &logits).ok());
  ASSERT_EQ(logits.size(), ref_logits_.size());
  const double err = MaxRelError(logits.data(), ref_logits_.data(), logits.size());
  std::printf("%s: prefill max relative logit error %.3g over %zu logits\n", GetParam().c_str(),
              err, logits.size());
  EXPECT_LT(err, 1e-4) << GetParam();
}

// Prefill the prompt, then decode token by token through the KV cache: the 32-token greedy
// continuation is identical, and each step's logits match the reference row.
TEST_P(GoldenTest, GreedyDecodeMatchesTransformers) {
  const int64_t n = static_cast<int64_t>(prompt_.size() + greedy_.size());
  auto kv = SequenceKv::Create(model_->config(), *backend_, n);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  ForwardItem item{prompt_, kv->get()};
  ASSERT_TRUE(model_->Forward({&item, 1}, false, &logits).ok());
  std::vector<int32_t> generated;
  double worst = 0;
  for (size_t step = 0; step < greedy_.size(); ++step) {
    const int64_t row = static_cast<int64_t>(prompt_.size() + step) - 1;
    worst = std::max(worst, MaxRelError(logits.data(), ref_logits_.data() + row * vocab_, vocab_));
    const int32_t next = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(next);
    item.tokens = absl::MakeConstSpan(&generated.back(), 1);
    ASSERT_TRUE(model_->Forward({&item, 1}, false, &logits).ok());
  }
  std::printf("%s: decode max relative logit error %.3g, %zu greedy tokens\n", GetParam().c_str(),
              worst, generated.size());
  EXPECT_EQ(generated, greedy_) << GetParam();
  EXPECT_LT(worst, 1e-4) << GetParam();
}

// Two sequences in one step give each the logits it gets alone (batching changes nothing).
TEST_P(GoldenTest, BatchedStepMatchesSingle) {
  std::vector<int32_t> other(prompt_.rbegin(), prompt_.rend());
  auto kv_a = SequenceKv::Create(model_->config(), *backend_, 64);
  auto kv_b = SequenceKv::Create(model_->config(), *backend_, 64);
  auto kv_c = SequenceKv::Create(model_->config(), *backend_, 64);
  ASSERT_TRUE(kv_a.ok() && kv_b.ok() && kv_c.ok());
  const ForwardItem batch[2] = {{prompt_, kv_a->get()}, {other, kv_b->get()}};
  std::vector<float> both, alone;
  ASSERT_TRUE(model_->Forward(batch, false, &both).ok());
  const ForwardItem single{other, kv_c->get()};
  ASSERT_TRUE(model_->Forward({&single, 1}, false, &alone).ok());
  EXPECT_LT(MaxRelError(both.data() + vocab_, alone.data(), vocab_), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Architectures, GoldenTest,
                         ::testing::Values("qwen3_moe", "qwen2_moe", "mixtral", "olmoe"));

}  // namespace
}  // namespace moe::engine
