// moe-import end to end on the golden fixtures: the expert names it derives from the engine's
// architecture table exist in real transformers checkpoints; f32 stores hold the (F32) fixtures'
// exact values and bf16 stores their exact bf16 rounding (read back through ExpertStore); int4
// stores are within the quantization bound;
// --verify passes on a good store and fails (exit 1) on a damaged one; resuming skips everything.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "expertstore/blob_index.h"
#include "expertstore/expert_store.h"
#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/quant.h"

namespace moe {
namespace {

struct TempDir {
  TempDir() {
    std::string tmpl = "/tmp/moe_import_XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

int RunImport(const std::string& args) {
  const int rc = std::system(absl::StrCat(MOE_IMPORT_BIN, " ", args, " 2>/dev/null").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class ImportMain : public ::testing::TestWithParam<const char*> {};

TEST_P(ImportMain, StoreServesTheCheckpointsExperts) {
  const std::string fixture = absl::StrCat(MOE_SOURCE_DIR, "/tests/golden/fixtures/", GetParam());
  auto config = engine::LoadModelConfig(fixture);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ckpt = store::Checkpoint::Open(fixture);
  ASSERT_TRUE(ckpt.ok());
  auto backend = std::move(kernels::MakeBackend(kernels::BackendKind::kCpu, {})).value();
  // The fixtures are F32: f32 stores are exact, bf16 stores are the round-to-nearest-even of it.
  for (const std::string format : {"f32", "bf16", "int4"}) {
    TempDir dir;
    const std::string store_dir = dir.path + "/store";
    ASSERT_EQ(RunImport(absl::StrCat("--model_dir=", fixture, " --store_dir=", store_dir,
                                     " --format=", format, " --verify")),
              0);
    // The store directory alone is a model directory: config and dense weights.
    auto store_config = engine::LoadModelConfig(store_dir);
    ASSERT_TRUE(store_config.ok()) << store_config.status();
    EXPECT_EQ(store_config->num_experts, config->num_experts);
    auto dense = store::Checkpoint::Open(store_dir);
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_TRUE((*dense)->Has("model.embed_tokens.weight"));
    store::StoreOptions o;
    o.store_dir = store_dir;
    o.model = GetParam();  // the default model id is the directory name
    o.device_budget_bytes = 1 << 20;
    o.host_budget_bytes = 1 << 20;
    auto es = store::ExpertStore::Open(o, backend.get());
    ASSERT_TRUE(es.ok()) << es.status();
    int checked = 0;
    for (int32_t l = 0; l < config->num_hidden_layers; ++l) {
      if (!config->IsSparseLayer(l)) continue;
      for (int32_t e = 0; e < config->num_experts; ++e) {
        auto h = (*es)->Acquire(l, std::vector<int32_t>{e});
        ASSERT_TRUE(h.ok());
        ASSERT_TRUE((*h)[0].ready.get().ok()) << (*h)[0].ready.get();
        const kernels::ExpertWeights& w = *(*h)[0].weights;
        const std::string prefix =
            absl::StrCat("model.layers.", l, ".", config->arch.moe_block, ".experts.", e, ".");
        const std::pair<const kernels::TensorView*, std::string> parts[] = {
            {&w.gate, config->arch.expert_gate},
            {&w.up, config->arch.expert_up},
            {&w.down, config->arch.expert_down}};
        for (const auto& [view, which] : parts) {
          auto src = (*ckpt)->Get(prefix + which + ".weight");
          ASSERT_TRUE(src.ok()) << src.status();
          ASSERT_EQ(view->numel(), src->numel());
          const int64_t cols = src->dim(1);
          for (int64_t i = 0; i < src->numel(); ++i) {
            if (format == "f32") {
              ASSERT_EQ(view->at(i), src->at(i)) << prefix << which << " element " << i;
            } else if (format == "bf16") {
              ASSERT_EQ(view->at(i), kernels::Bf16ToF32(kernels::F32ToBf16(src->at(i))))
                  << prefix << which << " element " << i;
            } else {
              // Half a step of the row's range (quant.h's bound is per group, tighter).
              float lo = 1e30f, hi = -1e30f;
              const int64_t r = i / cols;
              for (int64_t c = 0; c < cols; ++c) {
                lo = std::min(lo, src->at(r * cols + c));
                hi = std::max(hi, src->at(r * cols + c));
              }
              ASSERT_NEAR(view->at(i), src->at(i),
                          0.5f * (hi - lo) / 15.f * 1.01f + 1e-3f * std::max(-lo, hi))
                  << prefix << which << " element " << i;
            }
          }
        }
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
    es->reset();
    // Resume: everything already there. Then damage one blob: --verify alone fails.
    ASSERT_EQ(RunImport(absl::StrCat("--model_dir=", fixture, " --store_dir=", store_dir,
                                     " --format=", format)),
              0);
    auto index = store::BlobIndex::Open(store_dir + "/index", "", false);
    ASSERT_TRUE(index.ok());
    auto entries = (*index)->List();
    ASSERT_TRUE(entries.ok());
    const store::BlobLocation loc = entries->front();
    index->reset();
    {
      std::fstream f(store_dir + "/" + loc.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(loc.offset + 1000));
      f.write("garbage!", 8);
    }
    EXPECT_EQ(RunImport(absl::StrCat("--store_dir=", store_dir, " --verify")), 1);
  }
}

// --verify checks the blob count against the manifest: a store missing experts, or one whose
// import never finished (no manifest.json), fails even when every blob it has is good.
TEST(ImportMainVerify, IncompleteStoreFails) {
  TempDir dir;
  const std::string store_dir = dir.path + "/s";
  ASSERT_EQ(RunImport(absl::StrCat("--model_dir=", MOE_SOURCE_DIR, "/tests/golden/fixtures/mixtral",
                                   " --store_dir=", store_dir, " --format=bf16")),
            0);
  ASSERT_EQ(RunImport(absl::StrCat("--store_dir=", store_dir, " --verify")), 0);
  const std::string manifest_path = store_dir + "/manifest.json";
  std::string manifest;
  {
    std::ifstream in(manifest_path);
    manifest.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // One more expert promised than indexed: as if the index lost an entry.
  const size_t at = manifest.find("\"num_experts\": ");
  ASSERT_NE(at, std::string::npos) << manifest;
  const size_t begin = at + std::string("\"num_experts\": ").size();
  const size_t end = manifest.find_first_not_of("0123456789", begin);
  const int64_t n = std::stoll(manifest.substr(begin, end - begin));
  std::ofstream(manifest_path) << manifest.substr(0, begin) << n + 1 << manifest.substr(end);
  EXPECT_EQ(RunImport(absl::StrCat("--store_dir=", store_dir, " --verify")), 1);
  std::filesystem::remove(manifest_path);
  EXPECT_EQ(RunImport(absl::StrCat("--store_dir=", store_dir, " --verify")), 1);
}

// config.json and the tokenizer files are in place before manifest.json says the import
// finished: an import that cannot copy them leaves no manifest.json, and the re-run completes.
TEST(ImportMainVerify, ModelFilesComeBeforeTheManifest) {
  TempDir dir;
  const std::string store_dir = dir.path + "/s";
  const std::string args = absl::StrCat("--model_dir=", MOE_SOURCE_DIR,
                                        "/tests/golden/fixtures/mixtral --store_dir=", store_dir);
  // A directory where config.json's copy goes first: the copy fails.
  std::filesystem::create_directories(store_dir + "/config.json.tmp");
  EXPECT_EQ(RunImport(args), 1);
  EXPECT_FALSE(std::filesystem::exists(store_dir + "/manifest.json"));
  EXPECT_EQ(RunImport(absl::StrCat("--store_dir=", store_dir, " --verify")), 1);
  std::filesystem::remove(store_dir + "/config.json.tmp");
  ASSERT_EQ(RunImport(args + " --verify"), 0);
  EXPECT_TRUE(std::filesystem::exists(store_dir + "/config.json"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ImportMain,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe", "qwen2_moe"));

TEST(ImportMainFlags, BadFormatIsRefused) {
  TempDir dir;
  EXPECT_EQ(RunImport(absl::StrCat("--model_dir=", MOE_SOURCE_DIR, "/tests/golden/fixtures/mixtral",
                                   " --store_dir=", dir.path, "/s --format=int3")),
            1);
  EXPECT_EQ(RunImport("--store_dir="), 1);
}

}  // namespace
}  // namespace moe
