// moe-import: converts a Hugging Face checkpoint directory into a model store directory (blob
// files + RocksDB index for experts, dense.safetensors, manifest.json); resumable; --verify.
//
// Expert tensors are named from the engine's architecture table and config.json:
//   model.layers.{L}.{moe_block}.experts.{E}.{expert_gate|expert_up|expert_down}.weight
// for every sparse layer L (ModelConfig::IsSparseLayer) and E < num_experts. Every other tensor
// of the checkpoint is dense. config.json and the tokenizer files are copied beside them.
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model_config.h"
#include "engine/store_import.h"
#include "expertstore/importer.h"
#include "expertstore/manifest.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"

ABSL_FLAG(std::string, model_dir, "",
          "Hugging Face checkpoint directory (config.json + *.safetensors). Empty with --verify: "
          "only verify --store_dir");
ABSL_FLAG(std::string, store_dir, "",
          "Store directory to write (created; an existing one resumes)");
ABSL_FLAG(std::string, model, "", "Model id recorded in the index. Default: the model_dir's name");
ABSL_FLAG(std::string, format, "",
          "Expert format: bf16, f16, f32, int8, int4, int2, fp8. Default: bf16, or for a published "
          "quantized checkpoint (GPTQ, AWQ, compressed-tensors, fp8: config.json's "
          "quantization_config) its experts' own bits, copied without re-quantizing: int4, or "
          "for asymmetric int4 (GPTQ sym false, AWQ) int8, which holds its zero points exactly "
          "at twice the bytes, or fp8 (e4m3 codes, an fp32 scale per 128 columns)");
ABSL_FLAG(int32_t, group_size, 0,
          "Group size of quantized formats: 32, 64, 128 or 256. Default: 64 (fp8: 128), or a "
          "published checkpoint's own");
ABSL_FLAG(std::string, dense_format, "bf16",
          "Dense weight format: bf16, f16, f32, int8, int4, fp8 (quantized: matrices only, with "
          "--group_size; norms, biases, routers and the embedding keep the checkpoint's dtype)");
ABSL_FLAG(std::string, lm_head_format, "",
          "The lm head's format: bf16, f16, f32, int8, int4, fp8. Default: --dense_format. (The "
          "embedding, and a lm head tied to it, keep the checkpoint's dtype)");
ABSL_FLAG(std::string, max_blob_file_bytes, "4GiB", "Size at which a new blob file is started");
ABSL_FLAG(bool, verify, false,
          "Re-read every indexed blob and check its checksum and header (after the import, or "
          "alone when --model_dir is empty); exit status 1 when any blob is bad");

namespace {
using namespace moe;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "\nmoe-import: %s\n", std::string(s.ToString()).c_str());
  return 1;
}

void PrintProgress(const store::ImportProgress& p) {
  std::fprintf(stderr,
               "\r[import] %s / %s  experts %ld/%ld (%ld already there)  %s/s  ETA %.0fs   ",
               base::FormatBytes(p.bytes_written).c_str(), base::FormatBytes(p.bytes_total).c_str(),
               static_cast<long>(p.experts_done), static_cast<long>(p.experts_total),
               static_cast<long>(p.experts_skipped),
               base::FormatBytes(static_cast<uint64_t>(p.bytes_per_second)).c_str(), p.eta_seconds);
}

// Copies config, generation config and tokenizer files next to the store, so that the store
// directory alone is a model directory for the engine (LoadModelConfig + Checkpoint::Open on it
// read config.json and dense.safetensors). Each file goes through a temporary name.
absl::Status CopyModelFiles(const std::string& model_dir, const std::string& store_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    const bool wanted = ext == ".json" || ext == ".txt" || ext == ".model" || ext == ".tiktoken";
    if (!entry.is_regular_file() || !wanted || name == "model.safetensors.index.json" ||
        name == store::kManifestFile) {
      continue;
    }
    const fs::path tmp = fs::path(store_dir) / (name + ".tmp");
    fs::copy_file(entry.path(), tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, fs::path(store_dir) / name, ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("copying ", entry.path().string(), ": ", ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat("listing ", model_dir, ": ", ec.message()));
  return absl::OkStatus();
}

// The experts the finished import wrote (manifest.json's num_experts). FailedPrecondition when
// there is no manifest: the import never finished, whatever blobs are there.
absl::StatusOr<int64_t> ManifestExperts(const std::string& store_dir) {
  absl::StatusOr<store::StoreManifest> manifest = store::ReadManifest(store_dir);
  if (absl::IsNotFound(manifest.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest.status().message(), " (run moe-import again to resume)"));
  }
  if (!manifest.ok()) return manifest.status();
  return manifest->num_experts;
}

