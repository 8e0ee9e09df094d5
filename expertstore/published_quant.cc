// Checkpoint::RepackPublishedQuant: published int4 checkpoints, chosen by config.json's
// quantization_config, repacked at load into the layouts of kernels/quant.h, bit for bit:
//
//   gptq (bits 4, group_size 32/64/128/256, desc_act false or g_idx in order, sym true or false):
//     X.qweight int32 [K/8, N]: input k = 8i + j of output n in bits 4j..4j+3 of [i, n];
//     X.qzeros int32 [K/g, N/8] packed along N, output 8i + j in bits 4j..4j+3 (the "gptq" v1
//     format stores z - 1, "gptq_v2" z); X.scales fp16 [K/g, N]; X.g_idx int32 [K];
//     w = (q - z) s.
//   awq (bits 4, version gemm, zero_point true; AutoAWQ's WQLinear_GEMM): X.qweight int32
//     [K, N/8]: word [k, i] holds outputs 8i..8i+7, output 8i + order[p] in bits 4p..4p+3 with
//     AWQ's interleaved order = {0, 2, 4, 6, 1, 3, 5, 7}; X.qzeros int32 [K/g, N/8] packed the
//     same way, the zero point itself; X.scales fp16 [K/g, N]; w = (q - z) s.
//   compressed-tensors, format pack-quantized, int4 symmetric group weights, no activation
//     quantization (W4A16): X.weight_packed int32 [N, K/8], input k = 8i + j in bits 4j..4j+3 of
//     word i, stored q + 8; X.weight_scale [N, K/g] (fp16, or bf16/fp32 values fp16 holds
//     exactly); X.weight_shape int64 [2] = [N, K]; w = (stored - 8) s.
//
// Symmetric int4 (z = 8) is exactly our kQ4: codes q, scale s, offset m = -8 s (exact in fp16,
// and q s + m = (q - 8) s exactly in fp32). Asymmetric int4 (GPTQ sym false, AWQ) is not: its
// m = -z s rounded to fp16 is off by up to 2^-11 |z s|. It becomes our kQ8 instead, code
// q - z + 16 (0..31; z is at most 16, GPTQ v1's stored 15 + 1) with m = -16 s (exact in fp16:
// 16 is a power of two), so that code s + m = (q - z) s exactly in fp32 (both products and their
// sum fit fp32's 24 bits): the checkpoint's values at twice the bytes of int4 (logged at load).
// Why 16 and not int8's middle, 128: the CPU kernel computes a group's dot product as
// s sum(x code) + m sum(x) (kernels/cpu/matmul.cc), and codes near 128 with m = -128 s cancel
// 8x more of fp32's precision there than codes near 16 (a first AWQ golden fixture: 4.8e-4 max
// relative logit error with 128, over the 1e-4 bound; tests/bench/NOTES.md, stop 41).
// Everything not named here (another method, bits, option) is refused naming the key and value.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

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

// The scheme a quantization_config asks for, once validated.
struct Scheme {
  enum Kind { kGptq, kCompressedTensors, kAwq } kind = kGptq;
  int32_t group_size = 0;
  bool symmetric = true;     // zero point 8 everywhere (checked where qzeros are stored)
  uint32_t zero_offset = 0;  // added to a stored zero point (1 in GPTQ's v1 format: z - 1)
};

// AWQ packs output 8i + order[p] into nibble p of word i (order above); kAwqNibble is its
// inverse: the nibble of output 8i + j.
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

absl::Status RefuseGroup(const json& group) {
  return RefuseQuantConfig("group_size", group, "supported: 32, 64, 128, 256");
}
bool ValidGroup(const json& group) {
  return group.is_number_integer() &&
         kernels::ValidateQuantFormat(kernels::DType::kQ4, group.get<int32_t>()).ok();
}

