// BlobReader: pread into the caller's aligned buffer, then VerifyBlob. File descriptors are opened
// once per blob file and kept; a missing file is not remembered, so it can appear later.
#include "expertstore/blob_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/base/log.h"

namespace moe::store {

BlobReader::BlobReader(std::string store_dir, BlobReaderOptions options)
    : store_dir_(std::move(store_dir)),
      options_(options),
      pool_(std::make_unique<base::ThreadPool>(options.io_threads)) {}

BlobReader::~BlobReader() {
  pool_.reset();  // joins the reads in flight before their file descriptors close
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, f] : files_) ::close(f.fd);
}

absl::StatusOr<BlobReader::OpenFile> BlobReader::GetFile(const BlobLocation& loc,
                                                         const std::string& where) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = files_.find(loc.file); it != files_.end()) return it->second;
  const std::string path = absl::StrCat(store_dir_, "/", loc.file);
  OpenFile f;
  // O_DIRECT by default: each expert is read once into a slot that keeps it, so a page-cache copy
  // would only double the host memory it takes. A filesystem that refuses it still gets read.
  if (options_.use_o_direct) {
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    f.direct = f.fd >= 0;
    if (f.fd < 0 && errno == EINVAL) {
      MOE_LOG(WARNING) << "[store] " << path << ": O_DIRECT refused by the filesystem; "
                       << "reading through the page cache";
    }
  }
  if (f.fd < 0) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(where, ": blob file ", path, " is missing"));
    }
    return absl::InternalError(absl::StrCat(where, ": open ", path, ": ", std::strerror(err)));
  }
  files_[loc.file] = f;
  return f;
}

absl::Status BlobReader::Read(const BlobLocation& loc, void* dst) {
  const std::string where = absl::StrCat(ExpertName(loc.layer, loc.expert), ": ", loc.file,
                                         " at offset ", loc.offset, " (", loc.length, " bytes)");
  MOE_CHECK(reinterpret_cast<uintptr_t>(dst) % kBlobAlignment == 0) << "unaligned buffer " << dst;
  absl::StatusOr<OpenFile> f = GetFile(loc, where);
  if (!f.ok()) return f.status();
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < loc.length) {
    const ssize_t n =
        ::pread(f->fd, out + done, loc.length - done, static_cast<off_t>(loc.offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(where, ": read error: ", std::strerror(errno)));
    }
    // A read of 0 bytes before the blob's end: the file is shorter than the index says, so the
    // store itself is damaged (DataLoss), unlike a failing read (Internal).
    if (n == 0) {
      struct stat st {};
      ::fstat(f->fd, &st);
      return absl::DataLossError(absl::StrCat(where, ": truncated: the file ends at ", st.st_size,
                                              " bytes, the blob at ", loc.offset + loc.length));
    }
    done += static_cast<uint64_t>(n);
  }
  return VerifyBlob(loc, dst, options_.verify_checksums);
}

void BlobReader::ReadAsync(const BlobLocation& loc, void* dst,
                           std::function<void(absl::Status)> done) {
  pool_->Schedule([this, loc, dst, done = std::move(done)] { done(Read(loc, dst)); });
}

}  // namespace moe::store
