// ModelConfig: field reading per architecture, both RoPE spellings, and clear errors.
#include "engine/model_config.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {

nlohmann::json Qwen3() {
  return {{"model_type", "qwen3_moe"}, {"vocab_size", 100},         {"hidden_size", 16},
          {"num_hidden_layers", 4},    {"num_attention_heads", 4},   {"num_key_value_heads", 2},
          {"head_dim", 8},             {"intermediate_size", 32},    {"moe_intermediate_size", 8},
          {"num_experts", 8},          {"num_experts_per_tok", 2},   {"decoder_sparse_step", 2},
          {"mlp_only_layers", {3}},    {"max_position_embeddings", 64}, {"eos_token_id", 5}};
}

TEST(ModelConfigTest, ReadsQwen3MoeFieldsAndSparseLayers) {
  auto c = ParseModelConfig(Qwen3().dump(), R"({"eos_token_id": [7, 9]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch.qk_norm, QkNorm::kPerHead);
  EXPECT_TRUE(c->norm_topk_prob);  // qwen3_moe's default
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{7, 9}));  // generation_config wins
  // (l + 1) % 2 == 0 and not in mlp_only_layers
  EXPECT_FALSE(c->IsSparseLayer(0));
  EXPECT_TRUE(c->IsSparseLayer(1));
  EXPECT_FALSE(c->IsSparseLayer(2));
  EXPECT_FALSE(c->IsSparseLayer(3));
}

TEST(ModelConfigTest, RopeSpellings) {
  auto j = Qwen3();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  j["rope_theta"] = 5e5;
  auto c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.rope_type, "yarn");
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.rope_theta, 5e5);
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 1e4}, {"factor", 8.0}};
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.rope_type, "llama3");
  EXPECT_EQ(c->rope.rope_theta, 1e4);  // rope_parameters before top level
  j["rope_parameters"]["rope_type"] = "dynamic";
  EXPECT_EQ(ParseModelConfig(j.dump(), "").status().code(), absl::StatusCode::kUnimplemented);
}

TEST(ModelConfigTest, MixtralNamesItsFieldsDifferently) {
  nlohmann::json j = {{"model_type", "mixtral"},      {"vocab_size", 100},
                      {"hidden_size", 16},            {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},     {"num_key_value_heads", 4},
                      {"intermediate_size", 24},      {"num_local_experts", 8},
                      {"num_experts_per_tok", 2},     {"max_position_embeddings", 64},
                      {"sliding_window", 4096}};
  auto c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 24);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->SlidingWindow(0), 4096);  // every layer
  EXPECT_EQ(c->SlidingWindow(1), 4096);
  EXPECT_EQ(c->arch.moe_block, "block_sparse_moe");
}

nlohmann::json Qwen2() {
  return {{"model_type", "qwen2_moe"},  {"vocab_size", 100},          {"hidden_size", 16},
          {"num_hidden_layers", 4},     {"num_attention_heads", 4},    {"num_key_value_heads", 2},
          {"intermediate_size", 32},    {"moe_intermediate_size", 8},  {"num_experts", 8},
          {"num_experts_per_tok", 2},   {"shared_expert_intermediate_size", 16},
          {"max_position_embeddings", 64}, {"sliding_window", 32}};
}

std::vector<int64_t> Windows(const ModelConfig& c) {
  std::vector<int64_t> w;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) w.push_back(c.SlidingWindow(l));
  return w;
}

