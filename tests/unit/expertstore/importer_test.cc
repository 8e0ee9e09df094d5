// importer.h: round trips per format, resume, re-import of a damaged blob, --verify, and a crash
// test that kills the importer at every step it reports and then finishes the job.
#include "expertstore/importer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "expertstore/blob_index.h"
#include "expertstore/blob_reader.h"
#include "gtest/gtest.h"
#include "kernels/quant.h"
#include "rocksdb/db.h"
#include "tests/unit/expertstore/store_test_util.h"

namespace moe::store {
namespace {
using testing::TempDir;
using testing::TinyModel;
using testing::WriteTinyCheckpoint;

// The crash test's child: when MOE_CRASH_CHILD_STORE is set, this process imports into that
// store, SIGKILLs itself at step MOE_CRASH_AT, and never reaches main().
const bool kCrashChild = [] {
  const char* store = std::getenv("MOE_CRASH_CHILD_STORE");
  if (store == nullptr) return false;
  const std::string ckpt_dir = std::getenv("MOE_CRASH_CHILD_CKPT");
  const int crash_at = std::atoi(std::getenv("MOE_CRASH_AT"));
  ImportOptions options = WriteTinyCheckpoint(ckpt_dir, TinyModel{});
  options.sync_bytes = std::strtoull(std::getenv("MOE_CRASH_SYNC_BYTES"), nullptr, 10);
  int steps = 0;
  options.on_step = [&](ImportStep) {
    if (++steps == crash_at) ::raise(SIGKILL);
  };
  auto ckpt = Checkpoint::Open(ckpt_dir);
  if (!ckpt.ok()) std::_Exit(3);
  auto r = ImportModel(**ckpt, store, options);
  std::_Exit(r.ok() ? 0 : 2);
}();

std::vector<uint8_t> ReadBlob(const std::string& store, const BlobLocation& loc) {
  void* p = std::aligned_alloc(kBlobAlignment, loc.length);
  BlobReader reader(store, {});
  absl::Status s = reader.Read(loc, p);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<uint8_t> out(static_cast<uint8_t*>(p), static_cast<uint8_t*>(p) + loc.length);
  std::free(p);
  return out;
}

TEST(Importer, Bf16RoundTripIsExact) {
  TempDir dir;
  const TinyModel m;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), m);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string store = dir.path() + "/store";
  auto result = ImportModel(**ckpt, store, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->imported, m.layers * m.experts);
  auto index = BlobIndex::Open(store + "/index", "tiny-moe", false);
  ASSERT_TRUE(index.ok()) << index.status();
  auto entries = (*index)->List();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), options.experts.size());
  for (const ExpertTensorNames& n : options.experts) {
    auto loc = (*index)->Get(n.layer, n.expert);
    ASSERT_TRUE(loc.ok()) << loc.status();
    EXPECT_EQ(loc->offset % kBlobAlignment, 0u);
    EXPECT_EQ(loc->length % kBlobAlignment, 0u);
    std::vector<uint8_t> blob = ReadBlob(store, *loc);
    const kernels::ExpertWeights w = BlobWeights(*loc, blob.data());
    for (const auto& [view, name] : {std::pair{w.gate, n.gate}, {w.up, n.up}, {w.down, n.down}}) {
      auto src = (*ckpt)->Get(name);
      ASSERT_TRUE(src.ok());
      ASSERT_EQ(view.bytes(), src->bytes());
      EXPECT_EQ(std::memcmp(view.data, src->data, src->bytes()), 0) << name;
    }
  }
  // Dense weights are readable back as a checkpoint of their own, and the manifest exists.
  auto dense = Checkpoint::Open(store);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_TRUE((*dense)->Has("model.norm.weight"));
  EXPECT_TRUE(std::filesystem::exists(store + "/manifest.json"));
}

class QuantizedImport : public ::testing::TestWithParam<std::pair<kernels::DType, int32_t>> {};

