// Model::Load errors: each names the directory and the file or tensor; Forward rejects bad input.
// Checkpoints in other dtypes and sharded (model.safetensors.index.json) load to the same model.
#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/default_model.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {
namespace fs = std::filesystem;

const std::string kFixture = std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/qwen3_moe";

// A copy of the fixture whose safetensors holds every tensor but `drop`, and `reshape` with its
// first dimension halved.
void CopyFixture(const testing::TempDir& dir, const std::string& drop, const std::string& reshape) {
  for (const char* f : {"config.json", "generation_config.json"}) {
    fs::copy_file(kFixture + "/" + f, dir.File(f));
  }
  auto ckpt = store::Checkpoint::Open(kFixture);
  ASSERT_TRUE(ckpt.ok());
  std::vector<store::TensorToWrite> tensors;
  for (const auto& [name, info] : (*ckpt)->tensors()) {
    if (name == drop) continue;
    auto view = (*ckpt)->Get(name);
    std::vector<int64_t> shape = info.shape;
    if (name == reshape) shape[0] /= 2;
    tensors.push_back({name, info.dtype, shape, view->data});
  }
  ASSERT_TRUE(store::WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
}

class ModelLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = std::move(*kernels::MakeBackend(kernels::BackendKind::kCpu, {})); }
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(ModelLoadTest, MissingDirectoryOrConfig) {
  auto m = Model::Load("/nonexistent", *backend_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("config.json"), std::string::npos);
}

TEST_F(ModelLoadTest, MissingTensorIsNamed) {
  testing::TempDir dir;
  CopyFixture(dir, "model.layers.2.mlp.experts.5.down_proj.weight", "");
  auto m = Model::Load(dir.path(), *backend_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.layers.2.mlp.experts.5.down_proj.weight"),
            std::string::npos)
      << m.status();
}

TEST_F(ModelLoadTest, MisShapedTensorIsNamed) {
  testing::TempDir dir;
  CopyFixture(dir, "", "model.layers.0.self_attn.k_proj.weight");
  auto m = Model::Load(dir.path(), *backend_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("k_proj"), std::string::npos) << m.status();
}

TEST_F(ModelLoadTest, NoWeightsAtAll) {
  testing::TempDir dir;
  fs::copy_file(kFixture + "/config.json", dir.File("config.json"));
  EXPECT_EQ(Model::Load(dir.path(), *backend_).status().code(), absl::StatusCode::kNotFound);
}

