#include "service/main/model_flags.h"

#include <filesystem>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/budgets.h"
#include "engine/trained_model.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/log.h"
#include "kernels/base/memory.h"
#include "kernels/base/status.h"

constexpr char kDefaultModelDir[] = "models/default";

ABSL_FLAG(std::string, model, kDefaultModelDir,
          "Hugging Face model directory (config.json, *.safetensors, tokenizer.json) or a model "
          "store made by moe-import. The default is the built-in model, a small Qwen3-MoE the "
          "project trained on the King James Bible (tiny, not a useful assistant), written "
          "there on first use");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu or cuda");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 uses every hardware thread");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "KV cache format: bf16, fp8_e4m3, tq4, tq3.5, tq3, tq2.5, tq2");
ABSL_FLAG(int32_t, kv_tail_tokens, 0,
          "Keep each sequence's newest this many keys and values also in bf16, in front of a "
          "compressed --kv_cache_dtype (fp8_e4m3, tq*): every query reads its newest this many "
          "positions exactly, older ones compressed. 0: off");
ABSL_FLAG(int32_t, kv_block_size, 16, "Tokens per paged KV block");
ABSL_FLAG(int32_t, state_snapshot_blocks, 4,
          "Hybrid models (linear-attention layers): keep a recurrent-state snapshot every this "
          "many KV blocks for prefix reuse (prefill chunks end at these boundaries); 0: none, "
          "and no prefix reuse for such models. No effect on other models");
ABSL_FLAG(std::string, kv_budget, "auto",
          "KV cache memory for all sequences and sessions, e.g. 8GiB. auto: 1GiB on the CPU; on "
          "a GPU what is left of 90% of its free memory after the dense weights, a 2GiB "
          "workspace and the experts' VRAM tier (engine/budgets.h)");
ABSL_FLAG(std::string, device_budget, "auto",
          "Expert store (when --model is a store made by moe-import): VRAM (device tier) "
          "budget, e.g. 16GiB; 0 removes the tier. auto: every expert if they take at most 75% "
          "of the usable VRAM (see --kv_budget), else 75% of it; 0 on the CPU");
ABSL_FLAG(std::string, host_budget, "auto",
          "Expert store: pinned host RAM (host tier) budget; 0 removes the tier. auto: the "
          "experts the VRAM tier does not hold, at most half the available RAM; 0 on the CPU");
ABSL_FLAG(std::string, policy, "next_use",
          "Expert store eviction policy: next_use (Belady's rule on estimated next uses, with "
          "bypass), lru, weighted_lru, lfu_aging");
ABSL_FLAG(std::vector<std::string>, pinned_layers, {},
          "Expert store: comma-separated layers whose experts are never evicted");
ABSL_FLAG(bool, prefetch, false,
          "Expert store: prefetch the next layer's likely experts (its router applied to the "
          "current hidden state; one more host copy per layer). Its accuracy is prefetch "
          "used / issued (moe-generate's [store] line, moe_store_prefetches_total)");
ABSL_FLAG(bool, preload_experts, true,
          "Expert store: at start, load every expert into the VRAM tier when it holds them all "
          "(progress logged), so that decode steps route on the device and replay as CUDA graphs "
          "from the first; false: the tier fills as steps miss");
ABSL_FLAG(std::string, record_trace, "",
          "Write the routing trace (per step and MoE layer, the experts the batch needed) to "
          "this file, for moe-store-sim --trace. Empty: none");

