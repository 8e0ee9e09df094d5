// Published int4 checkpoints (expertstore/published_quant.cc): symmetric GPTQ and
// compressed-tensors layouts repacked to kQ4, asymmetric GPTQ and AWQ to kQ8, bit for bit (each
// element against (q - z) s from the codes, zero points and scales written), and every malformed
// or unsupported checkpoint refused naming the tensor or the quantization_config key and value,
// never a crash.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
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

// A [N=8 outputs, K=64 inputs] matrix: code of (n, k) = (3n + 5k) % 16, scale of (n, group r)
// = 2^-8 (1 + n + 4r) (exact in fp16 and bf16).
constexpr int64_t N = 8, K = 64;
uint32_t Code(int64_t n, int64_t k) { return static_cast<uint32_t>((3 * n + 5 * k) % 16); }
float Scale(int64_t n, int64_t r) { return static_cast<float>(1 + n + 4 * r) / 256.f; }
// An asymmetric checkpoint's zero point of (output n, group r), in 1..15 (GPTQ's v1 format
// stores z - 1).
uint32_t Zero(int64_t n, int64_t r) { return static_cast<uint32_t>(1 + (5 * n + 3 * r) % 15); }

// gptq tensors of module "m" with group g: qweight [K/8, N], qzeros [K/g, N/8] (stored zero
// `zero(n, r)`), scales fp16 [K/g, N], g_idx [K].
std::vector<RawTensor> Gptq(int64_t g, const std::function<uint32_t(int64_t, int64_t)>& zero) {
  std::vector<int32_t> qweight(K / 8 * N, 0), qzeros(K / g * (N / 8), 0), g_idx(K);
  for (int64_t k = 0; k < K; ++k) {
    g_idx[k] = static_cast<int32_t>(k / g);
    for (int64_t n = 0; n < N; ++n) {
      qweight[(k / 8) * N + n] |= static_cast<int32_t>(Code(n, k) << (4 * (k % 8)));
    }
  }
  for (int64_t r = 0; r < K / g; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      qzeros[r * (N / 8) + n / 8] |= static_cast<int32_t>(zero(n, r) << (4 * (n % 8)));
    }
  }
  std::vector<uint16_t> scales(K / g * N);
  for (int64_t r = 0; r < K / g; ++r) {
    for (int64_t n = 0; n < N; ++n) scales[r * N + n] = kernels::F32ToF16(Scale(n, r));
  }
  return {{"m.qweight", "I32", {K / 8, N}, Bytes(qweight)},
          {"m.qzeros", "I32", {K / g, N / 8}, Bytes(qzeros)},
          {"m.scales", "F16", {K / g, N}, Bytes(scales)},
          {"m.g_idx", "I32", {K}, Bytes(g_idx)},
          {"lm_head.weight", "F32", {2, 4}, std::string(32, '\0')}};
}
// Symmetric: every stored zero point z (7 in the v1 format).
std::vector<RawTensor> Gptq(int64_t g, uint32_t z = 7) {
  return Gptq(g, [z](int64_t, int64_t) { return z; });
}

// awq (GEMM) tensors of module "m" with group g: qweight [K, N/8] and qzeros [K/g, N/8], output
// 8i + j in nibble kAwqNibble[j] of word i; zero points Zero; scales fp16 [K/g, N].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // AutoAWQ's [0, 2, 4, 6, 1, 3, 5, 7]
std::vector<RawTensor> Awq(int64_t g) {
  std::vector<int32_t> qweight(K * (N / 8), 0), qzeros(K / g * (N / 8), 0);
  for (int64_t n = 0; n < N; ++n) {
    const int shift = 4 * kAwqNibble[n % 8];
    for (int64_t k = 0; k < K; ++k) {
      qweight[k * (N / 8) + n / 8] |= static_cast<int32_t>(Code(n, k) << shift);
    }
    for (int64_t r = 0; r < K / g; ++r) {
      qzeros[r * (N / 8) + n / 8] |= static_cast<int32_t>(Zero(n, r) << shift);
    }
  }
  std::vector<uint16_t> scales(K / g * N);
  for (int64_t r = 0; r < K / g; ++r) {
    for (int64_t n = 0; n < N; ++n) scales[r * N + n] = kernels::F32ToF16(Scale(n, r));
  }
  return {{"m.qweight", "I32", {K, N / 8}, Bytes(qweight)},
          {"m.qzeros", "I32", {K / g, N / 8}, Bytes(qzeros)},
          {"m.scales", "F16", {K / g, N}, Bytes(scales)}};
}

