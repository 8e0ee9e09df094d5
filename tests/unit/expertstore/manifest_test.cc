// manifest.h: the manifest a real import writes reads back; malformed ones fail with DataLoss
// naming the file and the field, a missing one with NotFound.
#include "expertstore/manifest.h"

#include <fstream>
#include <string>

#include "expertstore/blob_format.h"
#include "gtest/gtest.h"
#include "tests/unit/expertstore/store_test_util.h"

namespace moe::store {
namespace {
using testing::TempDir;

void WriteManifest(const std::string& dir, const std::string& text) {
  std::ofstream(ManifestPath(dir)) << text;
}

TEST(Manifest, ImportedStoreReadsBack) {
  TempDir dir;
  const testing::ImportedTiny tiny = testing::ImportTiny(dir.path());
  absl::StatusOr<StoreManifest> m = ReadManifest(tiny.store_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model, "tiny-moe");
  EXPECT_EQ(m->format_version, kStoreFormatVersion);
  EXPECT_EQ(m->expert_format, "bf16");
  EXPECT_EQ(m->group_size, 0);
  EXPECT_EQ(m->num_experts, tiny.model.layers * tiny.model.experts);
  EXPECT_EQ(m->dense_file, "dense.safetensors");
  EXPECT_EQ(m->num_dense_tensors, 2);
  EXPECT_EQ(m->index, "index");
}

TEST(Manifest, TextRoundTripsAndOptionalFieldsDefault) {
  TempDir dir;
  StoreManifest m;
  m.model = "m";
  m.format_version = 1;
  m.expert_format = "int4";
  m.group_size = 64;
  m.num_experts = 384;
  m.dense_format = "bf16";
  m.num_dense_tensors = 7;
  WriteManifest(dir.path(), ManifestText(m));
  absl::StatusOr<StoreManifest> back = ReadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ManifestText(*back), ManifestText(m));

  WriteManifest(dir.path(), R"({"expert_format": "bf16", "num_experts": 8})");
  back = ReadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model, "");
  EXPECT_EQ(back->group_size, 0);
  EXPECT_EQ(back->dense_file, "dense.safetensors");
  EXPECT_EQ(back->num_experts, 8);
}

TEST(Manifest, MissingIsNotFound) {
  TempDir dir;
  const absl::Status s = ReadManifest(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(ManifestPath(dir.path())), absl::string_view::npos) << s;
}

TEST(Manifest, MalformedIsDataLossNamingTheField) {
  TempDir dir;
  const struct {
    const char* text;
    const char* names;  // in the message
  } kCases[] = {
      {"{not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"num_experts": 8})", "\"expert_format\""},
      {R"({"expert_format": "", "num_experts": 8})", "\"expert_format\""},
      {R"({"expert_format": "bf16"})", "\"num_experts\""},
      {R"({"expert_format": "bf16", "num_experts": -1})", "\"num_experts\""},
      {R"({"expert_format": "bf16", "num_experts": "8"})", "\"num_experts\""},
      {R"({"expert_format": "int4", "num_experts": 8, "group_size": "64"})", "\"group_size\""},
      {R"({"expert_format": "bf16", "num_experts": 8, "model": 3})", "\"model\""},
  };
  for (const auto& c : kCases) {
    WriteManifest(dir.path(), c.text);
    const absl::Status s = ReadManifest(dir.path()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.text << ": " << s;
    EXPECT_NE(s.message().find(ManifestPath(dir.path())), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(c.names), absl::string_view::npos) << c.text << ": " << s;
  }
}

}  // namespace
}  // namespace moe::store
