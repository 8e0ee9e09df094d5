// BlobIndex on RocksDB. Keys: "manifest", and "e/<model>/<layer %08d>/<expert %08d>" so a prefix
// scan lists one model's experts in (layer, expert) order. Values are small JSON objects: a few
// thousand entries, read once at open, so legibility (ldb scan) wins over a binary encoding.
#include "expertstore/blob_index.h"

#include <cstdarg>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/write_batch.h"

namespace moe::store {
namespace {
using nlohmann::json;
constexpr char kManifestKey[] = "manifest";

// RocksDB's log goes to ours, warnings and worse only, instead of a LOG file in the index: on a
// full disk RocksDB 7.8 aborts (an assertion in WritableFileWriter) when it logs again to a LOG
// whose write failed, and a reader should not need to write to the store at all.
class WarningLogger : public rocksdb::Logger {
 public:
  WarningLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    std::vsnprintf(line, sizeof line, format, ap);
    MOE_LOG(WARNING) << "[store] rocksdb: " << line;
  }
};

std::string EntryPrefix(const std::string& model) { return absl::StrCat("e/", model, "/"); }
std::string EntryKey(const std::string& model, int32_t layer, int32_t expert) {
  return absl::StrFormat("%s%08d/%08d", EntryPrefix(model), layer, expert);
}

std::string Encode(const BlobLocation& l) {
  return json{{"layer", l.layer},
              {"expert", l.expert},
              {"file", l.file},
              {"offset", l.offset},
              {"length", l.length},
              {"checksum", l.checksum},
              {"checksum_kind", "xxh3_64"},
              {"version", l.version},
              {"dtype", static_cast<int>(l.dtype)},
              {"group_size", l.group_size},
              {"hidden_size", l.hidden_size},
              {"intermediate_size", l.intermediate_size}}
      .dump();
}

// j[key] as an integer of type T; throws (caught by the caller) for a float, a string or a value
// out of T's range, which nlohmann's get<T>() would convert with undefined behaviour.
template <typename T>
T Integer(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
        (i < 0 || static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return static_cast<T>(i);
    }
  }
  throw std::runtime_error(absl::StrCat("'", key, "' is not an integer in range: ", v.dump()));
}

// What the reader and the kernels rely on: aligned, and the three matrices inside `length`.
// Bounding the dimensions (2^20 each) keeps ComputeBlobLayout's products from overflowing.
absl::Status CheckGeometry(const BlobLocation& l) {
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  std::string bad;
  if (l.hidden_size <= 0 || l.hidden_size > kMaxDim || l.intermediate_size <= 0 ||
      l.intermediate_size > kMaxDim) {
    bad = absl::StrCat("hidden_size ", l.hidden_size, " / intermediate_size ",
                       l.intermediate_size, " outside [1, ", kMaxDim, "]");
  } else if (l.length == 0 || l.offset % kBlobAlignment != 0 || l.length % kBlobAlignment != 0) {
    bad = absl::StrCat("offset ", l.offset, " / length ", l.length, " not multiples of ",
                       kBlobAlignment);
  } else if (kernels::IsQuantized(l.dtype) &&
             !kernels::ValidateQuantFormat(l.dtype, l.group_size).ok()) {
    bad = absl::StrCat("group_size ", l.group_size, " is not valid for ",
                       kernels::DTypeName(l.dtype));
  } else if (const uint64_t need =
                 ComputeBlobLayout(l.dtype, l.group_size, l.hidden_size, l.intermediate_size)
                     .length;
             need > l.length) {
    bad = absl::StrCat("a ", l.intermediate_size, "x", l.hidden_size, " ",
                       kernels::DTypeName(l.dtype), " expert needs ", need, " bytes, length is ",
                       l.length);
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(ExpertName(l.layer, l.expert), ": ", bad));
}

}  // namespace

absl::StatusOr<BlobLocation> DecodeBlobLocation(const std::string& key, const std::string& value,
                                                const std::string& path) {
  try {
    const json j = json::parse(value);
    BlobLocation l;
    l.layer = Integer<int32_t>(j, "layer");
    l.expert = Integer<int32_t>(j, "expert");
    l.file = j.at("file").get<std::string>();
    l.offset = Integer<uint64_t>(j, "offset");
    l.length = Integer<uint64_t>(j, "length");
    l.checksum = Integer<uint64_t>(j, "checksum");
    l.version = Integer<uint32_t>(j, "version");
    const int dtype = Integer<int>(j, "dtype");
    if (dtype < 0 || dtype > static_cast<int>(kernels::DType::kF8))
      throw std::runtime_error("dtype");
    l.dtype = static_cast<kernels::DType>(dtype);
    l.group_size = Integer<int32_t>(j, "group_size");
    l.hidden_size = Integer<int64_t>(j, "hidden_size");
    l.intermediate_size = Integer<int64_t>(j, "intermediate_size");
    if (absl::Status st = CheckGeometry(l); !st.ok()) {
      return absl::DataLossError(absl::StrCat("index ", path, ": entry '", key, "': ",
                                              st.message()));
    }
    return l;
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("index ", path, ": entry '", key, "' does not decode: ", e.what()));
  }
}