// The CPU backend computes on the mapped checkpoint: q/k/v are views of its bytes, never a
// stacked copy (one matrix in place of three pays only where it saves launches, on CUDA).
TEST_F(ModelLoadTest, CpuBackendReadsTheAttentionProjectionsInPlace) {
  auto config = LoadModelConfig(kFixture);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ckpt = store::Checkpoint::Open(kFixture);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto weights = LoadDenseWeights(*config, **ckpt, *backend_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (size_t l = 0; l < weights->layers.size(); ++l) {
    const LayerWeights& L = weights->layers[l];
    EXPECT_EQ(L.qkv_proj.view.data, nullptr) << "layer " << l;
    for (const auto& [proj, view] : {std::pair{"q_proj", L.q_proj.view}, {"k_proj", L.k_proj.view},
                                      {"v_proj", L.v_proj.view}}) {
      auto mapped = (*ckpt)->Get(absl::StrCat("model.layers.", l, ".self_attn.", proj, ".weight"));
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      EXPECT_EQ(view.data, mapped->data) << "layer " << l << " " << proj;
    }
  }
}

TEST_F(ModelLoadTest, ForwardRejectsBadInputWithoutTouchingTheCache) {
  auto m = Model::Load(kFixture, *backend_);
  ASSERT_TRUE(m.ok()) << m.status();
  auto kv = SequenceKv::Create((*m)->config(), *backend_, 4);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  const std::vector<int32_t> out_of_vocab = {1, 384};
  ForwardItem item{out_of_vocab, kv->get()};
  EXPECT_EQ((*m)->Forward({&item, 1}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_long = {1, 2, 3, 4, 5};
  item.tokens = too_long;
  EXPECT_EQ((*m)->Forward({&item, 1}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  item.tokens = {};
  EXPECT_EQ((*m)->Forward({&item, 1}, false, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*kv)->length(), 0);
}

TEST_F(ModelLoadTest, ForwardSampleRejectsBadSamplingRowsBeforeAnyWork) {
  auto m = Model::Load(kFixture, *backend_);
  ASSERT_TRUE(m.ok()) << m.status();
  auto kv = SequenceKv::Create((*m)->config(), *backend_, 4);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> tokens = {1, 2};
  ForwardItem item{tokens, kv->get()};
  std::vector<kernels::SampledToken> out;
  auto run = [&](kernels::SampleParams p, std::vector<kernels::PenaltyToken> penalties) {
    return (*m)->ForwardSample({&item, 1}, {&p, 1}, penalties, &out);
  };
  kernels::SampleParams row;
  row.row = 1;  // one item: only row 0 exists
  absl::Status st = run(row, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sampling row 1 of 1"), std::string::npos) << st;
  row = {};
  row.top_logprobs = kernels::kMaxTopLogprobs + 1;
  EXPECT_EQ(run(row, {}).code(), absl::StatusCode::kInvalidArgument);
  row = {};
  row.penalty_count = 1;  // no entries given
  EXPECT_EQ(run(row, {}).code(), absl::StatusCode::kInvalidArgument);
  st = run(kernels::SampleParams{.penalty_count = 1}, {{384, 1}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("penalty token 384"), std::string::npos) << st;
  EXPECT_EQ((*kv)->length(), 0);  // nothing ran
  // A good row runs the step and draws a token of the vocabulary.
  ASSERT_TRUE(run(kernels::SampleParams{}, {}).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_GE(out[0].id, 0);
  EXPECT_LT(out[0].id, (*m)->config().vocab_size);
  EXPECT_EQ((*kv)->length(), 2);
}

// `from`'s checkpoint rewritten into `to` as two shards in `dtype` (kF16 or kBF16) named by a
// model.safetensors.index.json, tensors dealt alternately so every layer spans both shards.
void WriteTwoShards(const std::string& from, const testing::TempDir& to, kernels::DType dtype) {
  for (const char* f : {"config.json", "generation_config.json"}) {
    fs::copy_file(from + "/" + f, to.File(f));
  }
  auto ckpt = store::Checkpoint::Open(from);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string shard_names[2] = {"model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors"};
  std::vector<std::vector<uint16_t>> storage;
  storage.reserve((*ckpt)->tensors().size());
  std::vector<store::TensorToWrite> shards[2];
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (const auto& [name, info] : (*ckpt)->tensors()) {
    auto view = (*ckpt)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    const size_t n = info.bytes / kernels::DTypeSize(info.dtype);
    std::vector<uint16_t>& out = storage.emplace_back(n);
    for (size_t i = 0; i < n; ++i) {
      const float x = kernels::LoadAsF32(view->data, info.dtype, i);
      out[i] = dtype == kernels::DType::kF16 ? kernels::F32ToF16(x) : kernels::F32ToBf16(x);
    }
    const size_t shard = weight_map.size() % 2;
    shards[shard].push_back({name, dtype, info.shape, out.data()});
    weight_map[name] = shard_names[shard];
    total_size += n * 2;
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(store::WriteSafetensors(to.File(shard_names[i]), shards[i]).ok());
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                                {"weight_map", weight_map}};
  to.Write("model.safetensors.index.json", index.dump());
}

// Logits of every position of `prompt`, then `steps` greedy tokens after it.
struct Outputs {
  std::vector<float> logits;  // [T, V]
  std::vector<int32_t> greedy;
};

Outputs Generate(Model& model, const std::vector<int32_t>& prompt, int steps) {
  Outputs run;
  const int64_t V = model.config().vocab_size;
  auto kv = SequenceKv::Create(model.config(), model.backend(), 64);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return run;
  ForwardItem item{prompt, kv->get()};
  EXPECT_TRUE(model.Forward({&item, 1}, /*all_positions=*/true, &run.logits).ok());
  std::vector<float> last(run.logits.end() - V, run.logits.end());
  for (int s = 0; s < steps; ++s) {
    const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) -
                                              last.begin());
    run.greedy.push_back(next);
    ForwardItem step{{&run.greedy.back(), 1}, kv->get()};
    EXPECT_TRUE(model.Forward({&step, 1}, /*all_positions=*/false, &last).ok());
  }
  return run;
}

class ShardedCheckpointTest : public ModelLoadTest {
 protected:
  static void SetUpTestSuite() {
    original_ = new testing::TempDir();
    ASSERT_TRUE(WriteDefaultModel(original_->path()).ok());  // bf16, one model.safetensors
  }
  static void TearDownTestSuite() { delete original_; }

  // The original's logits and greedy tokens, and those of its copy as two `dtype` shards.
  void LoadBoth(kernels::DType dtype, Outputs* original, Outputs* sharded) {
    testing::TempDir dir;
    WriteTwoShards(original_->path(), dir, dtype);
    auto a = Model::Load(original_->path(), *backend_);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Model::Load(dir.path(), *backend_);
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<int32_t> prompt = {1, 17, 42, 99, 250, 7, 311, 64};
    *original = Generate(**a, prompt, kSteps);
    *sharded = Generate(**b, prompt, kSteps);
    ASSERT_EQ(original->logits.size(), sharded->logits.size());
    ASSERT_EQ(original->logits.size(), prompt.size() * (*a)->config().vocab_size);
  }

  static constexpr int kSteps = 8;
  static testing::TempDir* original_;
};
testing::TempDir* ShardedCheckpointTest::original_ = nullptr;

TEST_F(ShardedCheckpointTest, Bf16ShardsGiveTheSameLogits) {
  Outputs original, sharded;
  LoadBoth(kernels::DType::kBF16, &original, &sharded);
  EXPECT_EQ(sharded.logits, original.logits);  // the same bf16 values: bit for bit
  EXPECT_EQ(sharded.greedy, original.greedy);
}

TEST_F(ShardedCheckpointTest, F16ShardsGiveTheLogitsWithinF16Rounding) {
  Outputs original, sharded;
  LoadBoth(kernels::DType::kF16, &original, &sharded);
  // bf16 -> f16 is exact in f16's normal range; weights below 2^-14 (about 0.2% of N(0, 0.02))
  // become subnormals with absolute error up to 2^-25. The logits move by far less than the
  // tolerance, which is f16's own relative precision (2^-11) of the largest logit.
  float max_abs = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < original.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(sharded.logits[i])) << "logit " << i;
    max_abs = std::max(max_abs, std::fabs(original.logits[i]));
    const float err = std::fabs(sharded.logits[i] - original.logits[i]);
    if (err > max_err) max_err = err, worst = i;
  }
  EXPECT_LE(max_err, max_abs * 0x1p-11f)
      << "worst logit " << worst << ": " << sharded.logits[worst] << " vs "
      << original.logits[worst];
  EXPECT_EQ(sharded.greedy, original.greedy);
}

}  // namespace
}  // namespace moe::engine
