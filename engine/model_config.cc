// LoadModelConfig: JSON -> ModelConfig with every required field checked and named on error.
#include "engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {
using nlohmann::json;

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& what) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
    return j;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON: ", e.what()));
  }
}

// Present and non-null.
bool Has(const json& j, const std::string& key) { return j.contains(key) && !j[key].is_null(); }

// `v` as an integer of type T: an integer JSON number, or a float with an integral value, in T's
// range. nlohmann's get<T>() converts an out-of-range float with undefined behaviour (found by
// fuzz_model_config) and truncates 1.5 silently.
template <typename T>
bool ToInteger(const json& v, T* out) {
  using Limits = std::numeric_limits<T>;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(Limits::max())) return false;
    *out = static_cast<T>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < static_cast<int64_t>(Limits::min()) || i > static_cast<int64_t>(Limits::max())) {
      return false;
    }
    *out = static_cast<T>(i);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is the first double past int64's range; [min, max] of narrower types are exact.
    if (!std::isfinite(d) || d != std::trunc(d) || d < static_cast<double>(Limits::min()) ||
        d >= std::ldexp(1.0, Limits::digits)) {
      return false;
    }
    *out = static_cast<T>(d);
    return true;
  }
  return false;
}

template <typename T>
absl::Status ReadValue(const json& v, const std::string& key, T* out) {
  const auto wrong = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", key, "' ", what, ", got ", v.dump()));
  };
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!ToInteger(v, out)) return wrong("must be an integer in range");
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    if (!v.is_array()) return wrong("must be a list of integers");
    out->clear();
    for (const json& e : v) {
      int64_t i = 0;
      if (!ToInteger(e, &i)) return wrong("must be a list of integers");
      out->push_back(i);
    }
  } else {
    try {
      *out = v.get<T>();
    } catch (const json::exception& e) {
      return wrong("has the wrong type");
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Read(const json& j, const std::string& key, T* out, bool required) {
  if (!Has(j, key)) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing '", key, "'"));
    return absl::OkStatus();
  }
  return ReadValue(j[key], key, out);
}

absl::Status ReadRope(const json& cfg, RopeConfig* rope) {
  const json empty = json::object();
  const json& params = Has(cfg, "rope_parameters") ? cfg["rope_parameters"] : empty;
  const json& scaling = Has(cfg, "rope_scaling") ? cfg["rope_scaling"] : empty;
  if (!params.is_object() || !scaling.is_object()) {
    return absl::InvalidArgumentError("config.json: rope_parameters/rope_scaling is not an object");
  }
  // One lookup order for every RoPE field.
  auto get = [&](const std::string& key, auto* out) -> absl::Status {
    for (const json* src : {&params, &cfg, &scaling}) {
      if (Has(*src, key)) return Read(*src, key, out, true);
    }
    return absl::OkStatus();
  };
  MOE_RETURN_IF_ERROR(get("rope_type", &rope->rope_type));
  if (rope->rope_type == "default" && !Has(params, "rope_type")) {
    MOE_RETURN_IF_ERROR(get("type", &rope->rope_type));
  }
  MOE_RETURN_IF_ERROR(get("rope_theta", &rope->rope_theta));
  MOE_RETURN_IF_ERROR(get("factor", &rope->factor));
  MOE_RETURN_IF_ERROR(get("partial_rotary_factor", &rope->partial_rotary_factor));
  MOE_RETURN_IF_ERROR(get("original_max_position_embeddings",
                          &rope->original_max_position_embeddings));
  MOE_RETURN_IF_ERROR(get("attention_factor", &rope->attention_factor));
  MOE_RETURN_IF_ERROR(get("beta_fast", &rope->beta_fast));
  MOE_RETURN_IF_ERROR(get("beta_slow", &rope->beta_slow));
  MOE_RETURN_IF_ERROR(get("mscale", &rope->mscale));
  MOE_RETURN_IF_ERROR(get("mscale_all_dim", &rope->mscale_all_dim));
  MOE_RETURN_IF_ERROR(get("truncate", &rope->truncate));
  MOE_RETURN_IF_ERROR(get("low_freq_factor", &rope->low_freq_factor));
  MOE_RETURN_IF_ERROR(get("high_freq_factor", &rope->high_freq_factor));
  static const char* kSupported[] = {"default", "linear", "yarn", "llama3"};
  if (std::find(std::begin(kSupported), std::end(kSupported), rope->rope_type) ==
      std::end(kSupported)) {
    return absl::UnimplementedError(absl::StrCat("config.json: rope type '", rope->rope_type,
                                                 "' is not supported (default, linear, yarn, llama3)"));
  }
  if (rope->factor <= 0) return absl::InvalidArgumentError("config.json: rope factor must be > 0");
  return absl::OkStatus();
}

// eos_token_id may be an int or a list of ints.
absl::Status ReadEos(const json& j, std::vector<int32_t>* out) {
  if (!Has(j, "eos_token_id")) return absl::OkStatus();
  out->clear();
  const json& eos = j["eos_token_id"];
  for (const json& v : eos.is_array() ? eos : json::array({eos})) {
    int32_t id = 0;
    if (!ToInteger(v, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "eos_token_id is neither an integer nor a list of integers, got ", eos.dump()));
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

// config.json's layer_types: one entry per layer, each `first` or `second`; the error names the
// count or the entry.
absl::Status ReadLayerTypes(const json& cfg, int64_t layers, const std::string& first,
                            const std::string& second, std::vector<std::string>* out) {
  std::vector<std::string> types;
  MOE_RETURN_IF_ERROR(Read(cfg, "layer_types", &types, true));
  if (static_cast<int64_t>(types.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types has ", types.size(),
                                                   " entries, num_hidden_layers is ", layers));
  }
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != first && types[i] != second) {
      return absl::UnimplementedError(absl::StrCat("config.json: layer_types[", i, "] '",
                                                   types[i], "' is not supported (", first, ", ",
                                                   second, ")"));
    }
  }
  *out = std::move(types);
  return absl::OkStatus();
}

