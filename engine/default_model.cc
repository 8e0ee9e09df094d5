// WriteDefaultModel: config and weights of a 4-layer, 16-expert qwen3_moe, plus its tokenizer.
#include "engine/default_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
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

}  // namespace

absl::Status WriteDefaultModel(const std::string& dir, uint64_t seed, int head_dim) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));

  MOE_ASSIGN_OR_RETURN(const std::string tokenizer_json,
                       TrainTokenizerJson(DefaultCorpus(), kTrainedVocab, kSpecialTokens));
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
  add("model.embed_tokens.weight", {vocab, H}, 0.5f, 0.f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {H}, 0.05f, 1.f);
    add(p + "post_attention_layernorm.weight", {H}, 0.05f, 1.f);
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
  add("model.norm.weight", {H}, 0.05f, 1.f);
  add("lm_head.weight", {vocab, H}, 0.1f, 0.f);
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = storage[i].data();

  const fs::path d(dir);
  MOE_RETURN_IF_ERROR(store::WriteSafetensors((d / "model.safetensors").string(), tensors));
  MOE_RETURN_IF_ERROR(WriteText(d / "tokenizer.json", tokenizer_json));
  MOE_RETURN_IF_ERROR(WriteText(d / "tokenizer_config.json",
                                ChatMlTokenizerConfigJson("<|im_end|>", "<|endoftext|>")));
  MOE_RETURN_IF_ERROR(WriteText(d / "generation_config.json", generation.dump(2)));
  // config.json last: a directory with config.json is a complete model.
  return WriteText(d / "config.json", config.dump(2));
}

}  // namespace moe::engine
