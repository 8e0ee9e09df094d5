// manifest.json to and from StoreManifest. Optional fields keep their defaults when absent.
#include "expertstore/manifest.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moe::store {
namespace {

using json = nlohmann::json;

absl::Status BadField(const std::string& path, const char* key, const char* want) {
  return absl::DataLossError(absl::StrCat(path, ": \"", key, "\" must be ", want));
}

// Fills *out from j[key]; absent: DataLoss when required, else *out is left as it is.
absl::Status ReadString(const json& j, const std::string& path, const char* key, bool required,
                        std::string* out) {
  if (!j.contains(key)) return required ? BadField(path, key, "present") : absl::OkStatus();
  if (!j[key].is_string()) return BadField(path, key, "a string");
  *out = j[key].get<std::string>();
  if (required && out->empty()) return BadField(path, key, "a non-empty string");
  return absl::OkStatus();
}

absl::Status ReadCount(const json& j, const std::string& path, const char* key, bool required,
                       int64_t* out) {
  if (!j.contains(key)) return required ? BadField(path, key, "present") : absl::OkStatus();
  if (!j[key].is_number_unsigned()) return BadField(path, key, "an integer >= 0");
  *out = j[key].get<int64_t>();
  return absl::OkStatus();
}

}  // namespace

std::string ManifestPath(const std::string& store_dir) {
  return (std::filesystem::path(store_dir) / kManifestFile).string();
}

std::string ManifestText(const StoreManifest& m) {
  const json j = {{"model", m.model},
                  {"format_version", m.format_version},
                  {"expert_format", m.expert_format},
                  {"group_size", m.group_size},
                  {"num_experts", m.num_experts},
                  {"dense_file", m.dense_file},
                  {"dense_format", m.dense_format},
                  {"num_dense_tensors", m.num_dense_tensors},
                  {"index", m.index}};
  return j.dump(2) + "\n";
}

absl::StatusOr<StoreManifest> ReadManifest(const std::string& store_dir) {
  const std::string path = ManifestPath(store_dir);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", path, ": the import did not finish"));
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  StoreManifest m;
  for (absl::Status s : {ReadString(j, path, "model", false, &m.model),
                         ReadCount(j, path, "format_version", false, &m.format_version),
                         ReadString(j, path, "expert_format", true, &m.expert_format),
                         ReadCount(j, path, "group_size", false, &m.group_size),
                         ReadCount(j, path, "num_experts", true, &m.num_experts),
                         ReadString(j, path, "dense_file", false, &m.dense_file),
                         ReadString(j, path, "dense_format", false, &m.dense_format),
                         ReadCount(j, path, "num_dense_tensors", false, &m.num_dense_tensors),
                         ReadString(j, path, "index", false, &m.index)}) {
    if (!s.ok()) return s;
  }
  return m;
}

}  // namespace moe::store
