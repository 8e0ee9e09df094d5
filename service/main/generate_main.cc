// moe-generate: load a model, generate from a prompt or chat messages, stream the text, and
// print time to first token, decode speed and peak memory. The offline twin of the service: it
// runs the same Engine a worker runs.
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/tokenizer/chat_template.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"
#include "service/main/model_flags.h"

ABSL_FLAG(std::string, prompt, "", "Prompt text, tokenized as is (no chat template)");
ABSL_FLAG(std::string, messages, "",
          "Chat messages as JSON, e.g. '[{\"role\":\"user\",\"content\":\"Hi\"}]', rendered with "
          "the model's chat template. Messages go to the template as given (tool_calls, "
          "reasoning_content, ...). Used when --prompt is empty");
ABSL_FLAG(std::string, template_kwargs, "",
          "Further chat template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
ABSL_FLAG(std::string, user, "Write a short poem about the sea.",
          "A single user message, used when neither --prompt nor --messages is given");
ABSL_FLAG(std::string, system, "", "Optional system message in front of --user");
ABSL_FLAG(int64_t, max_tokens, 64, "Stop after this many generated tokens");
ABSL_FLAG(double, temperature, 0.7, "Sampling temperature; 0 is greedy");
ABSL_FLAG(int32_t, top_k, 0, "Keep the k most likely tokens; 0 keeps all");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass in (0, 1]");
ABSL_FLAG(double, min_p, 0.0, "Drop tokens below min_p times the top probability");
ABSL_FLAG(double, repetition_penalty, 1.0, "transformers-style repetition penalty (1 = off)");
ABSL_FLAG(double, presence_penalty, 0.0, "OpenAI-style presence penalty in [-2, 2]");
ABSL_FLAG(double, frequency_penalty, 0.0, "OpenAI-style frequency penalty in [-2, 2]");
ABSL_FLAG(uint64_t, seed, 0, "Sampling seed: the same seed gives the same tokens");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Comma-separated stop strings");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the model's EOS tokens");
ABSL_FLAG(int64_t, max_batch_tokens, 0,
          "Most tokens a step runs (the prompt is prefilled in chunks of this many); 0: the "
          "whole prompt in one step. 1 with --record_trace records the routing of every prompt "
          "token, teacher-forced");
ABSL_FLAG(bool, timings, false,
          "Print the per-phase time breakdown of the forward pass, as device times: the model "
          "synchronizes at every phase boundary, which slows the run it measures");

namespace moe {
namespace {

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// `text` (the value of `flag`) as JSON of the wanted kind.
absl::StatusOr<engine::TemplateJson> ParseJsonFlag(const char* flag, const std::string& text,
                                                   bool want_array) {
  engine::TemplateJson j = engine::TemplateJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || (want_array ? !j.is_array() : !j.is_object())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": not a JSON ", want_array ? "array" : "object"));
  }
  return j;
}