// Resolves c->layer_types as transformers does for the family (SlidingWindowRule); needs
// num_hidden_layers checked. qwen2_moe: sliding_window = use_sliding_window ? sliding_window :
// None; layer_types from config.json, else "sliding_attention" where layer >= max_window_layers.
absl::Status ReadSlidingWindow(const json& cfg, ModelConfig* c) {
  const SlidingWindowRule rule = c->arch.sliding_window;
  bool use_sliding_window = rule == SlidingWindowRule::kAllLayers;
  if (rule == SlidingWindowRule::kGated || rule == SlidingWindowRule::kPerLayer) {
    MOE_RETURN_IF_ERROR(Read(cfg, "use_sliding_window", &use_sliding_window, false));
  }
  if (use_sliding_window) MOE_RETURN_IF_ERROR(Read(cfg, "sliding_window", &c->sliding_window, false));
  if (c->sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: sliding_window must be >= 0, got ",
                                                   c->sliding_window));
  }
  if (use_sliding_window && rule != SlidingWindowRule::kAllLayers && c->sliding_window == 0) {
    return absl::InvalidArgumentError(
        "config.json: use_sliding_window is true but sliding_window is not set");
  }
  const int64_t L = c->num_hidden_layers;
  c->layer_types.assign(L, "full_attention");
  if (c->sliding_window == 0) return absl::OkStatus();
  if (rule != SlidingWindowRule::kPerLayer) {
    c->layer_types.assign(L, "sliding_attention");
    return absl::OkStatus();
  }
  if (Has(cfg, "layer_types")) {
    return ReadLayerTypes(cfg, L, "full_attention", "sliding_attention", &c->layer_types);
  }
  int64_t max_window_layers = 28;  // transformers' Qwen2MoeConfig default
  MOE_RETURN_IF_ERROR(Read(cfg, "max_window_layers", &max_window_layers, false));
  for (int64_t l = std::max<int64_t>(0, max_window_layers); l < L; ++l) {
    c->layer_types[l] = "sliding_attention";
  }
  return absl::OkStatus();
}

