// moe_offline_tokens (test tool): runs the Engine in-process, the way moe-generate does, and
// prints the generated token ids as JSON, so integration tests can check that the service
// streams exactly the offline engine's tokens. --write_default_model=DIR writes the built-in
// model and exits; --write_scripted_model=DIR --script=TEXT writes the model whose greedy output
// is TEXT (engine::WriteScriptedModel) and exits; --write_hybrid_model=DIR writes the Qwen3.5-MoE
// hybrid test model (engine::WriteHybridModel) and exits.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "kernels/base/flags.h"
#include "kernels/base/status.h"

ABSL_FLAG(std::string, write_default_model, "", "Write the built-in default model here and exit");
ABSL_FLAG(std::string, write_scripted_model, "",
          "Write the built-in model whose greedy output is --script here and exit");
ABSL_FLAG(std::string, script, "", "The text the scripted model emits");
ABSL_FLAG(std::string, write_hybrid_model, "",
          "Write the Qwen3.5-MoE-shaped hybrid test model here and exit");
ABSL_FLAG(std::string, model, "", "Model directory");
ABSL_FLAG(std::string, prompt_ids, "", "Comma-separated prompt token ids");
ABSL_FLAG(std::string, prompt, "", "Prompt text (used when --prompt_ids is empty)");
ABSL_FLAG(int64_t, max_tokens, 16, "Tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature");
ABSL_FLAG(double, top_p, 1.0, "top_p");
ABSL_FLAG(int32_t, top_k, 0, "top_k");
ABSL_FLAG(uint64_t, seed, 0, "Sampling seed");
ABSL_FLAG(bool, ignore_eos, false, "Generate past EOS");

namespace moe {
namespace {

absl::Status Run() {
  if (!absl::GetFlag(FLAGS_write_default_model).empty()) {
    return engine::WriteDefaultModel(absl::GetFlag(FLAGS_write_default_model));
  }
  if (!absl::GetFlag(FLAGS_write_scripted_model).empty()) {
    return engine::WriteScriptedModel(absl::GetFlag(FLAGS_write_scripted_model),
                                      absl::GetFlag(FLAGS_script));
  }
  if (!absl::GetFlag(FLAGS_write_hybrid_model).empty()) {
    return engine::WriteHybridModel(absl::GetFlag(FLAGS_write_hybrid_model));
  }
  const std::string dir = absl::GetFlag(FLAGS_model);
  MOE_ASSIGN_OR_RETURN(auto backend, kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
  MOE_ASSIGN_OR_RETURN(auto model, engine::Model::Load(dir, *backend));
  MOE_ASSIGN_OR_RETURN(auto tokenizer, engine::Tokenizer::LoadFromDir(dir));
  engine::Request request;
  request.id = "offline";
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',')) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(s, &id)) return absl::InvalidArgumentError("--prompt_ids");
      request.prompt.push_back(id);
    }
  } else {
    MOE_ASSIGN_OR_RETURN(request.prompt, tokenizer->Encode(absl::GetFlag(FLAGS_prompt)));
  }
  request.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  request.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  request.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  request.sampling.seed = absl::GetFlag(FLAGS_seed);
  request.stop.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  request.stop.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  MOE_ASSIGN_OR_RETURN(auto engine,
                       engine::Engine::Create(*model, *tokenizer, engine::EngineOptions{}));
  engine::Engine& eng = *engine;
  MOE_RETURN_IF_ERROR(eng.Add(std::move(request)));
  std::vector<int32_t> tokens;
  std::string text;
  const char* finish = "none";
  while (eng.HasWork()) {
    for (engine::Event& e : eng.Step()) {
      if (e.token) tokens.push_back(*e.token);
      text += e.text;
      if (e.finish != engine::FinishReason::kNone) {
        if (e.finish == engine::FinishReason::kError) return e.error;
        finish = engine::FinishReasonName(e.finish);
      }
    }
  }
  // Text is printed by the test's own JSON decoder-friendly form: ids only, text length.
  std::printf("{\"token_ids\": [%s], \"finish\": \"%s\", \"text_bytes\": %zu}\n",
              absl::StrJoin(tokens, ", ").c_str(), finish, text.size());
  return absl::OkStatus();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Test tool: prints the offline engine's generated token ids as JSON.\n"
      "  moe_offline_tokens --write_default_model=DIR\n"
      "  moe_offline_tokens --write_scripted_model=DIR --script=TEXT\n"
      "  moe_offline_tokens --model=DIR --prompt_ids=1,2,3 --max_tokens=8",
      __FILE__);
  const absl::Status status = moe::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "moe_offline_tokens: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  return 0;
}
