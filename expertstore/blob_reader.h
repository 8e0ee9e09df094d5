// BlobReader: reads whole expert blobs from the blob files with O_DIRECT through a pool of I/O
// threads (one read in flight per thread), and verifies each against its index entry.
//
// A failed read never looks like a successful one: the caller's buffer is only "valid" when the
// returned (or delivered) Status is OK; the store hands a buffer out only then. Codes, each with a
// message naming the expert, the file and the offset:
//   NotFound  the blob file is missing
//   DataLoss  the file is shorter than the blob (truncated), the checksum does not match, or the
//             blob's header names another expert (checked even with checksums off, so a zeroed
//             blob is always caught)
//   Internal  open/read failed otherwise (EIO, a directory where the file should be, ...)
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "expertstore/blob_format.h"
#include "kernels/base/thread_pool.h"

namespace moe::store {

struct BlobReaderOptions {
  // I/O worker threads, i.e. reads in flight. Default: 8.
  int io_threads = 8;
  // Verify XXH3 of every blob read. Default: true.
  bool verify_checksums = true;
  // Open blob files with O_DIRECT (bypass the page cache). Filesystems that refuse it (tmpfs)
  // fall back to buffered reads, logged once per file. Default: true.
  bool use_o_direct = true;
};

class BlobReader {
 public:
  BlobReader(std::string store_dir, BlobReaderOptions options);
  // Waits for queued reads to finish (their callbacks run).
  ~BlobReader();
  BlobReader(const BlobReader&) = delete;
  BlobReader& operator=(const BlobReader&) = delete;

  // Reads the blob at `loc` into dst, which must be kBlobAlignment-aligned and hold loc.length
  // bytes, and verifies it. Thread-safe. Blocking.
  absl::Status Read(const BlobLocation& loc, void* dst);
  // The same on an I/O thread; `done` runs there with the result.
  void ReadAsync(const BlobLocation& loc, void* dst, std::function<void(absl::Status)> done);

  const std::string& store_dir() const { return store_dir_; }

 private:
  struct OpenFile {
    int fd = -1;
    bool direct = false;
  };
  absl::StatusOr<OpenFile> GetFile(const BlobLocation& loc, const std::string& where);

  const std::string store_dir_;
  const BlobReaderOptions options_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, OpenFile> files_;  // by relative path; guarded by mu_
  std::unique_ptr<base::ThreadPool> pool_;            // reset first in the destructor: reads finish
                                                      // before their files close
};

}  // namespace moe::store