// Hybrids: layer_types from config.json, else from full_attention_interval, and the
// GatedDeltaNet fields, each checked by name.
absl::Status ReadHybridLayers(const json& cfg, ModelConfig* c) {
  const int64_t L = c->num_hidden_layers;
  if (Has(cfg, "layer_types")) {
    MOE_RETURN_IF_ERROR(
        ReadLayerTypes(cfg, L, "linear_attention", "full_attention", &c->layer_types));
  } else {
    int64_t interval = 4;  // transformers' default full_attention_interval
    MOE_RETURN_IF_ERROR(Read(cfg, "full_attention_interval", &interval, false));
    if (interval <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: 'full_attention_interval' must be > 0, got ", interval));
    }
    c->layer_types.clear();
    for (int64_t l = 0; l < L; ++l) {
      c->layer_types.push_back((l + 1) % interval == 0 ? "full_attention" : "linear_attention");
    }
  }
  struct Field {
    const char* name;
    int64_t* value;
  };
  for (const Field& f : {Field{"linear_num_key_heads", &c->linear_num_key_heads},
                         Field{"linear_num_value_heads", &c->linear_num_value_heads},
                         Field{"linear_key_head_dim", &c->linear_key_head_dim},
                         Field{"linear_value_head_dim", &c->linear_value_head_dim},
                         Field{"linear_conv_kernel_dim", &c->linear_conv_kernel_dim}}) {
    MOE_RETURN_IF_ERROR(Read(cfg, f.name, f.value, true));
    if (*f.value <= 0 || *f.value > (1 << 16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: '", f.name, "' must be in [1, 65536], got ", *f.value));
    }
  }
  if (c->linear_num_value_heads % c->linear_num_key_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: linear_num_value_heads ", c->linear_num_value_heads,
                     " is not a multiple of linear_num_key_heads ", c->linear_num_key_heads));
  }
  if (c->linear_conv_kernel_dim < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: 'linear_conv_kernel_dim' must be >= 2, got ", c->linear_conv_kernel_dim));
  }
  return absl::OkStatus();
}

// LFM2: layer_types is required ("conv" or "full_attention"; transformers derives nothing),
// then the short conv's fields.
absl::Status ReadConvLayers(const json& cfg, ModelConfig* c) {
  const int64_t L = c->num_hidden_layers;
  if (!Has(cfg, "layer_types")) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: missing 'layer_types' (model_type '", c->arch.model_type,
                     "' requires it: one of conv, full_attention per layer)"));
  }
  MOE_RETURN_IF_ERROR(ReadLayerTypes(cfg, L, "conv", "full_attention", &c->layer_types));
  c->conv_L_cache = 3;  // transformers' Lfm2MoeConfig default
  MOE_RETURN_IF_ERROR(Read(cfg, "conv_L_cache", &c->conv_L_cache, false));
  // 8: the widest conv the CUDA kernel holds in registers (kMaxConvWidth); LFM2 uses 3.
  if (c->conv_L_cache < 2 || c->conv_L_cache > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: 'conv_L_cache' must be in [2, 8], got ", c->conv_L_cache));
  }
  MOE_RETURN_IF_ERROR(Read(cfg, "conv_bias", &c->conv_bias, false));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int64_t ModelConfig::SlidingWindow(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layer_types.size())) return 0;
  return layer_types[layer] == "sliding_attention" ? sliding_window : 0;
}

bool ModelConfig::IsLinearLayer(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(layer_types.size()) &&
         layer_types[layer] == "linear_attention";
}

bool ModelConfig::IsConvLayer(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(layer_types.size()) &&
         layer_types[layer] == "conv";
}

int64_t ModelConfig::NumKvLayers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += StateFloats(l) > 0 ? 0 : 1;
  return n;
}

int64_t ModelConfig::KvLayerIndex(int64_t layer) const {
  if (StateFloats(layer) > 0) return -1;
  int64_t index = 0;
  for (int64_t l = 0; l < layer; ++l) index += StateFloats(l) > 0 ? 0 : 1;
  return index;
}

int64_t ModelConfig::StateFloats(int64_t layer) const {
  if (IsLinearLayer(layer)) return LinearStateFloats();
  if (IsConvLayer(layer)) return hidden_size * (conv_L_cache - 1);
  return 0;
}

int64_t ModelConfig::StateOffset(int64_t layer) const {
  int64_t offset = 0;
  for (int64_t l = 0; l < layer; ++l) offset += StateFloats(l);
  return offset;
}

int64_t ModelConfig::LinearConvChannels() const {
  return 2 * linear_num_key_heads * linear_key_head_dim +
         linear_num_value_heads * linear_value_head_dim;
}

int64_t ModelConfig::LinearStateFloats() const {
  if (arch.linear_attention == LinearAttention::kNone) return 0;
  return LinearConvChannels() * (linear_conv_kernel_dim - 1) +
         linear_num_value_heads * linear_key_head_dim * linear_value_head_dim;
}

