// The built-in models: the scripted model's greedy output is its script for any prompt that does
// not end on a piece of it, and it ends on <|im_end|>; a script that cannot fit is refused. The
// hybrid test model loads from the vision-language layout of real Qwen3.5 checkpoints.
#include "engine/default_model.h"

#include <filesystem>

#include "engine/engine.h"
#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

// Greedy generation of `prompt` on the model in `dir`: the text and the finish reason.
std::pair<std::string, FinishReason> Greedy(const std::string& dir, const std::string& prompt) {
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  auto model = Model::Load(dir, **backend);
  EXPECT_TRUE(model.ok()) << model.status();
  auto tokenizer = Tokenizer::LoadFromDir(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto engine = Engine::Create(**model, **tokenizer, EngineOptions{});
  EXPECT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.id = "r";
  r.prompt = *(*tokenizer)->Encode(prompt);
  r.sampling.temperature = 0.f;
  r.stop.max_tokens = 200;
  EXPECT_TRUE((*engine)->Add(std::move(r)).ok());
  std::string text;
  FinishReason finish = FinishReason::kNone;
  while ((*engine)->HasWork()) {
    for (Event& e : (*engine)->Step()) {
      text += e.text;
      if (e.finish != FinishReason::kNone) finish = e.finish;
    }
  }
  return {text, finish};
}

// The composite config's text_config is read, full_attention_interval gives the layer types, the
// text model's tensors are found under model.language_model., the fused experts are split into
// per-expert views of the same bytes (gate rows first), and the vision tower and MTP head are
// skipped; a prompt fed whole or token by token gives the same last logits.
TEST(HybridModel, LoadsFromTheVisionLanguageLayout) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteHybridModel(dir.path()).ok());
  auto config = LoadModelConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->arch.model_type, "qwen3_5_moe");
  EXPECT_EQ(config->layer_types, (std::vector<std::string>{"linear_attention", "full_attention",
                                                           "linear_attention", "full_attention"}));
  EXPECT_DOUBLE_EQ(config->rope.partial_rotary_factor, 0.25);

  auto ckpt = store::Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (const auto& [name, info] : (*ckpt)->tensors()) {
    EXPECT_EQ(name.find("language_model"), std::string::npos) << name;
    EXPECT_NE(name.rfind("mtp.", 0), 0u) << name;
    EXPECT_NE(name.rfind("model.visual.", 0), 0u) << name;
  }
  // Expert 5 of layer 2: gate = rows [5 * 2I, 5 * 2I + I) of gate_up_proj, up the next I rows.
  const int64_t I = config->moe_intermediate_size, H = config->hidden_size;
  auto gate = (*ckpt)->Get("model.layers.2.mlp.experts.5.gate_proj.weight", {I, H});
  auto up = (*ckpt)->Get("model.layers.2.mlp.experts.5.up_proj.weight", {I, H});
  auto down = (*ckpt)->Get("model.layers.2.mlp.experts.5.down_proj.weight", {H, I});
  auto down0 = (*ckpt)->Get("model.layers.2.mlp.experts.0.down_proj.weight", {H, I});
  ASSERT_TRUE(gate.ok() && up.ok() && down.ok() && down0.ok()) << gate.status() << up.status();
  EXPECT_EQ(static_cast<const uint8_t*>(up->data) - static_cast<const uint8_t*>(gate->data),
            I * H * 2);
  EXPECT_EQ(static_cast<const uint8_t*>(down->data) - static_cast<const uint8_t*>(down0->data),
            5 * H * I * 2);

  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  auto model = Model::Load(dir.path(), **backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_GT((*model)->state_bytes(), 0);
  const std::vector<int32_t> prompt = {5, 77, 300, 41, 9, 600, 64, 8, 15, 16, 23, 42};
  auto whole_kv = SequenceKv::Create((*model)->config(), **backend, 16);
  auto step_kv = SequenceKv::Create((*model)->config(), **backend, 16);
  ASSERT_TRUE(whole_kv.ok() && step_kv.ok());
  std::vector<float> whole, step;
  const ForwardItem all{prompt, whole_kv->get()};
  const absl::Status st = (*model)->Forward({&all, 1}, false, &whole);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const ForwardItem one{absl::MakeConstSpan(prompt).subspan(t, 1), step_kv->get()};
    ASSERT_TRUE((*model)->Forward({&one, 1}, false, &step).ok());
  }
  ASSERT_EQ(whole.size(), step.size());
  float max_abs = 0, max_err = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(whole[i]));
    max_err = std::max(max_err, std::abs(whole[i] - step[i]));
  }
  EXPECT_LT(max_err, 1e-4f * max_abs);
}

// A hybrid checkpoint without a layer's A_log, or with a conv1d of the wrong shape, fails to
// load with the tensor named.
TEST(HybridModel, MissingOrMisshapenTensorIsNamed) {
  testing::TempDir src;
  ASSERT_TRUE(WriteHybridModel(src.path()).ok());
  auto ckpt = store::Checkpoint::Open(src.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto rewrite = [&](const std::string& drop, const std::string& reshape) {
    testing::TempDir dir;
    std::vector<store::TensorToWrite> tensors;
    for (const auto& [name, info] : (*ckpt)->tensors()) {
      if (name == drop) continue;
      auto view = (*ckpt)->Get(name);
      EXPECT_TRUE(view.ok());
      std::vector<int64_t> shape = info.shape;
      if (name == reshape) shape = {shape[0] / 2, 1, shape[2] * 2};
      tensors.push_back({name, info.dtype, shape, view->data});
    }
    EXPECT_TRUE(store::WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
    std::filesystem::copy_file(src.File("config.json"), dir.File("config.json"));
    auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
    return Model::Load(dir.path(), **backend).status();
  };
  absl::Status st = rewrite("model.layers.2.linear_attn.A_log", "");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("model.layers.2.linear_attn.A_log"), std::string::npos) << st;
  st = rewrite("", "model.layers.0.linear_attn.conv1d.weight");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("model.layers.0.linear_attn.conv1d.weight"), std::string::npos) << st;
}

TEST(ScriptedModel, GreedyOutputIsTheScriptForAnyPrompt) {
  const std::string script =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>";
  testing::TempDir dir;
  ASSERT_TRUE(WriteScriptedModel(dir.path(), script).ok());
  for (const std::string& prompt : std::vector<std::string>{
           "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
           "Hello", script + " -- again?"}) {
    const auto [text, finish] = Greedy(dir.path(), prompt);
    EXPECT_EQ(text, script) << "prompt: " << prompt;
    EXPECT_EQ(finish, FinishReason::kStop) << "prompt: " << prompt;
  }
}

TEST(ScriptedModel, RepeatsAndMultiByteTextSurvive) {
  const std::string script = "ab ab ab ab ab — ü ü ü ü ü ü ü ü ab";
  testing::TempDir dir;
  ASSERT_TRUE(WriteScriptedModel(dir.path(), script).ok());
  EXPECT_EQ(Greedy(dir.path(), "x").first, script);
}

TEST(ScriptedModel, RefusesEmptyAndOverlongScripts) {
  testing::TempDir dir;
  EXPECT_EQ(WriteScriptedModel(dir.path(), "").code(), absl::StatusCode::kInvalidArgument);
  std::string long_script;
  for (int i = 0; i < 2000; ++i) long_script += std::to_string(i) + " ";  // ~2,000 pieces
  EXPECT_EQ(WriteScriptedModel(dir.path(), long_script).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moe::engine