json AwqConfig(int64_t g) {
  return {{"quant_method", "awq"}, {"bits", 4},         {"group_size", g},
          {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
}

json GptqConfig(int64_t g) {
  return {{"quant_method", "gptq"}, {"bits", 4},   {"group_size", g},
          {"desc_act", false},      {"sym", true}, {"checkpoint_format", "gptq"}};
}

// compressed-tensors pack-quantized: weight_packed [N, K/8] (stored code + 8 of q in [-8, 7],
// i.e. our code), weight_scale bf16 [N, K/g], weight_shape [2].
std::vector<RawTensor> CompressedTensors(int64_t g) {
  std::vector<int32_t> packed(N * (K / 8), 0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      packed[n * (K / 8) + k / 8] |= static_cast<int32_t>(Code(n, k) << (4 * (k % 8)));
    }
  }
  std::vector<uint16_t> scales(N * (K / g));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t r = 0; r < K / g; ++r) scales[n * (K / g) + r] = kernels::F32ToBf16(Scale(n, r));
  }
  return {{"m.weight_packed", "I32", {N, K / 8}, Bytes(packed)},
          {"m.weight_scale", "BF16", {N, K / g}, Bytes(scales)},
          {"m.weight_shape", "I64", {2}, Bytes(std::vector<int64_t>{N, K})}};
}

json CtConfig(int64_t g) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"input_activations", nullptr},
              {"weights",
               {{"num_bits", 4},
                {"type", "int"},
                {"symmetric", true},
                {"strategy", "group"},
                {"group_size", g},
                {"dynamic", false},
                {"actorder", nullptr}}}}}}}};
}

// Every element of "m.weight" is (Code - z) Scale exactly: z = 8 and kQ4 for a symmetric
// checkpoint, z = Zero and kQ8 (the exact form of asymmetric int4) otherwise.
void ExpectExact(const Checkpoint& ckpt, int64_t g, bool symmetric = true) {
  auto w = ckpt.Get("m.weight", {N, K});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, symmetric ? DType::kQ4 : DType::kQ8);
  EXPECT_EQ(w->group_size, g);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float z = symmetric ? 8.f : static_cast<float>(Zero(n, k / g));
      const float want = (static_cast<float>(Code(n, k)) - z) * Scale(n, k / g);
      ASSERT_EQ(w->at(n * K + k), want) << "output " << n << " input " << k;
    }
  }
}

absl::Status OpenStatus(const testing::TempDir& dir) {
  return Checkpoint::Open(dir.path()).status();
}

// `tensors` under `config` open as "m.weight" exactly (ExpectExact), with `left` tensors in all:
// the packed ones consumed.
void ExpectOpensExactly(const std::vector<RawTensor>& tensors, const json& config, int64_t g,
                        bool symmetric, size_t left) {
  testing::TempDir dir;
  WriteSafetensors(dir, tensors);
  WriteQuantConfig(dir, config);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectExact(**ckpt, g, symmetric);
  EXPECT_EQ((*ckpt)->tensors().size(), left);
}

TEST(PublishedQuantTest, GptqSymmetricRepacksExactly) {
  for (int64_t g : {32, 64}) {
    // Consumed: only the repacked matrix and the unquantized lm head (in its own dtype) remain.
    ExpectOpensExactly(Gptq(g), GptqConfig(g), g, /*symmetric=*/true, 2);
  }
  testing::TempDir dir;
  WriteSafetensors(dir, Gptq(32));
  WriteQuantConfig(dir, GptqConfig(32));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Get("lm_head.weight")->dtype, DType::kF32);
}

TEST(PublishedQuantTest, GptqV2StoresTheZeroPointItself) {
  json q = GptqConfig(32);
  q["checkpoint_format"] = "gptq_v2";
  ExpectOpensExactly(Gptq(32, 8), q, 32, /*symmetric=*/true, 2);
}

TEST(PublishedQuantTest, GptqAsymmetricLoadsExactlyAsInt8) {
  for (const char* format : {"gptq", "gptq_v2"}) {
    const uint32_t stored_minus = std::string(format) == "gptq" ? 1 : 0;  // v1 stores z - 1
    for (int64_t g : {32, 64}) {
      json q = GptqConfig(g);
      q["sym"] = false;
      q["checkpoint_format"] = format;
      ExpectOpensExactly(Gptq(g, [=](int64_t n, int64_t r) { return Zero(n, r) - stored_minus; }),
                         q, g,
                         /*symmetric=*/false, 2);
    }
  }
}