BlobIndex::BlobIndex(std::string path, std::unique_ptr<rocksdb::DB> db, IndexManifest manifest)
    : path_(std::move(path)), db_(std::move(db)), manifest_(std::move(manifest)) {}
BlobIndex::~BlobIndex() = default;

absl::StatusOr<std::unique_ptr<BlobIndex>> BlobIndex::Open(const std::string& path,
                                                           const std::string& model, bool create) {
  rocksdb::Options options;
  options.create_if_missing = create;
  options.info_log = std::make_shared<WarningLogger>();
  rocksdb::DB* raw = nullptr;
  // Readers open read-only: no new MANIFEST, OPTIONS or WAL file, so a store on a full or
  // read-only filesystem still opens (and the importer's LOCK does not keep readers out).
  rocksdb::Status s = create ? rocksdb::DB::Open(options, path, &raw)
                             : rocksdb::DB::OpenForReadOnly(options, path, &raw);
  if (!s.ok()) {
    // RocksDB's "does not exist (create_if_missing...)"; read-only: the directory's NotFound.
    if (!create && (s.IsInvalidArgument() || s.IsNotFound() || s.IsPathNotFound())) {
      return absl::NotFoundError(absl::StrCat("index ", path, " does not exist: ", s.ToString()));
    }
    return absl::InternalError(absl::StrCat("index ", path, ": cannot open: ", s.ToString()));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  s = db->Get(rocksdb::ReadOptions(), kManifestKey, &value);
  IndexManifest manifest;
  if (s.IsNotFound()) {
    if (!create || model.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("index ", path, " has no manifest (not a store index, or created empty)"));
    }
    manifest.model = model;
    const std::string text =
        json{{"model", manifest.model}, {"format_version", manifest.format_version}}.dump();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db->Put(wo, kManifestKey, text);
    if (!s.ok()) return absl::InternalError(absl::StrCat("index ", path, ": ", s.ToString()));
  } else if (!s.ok()) {
    return absl::InternalError(absl::StrCat("index ", path, ": reading manifest: ", s.ToString()));
  } else {
    try {
      const json j = json::parse(value);
      manifest.model = j.at("model").get<std::string>();
      manifest.format_version = Integer<uint32_t>(j, "format_version");
    } catch (const std::exception& e) {
      return absl::DataLossError(
          absl::StrCat("index ", path, ": manifest does not decode: ", e.what()));
    }
    if (manifest.format_version != kStoreFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "index ", path, " has store format version ", manifest.format_version,
          "; this binary reads version ", kStoreFormatVersion, " (re-import the model)"));
    }
    if (!model.empty() && manifest.model != model) {
      return absl::FailedPreconditionError(
          absl::StrCat("index ", path, " is for model '", manifest.model, "', not '", model, "'"));
    }
  }
  return std::unique_ptr<BlobIndex>(new BlobIndex(path, std::move(db), std::move(manifest)));
}

absl::StatusOr<BlobLocation> BlobIndex::Get(int32_t layer, int32_t expert) const {
  const std::string key = EntryKey(manifest_.model, layer, expert);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat(ExpertName(layer, expert), " is not in the index ", path_));
  }
  if (!s.ok()) return absl::InternalError(absl::StrCat("index ", path_, ": ", s.ToString()));
  return DecodeBlobLocation(key, value, path_);
}

absl::StatusOr<std::vector<BlobLocation>> BlobIndex::List() const {
  const std::string prefix = EntryPrefix(manifest_.model);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  std::vector<BlobLocation> out;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    MOE_ASSIGN_OR_RETURN(BlobLocation l,
                         DecodeBlobLocation(it->key().ToString(), it->value().ToString(), path_));
    out.push_back(std::move(l));
  }
  if (!it->status().ok()) {
    return absl::InternalError(absl::StrCat("index ", path_, ": scan: ", it->status().ToString()));
  }
  return out;
}

absl::Status BlobIndex::Put(const std::vector<BlobLocation>& entries) {
  rocksdb::WriteBatch batch;
  for (const BlobLocation& l : entries) {
    rocksdb::Status s = batch.Put(EntryKey(manifest_.model, l.layer, l.expert), Encode(l));
    if (!s.ok()) return absl::InternalError(absl::StrCat("index ", path_, ": ", s.ToString()));
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) return absl::InternalError(absl::StrCat("index ", path_, ": write: ", s.ToString()));
  return absl::OkStatus();
}

}  // namespace moe::store