absl::StatusOr<Scheme> ParseScheme(const json& q) {
  if (!q.is_object()) return RefuseQuantConfig("", q, "not an object");
  const json method = q.value("quant_method", json());
  Scheme scheme;
  if (method == "gptq") {
    const json bits = q.value("bits", json()), group = q.value("group_size", json());
    if (bits != 4) return RefuseQuantConfig("bits", bits, "only 4-bit GPTQ is supported");
    if (!ValidGroup(group)) return RefuseGroup(group);
    const json sym = q.value("sym", json(true));
    if (!sym.is_boolean()) return RefuseQuantConfig("sym", sym, "supported: true, false");
    const json format = q.value("checkpoint_format", json("gptq"));
    if (format != "gptq" && format != "gptq_v2") {
      return RefuseQuantConfig("checkpoint_format", format, "supported: gptq, gptq_v2");
    }
    scheme.group_size = group.get<int32_t>();
    scheme.symmetric = sym.get<bool>();
    scheme.zero_offset = format == "gptq" ? 1 : 0;
    return scheme;  // desc_act: checked per tensor on g_idx (in order is the same as false)
  }
  if (method == "compressed-tensors") {
    scheme.kind = Scheme::kCompressedTensors;
    const json format = q.value("format", json());
    if (format != "pack-quantized") {
      return RefuseQuantConfig("format", format,
                               "supported: pack-quantized (int4 W4A16), float-quantized (fp8)");
    }
    const json groups = q.value("config_groups", json());
    if (!groups.is_object() || groups.empty()) {
      return RefuseQuantConfig("config_groups", groups, "expected at least one group");
    }
    for (const auto& [name, g] : groups.items()) {
      const std::string at = absl::StrCat("config_groups.", name, ".");
      if (g.value("format", format) != format) {
        return RefuseQuantConfig(at + "format", g["format"], "supported: pack-quantized");
      }
      for (const char* act : {"input_activations", "output_activations"}) {
        if (!g.value(act, json()).is_null()) {
          return RefuseQuantConfig(at + act, g[act],
                                   "activation quantization is not supported (W4A16 only)");
        }
      }
      const json w = g.value("weights", json());
      const std::pair<const char*, json> want[] = {{"num_bits", 4},
                                                   {"type", "int"},
                                                   {"symmetric", true},
                                                   {"strategy", "group"},
                                                   {"dynamic", false}};
      for (const auto& [key, value] : want) {
        if (!w.is_object() || w.value(key, json()) != value) {
          return RefuseQuantConfig(
              at + "weights." + key, w.is_object() ? w.value(key, json()) : w,
              absl::StrCat("supported: ", value.dump(),
                           std::string(key) == "symmetric"
                               ? " (asymmetric compressed-tensors is not implemented)"
                               : ""));
        }
      }
      const json actorder = w.value("actorder", json());
      if (!actorder.is_null() && actorder != false) {
        return RefuseQuantConfig(at + "weights.actorder", actorder,
                                 "activation ordering is not supported");
      }
      const json group = w.value("group_size", json());
      if (!group.is_number_integer() ||
          !kernels::ValidateQuantFormat(kernels::DType::kQ4, group.get<int32_t>()).ok() ||
          (scheme.group_size != 0 && group.get<int32_t>() != scheme.group_size)) {
        return RefuseQuantConfig(at + "weights.group_size", group,
                                 "supported: 32, 64, 128, 256, the same in every group");
      }
      scheme.group_size = group.get<int32_t>();
    }
    return scheme;
  }
  if (method == "awq") {
    scheme.kind = Scheme::kAwq;
    scheme.symmetric = false;
    const json bits = q.value("bits", json()), group = q.value("group_size", json());
    if (bits != 4) return RefuseQuantConfig("bits", bits, "only 4-bit AWQ is supported");
    if (!ValidGroup(group)) return RefuseGroup(group);
    // HF's AwqConfig defaults: zero_point true, version gemm (written lower-case there,
    // "GEMM" in AutoAWQ's own quant_config.json). GEMV and the kernel-specific versions pack
    // differently.
    const json zero_point = q.value("zero_point", json(true));
    if (zero_point != true) return RefuseQuantConfig("zero_point", zero_point, "supported: true");
    const json version = q.value("version", json("gemm"));
    if (version != "gemm" && version != "GEMM") {
      return RefuseQuantConfig("version", version, "supported: gemm (AutoAWQ's GEMM packing)");
    }
    scheme.group_size = group.get<int32_t>();
    return scheme;
  }
  return RefuseQuantConfig(
      "quant_method", method,
      "supported: gptq (4-bit), awq (4-bit, gemm), fp8 (e4m3, block-scaled), "
      "compressed-tensors (pack-quantized int4 symmetric, float-quantized fp8)");
}

uint32_t Nibble(const uint8_t* words, int64_t word, int j) {
  uint32_t w;
  std::memcpy(&w, words + 4 * word, 4);
  return (w >> (4 * j)) & 0xfu;
}

}  // namespace

