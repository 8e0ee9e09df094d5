// WriteDefaultModel: config and weights of a 4-layer, 16-expert qwen3_moe, plus its tokenizer.
// WriteScriptedModel: the same shape, with weights set so that greedy decoding emits a script.
// WriteHybridModel: a Qwen3.5-MoE-shaped hybrid in the vision-language layout of real checkpoints.
// WriteLfm2Model: an LFM2-MoE short-conv hybrid in the layout of real LFM2 checkpoints.
// WriteDefaultTokenizer: the tokenizer alone.
#include "engine/default_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_trainer.h"
#include "engine/tokenizer/tokenizer.h"
#include "expertstore/safetensors.h"
#include "kernels/base/status.h"
#include "kernels/tensor.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kTrainedVocab = 1024;
const std::vector<std::string> kSpecialTokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// splitmix64 + Box-Muller: the same numbers on every platform (std::normal_distribution is not).
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : state_(seed) {}
  float Next() {
    const double u1 = (static_cast<double>(Bits() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(Bits() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }

 private:
  uint64_t Bits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) return absl::InternalError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainedTokenizerJson() {
  return TrainTokenizerJson(DefaultCorpus(), kTrainedVocab, kSpecialTokens);
}

// tokenizer.json and a ChatML tokenizer_config.json (eos <|im_end|>, bos <|endoftext|>).
absl::Status WriteTokenizerFiles(const fs::path& dir, const std::string& tokenizer_json) {
  MOE_RETURN_IF_ERROR(WriteText(dir / "tokenizer.json", tokenizer_json));
  return WriteText(dir / "tokenizer_config.json",
                   ChatMlTokenizerConfigJson("<|im_end|>", "<|endoftext|>"));
}

// The script cut into pieces, each the shortest run of at least 4 bytes (whole UTF-8
// characters) not cut before, so that every piece differs from the others and can be a token of
// its own: a model that maps each piece to the next can then emit the whole script.
std::vector<std::string> ScriptPieces(const std::string& script) {
  std::vector<std::string> pieces;
  std::set<std::string> seen;
  size_t start = 0;
  while (start < script.size()) {
    size_t end = start;
    std::string piece;
    do {
      ++end;
      while (end < script.size() && (static_cast<unsigned char>(script[end]) & 0xC0) == 0x80) {
        ++end;  // a UTF-8 continuation byte: the character goes on
      }
      piece = script.substr(start, end - start);
    } while (end < script.size() && (piece.size() < 4 || seen.count(piece)));
    if (seen.count(piece)) {  // the tail repeats an earlier piece: glue it to the previous one
      pieces.back() += piece;
    } else {
      pieces.push_back(piece);
    }
    seen.insert(pieces.back());
    start = end;
  }
  return pieces;
}

// Adds `pieces` to a trained tokenizer.json as added tokens (not special: they are text), with
// ids after the existing ones.
absl::StatusOr<std::string> AddPieceTokens(const std::string& tokenizer_json,
                                           const std::vector<std::string>& pieces) {
  json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InternalError("trained tokenizer.json does not parse");
  int64_t next_id = static_cast<int64_t>(root["model"]["vocab"].size());
  for (const json& t : root["added_tokens"]) {
    next_id = std::max<int64_t>(next_id, t["id"].get<int64_t>() + 1);
  }
  for (const std::string& piece : pieces) {
    root["added_tokens"].push_back({{"id", next_id++},
                                    {"content", piece},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", false}});
  }
  return root.dump(1);
}

// Makes greedy decoding emit the pieces in order, then <|im_end|>, whatever the prompt: attention
// and experts still run but write nothing (o_proj and down_proj zero), so the last hidden state is
// the current token's embedding. Every token that is not a piece embeds as basis vector e0, piece
// i as e(i+1); the lm head maps e0 to piece 0, e(i+1) to piece i+1 and the last piece to
// <|im_end|>, with every other row zero. After the final RMSNorm the right logit is sqrt(H) (times
// the norm's weight, ~1), every other one 0: exact in bf16.
absl::Status ScriptWeights(const Tokenizer& tokenizer, const std::vector<std::string>& pieces,
                           int64_t H, const std::vector<store::TensorToWrite>& tensors,
                           std::vector<std::vector<uint16_t>>& storage) {
  if (static_cast<int64_t>(pieces.size()) + 1 >= H) {
    return absl::InvalidArgumentError(
        absl::StrCat("script: ", pieces.size(), " pieces, at most ", H - 2, " fit"));
  }
  std::vector<int32_t> piece_ids;
  for (const std::string& piece : pieces) {
    const std::optional<int32_t> id = tokenizer.TokenId(piece);
    if (!id || std::count(piece_ids.begin(), piece_ids.end(), *id)) {
      return absl::InternalError(
          absl::StrCat("script piece '", piece, "' is not a token of its own"));
    }
    piece_ids.push_back(*id);
  }
  const int32_t eos = *tokenizer.TokenId("<|im_end|>");
  const uint16_t one = kernels::F32ToBf16(1.f);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::string& name = tensors[t].name;
    std::vector<uint16_t>& data = storage[t];
    if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) {
      std::fill(data.begin(), data.end(), uint16_t{0});
    } else if (name == "model.embed_tokens.weight") {
      std::fill(data.begin(), data.end(), uint16_t{0});
      const int64_t vocab = static_cast<int64_t>(data.size()) / H;
      for (int64_t id = 0; id < vocab; ++id) data[id * H] = one;
      for (size_t i = 0; i < piece_ids.size(); ++i) {
        data[piece_ids[i] * H] = 0;
        data[piece_ids[i] * H + 1 + i] = one;
      }
    } else if (name == "lm_head.weight") {
      std::fill(data.begin(), data.end(), uint16_t{0});
      data[piece_ids[0] * H] = one;
      for (size_t i = 0; i + 1 < piece_ids.size(); ++i) data[piece_ids[i + 1] * H + 1 + i] = one;
      data[eos * H + piece_ids.size()] = one;
    }
  }
  return absl::OkStatus();
}

// Which checkpoint layout WriteModel writes.
enum class Layout { kQwen3Moe, kQwen35Hybrid, kLfm2Moe };

absl::Status WriteModel(const std::string& dir, uint64_t seed, int head_dim,
                        const std::string& script, Layout layout) {
  const bool hybrid = layout == Layout::kQwen35Hybrid;
  const bool lfm2 = layout == Layout::kLfm2Moe;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));

  MOE_ASSIGN_OR_RETURN(std::string tokenizer_json, TrainedTokenizerJson());
  const std::vector<std::string> pieces = ScriptPieces(script);
  if (!pieces.empty()) {
    MOE_ASSIGN_OR_RETURN(tokenizer_json, AddPieceTokens(tokenizer_json, pieces));
  }
  MOE_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromJson(tokenizer_json));
  const int64_t vocab = tokenizer->vocab_size();
  const auto eos = tokenizer->TokenId("<|im_end|>");
  const auto eot = tokenizer->TokenId("<|endoftext|>");
  if (!eos || !eot) return absl::InternalError("trained tokenizer lacks its special tokens");

  const int64_t H = 256, layers = 4, heads = 8, kv_heads = 2, D = head_dim, E = 16, I = 128;
  json config = {
      {"architectures", {"Qwen3MoeForCausalLM"}},
      {"model_type", "qwen3_moe"},
      {"vocab_size", vocab},
      {"hidden_size", H},
      {"num_hidden_layers", layers},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"head_dim", D},
      {"intermediate_size", 512},
      {"moe_intermediate_size", I},
      {"num_experts", E},
      {"num_experts_per_tok", 4},
      {"norm_topk_prob", true},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", json::array()},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 4096},
      {"rope_theta", 1000000.0},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"bos_token_id", *eot},
      {"eos_token_id", *eos},
      {"torch_dtype", "bfloat16"},
  };
  json generation = {{"eos_token_id", {*eos, *eot}}, {"bos_token_id", *eot}};
  // The hybrid: Qwen3.5's vision-language layout, as its real checkpoints have it (the text
  // model's fields in text_config, its tensors under model.language_model., fused experts, a
  // vision tower and an MTP head the engine skips).
  const int64_t NK = 2, NV = 4, DK = 32, DV = 32, KW = 4, C = 2 * NK * DK + NV * DV;
  if (hybrid) {
    json text = config;
    text["model_type"] = "qwen3_5_moe_text";
    text["full_attention_interval"] = 2;  // layers 1 and 3 full attention, 0 and 2 linear
    text["linear_num_key_heads"] = NK;
    text["linear_num_value_heads"] = NV;
    text["linear_key_head_dim"] = DK;
    text["linear_value_head_dim"] = DV;
    text["linear_conv_kernel_dim"] = KW;
    text["shared_expert_intermediate_size"] = I;
    text["rope_parameters"] = {
        {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
    for (const char* key : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                            "intermediate_size", "rope_theta"}) {
      text.erase(key);
    }
    config = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
              {"model_type", "qwen3_5_moe"},
              {"text_config", text},
              {"tie_word_embeddings", false}};
  }
  // LFM2-MoE: short-conv layers 0 and 2, full attention 1 and 3, layer 0 a dense FFN, sigmoid
  // routing with an expert bias, tied embeddings, LFM2's tensor names (as real checkpoints).
  const int64_t L = 3, dense_I = 512;
  if (lfm2) {
    config = {{"architectures", {"Lfm2MoeForCausalLM"}},
              {"model_type", "lfm2_moe"},
              {"vocab_size", vocab},
              {"hidden_size", H},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"intermediate_size", dense_I},
              {"moe_intermediate_size", I},
              {"num_experts", E},
              {"num_experts_per_tok", 4},
              {"num_dense_layers", 1},
              {"layer_types", {"conv", "full_attention", "conv", "full_attention"}},
              {"conv_L_cache", L},
              {"conv_bias", false},
              {"use_expert_bias", true},
              {"routed_scaling_factor", 1.5},
              {"norm_topk_prob", true},
              {"norm_eps", 1e-5},
              {"max_position_embeddings", 4096},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
              {"tie_word_embeddings", true},
              {"bos_token_id", *eot},
              {"eos_token_id", *eos},
              {"torch_dtype", "bfloat16"}};
    if (head_dim != H / heads) {
      return absl::InvalidArgumentError("lfm2_moe: head_dim is hidden_size / heads (32)");
    }
  }

  // Weights: N(0, 0.02) projections, norms near 1, routers sharper so experts specialise.
  Gaussian rng(seed);
  std::vector<std::vector<uint16_t>> storage;
  std::vector<store::TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float std_dev, float mean) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& data = storage.emplace_back(n);
    for (auto& v : data) v = kernels::F32ToBf16(mean + std_dev * rng.Next());
    tensors.push_back({name, kernels::DType::kBF16, std::move(shape), nullptr});
  };
  const std::string model = hybrid ? "model.language_model." : "model.";
  const float norm_mean = hybrid ? 0.f : 1.f;  // the hybrid's norms scale by 1 + w
  add(model + "embed_tokens.weight", {vocab, H}, 0.5f, 0.f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat(model, "layers.", l, ".");
    add(p + "input_layernorm.weight", {H}, 0.05f, norm_mean);
    add(p + "post_attention_layernorm.weight", {H}, 0.05f, norm_mean);
    if (lfm2) {
      add(p + "operator_norm.weight", {H}, 0.05f, 1.f);
      add(p + "ffn_norm.weight", {H}, 0.05f, 1.f);
      if (l % 2 == 0) {
        add(p + "conv.in_proj.weight", {3 * H, H}, 0.06f, 0.f);  // B, C, X
        add(p + "conv.conv.weight", {H, 1, L}, 0.3f, 0.f);
        add(p + "conv.out_proj.weight", {H, H}, 0.06f, 0.f);
      } else {
        const std::string a = p + "self_attn.";
        add(a + "q_proj.weight", {heads * D, H}, 0.06f, 0.f);
        add(a + "k_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
        add(a + "v_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
        add(a + "out_proj.weight", {H, heads * D}, 0.06f, 0.f);
        add(a + "q_layernorm.weight", {D}, 0.05f, 1.f);
        add(a + "k_layernorm.weight", {D}, 0.05f, 1.f);
      }
      const std::string f = p + "feed_forward.";
      if (l == 0) {  // num_dense_layers
        add(f + "w1.weight", {dense_I, H}, 0.06f, 0.f);
        add(f + "w3.weight", {dense_I, H}, 0.06f, 0.f);
        add(f + "w2.weight", {H, dense_I}, 0.06f, 0.f);
        continue;
      }
      add(f + "gate.weight", {E, H}, 0.2f, 0.f);
      add(f + "expert_bias", {E}, 0.3f, 0.f);  // non-zero: the choice depends on it
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = absl::StrCat(f, "experts.", e, ".");
        add(x + "w1.weight", {I, H}, 0.06f, 0.f);
        add(x + "w3.weight", {I, H}, 0.06f, 0.f);
        add(x + "w2.weight", {H, I}, 0.06f, 0.f);
      }
      continue;
    }
    if (hybrid) {
      const std::string m = p + "mlp.";
      add(m + "gate.weight", {E, H}, 0.2f, 0.f);
      add(m + "experts.gate_up_proj", {E, 2 * I, H}, 0.06f, 0.f);
      add(m + "experts.down_proj", {E, H, I}, 0.06f, 0.f);
      add(m + "shared_expert.gate_proj.weight", {I, H}, 0.06f, 0.f);
      add(m + "shared_expert.up_proj.weight", {I, H}, 0.06f, 0.f);
      add(m + "shared_expert.down_proj.weight", {H, I}, 0.06f, 0.f);
      add(m + "shared_expert_gate.weight", {1, H}, 0.06f, 0.f);
      if (l % 2 == 0) {
        const std::string a = p + "linear_attn.";
        add(a + "in_proj_qkv.weight", {C, H}, 0.06f, 0.f);
        add(a + "in_proj_z.weight", {NV * DV, H}, 0.06f, 0.f);
        add(a + "in_proj_b.weight", {NV, H}, 0.06f, 0.f);
        add(a + "in_proj_a.weight", {NV, H}, 0.06f, 0.f);
        add(a + "conv1d.weight", {C, 1, KW}, 0.3f, 0.f);
        add(a + "A_log", {NV}, 0.5f, 0.7f);
        add(a + "dt_bias", {NV}, 0.5f, 0.f);
        add(a + "norm.weight", {DV}, 0.05f, 1.f);
        add(a + "out_proj.weight", {H, NV * DV}, 0.06f, 0.f);
        continue;
      }
      add(p + "self_attn.q_proj.weight", {2 * heads * D, H}, 0.06f, 0.f);  // query and gate
      add(p + "self_attn.k_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
      add(p + "self_attn.v_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
      add(p + "self_attn.o_proj.weight", {H, heads * D}, 0.06f, 0.f);
      add(p + "self_attn.q_norm.weight", {D}, 0.05f, 0.f);
      add(p + "self_attn.k_norm.weight", {D}, 0.05f, 0.f);
      continue;
    }
    add(p + "self_attn.q_proj.weight", {heads * D, H}, 0.06f, 0.f);
    add(p + "self_attn.k_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
    add(p + "self_attn.v_proj.weight", {kv_heads * D, H}, 0.06f, 0.f);
    add(p + "self_attn.o_proj.weight", {H, heads * D}, 0.06f, 0.f);
    add(p + "self_attn.q_norm.weight", {D}, 0.05f, 1.f);
    add(p + "self_attn.k_norm.weight", {D}, 0.05f, 1.f);
    add(p + "mlp.gate.weight", {E, H}, 0.2f, 0.f);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
      add(x + "gate_proj.weight", {I, H}, 0.06f, 0.f);
      add(x + "up_proj.weight", {I, H}, 0.06f, 0.f);
      add(x + "down_proj.weight", {H, I}, 0.06f, 0.f);
    }
  }
  if (lfm2) {
    add(model + "embedding_norm.weight", {H}, 0.05f, 1.f);  // tied: no lm_head
  } else {
    add(model + "norm.weight", {H}, 0.05f, norm_mean);
    add("lm_head.weight", {vocab, H}, 0.1f, 0.f);
  }
  if (hybrid) {
    add("model.visual.patch_embed.proj.weight", {H, 8}, 0.06f, 0.f);
    add("mtp.fc.weight", {H, 2 * H}, 0.06f, 0.f);
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = storage[i].data();
  if (!pieces.empty()) {
    MOE_RETURN_IF_ERROR(ScriptWeights(*tokenizer, pieces, H, tensors, storage));
  }

  const fs::path d(dir);
  MOE_RETURN_IF_ERROR(store::WriteSafetensors((d / "model.safetensors").string(), tensors));
  MOE_RETURN_IF_ERROR(WriteTokenizerFiles(d, tokenizer_json));
  MOE_RETURN_IF_ERROR(WriteText(d / "generation_config.json", generation.dump(2)));
  // config.json last: a directory with config.json is a complete model.
  return WriteText(d / "config.json", config.dump(2));
}

}  // namespace

absl::Status WriteDefaultModel(const std::string& dir, uint64_t seed, int head_dim) {
  return WriteModel(dir, seed, head_dim, /*script=*/"", Layout::kQwen3Moe);
}

absl::Status WriteHybridModel(const std::string& dir, uint64_t seed) {
  return WriteModel(dir, seed, 32, /*script=*/"", Layout::kQwen35Hybrid);
}

absl::Status WriteLfm2Model(const std::string& dir, uint64_t seed) {
  return WriteModel(dir, seed, 32, /*script=*/"", Layout::kLfm2Moe);
}

absl::Status WriteDefaultTokenizer(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(const std::string tokenizer_json, TrainedTokenizerJson());
  return WriteTokenizerFiles(dir, tokenizer_json);
}

absl::Status WriteScriptedModel(const std::string& dir, const std::string& script) {
  if (script.empty()) return absl::InvalidArgumentError("script is empty");
  return WriteModel(dir, 20261121, 32, script, Layout::kQwen3Moe);
}

}  // namespace moe::engine
