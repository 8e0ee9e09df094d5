// Checkpoint::RepackPublishedF8: published FP8 checkpoints, chosen by config.json's
// quantization_config, repacked at load into kF8 (kernels/quant.h), bit for bit:
//
//   fp8 (transformers' FineGrainedFP8: Qwen3-*-FP8, DeepSeek-V3): fmt e4m3, activation_scheme
//     dynamic, weight_block_size [bn, bk] (published: [128, 128]; bk 32/64/128/256, any bn):
//     X.weight F8_E4M3 [N, K]; X.weight_scale_inv F32 [ceil(N/bn), ceil(K/bk)], one per block
//     (partial blocks at the edges); w = fp8 * scale_inv (it multiplies, despite its name).
//   compressed-tensors, format float-quantized (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK):
//     weights type float, num_bits 8, symmetric, not dynamic, strategy channel (X.weight_scale
//     [N, 1]), tensor ([1] or []) or block (block_structure [bn, bk], [ceil(N/bn), ceil(K/bk)]);
//     input activations absent or dynamic (per token or tensor: computed at run time by engines
//     that quantize activations; ours stay bf16/fp32, so the weights are what must be exact).
//     Scales F32, or BF16/F16 (exact in fp32).
//
// kF8 keeps one fp32 scale per (row, group of bk columns): a block's scale repeated over its bn
// rows, a channel's or the tensor's over the row's groups (groups of 128). Modules not quantized
// (modules_to_not_convert, ignore: the lm head, routers, norms, embeddings) are tensors of their
// own dtype and load as they are. Static activation scales (X.input_scale), e5m2 weights, NaN
// codes and anything else are refused, naming the key and value or the tensor.
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "expertstore/published_common.h"
#include "expertstore/safetensors.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

namespace moe::store {
namespace {
using nlohmann::json;

struct F8Scheme {
  enum Strategy { kBlock, kChannel, kTensor } strategy = kBlock;
  int64_t block_rows = 0;    // kBlock: bn
  int32_t group_size = 128;  // kBlock: bk; else the kF8 group (any valid one is exact)
  std::string scale_suffix;  // ".weight_scale_inv" or ".weight_scale"
};

// [bn, bk] with bk a kF8 group size; the error names `key`.
absl::Status ParseBlock(const std::string& key, const json& block, F8Scheme* scheme) {
  if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
      !block[1].is_number_integer() || block[0].get<int64_t>() <= 0 ||
      !kernels::ValidateQuantFormat(kernels::DType::kF8, block[1].get<int32_t>()).ok()) {
    return RefuseQuantConfig(key, block,
                             "supported: [rows, cols] with cols 32, 64, 128 or 256 ([128, 128])");
  }
  scheme->block_rows = block[0].get<int64_t>();
  scheme->group_size = block[1].get<int32_t>();
  return absl::OkStatus();
}

absl::StatusOr<F8Scheme> ParseF8Scheme(const json& q) {
  F8Scheme scheme;
  if (q.value("quant_method", json()) == "fp8") {
    scheme.scale_suffix = ".weight_scale_inv";
    const json fmt = q.value("fmt", json("e4m3"));
    if (fmt != "e4m3") return RefuseQuantConfig("fmt", fmt, "supported: e4m3");
    const json act = q.value("activation_scheme", json("dynamic"));
    if (act != "dynamic") {
      return RefuseQuantConfig("activation_scheme", act,
                               "supported: dynamic (static input scales are not)");
    }
    const json block = q.value("weight_block_size", json());
    MOE_RETURN_IF_ERROR(ParseBlock("weight_block_size", block, &scheme));
    return scheme;
  }
  // compressed-tensors, format float-quantized (the caller checked both).
  scheme.scale_suffix = ".weight_scale";
  const json groups = q.value("config_groups", json());
  if (!groups.is_object() || groups.empty()) {
    return RefuseQuantConfig("config_groups", groups, "expected at least one group");
  }
  bool first = true;
  for (const auto& [name, g] : groups.items()) {
    const std::string at = absl::StrCat("config_groups.", name, ".");
    if (g.value("format", json("float-quantized")) != "float-quantized") {
      return RefuseQuantConfig(at + "format", g["format"], "supported: float-quantized");
    }
    if (!g.value("output_activations", json()).is_null()) {
      return RefuseQuantConfig(at + "output_activations", g["output_activations"], "not supported");
    }
    const json in = g.value("input_activations", json());
    if (!in.is_null() && (!in.is_object() || in.value("dynamic", json()) != true)) {
      return RefuseQuantConfig(at + "input_activations", in,
                               "supported: none or dynamic (static activation scales are not)");
    }
    const json w = g.value("weights", json());
    const std::pair<const char*, json> want[] = {
        {"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", false}};
    for (const auto& [key, value] : want) {
      if (!w.is_object() || w.value(key, json()) != value) {
        return RefuseQuantConfig(at + "weights." + key, w.is_object() ? w.value(key, json()) : w,
                                 absl::StrCat("supported: ", value.dump()));
      }
    }
    F8Scheme s = scheme;
    const json strategy = w.value("strategy", json());
    if (strategy == "channel") {
      s.strategy = F8Scheme::kChannel;
    } else if (strategy == "tensor") {
      s.strategy = F8Scheme::kTensor;
    } else if (strategy == "block") {
      s.strategy = F8Scheme::kBlock;
      MOE_RETURN_IF_ERROR(
          ParseBlock(at + "weights.block_structure", w.value("block_structure", json()), &s));
    } else {
      return RefuseQuantConfig(at + "weights.strategy", strategy,
                               "supported: channel, tensor, block");
    }
    if (!first && (s.strategy != scheme.strategy || s.block_rows != scheme.block_rows ||
                   s.group_size != scheme.group_size)) {
      return RefuseQuantConfig(at + "weights", w,
                               "every group must quantize its weights the same way");
    }
    scheme = s;
    first = false;
  }
  return scheme;
}

}  // namespace

