// kv-quality: the spec's T7 and T8 for every KV-cache format against the bf16 cache, on the golden
// fixture models, on the random-weight test model (head_dim 32, and a head_dim-128 variant for
// the split formats), on the trained default model (engine/default_model: real text, where
// random weights say little), plus T7 on random Gaussian Q/K/V at head_dim 128. Prints a
// markdown table.
//
//   build/tests/bench/kv-quality [--steps N] [--random_tokens N] [--tail W] [--backend cuda]
//
// --tail W (> 0) adds, under each compressed format's row, its T8 with a 16-bit tail of the
// newest W tokens (--kv_tail_tokens); T7 (attention outside the model) has no tail.
// --backend cuda runs the models (T8) on CUDA; T7 stays on the host either way.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/default_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/bench/kv_quality_lib.h"
#include "tests/testing/temp_dir.h"

namespace moe {
namespace {

// Held-out text of the trained model (Genesis 25, a chapter it never trained on): its prompt,
// 256 tokens, so that T7 sees real text only and T8 decodes on from it.
constexpr char kTrainedPrompt[] =
    "Then again Abraham took a wife, and her name was Keturah. And she bare him Zimran, and "
    "Jokshan, and Medan, and Midian, and Ishbak, and Shuah. And Jokshan begat Sheba, and Dedan. "
    "And the sons of Dedan were Asshurim, and Letushim, and Leummim. And the sons of Midian; "
    "Ephah, and Epher, and Hanoch, and Abidah, and Eldaah. All these were the children of "
    "Keturah. And Abraham gave all that he had unto Isaac. But unto the sons of the concubines, "
    "which Abraham had, Abraham gave gifts, and sent them away from Isaac his son, while he yet "
    "lived, eastward, unto the east country. And these are the days of the years of Abraham's "
    "life which he lived, an hundred threescore and fifteen years. Then Abraham gave up the "
    "ghost, and died in a good old age, an old man, and full of years; and was gathered to his "
    "people. And his sons Isaac and Ishmael buried him in the cave of Machpelah, in the field of "
    "Ephron the son of Zohar the Hittite, which is before Mamre; The field which Abraham "
    "purchased of the sons of Heth: there was Abraham buried, and Sarah his wife. And it came to "
    "pass after the death of Abraham, that God blessed his son Isaac; and Isaac dwelt by the "
    "well Lahairoi.";

const kernels::KvFormat kFormats[] = {kernels::KvFormat::kBf16, kernels::KvFormat::kFp8E4m3,
                                      kernels::KvFormat::kTq4,  kernels::KvFormat::kTq3p5,
                                      kernels::KvFormat::kTq3,  kernels::KvFormat::kTq2p5,
                                      kernels::KvFormat::kTq2};

int Run(int steps, int random_tokens, int tail, kernels::BackendKind kind) {
  auto backend = kernels::MakeBackend(kind, {});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  testing::TempDir d32, d128;
  if (!engine::WriteDefaultModel(d32.path()).ok() ||
      !engine::WriteDefaultModel(d128.path(), 20261121, 128).ok()) {
    std::fprintf(stderr, "cannot write the default model\n");
    return 1;
  }
  struct Entry {
    std::string name, dir;
    std::vector<int32_t> prompt;
  };
  std::vector<Entry> models;
  for (const char* arch : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "lfm2_moe"}) {
    const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/" + arch;
    std::ifstream in(dir + "/expected.json");
    const auto j = nlohmann::json::parse(in);
    models.push_back({std::string("golden/") + arch, dir, j["prompt_ids"].get<std::vector<int32_t>>()});
  }
  std::mt19937 rng(42);
  std::vector<int32_t> prompt(32);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 600);
  models.push_back({"random default (D=32)", d32.path(), prompt});
  models.push_back({"random default (D=128)", d128.path(), prompt});
  const std::string trained = std::string(MOE_SOURCE_DIR) + "/engine/default_model";
  auto tokenizer = engine::Tokenizer::LoadFromDir(trained);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s: %s\n", trained.c_str(), std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  auto text_ids = (*tokenizer)->Encode(kTrainedPrompt);
  if (!text_ids.ok()) return 1;
  text_ids->resize(std::min<size_t>(text_ids->size(), random_tokens));
  models.push_back({"trained default, held-out text", trained, *text_ids});

