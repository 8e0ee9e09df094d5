// weight-quality: the quality cost of the weight formats moe-import writes (issue 30), against
// transformers. Every golden fixture is imported with int4 experts (group 64) and its dense
// matrices in f32, bf16, int8 or int4 (lm head as named), then served on the CPU; one prefill of
// prompt + the reference's greedy continuation is compared with the fixture's logits (transformers,
// fp32): the max relative logit error over every position (max |ours - ref| / max |ref|), and over
// the continuation positions (teacher-forced) the next-token KL(p_ref || p_ours), mean and max,
// and the fraction whose argmax is the reference's greedy token. Prints a markdown table.
//
//   ninja -C build weight-quality && ./build/tests/bench/weight-quality
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/store_import.h"
#include "expertstore/importer.h"
#include "nlohmann/json.hpp"
#include "tests/golden/golden_reference.h"
#include "tests/testing/temp_dir.h"

namespace moe {
namespace {

using kernels::DType;

using testing::ComparePrefill;
using testing::FixtureDir;
using testing::LoadReference;
using testing::PrefillMatch;
using testing::Reference;

struct Formats {
  const char* name;
  DType dense;
  std::optional<DType> lm_head;
};
constexpr int32_t kGroup = 64;
const Formats kRows[] = {
    {"f32 dense", DType::kF32, std::nullopt},
    {"bf16 dense (today)", DType::kBF16, std::nullopt},
    {"int8 dense, int8 lm head", DType::kQ8, std::nullopt},
    {"int4 dense, int8 lm head", DType::kQ4, DType::kQ8},
    {"int4 dense, int4 lm head", DType::kQ4, std::nullopt},
};

// log-softmax of n logits
std::vector<double> LogSoftmax(const float* x, int64_t n) {
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = double(x[i]) - mx - std::log(sum);
  return out;
}

// One row of the table, or the reason there is none.
std::string Measure(const std::string& arch, const Reference& ref, const Formats& f,
                    kernels::Backend& backend) {
  auto ckpt = store::Checkpoint::Open(FixtureDir(arch));
  if (!ckpt.ok()) return "n/a: " + std::string(ckpt.status().message());
  auto config = engine::LoadModelConfig(FixtureDir(arch));
  if (!config.ok()) return "n/a: " + std::string(config.status().message());
  auto options = engine::ImportOptionsFor(*config, **ckpt);
  if (!options.ok()) return "n/a: " + std::string(options.status().message());
  options->model = arch;
  options->format = DType::kQ4;
  options->group_size = kGroup;
  options->dense_format = f.dense;
  options->lm_head_format = f.lm_head;
  testing::TempDir dir;
  auto imported = store::ImportModel(**ckpt, dir.path(), *options);
  if (!imported.ok()) return "n/a: import: " + std::string(imported.status().message());
  for (const char* name : {"config.json", "generation_config.json"}) {
    std::filesystem::copy_file(FixtureDir(arch) + "/" + name, dir.File(name));
  }
  store::StoreOptions so;
  so.device_budget_bytes = so.host_budget_bytes = uint64_t{256} << 20;
  auto model = engine::Model::Load(dir.path(), backend, so);
  if (!model.ok()) return "n/a: load: " + std::string(model.status().message());
  auto kv = engine::SequenceKv::Create((*model)->config(), backend,
                                       static_cast<int64_t>(ref.tokens.size()));
  if (!kv.ok()) return "n/a: " + std::string(kv.status().message());
  const engine::ForwardItem item{ref.tokens, kv->get()};
  std::vector<float> logits;
  if (absl::Status s = (*model)->Forward({&item, 1}, true, &logits); !s.ok()) {
    return "n/a: forward: " + std::string(s.message());
  }
  const PrefillMatch m = ComparePrefill(logits, ref);
  if (m.any_nan) return "n/a: NaN logits";
  double kl_sum = 0, kl_max = 0;
  for (size_t p = ref.prompt_len - 1; p + 1 < ref.tokens.size(); ++p) {
    const float* ours = logits.data() + p * ref.vocab;
    const std::vector<double> lp = LogSoftmax(ref.logits.data() + p * ref.vocab, ref.vocab);
    const std::vector<double> lq = LogSoftmax(ours, ref.vocab);
    double kl = 0;
    for (int64_t v = 0; v < ref.vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%.2e | %.2e | %.2e | %.3f (%d/%d)", m.max_rel(),
                kl_sum / m.total, kl_max, double(m.agree) / m.total, m.agree, m.total);
  return buf;
}

int Run() {
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  if (!backend.ok()) return 1;
  std::printf(
      "| fixture | experts | dense | max rel logit error | next-token KL mean | KL max | "
      "greedy agreement |\n|---|---|---|---|---|---|---|\n");
  for (const char* arch : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "qwen3_5_moe",
                           "qwen3_next", "lfm2_moe", "lfm2_moe_conv_bias"}) {
    const Reference ref = LoadReference(arch);
    for (const Formats& f : kRows) {
      std::printf("| %s | int4 g%d | %s | %s |\n", arch, kGroup, f.name,
                  Measure(arch, ref, f, **backend).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main() { return moe::Run(); }