bool Checkpoint::IsPublishedF8(const std::string& config_text) {
  const json q = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!q.is_object()) return false;
  const json method = q.value("quant_method", json());
  return method == "fp8" ||
         (method == "compressed-tensors" && q.value("format", json()) == "float-quantized");
}

absl::Status Checkpoint::RepackPublishedF8(const std::string& dir, const std::string& config_text) {
  MOE_ASSIGN_OR_RETURN(const F8Scheme scheme, ParseF8Scheme(json::parse(config_text)));
  auto bad = [&](const std::string& tensor, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", tensor, "': ", why));
  };
  // A scale whose weight is not fp8, and static activation scales.
  for (const auto& [name, info] : tensors_) {
    if (absl::EndsWith(name, ".input_scale")) {
      return bad(name, "static activation scales are not supported (dynamic activations only)");
    }
    if (!absl::EndsWith(name, scheme.scale_suffix)) continue;
    const std::string weight = name.substr(0, name.size() - scheme.scale_suffix.size()) + ".weight";
    auto it = tensors_.find(weight);
    if (it != tensors_.end()) {
      return bad(weight, absl::StrCat("dtype ", kernels::DTypeName(it->second.dtype),
                                      ", expected F8_E4M3 (it has ", name, ")"));
    }
  }
  std::vector<std::string> modules;
  for (const auto& [name, raw] : raw_) {
    if (absl::EndsWith(name, ".weight") && absl::StartsWith(raw.dtype, "F8_")) {
      modules.push_back(name.substr(0, name.size() - 7));
    }
  }
  const int32_t G = scheme.group_size;
  for (const std::string& m : modules) {
    const std::string weight_name = m + ".weight", scale_name = m + scheme.scale_suffix;
    const RawTensor& weight = raw_.at(weight_name);
    if (weight.dtype != "F8_E4M3") {
      return bad(weight_name, "dtype " + weight.dtype + ", expected F8_E4M3");
    }
    if (weight.shape.size() != 2) {
      return bad(weight_name, "shape " + ShapeText(weight.shape) + " is not 2-D");
    }
    const int64_t N = weight.shape[0], K = weight.shape[1];  // outputs (our rows), inputs
    auto scale_it = tensors_.find(scale_name);
    if (scale_it == tensors_.end()) {
      return bad(scale_name, "missing (the scales of " + weight_name + ")");
    }
    if (kernels::IsQuantized(scale_it->second.dtype)) return bad(scale_name, "is quantized");
    const std::vector<int64_t>& got = scale_it->second.shape;
    std::vector<int64_t> want;
    switch (scheme.strategy) {
      case F8Scheme::kBlock:
        want = {(N + scheme.block_rows - 1) / scheme.block_rows, (K + G - 1) / G};
        break;
      case F8Scheme::kChannel:
        want = {N, 1};
        break;
      case F8Scheme::kTensor:
        want = {1};
        break;
    }
    const bool shape_ok = got == want ||
                          (scheme.strategy == F8Scheme::kChannel && got == std::vector{N}) ||
                          (scheme.strategy == F8Scheme::kTensor && got.empty());
    if (!shape_ok) {
      return bad(scale_name, absl::StrCat("shape ", ShapeText(got), ", expected ", ShapeText(want),
                                          " (", weight_name, " ", ShapeText(weight.shape), ")"));
    }
    MOE_ASSIGN_OR_RETURN(const kernels::TensorView scales, Get(scale_name));
    TensorInfo info;
    info.name = weight_name;
    info.dtype = kernels::DType::kF8;
    info.shape = {N, K};
    info.group_size = G;
    info.file = scale_it->second.file;
    info.bytes = kernels::QuantizedBytes(info.dtype, N, K, G);
    std::vector<uint8_t>& out = repacked_.emplace_back(info.bytes, 0);
    for (int64_t i = 0; i < N * K; ++i) {
      if ((weight.data[i] & 0x7f) == 0x7f) {
        return bad(weight_name, absl::StrCat("NaN code at output ", i / K, ", input ", i % K));
      }
    }
    std::memcpy(out.data(), weight.data, N * K);
    auto* out_scales =
        reinterpret_cast<float*>(out.data() + kernels::QuantParamsOffset(info.dtype, N, K));
    const int64_t groups = kernels::QuantGroups(K, G);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = scheme.strategy == F8Scheme::kBlock ? n / scheme.block_rows * groups + g
                           : scheme.strategy == F8Scheme::kChannel ? n
                                                                   : 0;
        const float s = scales.at(at);  // F32, or BF16/F16 widened: exact
        if (!std::isfinite(s)) {
          return bad(scale_name, absl::StrCat("scale ", s, " at ", at, " is not finite"));
        }
        out_scales[n * groups + g] = s;
      }
    }
    info.data = out.data();
    tensors_.erase(scale_name);
    raw_.erase(weight_name);
    tensors_.emplace(info.name, std::move(info));
  }
  if (!modules.empty()) {  // (a store's dense.safetensors holds kF8 already: nothing to repack)
    MOE_LOG(INFO) << "[checkpoint] " << dir << ": " << modules.size()
                  << " fp8 e4m3 matrices loaded exactly (kF8: an fp32 scale per row and " << G
                  << " columns)";
  }
  return absl::OkStatus();
}

}  // namespace moe::store
