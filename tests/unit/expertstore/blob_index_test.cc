// blob_index.h: DecodeBlobLocation refuses entries the readers cannot use (found by fuzz_blob;
// the inputs are also in tests/fuzz/corpus/fuzz_blob/crash-*).
#include "expertstore/blob_index.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moe::store {
namespace {

nlohmann::json Entry() {
  return {{"layer", 3},     {"expert", 7},       {"file", "blobs/000000.blob"}, {"offset", 8192},
          {"length", 4096}, {"checksum", 1},     {"version", 1},               {"dtype", 2},
          {"group_size", 0}, {"hidden_size", 8}, {"intermediate_size", 4}};
}

absl::Status Decode(const nlohmann::json& j) {
  return DecodeBlobLocation("e/m/00000003/00000007", j.dump(), "store/index").status();
}

TEST(BlobIndexTest, DecodesAGoodEntry) {
  auto l = DecodeBlobLocation("k", Entry().dump(), "store/index");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->layer, 3);
  EXPECT_EQ(l->expert, 7);
  EXPECT_EQ(l->offset, 8192u);
  EXPECT_EQ(l->hidden_size, 8);
}

// fuzz_blob: a q8 64x32 expert in a 4096-byte blob gave views past the blob's end.
TEST(BlobIndexTest, RefusesMatricesThatDoNotFitTheLength) {
  auto j = Entry();
  j["dtype"] = 3;  // kQ8
  j["group_size"] = 32;
  j["hidden_size"] = 64;
  j["intermediate_size"] = 32;
  const absl::Status st = Decode(j);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("needs"), std::string::npos) << st;
  EXPECT_NE(st.message().find("layer 3, expert 7"), std::string::npos) << st;
  EXPECT_NE(st.message().find("store/index"), std::string::npos) << st;
}

TEST(BlobIndexTest, RefusesBadGeometry) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"hidden_size", 0}, {"intermediate_size", -1}, {"hidden_size", int64_t{1} << 40},
           {"offset", 100}, {"length", 0}, {"length", 4097}}) {
    auto j = Entry();
    j[key] = value;
    EXPECT_EQ(Decode(j).code(), absl::StatusCode::kDataLoss) << key << " " << value;
  }
  auto q = Entry();
  q["dtype"] = 4;  // kQ4
  q["group_size"] = 0;  // QuantizedBytes would abort on it
  EXPECT_NE(Decode(q).message().find("group_size 0"), std::string::npos) << Decode(q);
}

// kF8 (6, the last dtype) decodes; one past it is refused naming the field.
TEST(BlobIndexTest, Fp8DecodesAndUnknownDtypesAreRefused) {
  auto j = Entry();
  j["dtype"] = 6;  // kF8
  j["group_size"] = 128;
  EXPECT_TRUE(Decode(j).ok()) << Decode(j);
  j["dtype"] = 7;
  const absl::Status st = Decode(j);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("dtype"), std::string::npos) << st;
}

// fuzz_blob: "layer": 4.09e9 went through nlohmann's float->int conversion (undefined).
TEST(BlobIndexTest, RefusesNonIntegersAndOutOfRange) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"layer", 4.09e9}, {"layer", 1.5}, {"expert", "7"}, {"offset", -4096},
           {"version", int64_t{1} << 33}, {"dtype", 1e300}}) {
    auto j = Entry();
    j[key] = value;
    const absl::Status st = Decode(j);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << key << " " << value;
    EXPECT_NE(st.message().find(key), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace moe::store
