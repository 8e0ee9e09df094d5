// Checkpoint reading: round trip through WriteSafetensors, sharded index, and every malformed
// input named in the issue gives a clear error, never a crash.
#include "expertstore/safetensors.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::store {
namespace {

using kernels::DType;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file with one tensor "w" of 2x3 floats 0..5.
std::string WriteSmall(const testing::TempDir& dir, const std::string& name = "model.safetensors") {
  static const float data[6] = {0, 1, 2, 3, 4, 5};
  EXPECT_TRUE(WriteSafetensors(dir.File(name), {{"w", DType::kF32, {2, 3}, data}}).ok());
  return dir.File(name);
}

// Builds a raw file from a header string and a payload.
std::string Raw(const std::string& header, const std::string& payload) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + payload;
}

TEST(SafetensorsTest, RoundTripAllFloatTypes) {
  testing::TempDir dir;
  const float f32[2] = {1.5f, -2.f};
  const uint16_t bf16[2] = {kernels::F32ToBf16(3.f), kernels::F32ToBf16(-0.5f)};
  const uint16_t f16[2] = {kernels::F32ToF16(0.25f), kernels::F32ToF16(65504.f)};
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"),
                               {{"a", DType::kF32, {2}, f32},
                                {"b", DType::kBF16, {1, 2}, bf16},
                                {"c", DType::kF16, {2}, f16}})
                  .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto b = (*ckpt)->Get("b", {1, 2});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->at(0), 3.f);
  EXPECT_EQ(b->at(1), -0.5f);
  EXPECT_EQ((*ckpt)->Get("c")->at(1), 65504.f);
  EXPECT_EQ((*ckpt)->Get("a")->at(0), 1.5f);
}

TEST(SafetensorsTest, ShardedIndex) {
  testing::TempDir dir;
  const float x[1] = {7}, y[1] = {8};
  ASSERT_TRUE(WriteSafetensors(dir.File("a.safetensors"), {{"x", DType::kF32, {1}, x}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("b.safetensors"), {{"y", DType::kF32, {1}, y}}).ok());
  dir.Write("model.safetensors.index.json",
            R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Get("y")->at(0), 8.f);
}

TEST(SafetensorsTest, MissingShardNamedByIndex) {
  testing::TempDir dir;
  dir.Write("model.safetensors.index.json", R"({"weight_map": {"x": "gone.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ckpt.status().message().find("gone.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, NoFiles) {
  testing::TempDir dir;
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, TruncatedFileAtEveryLength) {
  testing::TempDir dir;
  const std::string whole = ReadAll(WriteSmall(dir));
  // Every proper prefix is rejected with DataLoss or InvalidArgument, never a crash.
  for (size_t n = 0; n < whole.size(); ++n) {
    testing::TempDir cut;
    cut.Write("model.safetensors", whole.substr(0, n));
    auto ckpt = Checkpoint::Open(cut.path());
    ASSERT_FALSE(ckpt.ok()) << "prefix " << n << " of " << whole.size();
    EXPECT_TRUE(ckpt.status().code() == absl::StatusCode::kDataLoss ||
                ckpt.status().code() == absl::StatusCode::kInvalidArgument)
        << ckpt.status();
  }
}

TEST(SafetensorsTest, HeaderLiesAboutSizes) {
  testing::TempDir dir;
  // Offsets past the end of the data.
  dir.Write("model.safetensors",
            Raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", std::string(8, '\0')));
  auto st = Checkpoint::Open(dir.path()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st;
  // Byte count disagrees with shape x dtype.
  dir.Write("model.safetensors",
            Raw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kDataLoss);
  // Header length larger than the file.
  std::string lie = Raw("{}", "");
  lie[0] = 100;
  dir.Write("model.safetensors", lie);
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsTest, BadJsonAndBadEntries) {
  testing::TempDir dir;
  dir.Write("model.safetensors", Raw("{not json", ""));
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  dir.Write("model.safetensors", Raw(R"({"w":{"dtype":"F32"}})", ""));
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  dir.Write("model.safetensors", Raw(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                     std::string(8, '\0')));
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kUnimplemented);
  dir.Write("model.safetensors.index.json", "[1, 2");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, MissingAndMisShapedTensor) {
  testing::TempDir dir;
  WriteSmall(dir);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto missing = (*ckpt)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  auto shaped = (*ckpt)->Get("w", {3, 2});
  EXPECT_EQ(shaped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shaped.status().message().find("[2,3]"), std::string::npos) << shaped.status();
}

}  // namespace
}  // namespace moe::store