// Every element of every matrix within half a quantization step of its row's range (a looser
// form of quant.h's per-group bound, which quant_test checks exactly).
TEST_P(QuantizedImport, RoundTripWithinBound) {
  TempDir dir;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), TinyModel{});
  options.format = GetParam().first;
  options.group_size = GetParam().second;
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const std::string store = dir.path() + "/store";
  ASSERT_TRUE(ImportModel(**ckpt, store, options).ok());
  auto index = BlobIndex::Open(store + "/index", "", false);
  ASSERT_TRUE(index.ok());
  const float qmax = static_cast<float>((1 << kernels::QuantBits(options.format)) - 1);
  for (const ExpertTensorNames& n : options.experts) {
    auto loc = (*index)->Get(n.layer, n.expert);
    ASSERT_TRUE(loc.ok());
    EXPECT_EQ(loc->dtype, options.format);
    std::vector<uint8_t> blob = ReadBlob(store, *loc);
    const kernels::ExpertWeights w = BlobWeights(*loc, blob.data());
    for (const auto& [view, name] : {std::pair{w.gate, n.gate}, {w.up, n.up}, {w.down, n.down}}) {
      auto src = (*ckpt)->Get(name);
      ASSERT_TRUE(src.ok());
      const int64_t rows = src->dim(0), cols = src->dim(1);
      for (int64_t r = 0; r < rows; ++r) {
        float lo = 1e30f, hi = -1e30f;
        for (int64_t c = 0; c < cols; ++c) {
          lo = std::min(lo, src->at(r * cols + c));
          hi = std::max(hi, src->at(r * cols + c));
        }
        const float bound = 0.5f * (hi - lo) / qmax * 1.01f + 1e-3f * std::max(-lo, hi);
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_NEAR(view.at(r * cols + c), src->at(r * cols + c), bound) << name << " " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedImport,
                         ::testing::Values(std::pair{kernels::DType::kQ8, 64},
                                           std::pair{kernels::DType::kQ4, 64},
                                           std::pair{kernels::DType::kQ4, 128},
                                           std::pair{kernels::DType::kQ2, 64}));

TEST(Importer, RerunSkipsVerifiedAndReimportsDamaged) {
  TempDir dir;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), TinyModel{});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const std::string store = dir.path() + "/store";
  ASSERT_TRUE(ImportModel(**ckpt, store, options).ok());
  auto again = ImportModel(**ckpt, store, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->imported, 0);
  EXPECT_EQ(again->skipped, static_cast<int64_t>(options.experts.size()));

  BlobLocation loc;
  {
    auto index = BlobIndex::Open(store + "/index", "", false);
    ASSERT_TRUE(index.ok());
    loc = *(*index)->Get(1, 2);
  }
  testing::Scribble(store + "/" + loc.file, loc.offset + 300, 8, 0xAB);
  auto verify = VerifyStore(store);
  ASSERT_TRUE(verify.ok());
  ASSERT_EQ(verify->errors.size(), 1u);
  EXPECT_EQ(verify->errors[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(verify->errors[0].message().find("expert (layer 1, expert 2)"), std::string::npos);
  EXPECT_NE(verify->errors[0].message().find(loc.file), std::string::npos);

  auto repaired = ImportModel(**ckpt, store, options);
  ASSERT_TRUE(repaired.ok());
  EXPECT_EQ(repaired->reimported, 1);
  EXPECT_EQ(repaired->imported, 1);
  verify = VerifyStore(store);
  ASSERT_TRUE(verify.ok());
  EXPECT_TRUE(verify->errors.empty());
  EXPECT_EQ(verify->blobs_ok, static_cast<int64_t>(options.experts.size()));
}

// Quantized dense weights: matrices in the chosen format (read back as quantized views through
// the safetensors extension), vectors and kept tensors in their checkpoint dtype.
TEST(Importer, QuantizedDenseWeights) {
  TempDir dir;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), TinyModel{});
  options.dense_format = kernels::DType::kQ8;
  options.group_size = 32;
  options.dense_tensors.push_back(options.experts[0].gate);  // a matrix kept as is
  options.dense_full_precision = {options.experts[0].gate};
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const std::string store = dir.path() + "/store";
  ASSERT_TRUE(ImportModel(**ckpt, store, options).ok());
  auto dense = Checkpoint::Open(store);
  ASSERT_TRUE(dense.ok()) << dense.status();
  auto embed = (*dense)->Get("model.embed_tokens.weight", {16, 64});
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(embed->dtype, kernels::DType::kQ8);
  EXPECT_EQ(embed->group_size, 32);
  auto src = (*ckpt)->Get("model.embed_tokens.weight");
  for (int64_t i = 0; i < src->numel(); ++i) {
    // int8 over a row range of ~0.4: half a step is ~0.0008.
    ASSERT_NEAR(embed->at(i), src->at(i), 2e-3) << i;
  }
  auto norm = (*dense)->Get("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->dtype, kernels::DType::kBF16);
  auto kept = (*dense)->Get(options.experts[0].gate);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->dtype, kernels::DType::kBF16);
  EXPECT_EQ(std::memcmp(kept->data, (*ckpt)->Get(options.experts[0].gate)->data, kept->bytes()), 0);
}

