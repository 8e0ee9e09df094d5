// The table of supported MoE families. Checked against transformers 5.17's modeling files.
#include "engine/architecture.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe::engine {
namespace {

std::vector<Architecture> Table() {
  std::vector<Architecture> t;
  {
    Architecture a;
    a.model_type = "qwen3_moe";
    a.qk_norm = QkNorm::kPerHead;
    a.default_norm_topk_prob = true;
    a.reads_sparse_step = true;
    a.sliding_window = SlidingWindowRule::kGated;
    t.push_back(a);
  }
  {
    Architecture a;
    a.model_type = "qwen2_moe";
    a.default_qkv_bias = true;
    a.qkv_bias_field = "qkv_bias";
    a.has_shared_expert = true;
    a.reads_sparse_step = true;
    a.sliding_window = SlidingWindowRule::kPerLayer;
    t.push_back(a);
  }
  {
    Architecture a;
    a.model_type = "mixtral";
    a.moe_block = "block_sparse_moe";
    a.expert_gate = "w1";
    a.expert_up = "w3";
    a.expert_down = "w2";
    a.num_experts_fields = {"num_local_experts"};
    a.expert_width_fields = {"intermediate_size"};
    a.always_renormalize = true;
    t.push_back(a);
  }
  {
    Architecture a;
    a.model_type = "olmoe";
    a.qk_norm = QkNorm::kWholeProj;
    a.expert_width_fields = {"intermediate_size"};
    a.sliding_window = SlidingWindowRule::kNone;
    t.push_back(a);
  }
  for (const char* type : {"qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"}) {
    Architecture a;
    a.model_type = type;
    a.has_shared_expert = true;
    a.sliding_window = SlidingWindowRule::kNone;
    a.linear_attention = LinearAttention::kSeparate;
    a.zero_centred_norms = true;
    a.qk_norm = QkNorm::kPerHead;
    a.attention_output_gate = true;
    a.default_partial_rotary_factor = 0.25;
    if (a.model_type == "qwen3_next") {
      a.linear_attention = LinearAttention::kGrouped;
      a.default_norm_topk_prob = true;
      a.reads_sparse_step = true;
    } else {
      a.always_renormalize = true;
      a.text_config = a.model_type == "qwen3_5_moe";
    }
    t.push_back(a);
  }
  {
    Architecture a;
    a.model_type = "lfm2_moe";
    a.qk_norm = QkNorm::kPerHead;
    a.moe_block = "feed_forward";
    a.expert_gate = "w1";
    a.expert_up = "w3";
    a.expert_down = "w2";
    a.num_experts_fields = {"num_experts"};
    a.default_norm_topk_prob = true;
    a.sliding_window = SlidingWindowRule::kNone;
    a.short_conv = true;
    a.sigmoid_routing = true;
    a.default_tie_word_embeddings = true;
    a.default_rope_theta = 1e6;
    a.rms_norm_eps_field = "norm_eps";
    a.reads_head_dim = false;
    a.input_norm = "operator_norm";
    a.post_attention_norm = "ffn_norm";
    a.final_norm = "embedding_norm";  // after the last layer, despite its name
    a.o_proj = "out_proj";
    a.q_norm = "q_layernorm";
    a.k_norm = "k_layernorm";
    a.dense_block = "feed_forward";
    a.dense_gate = "w1";
    a.dense_up = "w3";
    a.dense_down = "w2";
    t.push_back(a);
  }
  return t;
}

}  // namespace

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const Architecture& a : Table()) names.push_back(a.model_type);
  return names;
}

absl::StatusOr<Architecture> FindArchitecture(const std::string& model_type) {
  for (const Architecture& a : Table()) {
    if (a.model_type == model_type) return a;
  }
  return absl::UnimplementedError(absl::StrCat("unknown architecture model_type '", model_type,
                                               "'; supported: ",
                                               absl::StrJoin(SupportedArchitectures(), ", ")));
}

}  // namespace moe::engine
