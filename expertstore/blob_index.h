// BlobIndex: the RocksDB index of a store, (model, layer, expert) -> BlobLocation, plus one
// manifest record (model id, format version). It is the only source of truth for which blobs
// exist: a blob the index does not name does not exist, whatever the blob files hold.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "expertstore/blob_format.h"

namespace rocksdb {
class DB;
}

namespace moe::store {

struct IndexManifest {
  std::string model;
  uint32_t format_version = kStoreFormatVersion;
};

// Decodes one index entry's value (key and index_path name it in errors); what Get and List
// return for each entry. DataLoss when it does not decode, or describes a blob the readers
// cannot use: dimensions outside [1, 2^20], offset or length not 4 KiB multiples, a group size
// invalid for its quantized dtype, or matrices that do not fit `length`.
absl::StatusOr<BlobLocation> DecodeBlobLocation(const std::string& key, const std::string& value,
                                                const std::string& index_path);

class BlobIndex {
 public:
  // Opens the index at `path` (a RocksDB directory).
  // `model`: the model the caller expects; empty accepts whatever the manifest says.
  // `create`: when the index does not exist, create it with a manifest naming `model`
  //   (which must then be non-empty); otherwise a missing index is NotFound, and the index is
  //   opened read-only (it writes nothing: a full or read-only disk does not stop readers).
  // FailedPrecondition: the manifest names another model, or another format version (the message
  // names the index path and both values). DataLoss: an unreadable manifest. Internal: RocksDB
  // could not open (the message carries RocksDB's, e.g. the LOCK held by another importer).
  static absl::StatusOr<std::unique_ptr<BlobIndex>> Open(const std::string& path,
                                                         const std::string& model, bool create);
  ~BlobIndex();

  const IndexManifest& manifest() const { return manifest_; }
  const std::string& path() const { return path_; }

  // NotFound when (layer, expert) has no entry. DataLoss when the entry does not decode.
  absl::StatusOr<BlobLocation> Get(int32_t layer, int32_t expert) const;
  // Every entry of this model, ordered by (layer, expert).
  absl::StatusOr<std::vector<BlobLocation>> List() const;
  // Writes the entries in one atomic, synced batch: after a crash either all or none are there.
  // The caller must have made the blobs durable first (the importer fsyncs before Put).
  absl::Status Put(const std::vector<BlobLocation>& entries);

 private:
  BlobIndex(std::string path, std::unique_ptr<rocksdb::DB> db, IndexManifest manifest);
  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  IndexManifest manifest_;
};

}  // namespace moe::store