int Verify(const std::string& store_dir) {
  // Every expert the manifest promises must be there and good: a store missing blobs verifies
  // nothing by checking only the blobs it has.
  absl::StatusOr<int64_t> expected = ManifestExperts(store_dir);
  if (!expected.ok()) return Fail(expected.status());
  auto result = store::VerifyStore(store_dir, [](int64_t done, int64_t total) {
    if (done % 64 == 0 || done == total) {
      std::fprintf(stderr, "\r[verify] %ld/%ld blobs", static_cast<long>(done),
                   static_cast<long>(total));
    }
  });
  if (!result.ok()) return Fail(result.status());
  std::fprintf(stderr, "\n");
  for (const absl::Status& s : result->errors) {
    std::fprintf(stderr, "moe-import: %s\n", std::string(s.ToString()).c_str());
  }
  const int64_t indexed = result->blobs_ok + static_cast<int64_t>(result->errors.size());
  std::fprintf(stderr, "[verify] %ld blobs ok, %zu bad, %ld of %ld experts indexed\n",
               static_cast<long>(result->blobs_ok), result->errors.size(),
               static_cast<long>(indexed), static_cast<long>(*expected));
  if (indexed != *expected) {
    std::fprintf(stderr, "moe-import: the store is incomplete: its index holds %ld of the %ld "
                 "experts manifest.json names\n", static_cast<long>(indexed),
                 static_cast<long>(*expected));
    return 1;
  }
  return result->errors.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  moe::base::ParseFlags(
      argc, argv,
      "Converts a Hugging Face MoE checkpoint into a model store directory.\n"
      "Usage: moe-import --model_dir=DIR --store_dir=DIR [--format=int4 --group_size=64] "
      "[--dense_format=int4 --lm_head_format=int8] "
      "[--verify]\n       moe-import --store_dir=DIR --verify",
      __FILE__);
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  const std::string store_dir = absl::GetFlag(FLAGS_store_dir);
  if (store_dir.empty()) return Fail(absl::InvalidArgumentError("--store_dir is required"));
  if (model_dir.empty()) {
    if (absl::GetFlag(FLAGS_verify)) return Verify(store_dir);
    return Fail(absl::InvalidArgumentError("--model_dir is required (or --verify alone)"));
  }
  auto config = engine::LoadModelConfig(model_dir);
  if (!config.ok()) return Fail(config.status());
  auto ckpt = store::Checkpoint::Open(model_dir);
  if (!ckpt.ok()) return Fail(ckpt.status());
  auto options = engine::ImportOptionsFor(*config, **ckpt);
  if (!options.ok()) return Fail(options.status());
  options->model = absl::GetFlag(FLAGS_model);
  if (options->model.empty()) {
    options->model = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (options->model.empty()) {
      options->model = std::filesystem::path(model_dir).lexically_normal().parent_path().filename();
    }
  }
  // Experts already quantized in the checkpoint are copied, never re-quantized: their format is
  // the default, and flags asking another are refused by the importer, naming both.
  options->format = kernels::DType::kBF16;
  options->group_size = 64;
  if (auto first = (*ckpt)->Get(options->experts.front().gate);
      first.ok() && kernels::IsQuantized(first->dtype)) {
    options->format = first->dtype;
    options->group_size = first->group_size;
  }
  if (!absl::GetFlag(FLAGS_format).empty()) {
    auto format = kernels::ParseWeightFormat(absl::GetFlag(FLAGS_format));
    if (!format.ok()) return Fail(base::Annotate(format.status(), "--format"));
    options->format = *format;
  }
  auto dense = kernels::ParseWeightFormat(absl::GetFlag(FLAGS_dense_format));
  if (!dense.ok()) return Fail(base::Annotate(dense.status(), "--dense_format"));
  options->dense_format = *dense;
  // fp8 from a float checkpoint: 128-column groups, as published FP8 checkpoints block theirs.
  if (options->format == kernels::DType::kF8 ||
      (!kernels::IsQuantized(options->format) && *dense == kernels::DType::kF8)) {
    options->group_size = 128;
  }
  if (absl::GetFlag(FLAGS_group_size) != 0) options->group_size = absl::GetFlag(FLAGS_group_size);
  if (!absl::GetFlag(FLAGS_lm_head_format).empty()) {
    auto lm_head = kernels::ParseWeightFormat(absl::GetFlag(FLAGS_lm_head_format));
    if (!lm_head.ok()) return Fail(base::Annotate(lm_head.status(), "--lm_head_format"));
    options->lm_head_format = *lm_head;
  }
  auto max_file = base::ParseBytes(absl::GetFlag(FLAGS_max_blob_file_bytes));
  if (!max_file.ok()) return Fail(base::Annotate(max_file.status(), "--max_blob_file_bytes"));
  options->max_blob_file_bytes = *max_file;
  options->on_progress = PrintProgress;

  const double start = base::NowSeconds();
  // The model files first: manifest.json, which ImportModel writes last, means the store is whole
  // (a disk that filled while copying them left a store that verified without its config.json).
  std::error_code ec;
  std::filesystem::create_directories(store_dir, ec);
  if (ec) {
    return Fail(absl::InternalError(absl::StrCat("creating ", store_dir, ": ", ec.message())));
  }
  if (absl::Status s = CopyModelFiles(model_dir, store_dir); !s.ok()) return Fail(s);
  auto result = store::ImportModel(**ckpt, store_dir, *options);
  if (!result.ok()) return Fail(result.status());
  std::fprintf(stderr,
               "\n[import] model '%s': %ld experts written (%ld re-written), %ld already there, "
               "%s in %.1fs; %zu dense tensors\n",
               options->model.c_str(), static_cast<long>(result->imported),
               static_cast<long>(result->reimported), static_cast<long>(result->skipped),
               base::FormatBytes(result->bytes_written).c_str(), base::NowSeconds() - start,
               options->dense_tensors.size());
  if (absl::GetFlag(FLAGS_verify)) return Verify(store_dir);
  return 0;
}