absl::Status Checkpoint::RepackPublishedQuant(const std::string& dir) {
  const std::filesystem::path config_path = std::filesystem::path(dir) / "config.json";
  json config;
  {
    std::ifstream in(config_path);
    if (!in) return absl::OkStatus();  // not a model directory: nothing to interpret
    config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  if (!config.is_object() || !config.contains("quantization_config")) return absl::OkStatus();
  if (const std::string q = config["quantization_config"].dump(); IsPublishedF8(q)) {
    return RepackPublishedF8(dir, q);  // published_f8.cc
  }
  MOE_ASSIGN_OR_RETURN(const Scheme scheme, ParseScheme(config["quantization_config"]));
  const bool ct = scheme.kind == Scheme::kCompressedTensors;
  const bool awq = scheme.kind == Scheme::kAwq;
  const std::string packed_suffix = ct ? ".weight_packed" : ".qweight";
  for (const auto& [name, info] : tensors_) {  // a float tensor where packed int32 belongs
    if (absl::EndsWith(name, packed_suffix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": tensor '", name, "': dtype ", kernels::DTypeName(info.dtype), ", expected I32"));
    }
  }
  std::vector<std::string> modules;
  for (const auto& [name, raw] : raw_) {
    if (absl::EndsWith(name, packed_suffix)) {
      modules.push_back(name.substr(0, name.size() - packed_suffix.size()));
    }
  }
  const int64_t g = scheme.group_size;
  // Symmetric: kQ4, code q. Asymmetric: kQ8, code q - z + 16 (the header says why).
  const kernels::DType dtype = scheme.symmetric ? kernels::DType::kQ4 : kernels::DType::kQ8;
  const int64_t bias = scheme.symmetric ? 8 : 16;
  for (const std::string& m : modules) {
    const std::string packed_name = m + packed_suffix;
    const RawTensor& packed = raw_.at(packed_name);
    auto bad = [&](const std::string& tensor, const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", tensor, "': ", why));
    };
    if (packed.dtype != "I32") return bad(packed_name, "dtype " + packed.dtype + ", expected I32");
    if (packed.shape.size() != 2)
      return bad(packed_name, "shape " + ShapeText(packed.shape) + " is not 2-D");
    // N outputs (our rows), K inputs (our columns).
    int64_t N = 0, K = 0;
    const std::string scale_name = m + (ct ? ".weight_scale" : ".scales");
    auto scale_it = tensors_.find(scale_name);
    if (scale_it == tensors_.end())
      return bad(scale_name, "missing (the scales of " + packed_name + ")");
    const TensorInfo& scale_info = scale_it->second;
    if (awq) {
      K = packed.shape[0];
      N = packed.shape[1] * 8;
    } else if (!ct) {
      K = packed.shape[0] * 8;
      N = packed.shape[1];
    } else {
      N = packed.shape[0];
      K = packed.shape[1] * 8;
      const std::string shape_name = m + ".weight_shape";
      auto it = raw_.find(shape_name);
      if (it == raw_.end() || it->second.dtype != "I64" || it->second.bytes != 16) {
        return bad(shape_name, "missing or not int64 [2]");
      }
      int64_t shape[2];
      std::memcpy(shape, it->second.data, 16);
      if (shape[0] != N || shape[1] > K || shape[1] <= K - 8) {
        return bad(shape_name, absl::StrCat("[", shape[0], ",", shape[1], "] does not match ",
                                            packed_name, " ", ShapeText(packed.shape)));
      }
      K = shape[1];
    }
    if (K % g != 0) {
      return bad(packed_name, absl::StrCat("group size ", g, " does not divide the width ", K));
    }
    const std::vector<int64_t> want_scale =
        ct ? std::vector<int64_t>{N, K / g} : std::vector<int64_t>{K / g, N};
    if (scale_info.shape != want_scale) {
      return bad(scale_name, absl::StrCat("shape ", ShapeText(scale_info.shape), ", expected ",
                                          ShapeText(want_scale), " (", packed_name, " ",
                                          ShapeText(packed.shape), ", group size ", g, ")"));
    }
    if (kernels::IsQuantized(scale_info.dtype)) return bad(scale_name, "is quantized");
    MOE_ASSIGN_OR_RETURN(const kernels::TensorView scales, Get(scale_name));
    // The code of (output n, input k) and the zero point of (group r, output n).
    auto code = [&](int64_t n, int64_t k) -> int64_t {
      if (awq) return Nibble(packed.data, k * (N / 8) + n / 8, kAwqNibble[n % 8]);
      if (ct) return Nibble(packed.data, n * packed.shape[1] + k / 8, static_cast<int>(k % 8));
      return Nibble(packed.data, (k / 8) * N + n, static_cast<int>(k % 8));
    };
    std::vector<int64_t> zeros;  // [K/g, N]; empty: 8 everywhere (compressed-tensors)
    if (!ct) {
      const std::string zeros_name = m + ".qzeros";
      auto z = raw_.find(zeros_name);
      if (z == raw_.end()) return bad(zeros_name, "missing");
      const int64_t words = (N + 7) / 8;
      if (z->second.dtype != "I32" || z->second.shape != std::vector<int64_t>{K / g, words}) {
        return bad(zeros_name, absl::StrCat(z->second.dtype, " ", ShapeText(z->second.shape),
                                            ", expected I32 [", K / g, ",", words, "]"));
      }
      zeros.resize(K / g * N);
      for (int64_t r = 0; r < K / g; ++r) {
        for (int64_t n = 0; n < N; ++n) {
          const uint32_t stored = Nibble(z->second.data, r * words + n / 8,
                                         awq ? kAwqNibble[n % 8] : static_cast<int>(n % 8));
          zeros[r * N + n] = stored + scheme.zero_offset;
          if (scheme.symmetric && zeros[r * N + n] != 8) {
            return bad(zeros_name,
                       absl::StrCat("zero point ", stored, " at group ", r, ", output ", n,
                                    ": a symmetric checkpoint stores ", 8 - scheme.zero_offset,
                                    " (an asymmetric one says sym: false)"));
          }
        }
      }
      raw_.erase(z);
    }
    if (!ct && !awq) {
      const std::string gidx_name = m + ".g_idx";
      if (auto gi = raw_.find(gidx_name); gi != raw_.end()) {
        if (gi->second.dtype != "I32" || gi->second.shape != std::vector<int64_t>{K}) {
          return bad(gidx_name, absl::StrCat(gi->second.dtype, " ", ShapeText(gi->second.shape),
                                             ", expected I32 [", K, "]"));
        }
        for (int64_t k = 0; k < K; ++k) {
          int32_t v;
          std::memcpy(&v, gi->second.data + 4 * k, 4);
          if (v != k / g) {
            return bad(gidx_name, absl::StrCat("input ", k, " is in group ", v, ", not ", k / g,
                                               ": act-order (desc_act) GPTQ is not supported"));
          }
        }
        raw_.erase(gi);
      }
    }
    if (ct) raw_.erase(m + ".weight_shape");
    // Repack: codes [N, K] (kQ4: two a byte, even input in the low nibble), then {s, -bias s}
    // per group.
    TensorInfo info;
    info.name = m + ".weight";
    info.dtype = dtype;
    info.shape = {N, K};
    info.group_size = static_cast<int32_t>(g);
    info.file = scale_info.file;
    info.bytes = kernels::QuantizedBytes(dtype, N, K, info.group_size);
    std::vector<uint8_t>& out = repacked_.emplace_back(info.bytes, 0);
    const int64_t row_bytes = kernels::QuantRowBytes(dtype, K);
    for (int64_t n = 0; n < N; ++n) {
      uint8_t* row = out.data() + n * row_bytes;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t z = zeros.empty() ? 8 : zeros[(k / g) * N + n];
        const auto c = static_cast<uint8_t>(code(n, k) - z + bias);  // 0..15, or 0..31
        if (scheme.symmetric) {
          row[k / 2] |= static_cast<uint8_t>(c << (4 * (k % 2)));
        } else {
          row[k] = c;
        }
      }
    }
    auto* params =
        reinterpret_cast<uint16_t*>(out.data() + kernels::QuantParamsOffset(dtype, N, K));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t r = 0; r < K / g; ++r) {
        const float s = scales.at(ct ? n * (K / g) + r : r * N + n);
        const float offset = -static_cast<float>(bias) * s;
        const uint16_t s16 = kernels::F32ToF16(s), m16 = kernels::F32ToF16(offset);
        if (!std::isfinite(s) || kernels::F16ToF32(s16) != s || kernels::F16ToF32(m16) != offset) {
          return bad(scale_name, absl::StrCat("scale ", s, " (output ", n, ", group ", r,
                                              ") is not exact in fp16 (nor ", offset, ")"));
        }
        params[2 * (n * (K / g) + r)] = s16;
        params[2 * (n * (K / g) + r) + 1] = m16;
      }
    }
    info.data = out.data();
    if (tensors_.count(info.name)) return bad(info.name, "present beside " + packed_name);
    tensors_.erase(scale_name);
    raw_.erase(packed_name);
    tensors_.emplace(info.name, std::move(info));
  }
  if (!scheme.symmetric && !modules.empty()) {
    MOE_LOG(INFO) << "[checkpoint] " << dir << ": " << modules.size() << " asymmetric int4 "
                  << (awq ? "AWQ" : "GPTQ")
                  << " matrices loaded exactly as int8 (code q - z + 16, offset -16 s): twice "
                     "the bytes of int4";
  }
  return absl::OkStatus();
}

}  // namespace moe::store
