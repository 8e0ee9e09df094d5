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
  EXPECT_EQ(c->arch.moe_block, "block_sparse_moe");
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

}  // namespace
}  // namespace moe::engine