namespace moe::service {
namespace {

// A budget flag: "auto" takes `automatic`, else a byte count (base::ParseBytes).
absl::StatusOr<uint64_t> Budget(const char* flag, const std::string& value, uint64_t automatic) {
  if (value == "auto") return automatic;
  absl::StatusOr<uint64_t> bytes = base::ParseBytes(value);
  if (!bytes.ok()) return base::Annotate(bytes.status(), absl::StrCat("--", flag));
  return *bytes;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModelFromFlags(const char* who) {
  LoadedModel m;
  m.dir = absl::GetFlag(FLAGS_model);
  if (m.dir == kDefaultModelDir &&
      !std::filesystem::exists(std::filesystem::path(m.dir) / "config.json")) {
    MOE_LOG(INFO) << who << " writing the built-in default model (trained, tests/default_model) to "
                  << m.dir;
    MOE_RETURN_IF_ERROR(engine::WriteTrainedModel(m.dir));
  }
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  if (backend_name != "cpu" && backend_name != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--backend: '", backend_name, "' (cpu or cuda)"));
  }
  m.gpu = backend_name == "cuda";
  kernels::BackendOptions backend_options;
  backend_options.num_threads = absl::GetFlag(FLAGS_threads);
  MOE_ASSIGN_OR_RETURN(m.backend, kernels::MakeBackend(m.gpu ? kernels::BackendKind::kCuda
                                                             : kernels::BackendKind::kCpu,
                                                       backend_options));

  // Budgets: "auto" from the machine and the model's size, before anything is allocated.
  const bool any_auto = absl::GetFlag(FLAGS_kv_budget) == "auto" ||
                        absl::GetFlag(FLAGS_device_budget) == "auto" ||
                        absl::GetFlag(FLAGS_host_budget) == "auto";
  engine::Budgets automatic;
  if (any_auto) {
    MOE_ASSIGN_OR_RETURN(engine::BudgetFacts facts, engine::ModelBudgetFacts(m.dir));
    facts.gpu = m.gpu;
    facts.free_device = m.gpu ? m.backend->Memory().free_bytes : 0;
    facts.free_host = base::HostMemory().free_bytes;
    MOE_ASSIGN_OR_RETURN(automatic, engine::AutoBudgets(facts));
  }
  store::StoreOptions sopts;
  MOE_ASSIGN_OR_RETURN(sopts.device_budget_bytes,
                       Budget("device_budget", absl::GetFlag(FLAGS_device_budget), automatic.device));
  MOE_ASSIGN_OR_RETURN(sopts.host_budget_bytes,
                       Budget("host_budget", absl::GetFlag(FLAGS_host_budget), automatic.host));
  MOE_ASSIGN_OR_RETURN(const uint64_t kv,
                       Budget("kv_budget", absl::GetFlag(FLAGS_kv_budget), automatic.kv));
  m.kv_budget = static_cast<int64_t>(kv);
  sopts.policy.name = absl::GetFlag(FLAGS_policy);
  for (const std::string& layer : absl::GetFlag(FLAGS_pinned_layers)) {
    int32_t l = 0;
    if (!absl::SimpleAtoi(layer, &l)) {
      return absl::InvalidArgumentError(absl::StrCat("--pinned_layers: '", layer, "' is not a layer"));
    }
    sopts.policy.pinned_layers.push_back(l);
  }

  const double t_load = base::NowSeconds();
  MOE_ASSIGN_OR_RETURN(m.model, engine::Model::Load(m.dir, *m.backend, sopts));
  MOE_ASSIGN_OR_RETURN(m.tokenizer, engine::Tokenizer::LoadFromDir(m.dir));
  const bool is_store = m.model->expert_store() != nullptr;
  m.device_budget = is_store ? sopts.device_budget_bytes : 0;
  m.host_budget = is_store ? sopts.host_budget_bytes : 0;
  m.model->set_prefetch_next_layer(absl::GetFlag(FLAGS_prefetch));
  if (absl::GetFlag(FLAGS_prefetch) && !is_store) {
    MOE_LOG(WARNING) << who << " --prefetch: " << m.dir
                     << " is not a model store (moe-import); no effect";
  }
  if (is_store && m.device_budget > 0 && absl::GetFlag(FLAGS_preload_experts)) {
    // A layer routes on the device only once all its experts are readable (engine/moe_layer.h):
    // filled as steps miss, the tier left most layers host-routed for as long as some expert had
    // not been used (the service at 1 stream, tests/bench/NOTES.md, stop 42).
    const double t0 = base::NowSeconds();
    const auto layers = static_cast<int32_t>(m.model->config().num_hidden_layers);
    double next_log = 2.0;  // seconds
    auto progress = [&](int32_t done) {
      const double t = base::NowSeconds() - t0;
      if (done < layers && t < next_log) return;
      next_log = t + 2.0;
      MOE_LOG(INFO) << who << " preloading experts into the VRAM tier: " << done << "/" << layers
                    << " layers in " << t << " s";
    };
    MOE_ASSIGN_OR_RETURN(const int64_t loaded, m.model->PreloadExperts(progress));
    if (loaded == 0) {
      MOE_LOG(INFO) << who << " experts not preloaded: the VRAM tier holds only part of them "
                    << "(it fills as steps miss)";
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_record_trace); !path.empty()) {
    MOE_ASSIGN_OR_RETURN(m.trace, m.model->RecordRoutingTrace(path));
    MOE_LOG(INFO) << who << " recording the routing trace to " << path;
  }
  m.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  m.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  m.state_snapshot_blocks = absl::GetFlag(FLAGS_state_snapshot_blocks);
  m.kv_tail_tokens = absl::GetFlag(FLAGS_kv_tail_tokens);
  if (m.kv_tail_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_tail_tokens must be >= 0 (0: off), got ", m.kv_tail_tokens));
  }
  const engine::ModelConfig& c = m.model->config();
  MOE_LOG(INFO) << who << " loaded " << m.dir << " (" << c.arch.model_type << ", "
                << c.num_hidden_layers << " layers, " << c.num_experts << " experts) on "
                << backend_name << " in " << base::NowSeconds() - t_load << " s; budgets: KV "
                << base::FormatBytes(kv) << ", expert VRAM tier "
                << (is_store ? base::FormatBytes(m.device_budget) : "- (experts loaded whole)")
                << ", host tier " << (is_store ? base::FormatBytes(m.host_budget) : "-")
                << (any_auto ? " (auto: engine/budgets.h)" : "");
  return m;
}

}  // namespace moe::service
