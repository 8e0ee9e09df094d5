// ImportModel: expert by expert, build the blob in memory, append it to the current blob file;
// every sync_bytes, fdatasync and then index the batch (the order that makes crashes safe).
#include "expertstore/importer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "expertstore/blob_index.h"
#include "expertstore/blob_reader.h"
#include "expertstore/dense_writer.h"
#include "kernels/base/clock.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "kernels/base/thread_pool.h"
#include "kernels/quant.h"

namespace moe::store {
namespace fs = std::filesystem;
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("fsync", dir);
}

absl::Status WriteAll(int fd, const uint8_t* data, uint64_t n, uint64_t offset,
                      const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    data += w;
    n -= static_cast<uint64_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// The append-only blob file currently written, and the blobs written to it since the last sync.
class BlobAppender {
 public:
  BlobAppender(std::string store_dir, uint64_t max_file_bytes)
      : dir_(std::move(store_dir)), max_file_bytes_(max_file_bytes) {}
  ~BlobAppender() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens the highest-numbered blob file (appending after its tail, garbage included).
  absl::Status Start() {
    std::error_code ec;
    fs::create_directories(fs::path(dir_) / "blobs", ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir_, "/blobs: ", ec.message()));
    int last = 0;
    for (const auto& e : fs::directory_iterator(fs::path(dir_) / "blobs", ec)) {
      const std::string stem = e.path().stem().string();
      if (e.path().extension() == ".blob") last = std::max(last, std::atoi(stem.c_str()));
    }
    if (ec) return absl::InternalError(absl::StrCat("list ", dir_, "/blobs: ", ec.message()));
    return OpenFile(std::max(last, 1));
  }

  // Where a blob of `length` bytes goes; moves to a new file when this one is full. The caller
  // must have synced and indexed the pending blobs before a switch (NeedsSwitch).
  bool NeedsSwitch(uint64_t length) const {
    return next_offset_ > 0 && next_offset_ + length > max_file_bytes_;
  }
  absl::Status Switch() { return OpenFile(file_number_ + 1); }

  const std::string& file() const { return file_; }
  std::string path() const { return absl::StrCat(dir_, "/", file_); }
  uint64_t Reserve(uint64_t length) {
    const uint64_t at = next_offset_;
    next_offset_ += length;
    return at;
  }
  int fd() const { return fd_; }

  absl::Status Sync() {
    if (::fdatasync(fd_) != 0) return Errno("fdatasync", path());
    if (created_) {
      MOE_RETURN_IF_ERROR(SyncDir(absl::StrCat(dir_, "/blobs")));
      created_ = false;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status OpenFile(int number) {
    if (fd_ >= 0) ::close(fd_);
    file_number_ = number;
    file_ = absl::StrFormat("blobs/%06d.blob", number);
    created_ = !fs::exists(path());
    fd_ = ::open(path().c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("open", path());
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return Errno("stat", path());
    next_offset_ = AlignUp(static_cast<uint64_t>(st.st_size), kBlobAlignment);
    return absl::OkStatus();
  }

  const std::string dir_;
  const uint64_t max_file_bytes_;
  int fd_ = -1;
  int file_number_ = 0;
  std::string file_;
  uint64_t next_offset_ = 0;
  bool created_ = false;
};

// Fills `blob` (layout.length bytes, zeroed) with the header and the three matrices.
absl::StatusOr<BlobLocation> BuildBlob(const Checkpoint& ckpt, const ExpertTensorNames& names,
                                       const ImportOptions& options, std::vector<uint8_t>* blob) {
  const std::string who = ExpertName(names.layer, names.expert);
  auto get = [&](const std::string& name) -> absl::StatusOr<kernels::TensorView> {
    absl::StatusOr<kernels::TensorView> v = ckpt.Get(name);
    if (!v.ok()) return base::Annotate(v.status(), who);
    if (v->rank != 2) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": tensor '", name, "' is not 2-D"));
    }
    return v;
  };
  MOE_ASSIGN_OR_RETURN(const kernels::TensorView gate, get(names.gate));
  MOE_ASSIGN_OR_RETURN(const kernels::TensorView up, get(names.up));
  MOE_ASSIGN_OR_RETURN(const kernels::TensorView down, get(names.down));
  const int64_t I = gate.dim(0), H = gate.dim(1);
  if (up.dim(0) != I || up.dim(1) != H || down.dim(0) != H || down.dim(1) != I) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": shapes gate [", I, ",", H, "] up [", up.dim(0), ",", up.dim(1),
                     "] down [", down.dim(0), ",", down.dim(1), "] are not [I,H] [I,H] [H,I]"));
  }
  BlobLocation loc;
  loc.layer = names.layer;
  loc.expert = names.expert;
  loc.dtype = options.format;
  loc.group_size = kernels::IsQuantized(options.format) ? options.group_size : 0;
  loc.hidden_size = H;
  loc.intermediate_size = I;
  const BlobLayout layout = ComputeBlobLayout(loc.dtype, loc.group_size, H, I);
  loc.length = layout.length;
  blob->assign(layout.length, 0);
  BlobHeader header{};
  std::memcpy(header.magic, kBlobMagic, sizeof(kBlobMagic));
  header.version = loc.version;
  header.layer = loc.layer;
  header.expert = loc.expert;
  std::memcpy(blob->data(), &header, sizeof(header));
  const std::pair<const kernels::TensorView*, uint64_t> parts[] = {
      {&gate, layout.gate_offset}, {&up, layout.up_offset}, {&down, layout.down_offset}};
  for (const auto& [src, offset] : parts) {
    if (kernels::IsQuantized(src->dtype)) {
      // A published int4 checkpoint's expert (repacked at load): its own bits, copied.
      if (src->dtype != loc.dtype || src->group_size != loc.group_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, ": the checkpoint's experts are ", kernels::WeightFormatName(src->dtype),
            " group ", src->group_size, " (quantization_config); the import asks ",
            kernels::WeightFormatName(loc.dtype), " group ", loc.group_size,
            ": import with that format and group size"));
      }
      std::memcpy(blob->data() + offset, src->data, src->bytes());
    } else if (kernels::IsQuantized(loc.dtype)) {
      absl::StatusOr<kernels::TensorView> q =
          kernels::Quantize(*src, loc.dtype, loc.group_size, blob->data() + offset);
      if (!q.ok()) return base::Annotate(q.status(), who);
    } else {
      kernels::ConvertDense(*src, loc.dtype, blob->data() + offset);
    }
  }
  loc.checksum = BlobChecksum(blob->data(), loc.length);
  return loc;
}