// Issue 29: a hidden_act other than SiLU loaded and silently computed SiLU.
TEST(ModelConfigTest, RefusesAnActivationItDoesNotCompute) {
  nlohmann::json j = Qwen3();
  for (const char* ok : {"silu", "swish"}) {
    j["hidden_act"] = ok;
    EXPECT_TRUE(ParseModelConfig(j.dump(), "").ok()) << ok;
  }
  j.erase("hidden_act");
  EXPECT_TRUE(ParseModelConfig(j.dump(), "").ok());  // transformers' default is silu
  j = {{"model_type", "mixtral"},   {"vocab_size", 100},        {"hidden_size", 16},
       {"num_hidden_layers", 2},    {"num_attention_heads", 4}, {"intermediate_size", 24},
       {"num_local_experts", 8},    {"num_experts_per_tok", 2}, {"max_position_embeddings", 64},
       {"hidden_act", "gelu"}};
  const absl::Status st = ParseModelConfig(j.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("hidden_act"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'gelu'"), std::string::npos) << st;
}

// Issue 29: qwen2_moe's use_sliding_window windowed every layer, whatever layer_types and
// max_window_layers said. transformers: the window applies only with use_sliding_window, and only
// on layers that layer_types names "sliding_attention" (else those >= max_window_layers).
TEST(ModelConfigTest, Qwen2MoeWindowsOnlyTheLayersLayerTypesNames) {
  nlohmann::json j = Qwen2();
  auto c = ParseModelConfig(j.dump(), "");  // use_sliding_window defaults to false
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 0, 0}));

  j["use_sliding_window"] = true;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 32, 0, 32}));

  j.erase("layer_types");
  j["max_window_layers"] = 2;
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 32, 32}));
  j.erase("max_window_layers");  // transformers' default 28: no layer of 4 is windowed
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 0, 0}));

  j["use_sliding_window"] = false;  // layer_types cannot window without use_sliding_window
  j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                      "sliding_attention"};
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 0, 0}));

  j["use_sliding_window"] = true;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  absl::Status st = ParseModelConfig(j.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer_types"), std::string::npos) << st;
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  st = ParseModelConfig(j.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("chunked_attention"), std::string::npos) << st;
  j.erase("layer_types");
  j.erase("sliding_window");
  st = ParseModelConfig(j.dump(), "").status();
  EXPECT_NE(st.message().find("sliding_window"), std::string::npos) << st;
}

// qwen3_moe gates the window with use_sliding_window, then windows every layer; olmoe has none.
TEST(ModelConfigTest, SlidingWindowRulesOfTheOtherFamilies) {
  nlohmann::json j = Qwen3();
  j["sliding_window"] = 16;
  auto c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 0, 0}));
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 2;  // not read by transformers' qwen3_moe
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{16, 16, 16, 16}));
  j["model_type"] = "olmoe";
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Windows(*c), (std::vector<int64_t>{0, 0, 0, 0}));
}

// Found by fuzz_model_config (inputs in tests/fuzz/corpus/fuzz_model_config/): a float where an
// integer belongs went through nlohmann's float->int conversion (undefined behaviour when out of
// range), and 10^15 layers hung the parser.
TEST(ModelConfigTest, IntegersMustBeIntegersInRangeAndLayersBounded) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"num_experts", 1e300}, {"num_experts", 1.5}, {"vocab_size", -1e30},
           {"bos_token_id", int64_t{1} << 40}, {"mlp_only_layers", {1, 2.5}},
           {"eos_token_id", {1, 1e20}}}) {
    auto j = Qwen3();
    j[key] = value;
    const absl::Status st = ParseModelConfig(j.dump(), "").status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << key << " " << value;
    EXPECT_NE(st.message().find(key), std::string::npos) << st;
  }
  auto j = Qwen3();
  j["num_experts"] = 8.0;  // an integral float is the integer
  auto c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  j["num_hidden_layers"] = int64_t{1000000000000000};
  const absl::Status st = ParseModelConfig(j.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_hidden_layers"), std::string::npos) << st;
}

