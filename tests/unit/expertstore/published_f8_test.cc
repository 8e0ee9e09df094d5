// Published FP8 checkpoints (expertstore/published_f8.cc): transformers' block-scaled fp8 and
// compressed-tensors float-quantized (channel, tensor, block) repacked to kF8 bit for bit (each
// element against a hand dequantization of the e4m3 code times the scale written), and every
// malformed or unsupported checkpoint refused naming the tensor or the quantization_config key
// and value.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"
#include "tests/testing/raw_safetensors.h"
#include "tests/testing/temp_dir.h"

namespace moe::store {
namespace {

using kernels::DType;
using nlohmann::json;

using testing::Bytes;
using testing::RawTensor;
using testing::WriteQuantConfig;
using testing::WriteSafetensors;

// A [N=200, K=160] matrix: 128x128 blocks leave a partial block in both directions (72 rows,
// 32 columns). Code of (n, k): every byte but the NaNs 0x7f and 0xff, in an order where
// neighbours differ.
constexpr int64_t N = 200, K = 160;
uint8_t Code(int64_t n, int64_t k) {
  const auto b = static_cast<uint8_t>((7 * n + 13 * k) % 256);
  return (b & 0x7f) == 0x7f ? 0x3a : b;
}
// e4m3 by hand: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal.
double E4m3ByHand(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
// A block's scale: not exact in fp16 (kF8 must keep fp32 bits), different in every block.
float Scale(int64_t i, int64_t j) { return 0.0123f * static_cast<float>(1 + i + 3 * j); }

std::string Codes() {
  std::string out(N * K, '\0');
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) out[n * K + k] = static_cast<char>(Code(n, k));
  }
  return out;
}

// transformers' fp8: m.weight F8_E4M3 [N, K], m.weight_scale_inv F32 [2, 2]; the unquantized
// lm head and router in their own dtypes.
std::vector<RawTensor> Fp8Tensors() {
  std::vector<float> s;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 2; ++j) s.push_back(Scale(i, j));
  }
  return {{"m.weight", "F8_E4M3", {N, K}, Codes()},
          {"m.weight_scale_inv", "F32", {2, 2}, Bytes(s)},
          {"lm_head.weight", "F32", {2, 4}, std::string(32, '\0')},
          {"mlp.gate.weight", "BF16", {2, 4}, std::string(16, '\0')}};
}

json Fp8Config() {
  return {{"quant_method", "fp8"},
          {"activation_scheme", "dynamic"},
          {"fmt", "e4m3"},
          {"weight_block_size", {128, 128}},
          {"modules_to_not_convert", {"lm_head"}}};
}

json CtConfig(const std::string& strategy) {
  json weights = {{"num_bits", 8},
                  {"type", "float"},
                  {"symmetric", true},
                  {"strategy", strategy},
                  {"dynamic", false}};
  if (strategy == "block") weights["block_structure"] = {128, 128};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"format", "float-quantized"},
              {"input_activations",
               {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}},
              {"weights", weights}}}}}};
}

// Every element of "m.weight" is e4m3(Code) * scale(n, k), computed by hand, exactly.
template <typename ScaleOf>
void ExpectExact(const Checkpoint& ckpt, ScaleOf scale_of) {
  auto w = ckpt.Get("m.weight", {N, K});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, DType::kF8);
  EXPECT_EQ(w->group_size, 128);
  EXPECT_EQ(w->bytes(), kernels::QuantizedBytes(DType::kF8, N, K, 128));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float want = static_cast<float>(E4m3ByHand(Code(n, k)) * scale_of(n, k));
      ASSERT_EQ(w->at(n * K + k), want) << "output " << n << " input " << k;
    }
  }
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::vector<RawTensor>& tensors,
                                                 const json& config) {
  testing::TempDir dir;
  WriteSafetensors(dir, tensors);
  WriteQuantConfig(dir, config);
  return Checkpoint::Open(dir.path());
}

TEST(PublishedF8Test, E4m3ToF32MatchesTheFormat) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(kernels::E4m3ToF32(static_cast<uint8_t>(b))));
      continue;
    }
    EXPECT_EQ(kernels::E4m3ToF32(static_cast<uint8_t>(b)), E4m3ByHand(static_cast<uint8_t>(b)))
        << "code " << b;
  }
  EXPECT_EQ(kernels::E4m3ToF32(0x7e), 448.f);
  EXPECT_EQ(kernels::E4m3ToF32(0x01), std::ldexp(1.f, -9));
}

TEST(PublishedF8Test, BlockScaledRepacksExactly) {
  auto ckpt = Open(Fp8Tensors(), Fp8Config());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectExact(**ckpt, [](int64_t n, int64_t k) { return Scale(n / 128, k / 128); });
  // Consumed: the matrix, the lm head and the router (their own dtypes) remain.
  EXPECT_EQ((*ckpt)->tensors().size(), 3u);
  EXPECT_EQ((*ckpt)->Get("mlp.gate.weight")->dtype, DType::kBF16);
  EXPECT_EQ((*ckpt)->Get("lm_head.weight")->dtype, DType::kF32);
}