TEST(Importer, ReportsProgress) {
  TempDir dir;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), TinyModel{});
  options.sync_bytes = 1;  // a batch per blob: a report per expert
  std::vector<ImportProgress> reports;
  options.on_progress = [&](const ImportProgress& p) { reports.push_back(p); };
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ImportModel(**ckpt, dir.path() + "/store", options).ok());
  const int64_t total = static_cast<int64_t>(options.experts.size());
  ASSERT_EQ(static_cast<int64_t>(reports.size()), total);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].experts_done, static_cast<int64_t>(i + 1));
    EXPECT_EQ(reports[i].experts_total, total);
    EXPECT_GT(reports[i].bytes_per_second, 0);
  }
  EXPECT_EQ(reports.back().bytes_written, reports.back().bytes_total);
  EXPECT_EQ(reports.back().eta_seconds, 0);
}

TEST(Importer, ChangingFormatOnResumeIsRefused) {
  TempDir dir;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), TinyModel{});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const std::string store = dir.path() + "/store";
  ASSERT_TRUE(ImportModel(**ckpt, store, options).ok());
  options.format = kernels::DType::kQ4;
  EXPECT_EQ(ImportModel(**ckpt, store, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Readers open the index read-only (a store on a full or read-only disk still opens, and the
// importer's LOCK does not keep them out); RocksDB's log goes to ours, not to a LOG file there.
TEST(BlobIndexTest, ReadersOpenReadOnlyAndNothingLogsIntoTheIndex) {
  TempDir dir;
  const std::string path = dir.path() + "/index";
  auto writer = BlobIndex::Open(path, "model-a", true);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto reader = BlobIndex::Open(path, "model-a", false);  // while the writer holds the LOCK
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().model, "model-a");
  EXPECT_FALSE(std::filesystem::exists(path + "/LOG"));
}

TEST(BlobIndexTest, OtherModelOrFormatVersionIsFailedPrecondition) {
  TempDir dir;
  const std::string path = dir.path() + "/index";
  ASSERT_TRUE(BlobIndex::Open(path, "model-a", true).ok());
  auto other = BlobIndex::Open(path, "model-b", false);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("model-a"), std::string::npos) << other.status();
  EXPECT_NE(other.status().message().find(path), std::string::npos);
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &db).ok());
    ASSERT_TRUE(db->Put({}, "manifest", R"({"model":"model-a","format_version":99})").ok());
    delete db;
  }
  auto old = BlobIndex::Open(path, "model-a", false);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("version 99"), std::string::npos) << old.status();
  EXPECT_EQ(BlobIndex::Open(dir.path() + "/nothing", "", false).status().code(),
            absl::StatusCode::kNotFound);
}