// The experts already in the index, by (layer, expert). FailedPrecondition when one was written
// in another format: a store holds one format.
absl::StatusOr<absl::flat_hash_map<std::pair<int32_t, int32_t>, BlobLocation>> IndexedExperts(
    const BlobIndex& index, const std::string& store_dir, const ImportOptions& options) {
  MOE_ASSIGN_OR_RETURN(std::vector<BlobLocation> existing, index.List());
  absl::flat_hash_map<std::pair<int32_t, int32_t>, BlobLocation> indexed;
  const int32_t want_group = kernels::IsQuantized(options.format) ? options.group_size : 0;
  for (BlobLocation& l : existing) {
    if (l.dtype != options.format || l.group_size != want_group) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store ", store_dir, " holds ", ExpertName(l.layer, l.expert), " as ",
          kernels::WeightFormatName(l.dtype), " group ", l.group_size, "; this import asks ",
          kernels::WeightFormatName(options.format), " group ", want_group, " (use a new store)"));
    }
    indexed[{l.layer, l.expert}] = std::move(l);
  }
  return indexed;
}

// The experts this run writes: those not indexed, and (with verify_existing) those indexed whose
// blob no longer verifies. Counts skipped and re-imported experts into `result`.
std::vector<const ExpertTensorNames*> ExpertsToWrite(
    const absl::flat_hash_map<std::pair<int32_t, int32_t>, BlobLocation>& indexed,
    const std::string& store_dir, const ImportOptions& options, ImportResult* result) {
  std::vector<const ExpertTensorNames*> todo;
  BlobReader reader(store_dir, BlobReaderOptions{.io_threads = 1});
  std::unique_ptr<void, decltype(&std::free)> buf(nullptr, &std::free);
  uint64_t buf_bytes = 0;
  for (const ExpertTensorNames& e : options.experts) {
    auto it = indexed.find({e.layer, e.expert});
    if (it == indexed.end()) {
      todo.push_back(&e);
      continue;
    }
    if (options.verify_existing) {
      if (it->second.length > buf_bytes) {
        buf_bytes = it->second.length;
        buf.reset(std::aligned_alloc(kBlobAlignment, buf_bytes));
      }
      if (absl::Status s = reader.Read(it->second, buf.get()); !s.ok()) {
        MOE_LOG(WARNING) << "[import] re-importing: " << s;
        ++result->reimported;
        todo.push_back(&e);
        continue;
      }
    }
    ++result->skipped;
  }
  return todo;
}

}  // namespace