TEST(PublishedF8Test, CompressedTensorsStrategiesRepackExactly) {
  std::vector<RawTensor> t = Fp8Tensors();
  t[1].name = "m.weight_scale";
  {  // block: as transformers' fp8
    auto ckpt = Open(t, CtConfig("block"));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ExpectExact(**ckpt, [](int64_t n, int64_t k) { return Scale(n / 128, k / 128); });
  }
  {  // channel: bf16 [N, 1]
    std::vector<uint16_t> s(N);
    for (int64_t n = 0; n < N; ++n) s[n] = kernels::F32ToBf16(Scale(n, 0));
    t[1] = {"m.weight_scale", "BF16", {N, 1}, Bytes(s)};
    auto ckpt = Open(t, CtConfig("channel"));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ExpectExact(**ckpt, [&](int64_t n, int64_t) { return kernels::Bf16ToF32(s[n]); });
  }
  {  // tensor: F32 [1]
    t[1] = {"m.weight_scale", "F32", {1}, Bytes(std::vector<float>{Scale(5, 0)})};
    auto ckpt = Open(t, CtConfig("tensor"));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ExpectExact(**ckpt, [](int64_t, int64_t) { return Scale(5, 0); });
  }
}

void ExpectRefused(const std::vector<RawTensor>& tensors, const json& config,
                   const std::vector<std::string>& words) {
  auto ckpt = Open(tensors, config);
  ASSERT_FALSE(ckpt.ok()) << config.dump();
  for (const std::string& w : words) {
    EXPECT_NE(ckpt.status().message().find(w), std::string::npos)
        << ckpt.status() << " does not name " << w;
  }
}

TEST(PublishedF8Test, UnsupportedOptionsAreRefusedNamingKeyAndValue) {
  json c = Fp8Config();
  c["weight_block_size"] = {128, 100};
  ExpectRefused(Fp8Tensors(), c, {"weight_block_size", "100"});
  c = Fp8Config();
  c.erase("weight_block_size");
  ExpectRefused(Fp8Tensors(), c, {"weight_block_size", "null"});
  c = Fp8Config();
  c["fmt"] = "e5m2";
  ExpectRefused(Fp8Tensors(), c, {"fmt", "e5m2"});
  c = Fp8Config();
  c["activation_scheme"] = "static";
  ExpectRefused(Fp8Tensors(), c, {"activation_scheme", "static"});
  std::vector<RawTensor> t = Fp8Tensors();
  t[1].name = "m.weight_scale";
  c = CtConfig("group");
  ExpectRefused(t, c, {"config_groups.group_0.weights.strategy", "group"});
  c = CtConfig("channel");
  c["config_groups"]["group_0"]["weights"]["type"] = "int";
  ExpectRefused(t, c, {"weights.type", "int"});
  c = CtConfig("channel");
  c["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
  ExpectRefused(t, c, {"input_activations", "static"});
  c = CtConfig("channel");
  c["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  ExpectRefused(t, c, {"weights.num_bits", "4"});
}

TEST(PublishedF8Test, MalformedTensorsAreNamed) {
  std::vector<RawTensor> t = Fp8Tensors();
  t.erase(t.begin() + 1);
  ExpectRefused(t, Fp8Config(), {"m.weight_scale_inv", "missing"});
  t = Fp8Tensors();
  t[1].shape = {2, 1};
  t[1].bytes.resize(8);
  ExpectRefused(t, Fp8Config(), {"m.weight_scale_inv", "[2,1]", "expected [2,2]"});
  t = Fp8Tensors();
  t[1].shape = {1, 4};  // the right count, the wrong shape
  ExpectRefused(t, Fp8Config(), {"m.weight_scale_inv", "[1,4]"});
  t = Fp8Tensors();
  t[0].dtype = "BF16";
  t[0].bytes = std::string(N * K * 2, '\0');
  ExpectRefused(t, Fp8Config(), {"m.weight", "BF16", "expected F8_E4M3"});
  t = Fp8Tensors();
  t[0].dtype = "F8_E5M2";
  ExpectRefused(t, Fp8Config(), {"m.weight", "F8_E5M2", "expected F8_E4M3"});
  t = Fp8Tensors();
  t[0].bytes[3 * K + 5] = static_cast<char>(0xff);
  ExpectRefused(t, Fp8Config(), {"m.weight", "NaN", "output 3, input 5"});
  t = Fp8Tensors();
  t.push_back({"m.input_scale", "F32", {1}, Bytes(std::vector<float>{1.f})});
  ExpectRefused(t, Fp8Config(), {"m.input_scale", "static"});
  t = Fp8Tensors();
  t[0].shape = {N * K};
  ExpectRefused(t, Fp8Config(), {"m.weight", "not 2-D"});
}

// Without a quantization_config, an fp8 tensor is refused naming it (nothing says how to scale).
TEST(PublishedF8Test, Fp8WithoutAQuantizationConfigIsRefused) {
  testing::TempDir dir;
  WriteSafetensors(dir, Fp8Tensors());
  dir.Write("config.json", json{{"model_type", "qwen3_moe"}}.dump());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("m.weight"), std::string::npos) << ckpt.status();
  EXPECT_NE(ckpt.status().message().find("F8_E4M3"), std::string::npos) << ckpt.status();
}

}  // namespace
}  // namespace moe::store
