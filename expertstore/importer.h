// The importer: converts a checkpoint's experts into the blob tier of a store directory, and its
// dense (non-expert) weights into dense.safetensors. It knows no architecture: the caller names
// the tensors of every expert.
//
// Store directory layout (everything the store reads):
//   index/            RocksDB: the BlobIndex (manifest record + one entry per expert)
//   blobs/NNNNNN.blob append-only blob files (blob_format.h)
//   dense.safetensors dense weights, in dense_format
//   manifest.json     written last: model, formats, counts; its presence means "import finished"
//
// Crash safety: blobs are written, then fdatasync'ed (and the blobs/ directory fsync'ed when a
// file was created), and only then recorded in the index in one synced RocksDB batch. So after a
// crash the index names only whole blobs; bytes written after the last batch are unreferenced
// garbage at the tail of a blob file, which the next run appends after (never overwrites).
// Resuming: run again with the same options; experts already indexed are re-read and verified,
// and skipped when whole (re-imported when not).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "expertstore/safetensors.h"
#include "kernels/tensor.h"

namespace moe::store {

// The checkpoint tensor names of one expert's SwiGLU MLP: gate, up [I, H]; down [H, I].
struct ExpertTensorNames {
  int32_t layer = 0;
  int32_t expert = 0;
  std::string gate, up, down;
};

// Points at which the importer reports to ImportOptions::on_step (for crash tests).
enum class ImportStep {
  kBlobPartWritten,  // the first part of a blob is in the file, the rest not yet
  kBlobWritten,      // a whole blob is in the file, not yet synced
  kDataSynced,       // a batch of blobs is durable, not yet indexed
  kIndexed,          // the batch is in the index
};

struct ImportProgress {
  uint64_t bytes_written = 0;  // blob bytes written by this run
  uint64_t bytes_total = 0;    // blob bytes this run has to write
  int64_t experts_done = 0;    // imported or skipped, of experts_total
  int64_t experts_skipped = 0;
  int64_t experts_total = 0;
  double bytes_per_second = 0;
  double eta_seconds = 0;
};

struct ImportOptions {
  std::string model;  // model id recorded in the index; required
  // Expert format: kBF16, kF16, kF32, kQ8, kQ4, kQ2. Default: kBF16 (exact for bf16 checkpoints).
  kernels::DType format = kernels::DType::kBF16;
  int32_t group_size = 64;  // quantized formats only: 32, 64, 128 or 256. Default: 64.
  std::vector<ExpertTensorNames> experts;
  // Dense tensors copied into dense.safetensors, converted to dense_format: kBF16, kF16, kF32,
  // or kQ8/kQ4 (group_size) for matrices, the others keeping their checkpoint dtype, as do the
  // tensors named in dense_full_precision (routers). Default: kBF16.
  std::vector<std::string> dense_tensors;
  kernels::DType dense_format = kernels::DType::kBF16;
  // The lm head's format when set (same choices as dense_format); unset: dense_format. Its
  // tensor: lm_head_tensor (a lm head tied to the embedding is the embedding, which callers
  // keep in dense_full_precision).
  std::optional<kernels::DType> lm_head_format;
  std::string lm_head_tensor = "lm_head.weight";
  std::vector<std::string> dense_full_precision;
  uint64_t max_blob_file_bytes = uint64_t{4} << 30;  // Default: 4 GiB per blob file
  uint64_t sync_bytes = uint64_t{256} << 20;  // Blobs per fsync + index batch. Default: 256 MiB.
  int num_threads = 0;          // threads converting/quantizing blobs; 0: all cores. Default: 0.
  bool verify_existing = true;  // re-read and verify already-indexed blobs before skipping them
  std::function<void(const ImportProgress&)> on_progress;  // after every batch
  std::function<void(ImportStep)> on_step;                 // tests only

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

struct ImportResult {
  int64_t imported = 0;    // written by this run
  int64_t skipped = 0;     // already indexed and verified
  int64_t reimported = 0;  // indexed but failed verification, written again (counted in imported)
  uint64_t bytes_written = 0;
};

// Imports every expert of options.experts and the dense tensors into store_dir.
// NotFound/InvalidArgument: a tensor missing or of the wrong shape (named, with its expert).
// FailedPrecondition: store_dir holds another model, another store format version, or experts
// in another format/group size. Internal: I/O errors (named file).
absl::StatusOr<ImportResult> ImportModel(const Checkpoint& checkpoint, const std::string& store_dir,
                                         const ImportOptions& options);

struct VerifyResult {
  int64_t blobs_ok = 0;
  std::vector<absl::Status> errors;  // one per bad blob, each naming expert, file and offset
};
// Re-reads every indexed blob of store_dir and verifies checksum and header. The Status is for
// the store as a whole (index missing or of another version); bad blobs are listed in the result.
absl::StatusOr<VerifyResult> VerifyStore(
    const std::string& store_dir,
    const std::function<void(int64_t done, int64_t total)>& on_progress = nullptr);

}  // namespace moe::store