TEST(PublishedQuantTest, AwqLoadsExactlyAsInt8) {
  for (int64_t g : {32, 64}) ExpectOpensExactly(Awq(g), AwqConfig(g), g, /*symmetric=*/false, 1);
}

TEST(PublishedQuantTest, CompressedTensorsPackQuantizedRepacksExactly) {
  ExpectOpensExactly(CompressedTensors(32), CtConfig(32), 32, /*symmetric=*/true, 1);
}

// The message must name `what` (a tensor, or a key and its value).
void ExpectRefused(const testing::TempDir& dir, absl::StatusCode code, const std::string& what) {
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
}

TEST(PublishedQuantTest, UnsupportedOptionsAreRefusedNamingKeyAndValue) {
  struct Case {
    const char* key;
    json value;
    const char* named;
  };
  // Each case: `config` with key set to value, refused naming them.
  const auto each_refused = [](const std::vector<RawTensor>& tensors, const json& config,
                               std::initializer_list<Case> cases) {
    for (const Case& c : cases) {
      testing::TempDir dir;
      WriteSafetensors(dir, tensors);
      json q = config;
      q[c.key] = c.value;
      WriteQuantConfig(dir, q);
      ExpectRefused(dir, absl::StatusCode::kUnimplemented, c.named);
    }
  };
  each_refused(
      Gptq(32), GptqConfig(32),
      {
          {"sym", "no", "quantization_config.sym = \"no\""},
          {"bits", 8, "quantization_config.bits = 8"},
          {"group_size", -1, "quantization_config.group_size = -1"},
          {"checkpoint_format", "marlin", "quantization_config.checkpoint_format = \"marlin\""},
          // fp8 is loaded (published_f8_test), but not without its block size
          {"quant_method", "fp8", "quantization_config.weight_block_size = null"},
          {"quant_method", "bitsandbytes", "quantization_config.quant_method = \"bitsandbytes\""},
      });
  each_refused(Awq(32), AwqConfig(32),
               {
                   {"version", "gemv", "quantization_config.version = \"gemv\""},
                   {"zero_point", false, "quantization_config.zero_point = false"},
                   {"bits", 8, "quantization_config.bits = 8"},
                   {"group_size", 96, "quantization_config.group_size = 96"},
               });
  testing::TempDir dir;
  WriteSafetensors(dir, CompressedTensors(32));
  json q = CtConfig(32);
  q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  WriteQuantConfig(dir, q);
  ExpectRefused(dir, absl::StatusCode::kUnimplemented,
                "quantization_config.config_groups.group_0.weights.symmetric = false");
  q = CtConfig(32);
  q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  WriteQuantConfig(dir, q);
  ExpectRefused(dir, absl::StatusCode::kUnimplemented,
                "quantization_config.config_groups.group_0.input_activations");
}

TEST(PublishedQuantTest, MalformedTensorsAreNamed) {
  // Scales of the wrong shape.
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = Gptq(32);
    t[2].shape = {N, K / 32};
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, GptqConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument,
                  "'m.scales': shape [8,2], expected [2,8]");
  }
  // A group size that does not divide the width (K = 64, group 128 would leave half a group;
  // 256 > K likewise).
  {
    testing::TempDir dir;
    WriteSafetensors(dir, Gptq(32));
    WriteQuantConfig(dir, GptqConfig(128));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument,
                  "'m.qweight': group size 128 does not divide the width 64");
  }
  // qweight of the wrong dtype.
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = Gptq(32);
    t[0].dtype = "F32";
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, GptqConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.qweight': dtype F32, expected I32");
  }
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = Gptq(32);
    t[0].dtype = "I64";
    t[0].shape = {K / 16, N};
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, GptqConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.qweight': dtype I64, expected I32");
  }
  // Missing scales.
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = Gptq(32);
    t.erase(t.begin() + 2);
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, GptqConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.scales': missing");
  }
  // An asymmetric zero point in a checkpoint that says sym: the zero point is checked.
  {
    testing::TempDir dir;
    WriteSafetensors(dir, Gptq(32, 3));
    WriteQuantConfig(dir, GptqConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.qzeros': zero point 3");
  }
  // Act-order (desc_act) g_idx.
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = Gptq(32);
    std::vector<int32_t> g_idx(K);
    for (int64_t k = 0; k < K; ++k) g_idx[k] = static_cast<int32_t>(k % 2);
    t[3].bytes = Bytes(g_idx);
    WriteSafetensors(dir, t);
    json q = GptqConfig(32);
    q["desc_act"] = true;
    WriteQuantConfig(dir, q);
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument,
                  "'m.g_idx': input 1 is in group 1, not 0: act-order (desc_act)");
  }
  // compressed-tensors: weight_shape that contradicts weight_packed.
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = CompressedTensors(32);
    t[2].bytes = Bytes(std::vector<int64_t>{N, 2 * K});
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, CtConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.weight_shape': [8,128]");
  }
  // A scale fp16 cannot hold exactly (fp32 scales are accepted only when they are fp16 values).
  {
    testing::TempDir dir;
    std::vector<RawTensor> t = CompressedTensors(32);
    std::vector<float> scales(N * (K / 32), 0.1f);
    t[1] = {"m.weight_scale", "F32", {N, K / 32}, Bytes(scales)};
    WriteSafetensors(dir, t);
    WriteQuantConfig(dir, CtConfig(32));
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, "'m.weight_scale': scale 0.1");
  }
}