absl::Status Run() {
  // Shared with moe-worker (service/main/model_flags.h): backend, budgets, model, tokenizer.
  MOE_ASSIGN_OR_RETURN(service::LoadedModel loaded, service::LoadModelFromFlags("[generate]"));
  engine::Model* model = loaded.model.get();
  engine::Tokenizer* tokenizer = loaded.tokenizer.get();
  kernels::Backend* backend = loaded.backend.get();
  std::unique_ptr<store::RoutingTraceWriter>& trace = loaded.trace;
  model->set_exact_timings(absl::GetFlag(FLAGS_timings));

  std::string text = absl::GetFlag(FLAGS_prompt);
  if (text.empty()) {
    engine::TemplateJson messages = engine::TemplateJson::array();
    if (!absl::GetFlag(FLAGS_messages).empty()) {
      MOE_ASSIGN_OR_RETURN(messages,
                           ParseJsonFlag("messages", absl::GetFlag(FLAGS_messages), true));
    } else {
      if (!absl::GetFlag(FLAGS_system).empty()) {
        messages.push_back({{"role", "system"}, {"content", absl::GetFlag(FLAGS_system)}});
      }
      messages.push_back({{"role", "user"}, {"content", absl::GetFlag(FLAGS_user)}});
    }
    engine::TemplateJson kwargs = engine::TemplateJson::object();
    if (!absl::GetFlag(FLAGS_template_kwargs).empty()) {
      MOE_ASSIGN_OR_RETURN(
          kwargs, ParseJsonFlag("template_kwargs", absl::GetFlag(FLAGS_template_kwargs), false));
    }
    MOE_ASSIGN_OR_RETURN(text, tokenizer->chat_template().Render(messages, nullptr, kwargs,
                                                                 /*add_generation_prompt=*/true));
  }
  engine::Request request;
  request.id = "cli";
  MOE_ASSIGN_OR_RETURN(request.prompt, tokenizer->Encode(text));
  request.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  request.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  request.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  request.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  request.sampling.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  request.sampling.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  request.sampling.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  request.sampling.seed = absl::GetFlag(FLAGS_seed);
  request.stop.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  request.stop.stop_strings = absl::GetFlag(FLAGS_stop);
  request.stop.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);

  engine::EngineOptions options;
  options.kv_budget_bytes = loaded.kv_budget;
  options.kv_cache_dtype = loaded.kv_cache_dtype;
  options.block_size = loaded.kv_block_size;
  options.state_snapshot_blocks = loaded.state_snapshot_blocks;
  options.kv_tail_tokens = loaded.kv_tail_tokens;
  options.max_batch_tokens =
      absl::GetFlag(FLAGS_max_batch_tokens) > 0
          ? absl::GetFlag(FLAGS_max_batch_tokens)
          : std::max<int64_t>(256, static_cast<int64_t>(request.prompt.size()));
  MOE_RETURN_IF_ERROR(options.Validate());
  MOE_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(*model, *tokenizer, options));
  engine::Engine& eng = *engine;
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  MOE_RETURN_IF_ERROR(eng.Add(std::move(request)));

  const double t0 = base::NowSeconds();
  double t_first = 0;
  engine::Event final_event;
  while (eng.HasWork()) {
    for (engine::Event& e : eng.Step()) {
      if (e.token && t_first == 0) t_first = base::NowSeconds();
      std::cout << e.text << std::flush;
      if (e.finish != engine::FinishReason::kNone) final_event = std::move(e);
    }
  }
  const double t_end = base::NowSeconds();
  std::cout << std::endl;
  if (final_event.finish == engine::FinishReason::kError) return final_event.error;
  if (trace != nullptr) {
    model->set_routing_trace(nullptr);
    MOE_RETURN_IF_ERROR(trace->Flush());
  }
  const int64_t n = final_event.usage.completion_tokens;
  std::fprintf(stderr,
               "\n[generate] finish=%s prompt_tokens=%lld completion_tokens=%lld\n"
               "[generate] time to first token %.1f ms (prefill %.0f tok/s), decode %.1f tok/s, "
               "peak memory %s\n",
               engine::FinishReasonName(final_event.finish), static_cast<long long>(prompt_tokens),
               static_cast<long long>(n), (t_first - t0) * 1e3,
               prompt_tokens / std::max(t_first - t0, 1e-9),
               n > 1 ? (n - 1) / std::max(t_end - t_first, 1e-9) : 0.0,
               base::FormatBytes(PeakRssBytes()).c_str());
  if (const std::string issued = backend->IssueStats(); !issued.empty()) {
    std::fprintf(stderr, "[generate] %s\n", issued.c_str());
  }
  if (const store::ExpertStore* es = model->expert_store(); es != nullptr) {
    const store::StoreStats st = es->Stats();
    std::fprintf(stderr,
                 "[store] device hits %llu misses %llu, host hits %llu misses %llu, blob reads "
                 "%llu, experts read from the host tier %llu; prefetch issued %llu used %llu "
                 "dropped %llu (accuracy %s)\n",
                 static_cast<unsigned long long>(st.device.hits),
                 static_cast<unsigned long long>(st.device.misses),
                 static_cast<unsigned long long>(st.host.hits),
                 static_cast<unsigned long long>(st.host.misses),
                 static_cast<unsigned long long>(st.blob_reads),
                 static_cast<unsigned long long>(st.host_reads),
                 static_cast<unsigned long long>(st.prefetch_issued),
                 static_cast<unsigned long long>(st.prefetch_used),
                 static_cast<unsigned long long>(st.prefetch_dropped),
                 st.prefetch_issued == 0
                     ? "n/a"
                     : absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(st.prefetch_used) /
                                                    static_cast<double>(st.prefetch_issued))
                           .c_str());
  }
  if (absl::GetFlag(FLAGS_timings)) {
    // Totals over prefill and decode; per token = per forward step of one sequence.
    const engine::PhaseTimes& t = model->phase_times();
    const double steps = static_cast<double>(std::max<int64_t>(n, 1));
    const double layers = static_cast<double>(model->config().num_hidden_layers);
    std::fprintf(stderr, "[timings] phase          total ms   ms/step   ms/layer/step\n");
    const std::pair<const char*, int64_t> phases[] = {
        {"attention", t.attention_us},         {"routing", t.routing_us},
        {"expert_wait", t.expert_wait_us},     {"expert_compute", t.expert_compute_us},
        {"dense_mlp", t.dense_us},             {"norm+logits", t.logits_us},
        {"sampling", t.sampling_us},           {"prefetch", t.prefetch_us}};
    for (const auto& [name, us] : phases) {
      std::fprintf(stderr, "[timings] %-14s %9.2f %9.3f %12.4f\n", name, us / 1e3,
                   us / 1e3 / steps, us / 1e3 / steps / layers);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Generates text with a Mixture-of-Experts model on this machine.\n"
      "  moe-generate                       # built-in default model, a sample chat prompt\n"
      "  moe-generate --model=/path/to/Qwen3-30B-A3B --user='Hello' --max_tokens=128",
      __FILE__);
  const absl::Status status = moe::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "moe-generate: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  return 0;
}