// Kill the importer (SIGKILL, in a child process) at its n-th reported step, for every n: the
// index must name only whole blobs, and a rerun must finish with exactly the blobs a clean
// import writes.
TEST(ImporterCrash, KilledAtEveryStepThenResumed) {
  TempDir dir;
  const TinyModel m;
  ImportOptions options = WriteTinyCheckpoint(dir.path(), m);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  absl::flat_hash_map<std::pair<int32_t, int32_t>, uint64_t> clean_checksums;
  {
    const std::string clean = dir.path() + "/clean";
    ASSERT_TRUE(ImportModel(**ckpt, clean, options).ok());
    auto index = BlobIndex::Open(clean + "/index", "", false);
    ASSERT_TRUE(index.ok());
    auto entries = (*index)->List();
    ASSERT_TRUE(entries.ok());
    for (const BlobLocation& l : *entries) clean_checksums[{l.layer, l.expert}] = l.checksum;
  }
  // sync_bytes 1: a sync per blob; 3 blobs' worth: batches of 3.
  const uint64_t blob_bytes =
      ComputeBlobLayout(kernels::DType::kBF16, 0, m.hidden, m.intermediate).length;
  for (const uint64_t sync_bytes : {uint64_t{1}, 3 * blob_bytes}) {
    int total_steps = 0;
    {
      ImportOptions count = options;
      count.sync_bytes = sync_bytes;
      count.on_step = [&](ImportStep) { ++total_steps; };
      ASSERT_TRUE(
          ImportModel(**ckpt, dir.path() + "/count_" + std::to_string(sync_bytes), count).ok());
    }
    ASSERT_GT(total_steps, 2 * m.layers * m.experts);
    for (int n = 1; n <= total_steps; ++n) {
      const std::string store = absl::StrCat(dir.path(), "/crash_", sync_bytes, "_", n);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::setenv("MOE_CRASH_CHILD_STORE", store.c_str(), 1);
        ::setenv("MOE_CRASH_CHILD_CKPT", (store + "_ckpt").c_str(), 1);
        std::filesystem::create_directories(store + "_ckpt");
        ::setenv("MOE_CRASH_AT", std::to_string(n).c_str(), 1);
        ::setenv("MOE_CRASH_SYNC_BYTES", std::to_string(sync_bytes).c_str(), 1);
        ::execl("/proc/self/exe", "importer_crash_child", static_cast<char*>(nullptr));
        std::_Exit(127);
      }
      int wstatus = 0;
      ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
      // Every counted step is reached, so every child dies there.
      ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
          << "step " << n << " status " << wstatus;
      // Whatever the index names after the crash is whole.
      auto verify = VerifyStore(store);
      if (verify.ok()) {
        for (const absl::Status& s : verify->errors) ADD_FAILURE() << "step " << n << ": " << s;
      }
      options.on_step = nullptr;
      ASSERT_TRUE(ImportModel(**ckpt, store, options).ok()) << "resume after step " << n;
      verify = VerifyStore(store);
      ASSERT_TRUE(verify.ok());
      EXPECT_TRUE(verify->errors.empty());
      EXPECT_EQ(verify->blobs_ok, m.layers * m.experts) << "step " << n;
      auto index = BlobIndex::Open(store + "/index", "", false);
      ASSERT_TRUE(index.ok());
      auto entries = (*index)->List();
      ASSERT_TRUE(entries.ok());
      for (const BlobLocation& l : *entries) {
        EXPECT_EQ(l.checksum, (clean_checksums[{l.layer, l.expert}])) << "step " << n;
      }
      std::error_code ec;
      std::filesystem::remove_all(store, ec);
      std::filesystem::remove_all(store + "_ckpt", ec);
    }
  }
}

}  // namespace
}  // namespace moe::store