// The same malformations in the asymmetric layouts (AWQ, GPTQ sym false): named, no crash.
TEST(PublishedQuantTest, MalformedAsymmetricTensorsAreNamed) {
  const auto asym_gptq = [] {
    return Gptq(32, [](int64_t n, int64_t r) { return Zero(n, r) - 1; });
  };
  json asym_config = GptqConfig(32);
  asym_config["sym"] = false;
  struct Case {
    const char* what;
    std::vector<RawTensor> tensors;
    json config;
    const char* named;
  };
  std::vector<Case> cases;
  {  // qzeros of the wrong shape: one word more per group row
    std::vector<RawTensor> t = Awq(32);
    t[1].shape = {K / 32 / 2, 2 * (N / 8)};
    cases.push_back(
        {"awq qzeros shape", t, AwqConfig(32), "'m.qzeros': I32 [1,2], expected I32 [2,1]"});
    t = asym_gptq();
    t[1].shape = {K / 32 / 2, 2 * (N / 8)};
    cases.push_back(
        {"gptq qzeros shape", t, asym_config, "'m.qzeros': I32 [1,2], expected I32 [2,1]"});
  }
  {  // qzeros missing
    std::vector<RawTensor> t = Awq(32);
    t.erase(t.begin() + 1);
    cases.push_back({"awq qzeros missing", t, AwqConfig(32), "'m.qzeros': missing"});
  }
  {  // scales of the wrong shape ([N, K/g], the compressed-tensors orientation)
    std::vector<RawTensor> t = Awq(32);
    t[2].shape = {N, K / 32};
    cases.push_back(
        {"awq scales shape", t, AwqConfig(32), "'m.scales': shape [8,2], expected [2,8]"});
    t = asym_gptq();
    t[2].shape = {N, K / 32};
    cases.push_back(
        {"gptq scales shape", t, asym_config, "'m.scales': shape [8,2], expected [2,8]"});
  }
  {  // a group that does not divide the width (K = 64)
    json q = AwqConfig(128);
    cases.push_back(
        {"awq group", Awq(32), q, "'m.qweight': group size 128 does not divide the width 64"});
    q = asym_config;
    q["group_size"] = 128;
    cases.push_back(
        {"gptq group", asym_gptq(), q, "'m.qweight': group size 128 does not divide the width 64"});
  }
  {  // qweight of the wrong dtype
    std::vector<RawTensor> t = Awq(32);
    t[0].dtype = "F32";
    cases.push_back({"awq qweight F32", t, AwqConfig(32), "'m.qweight': dtype F32, expected I32"});
    t = Awq(32);
    t[0].dtype = "I16";
    t[0].shape = {K, 2 * (N / 8)};
    cases.push_back({"awq qweight I16", t, AwqConfig(32), "'m.qweight': dtype I16, expected I32"});
    t = asym_gptq();
    t[0].dtype = "F32";
    cases.push_back({"gptq qweight F32", t, asym_config, "'m.qweight': dtype F32, expected I32"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    testing::TempDir dir;
    WriteSafetensors(dir, c.tensors);
    WriteQuantConfig(dir, c.config);
    ExpectRefused(dir, absl::StatusCode::kInvalidArgument, c.named);
  }
}

TEST(PublishedQuantTest, IntegerTensorsWithoutAQuantizationConfigAreRefused) {
  testing::TempDir dir;
  WriteSafetensors(dir, Gptq(32));
  ExpectRefused(dir, absl::StatusCode::kUnimplemented, "dtype I32 is not supported");
}

}  // namespace
}  // namespace moe::store