bool ModelConfig::IsSparseLayer(int64_t layer) const {
  if (num_experts <= 0 || layer < num_dense_layers) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& config_json,
                                             const std::string& generation_config_json) {
  MOE_ASSIGN_OR_RETURN(json cfg, ParseJson(config_json, "config.json"));
  ModelConfig c;
  std::string model_type;
  MOE_RETURN_IF_ERROR(Read(cfg, "model_type", &model_type, true));
  MOE_ASSIGN_OR_RETURN(c.arch, FindArchitecture(model_type));
  if (c.arch.text_config) {  // a vision-language checkpoint: the text model's own config
    if (!Has(cfg, "text_config") || !cfg["text_config"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: model_type '", model_type, "' needs a 'text_config' object"));
    }
    json text = cfg["text_config"];
    // Token ids and tying may sit at the top level only.
    for (const char* key : {"eos_token_id", "bos_token_id", "tie_word_embeddings"}) {
      if (!Has(text, key) && Has(cfg, key)) text[key] = cfg[key];
    }
    cfg = std::move(text);
  }
  const Architecture& a = c.arch;

  MOE_RETURN_IF_ERROR(Read(cfg, "vocab_size", &c.vocab_size, true));
  MOE_RETURN_IF_ERROR(Read(cfg, "hidden_size", &c.hidden_size, true));
  MOE_RETURN_IF_ERROR(Read(cfg, "num_hidden_layers", &c.num_hidden_layers, true));
  MOE_RETURN_IF_ERROR(Read(cfg, "num_attention_heads", &c.num_attention_heads, true));
  c.num_key_value_heads = c.num_attention_heads;
  MOE_RETURN_IF_ERROR(Read(cfg, "num_key_value_heads", &c.num_key_value_heads, false));
  if (a.reads_head_dim) MOE_RETURN_IF_ERROR(Read(cfg, "head_dim", &c.head_dim, false));
  MOE_RETURN_IF_ERROR(Read(cfg, "intermediate_size", &c.intermediate_size, false));
  for (const std::string& f : a.num_experts_fields) {
    if (Has(cfg, f)) {
      MOE_RETURN_IF_ERROR(Read(cfg, f, &c.num_experts, true));
      break;
    }
  }
  for (const std::string& f : a.expert_width_fields) {
    if (Has(cfg, f)) {
      MOE_RETURN_IF_ERROR(Read(cfg, f, &c.moe_intermediate_size, true));
      break;
    }
  }
  MOE_RETURN_IF_ERROR(Read(cfg, "num_experts_per_tok", &c.num_experts_per_tok, true));
  if (a.has_shared_expert) {
    MOE_RETURN_IF_ERROR(Read(cfg, "shared_expert_intermediate_size",
                             &c.shared_expert_intermediate_size, true));
  }
  c.norm_topk_prob = a.always_renormalize || a.default_norm_topk_prob;
  if (!a.always_renormalize) MOE_RETURN_IF_ERROR(Read(cfg, "norm_topk_prob", &c.norm_topk_prob, false));
  if (a.reads_sparse_step) {
    MOE_RETURN_IF_ERROR(Read(cfg, "decoder_sparse_step", &c.decoder_sparse_step, false));
    MOE_RETURN_IF_ERROR(Read(cfg, "mlp_only_layers", &c.mlp_only_layers, false));
  }
  if (a.short_conv) MOE_RETURN_IF_ERROR(Read(cfg, "num_dense_layers", &c.num_dense_layers, false));
  if (a.sigmoid_routing) {
    MOE_RETURN_IF_ERROR(Read(cfg, "use_expert_bias", &c.use_expert_bias, false));
    MOE_RETURN_IF_ERROR(Read(cfg, "routed_scaling_factor", &c.routed_scaling_factor, false));
  }
  MOE_RETURN_IF_ERROR(Read(cfg, a.rms_norm_eps_field, &c.rms_norm_eps, false));
  MOE_RETURN_IF_ERROR(Read(cfg, "max_position_embeddings", &c.max_position_embeddings, true));
  c.tie_word_embeddings = a.default_tie_word_embeddings;
  if (a.short_conv) {  // LFM2's legacy spelling
    MOE_RETURN_IF_ERROR(Read(cfg, "tie_embedding", &c.tie_word_embeddings, false));
  }
  MOE_RETURN_IF_ERROR(Read(cfg, "tie_word_embeddings", &c.tie_word_embeddings, false));
  c.attention_bias = a.default_qkv_bias;
  MOE_RETURN_IF_ERROR(Read(cfg, a.qkv_bias_field, &c.attention_bias, false));
  MOE_RETURN_IF_ERROR(Read(cfg, "clip_qkv", &c.clip_qkv, false));
  // Every family's MLPs and experts compute silu(gate) * up; refuse another activation rather
  // than compute SiLU under its name (transformers' ACT2FN: "swish" is SiLU too).
  MOE_RETURN_IF_ERROR(Read(cfg, "hidden_act", &c.hidden_act, false));
  if (c.hidden_act != "silu" && c.hidden_act != "swish") {
    return absl::UnimplementedError(absl::StrCat("config.json: hidden_act '", c.hidden_act,
                                                 "' is not implemented (silu, swish)"));
  }
  c.rope.partial_rotary_factor = a.default_partial_rotary_factor;
  c.rope.rope_theta = a.default_rope_theta;
  MOE_RETURN_IF_ERROR(ReadRope(cfg, &c.rope));
  MOE_RETURN_IF_ERROR(ReadEos(cfg, &c.eos_token_ids));
  MOE_RETURN_IF_ERROR(Read(cfg, "bos_token_id", &c.bos_token_id, false));
  if (!generation_config_json.empty()) {
    MOE_ASSIGN_OR_RETURN(json gen, ParseJson(generation_config_json, "generation_config.json"));
    MOE_RETURN_IF_ERROR(base::Annotate(ReadEos(gen, &c.eos_token_ids), "generation_config.json"));
    MOE_RETURN_IF_ERROR(Read(gen, "bos_token_id", &c.bos_token_id, false));
  }

  // Consistency: every check names the field.
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  auto positive = [](int64_t v, const char* name) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("config.json: '", name, "' must be > 0, got ", v));
  };
  MOE_RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  MOE_RETURN_IF_ERROR(positive(c.hidden_size, "hidden_size"));
  MOE_RETURN_IF_ERROR(positive(c.num_hidden_layers, "num_hidden_layers"));
  // Per-layer work below (and in every loader) is O(layers): 10^15 layers hung the parser
  // (fuzz_model_config). The largest released MoE models have under 100.
  constexpr int64_t kMaxLayers = 4096;
  if (c.num_hidden_layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_hidden_layers ",
                                                   c.num_hidden_layers, " exceeds ", kMaxLayers));
  }
  MOE_RETURN_IF_ERROR(positive(c.num_attention_heads, "num_attention_heads"));
  MOE_RETURN_IF_ERROR(positive(c.num_key_value_heads, "num_key_value_heads"));
  MOE_RETURN_IF_ERROR(positive(c.head_dim, "head_dim"));
  MOE_RETURN_IF_ERROR(positive(c.num_experts, a.num_experts_fields.front().c_str()));
  MOE_RETURN_IF_ERROR(positive(c.moe_intermediate_size, a.expert_width_fields.front().c_str()));
  MOE_RETURN_IF_ERROR(positive(c.decoder_sparse_step, "decoder_sparse_step"));
  MOE_RETURN_IF_ERROR(positive(c.max_position_embeddings, "max_position_embeddings"));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: num_attention_heads ", c.num_attention_heads,
        " is not a multiple of num_key_value_heads ", c.num_key_value_heads));
  }
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_experts_per_tok ",
                                                   c.num_experts_per_tok, " must be in [1, ",
                                                   c.num_experts, "]"));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsSparseLayer(l)) MOE_RETURN_IF_ERROR(positive(c.intermediate_size, "intermediate_size"));
  }
  if (c.num_dense_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: 'num_dense_layers' must be >= 0, got ", c.num_dense_layers));
  }
  if (!std::isfinite(c.routed_scaling_factor)) {
    return absl::InvalidArgumentError("config.json: 'routed_scaling_factor' must be finite");
  }
  if (a.short_conv) {
    MOE_RETURN_IF_ERROR(ReadConvLayers(cfg, &c));
  } else if (a.linear_attention == LinearAttention::kNone) {
    MOE_RETURN_IF_ERROR(ReadSlidingWindow(cfg, &c));
  } else {
    MOE_RETURN_IF_ERROR(ReadHybridLayers(cfg, &c));
  }
  if (c.rope.original_max_position_embeddings == 0) {
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  auto config_text = ReadFile(config_path);
  if (!config_text.ok()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json (is this a Hugging Face model directory?)"));
  }
  std::string gen_text;
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  std::error_code ec;
  if (fs::exists(gen_path, ec)) {
    MOE_ASSIGN_OR_RETURN(gen_text, ReadFile(gen_path));
  }
  auto config = ParseModelConfig(*config_text, gen_text);
  if (!config.ok()) return base::Annotate(config.status(), dir);
  return config;
}

}  // namespace moe::engine
