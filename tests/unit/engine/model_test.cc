// Model::Load errors: each names the directory and the file or tensor; Forward rejects bad input.
#include "engine/model.h"

#include <filesystem>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace moe::engine