  std::printf("| model | D | format | T7 attn-out rel L2 | T7 attn-prob KL | T8 next-token KL mean | "
              "T8 KL max | T8 greedy agreement |\n|---|---|---|---|---|---|---|---|\n");
  for (const Entry& m : models) {
    auto model = engine::Model::Load(m.dir, **backend);
    if (!model.ok()) {
      std::fprintf(stderr, "%s: %s\n", m.name.c_str(), std::string(model.status().message()).c_str());
      return 1;
    }
    const engine::ModelConfig& c = (*model)->config();
    // T7 on this model's own Q/K/V: prompt, then pseudo-random tokens up to random_tokens.
    std::vector<int32_t> tokens = m.prompt;
    while (static_cast<int>(tokens.size()) < random_tokens) {
      tokens.push_back(static_cast<int32_t>(rng() % std::min<int64_t>(c.vocab_size, 600)));
    }
    auto qkv = bench::CaptureQkv(**model, tokens);
    if (!qkv.ok()) {
      std::fprintf(stderr, "%s: %s\n", m.name.c_str(), std::string(qkv.status().message()).c_str());
      return 1;
    }
    for (kernels::KvFormat f : kFormats) {
      bench::AttentionQuality t7;
      bool supported = true;
      // The mean over the attention layers (a hybrid's conv or linear layers have no Q/K/V).
      const double attention_layers = static_cast<double>(std::count_if(
          qkv->begin(), qkv->end(), [](const bench::LayerQkv& x) { return x.T > 0; }));
      for (size_t l = 0; l < qkv->size(); ++l) {
        const bench::LayerQkv& x = (*qkv)[l];
        if (x.T == 0) continue;
        auto r = bench::MeasureAttention(f, x.q.data(), x.k.data(), x.v.data(), x.T,
                                         static_cast<int>(c.num_attention_heads),
                                         static_cast<int>(c.num_key_value_heads),
                                         static_cast<int>(c.head_dim), static_cast<int>(l));
        if (!r.ok()) {
          supported = false;
          break;
        }
        t7.rel_l2 += r->rel_l2 / attention_layers;
        t7.kl += r->kl / attention_layers;
      }
      if (!supported) {
        std::printf("| %s | %lld | %s | n/a (head_dim) | | | | |\n", m.name.c_str(),
                    static_cast<long long>(c.head_dim), kernels::KvFormatName(f));
        continue;
      }
      auto t8 = bench::MeasureNextToken(**model, f, m.prompt, steps);
      if (!t8.ok()) {
        std::fprintf(stderr, "%s %s: %s\n", m.name.c_str(), kernels::KvFormatName(f),
                     std::string(t8.status().message()).c_str());
        return 1;
      }
      std::printf("| %s | %lld | %s | %.4f | %.2e | %.2e | %.2e | %.3f (%lld) |\n", m.name.c_str(),
                  static_cast<long long>(c.head_dim), kernels::KvFormatName(f), t7.rel_l2, t7.kl,
                  t8->mean_kl, t8->max_kl, t8->agreement, static_cast<long long>(t8->positions));
      if (tail > 0 && f != kernels::KvFormat::kBf16) {
        auto t8t = bench::MeasureNextToken(**model, f, m.prompt, steps, tail);
        if (!t8t.ok()) {
          std::fprintf(stderr, "%s %s tail %d: %s\n", m.name.c_str(), kernels::KvFormatName(f),
                       tail, std::string(t8t.status().message()).c_str());
          return 1;
        }
        std::printf("| %s | %lld | %s + bf16 tail %d | | | %.2e | %.2e | %.3f (%lld) |\n",
                    m.name.c_str(), static_cast<long long>(c.head_dim), kernels::KvFormatName(f),
                    tail, t8t->mean_kl, t8t->max_kl, t8t->agreement,
                    static_cast<long long>(t8t->positions));
      }
      std::fflush(stdout);
    }
  }
  // T7 on random Gaussian Q/K/V, D = 128, 8 query heads over 2 kv-heads.
  const int T = 256, NH = 8, NKV = 2, D = 128;
  std::normal_distribution<float> g;
  std::vector<float> q(T * NH * D), k(T * NKV * D), v(T * NKV * D);
  for (float& x : q) x = g(rng);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  for (kernels::KvFormat f : kFormats) {
    auto r = bench::MeasureAttention(f, q.data(), k.data(), v.data(), T, NH, NKV, D, 0);
    if (!r.ok()) return 1;
    std::printf("| random N(0,1) Q/K/V, T=%d | %d | %s | %.4f | %.2e | | | |\n", T, D,
                kernels::KvFormatName(f), r->rel_l2, r->kl);
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  int steps = 256, random_tokens = 256, tail = 0;
  moe::kernels::BackendKind kind = moe::kernels::BackendKind::kCpu;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--random_tokens") == 0) random_tokens = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--tail") == 0) tail = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--backend") == 0) {
      if (std::strcmp(argv[i + 1], "cuda") == 0) {
        kind = moe::kernels::BackendKind::kCuda;
      } else if (std::strcmp(argv[i + 1], "cpu") != 0) {
        std::fprintf(stderr, "--backend %s: cpu or cuda\n", argv[i + 1]);
        return 2;
      }
    }
  }
  if (tail < 0) {
    std::fprintf(stderr, "--tail must be >= 0, got %d\n", tail);
    return 2;
  }
  return moe::Run(steps, random_tokens, tail, kind);
}