TEST(ModelConfigTest, ClearErrors) {
  auto unknown = Qwen3();
  unknown["model_type"] = "llama";
  auto st = ParseModelConfig(unknown.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("llama"), std::string::npos);
  EXPECT_NE(st.message().find("qwen3_moe"), std::string::npos);

  auto missing = Qwen3();
  missing.erase("hidden_size");
  st = ParseModelConfig(missing.dump(), "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("hidden_size"), std::string::npos);

  auto wrong_type = Qwen3();
  wrong_type["num_experts"] = "eight";
  st = ParseModelConfig(wrong_type.dump(), "").status();
  EXPECT_NE(st.message().find("num_experts"), std::string::npos);

  auto heads = Qwen3();
  heads["num_key_value_heads"] = 3;
  EXPECT_EQ(ParseModelConfig(heads.dump(), "").status().code(), absl::StatusCode::kInvalidArgument);

  auto topk = Qwen3();
  topk["num_experts_per_tok"] = 9;
  EXPECT_NE(ParseModelConfig(topk.dump(), "").status().message().find("num_experts_per_tok"),
            std::string::npos);

  EXPECT_EQ(ParseModelConfig("{\"model_type\":", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig(Qwen3().dump(), "[").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadModelConfig("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

nlohmann::json Qwen35Text() {
  return {{"model_type", "qwen3_5_moe_text"},
          {"vocab_size", 100},
          {"hidden_size", 16},
          {"num_hidden_layers", 8},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"moe_intermediate_size", 8},
          {"shared_expert_intermediate_size", 8},
          {"num_experts", 8},
          {"num_experts_per_tok", 2},
          {"max_position_embeddings", 64},
          {"linear_num_key_heads", 2},
          {"linear_num_value_heads", 4},
          {"linear_key_head_dim", 8},
          {"linear_value_head_dim", 6},
          {"linear_conv_kernel_dim", 4}};
}

// The hybrids: layer types from full_attention_interval (default 4) or layer_types, the
// GatedDeltaNet fields, partial rotary 0.25 unless given, always-renormalised routing, the
// composite config's text_config.
TEST(ModelConfigTest, HybridLayersAndDefaults) {
  auto c = ParseModelConfig(Qwen35Text().dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(c->IsLinearLayer(l), (l + 1) % 4 != 0) << l;
  EXPECT_DOUBLE_EQ(c->rope.partial_rotary_factor, 0.25);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->arch.zero_centred_norms);
  EXPECT_EQ(c->LinearConvChannels(), 2 * 2 * 8 + 4 * 6);
  EXPECT_EQ(c->LinearStateFloats(), (2 * 2 * 8 + 4 * 6) * 3 + 4 * 8 * 6);
  for (int64_t l = 0; l < 8; ++l) EXPECT_TRUE(c->IsSparseLayer(l)) << l;

  auto interval = Qwen35Text();
  interval["full_attention_interval"] = 2;
  interval["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  c = ParseModelConfig(interval.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsLinearLayer(0));
  EXPECT_FALSE(c->IsLinearLayer(1));
  EXPECT_DOUBLE_EQ(c->rope.partial_rotary_factor, 0.5);

  const nlohmann::json composite = {
      {"model_type", "qwen3_5_moe"}, {"text_config", Qwen35Text()}, {"eos_token_id", 7}};
  c = ParseModelConfig(composite.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 16);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{7});  // top-level ids reach the text model

  auto next = Qwen35Text();
  next["model_type"] = "qwen3_next";
  next["intermediate_size"] = 12;
  next["mlp_only_layers"] = {1};
  next["norm_topk_prob"] = false;
  c = ParseModelConfig(next.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch.linear_attention, LinearAttention::kGrouped);
  EXPECT_FALSE(c->IsSparseLayer(1));
  EXPECT_FALSE(c->norm_topk_prob);
}

// Each hybrid config error names its field or entry.
TEST(ModelConfigTest, HybridErrorsNameTheField) {
  auto expect = [](const nlohmann::json& j, absl::StatusCode code, const std::string& needle) {
    const absl::Status st = ParseModelConfig(j.dump(), "").status();
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  auto types = Qwen35Text();
  types["layer_types"] = {"linear_attention", "full_attention",   "mamba",
                          "full_attention",   "linear_attention", "full_attention",
                          "linear_attention", "full_attention"};
  expect(types, absl::StatusCode::kUnimplemented, "layer_types[2] 'mamba'");
  auto count = Qwen35Text();
  count["layer_types"] = {"linear_attention", "full_attention"};
  expect(count, absl::StatusCode::kInvalidArgument, "layer_types has 2 entries");
  auto heads = Qwen35Text();
  heads["linear_num_value_heads"] = 5;
  expect(heads, absl::StatusCode::kInvalidArgument,
         "linear_num_value_heads 5 is not a multiple of linear_num_key_heads 2");
  auto missing = Qwen35Text();
  missing.erase("linear_key_head_dim");
  expect(missing, absl::StatusCode::kInvalidArgument, "linear_key_head_dim");
  auto width = Qwen35Text();
  width["linear_conv_kernel_dim"] = 1;
  expect(width, absl::StatusCode::kInvalidArgument, "linear_conv_kernel_dim");
  auto interval = Qwen35Text();
  interval["full_attention_interval"] = 0;
  expect(interval, absl::StatusCode::kInvalidArgument, "full_attention_interval");
  expect({{"model_type", "qwen3_5_moe"}}, absl::StatusCode::kInvalidArgument, "text_config");
}

nlohmann::json Lfm2() {
  return {{"model_type", "lfm2_moe"},
          {"vocab_size", 100},
          {"hidden_size", 16},
          {"intermediate_size", 32},
          {"moe_intermediate_size", 8},
          {"num_hidden_layers", 4},
          {"layer_types", {"conv", "full_attention", "conv", "full_attention"}},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_dense_layers", 1},
          {"num_experts", 8},
          {"num_experts_per_tok", 2},
          {"norm_eps", 1e-5},
          {"routed_scaling_factor", 1.5},
          {"max_position_embeddings", 64}};
}

// LFM2 (architectures.md §3.1): its field names and defaults, conv layers keep a state and no KV.
TEST(ModelConfigTest, Lfm2FieldsAndDefaults) {
  auto j = Lfm2();
  j["head_dim"] = 3;  // not a field of the family: hd = H / nH
  auto c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope.rope_theta, 1e6);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->use_expert_bias);
  EXPECT_EQ(c->routed_scaling_factor, 1.5);
  EXPECT_EQ(c->conv_L_cache, 3);
  EXPECT_FALSE(c->conv_bias);
  EXPECT_FALSE(c->IsSparseLayer(0));  // num_dense_layers
  EXPECT_TRUE(c->IsSparseLayer(1));
  EXPECT_TRUE(c->IsConvLayer(0));
  EXPECT_FALSE(c->IsConvLayer(1));
  EXPECT_FALSE(c->IsLinearLayer(0));
  EXPECT_EQ(c->NumKvLayers(), 2);
  EXPECT_EQ(c->KvLayerIndex(0), -1);
  EXPECT_EQ(c->KvLayerIndex(3), 1);
  EXPECT_EQ(c->StateFloats(0), 16 * 2);
  EXPECT_EQ(c->StateFloats(1), 0);
  EXPECT_EQ(c->StateOffset(2), 32);
  EXPECT_EQ(c->StateOffset(4), 64);
  j["tie_embedding"] = false;  // the legacy spelling
  j["conv_L_cache"] = 4;
  j["conv_bias"] = true;
  j["norm_topk_prob"] = false;
  c = ParseModelConfig(j.dump(), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->StateFloats(2), 16 * 3);
  EXPECT_TRUE(c->conv_bias);
  EXPECT_FALSE(c->norm_topk_prob);
}

// layer_types is required (transformers derives nothing) and its entries are checked.
TEST(ModelConfigTest, Lfm2ErrorsNameTheField) {
  auto expect = [](const nlohmann::json& j, absl::StatusCode code, const std::string& needle) {
    const absl::Status st = ParseModelConfig(j.dump(), "").status();
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  auto missing = Lfm2();
  missing.erase("layer_types");
  expect(missing, absl::StatusCode::kInvalidArgument, "missing 'layer_types'");
  auto unknown = Lfm2();
  unknown["layer_types"] = {"conv", "full_attention", "linear_attention", "full_attention"};
  expect(unknown, absl::StatusCode::kUnimplemented, "layer_types[2] 'linear_attention'");
  auto count = Lfm2();
  count["layer_types"] = {"conv"};
  expect(count, absl::StatusCode::kInvalidArgument, "layer_types has 1 entries");
  auto width = Lfm2();
  width["conv_L_cache"] = 1;
  expect(width, absl::StatusCode::kInvalidArgument, "conv_L_cache");
  width["conv_L_cache"] = 9;
  expect(width, absl::StatusCode::kInvalidArgument, "'conv_L_cache' must be in [2, 8], got 9");
}

}  // namespace
}  // namespace moe::engine