absl::Status ImportOptions::Validate() const {
  if (model.empty()) return absl::InvalidArgumentError("import: model is empty");
  if (kernels::IsQuantized(format)) {
    if (absl::Status s = kernels::ValidateQuantFormat(format, group_size); !s.ok()) {
      return base::Annotate(s, "import: format");
    }
  }
  for (const auto& [field, f] :
       {std::pair{"dense_format", dense_format},
        std::pair{"lm_head_format", lm_head_format.value_or(dense_format)}}) {
    if (f == kernels::DType::kQ2) {
      return absl::InvalidArgumentError(
          absl::StrCat("import: ", field, " int2 is not offered (too lossy)"));
    }
    if (kernels::IsQuantized(f)) {
      if (absl::Status s = kernels::ValidateQuantFormat(f, group_size); !s.ok()) {
        return base::Annotate(s, absl::StrCat("import: ", field));
      }
    }
  }
  if (max_blob_file_bytes < kBlobAlignment) {
    return absl::InvalidArgumentError("import: max_blob_file_bytes is below 4 KiB");
  }
  return absl::OkStatus();
}

absl::StatusOr<ImportResult> ImportModel(const Checkpoint& checkpoint, const std::string& store_dir,
                                         const ImportOptions& options) {
  MOE_RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  fs::create_directories(store_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", store_dir, ": ", ec.message()));
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<BlobIndex> index,
                       BlobIndex::Open(store_dir + "/index", options.model, /*create=*/true));
  using Indexed = absl::flat_hash_map<std::pair<int32_t, int32_t>, BlobLocation>;
  MOE_ASSIGN_OR_RETURN(const Indexed indexed, IndexedExperts(*index, store_dir, options));
  ImportResult result;
  ImportProgress progress;
  progress.experts_total = static_cast<int64_t>(options.experts.size());
  const std::vector<const ExpertTensorNames*> todo =
      ExpertsToWrite(indexed, store_dir, options, &result);
  progress.experts_skipped = result.skipped;
  progress.experts_done = result.skipped;
  // Bytes to write, for the ETA: every expert of one model has the same shape in practice, so
  // the first blob's length times the count is exact for them (an estimate otherwise).
  uint64_t first_length = 0;

  BlobAppender appender(store_dir, options.max_blob_file_bytes);
  MOE_RETURN_IF_ERROR(appender.Start());
  std::vector<BlobLocation> pending;
  uint64_t pending_bytes = 0;
  const double start = base::NowSeconds();
  auto step = [&](ImportStep s) {
    if (options.on_step) options.on_step(s);
  };
  auto flush = [&]() -> absl::Status {
    if (pending.empty()) return absl::OkStatus();
    MOE_RETURN_IF_ERROR(appender.Sync());
    step(ImportStep::kDataSynced);
    MOE_RETURN_IF_ERROR(index->Put(pending));
    step(ImportStep::kIndexed);
    progress.experts_done += static_cast<int64_t>(pending.size());
    pending.clear();
    pending_bytes = 0;
    const double elapsed = std::max(1e-6, base::NowSeconds() - start);
    progress.bytes_per_second = static_cast<double>(progress.bytes_written) / elapsed;
    progress.eta_seconds =
        static_cast<double>(progress.bytes_total -
                            std::min(progress.bytes_total, progress.bytes_written)) /
        std::max(1.0, progress.bytes_per_second);
    if (options.on_progress) options.on_progress(progress);
    return absl::OkStatus();
  };

  // Blobs are built (converted/quantized: the CPU-heavy part) a chunk at a time in parallel, then
  // written in order, so the file layout and the crash steps are those of a serial import.
  base::ThreadPool pool(options.num_threads);
  const size_t chunk = 2 * static_cast<size_t>(pool.num_threads());
  std::vector<std::vector<uint8_t>> blobs(chunk);
  std::vector<absl::StatusOr<BlobLocation>> built(chunk);
  for (size_t begin = 0; begin < todo.size(); begin += chunk) {
    const size_t n = std::min(chunk, todo.size() - begin);
    pool.ParallelFor(static_cast<int64_t>(n), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        built[i] = BuildBlob(checkpoint, *todo[begin + i], options, &blobs[i]);
      }
    });
    for (size_t i = 0; i < n; ++i) {
      if (!built[i].ok()) return built[i].status();
      BlobLocation loc = *built[i];
      const std::vector<uint8_t>& blob = blobs[i];
      if (first_length == 0) {
        first_length = loc.length;
        progress.bytes_total = first_length * todo.size();
      }
      if (appender.NeedsSwitch(loc.length)) {
        MOE_RETURN_IF_ERROR(flush());
        MOE_RETURN_IF_ERROR(appender.Switch());
      }
      loc.file = appender.file();
      loc.offset = appender.Reserve(loc.length);
      // Two writes, so crash tests can stop between them and see a torn blob is never indexed.
      const uint64_t half = loc.length / 2;
      MOE_RETURN_IF_ERROR(WriteAll(appender.fd(), blob.data(), half, loc.offset, appender.path()));
      step(ImportStep::kBlobPartWritten);
      MOE_RETURN_IF_ERROR(WriteAll(appender.fd(), blob.data() + half, loc.length - half,
                                   loc.offset + half, appender.path()));
      step(ImportStep::kBlobWritten);
      progress.bytes_written += loc.length;
      result.bytes_written += loc.length;
      ++result.imported;
      pending_bytes += loc.length;
      pending.push_back(std::move(loc));
      if (pending_bytes >= options.sync_bytes) MOE_RETURN_IF_ERROR(flush());
    }
  }
  MOE_RETURN_IF_ERROR(flush());

  MOE_RETURN_IF_ERROR(WriteDenseAndManifest(checkpoint, store_dir, options));
  return result;
}

absl::StatusOr<VerifyResult> VerifyStore(const std::string& store_dir,
                                         const std::function<void(int64_t, int64_t)>& on_progress) {
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<BlobIndex> index,
                       BlobIndex::Open(store_dir + "/index", "", /*create=*/false));
  MOE_ASSIGN_OR_RETURN(std::vector<BlobLocation> entries, index->List());
  VerifyResult result;
  BlobReader reader(store_dir, BlobReaderOptions{});
  uint64_t buf_bytes = 0;
  void* buf = nullptr;
  int64_t done = 0;
  for (const BlobLocation& l : entries) {
    if (l.length > buf_bytes) {
      std::free(buf);
      buf_bytes = l.length;
      buf = std::aligned_alloc(kBlobAlignment, buf_bytes);
    }
    if (absl::Status s = reader.Read(l, buf); s.ok()) {
      ++result.blobs_ok;
    } else {
      result.errors.push_back(std::move(s));
    }
    if (on_progress) on_progress(++done, static_cast<int64_t>(entries.size()));
  }
  std::free(buf);
  return result;
}

}  // namespace moe::store
