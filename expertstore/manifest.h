// manifest.json: what a finished import wrote (model, formats, counts). The importer writes it
// last (dense_writer.h), so its presence means "import finished"; ReadManifest is the one reader.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace moe::store {

inline constexpr char kManifestFile[] = "manifest.json";

struct StoreManifest {
  std::string model;               // moe-import --model; empty when it names none
  int64_t format_version = 0;      // kStoreFormatVersion of the writer
  std::string expert_format;       // kernels::WeightFormatName: "bf16", "int4", ...
  int64_t group_size = 0;          // quantization group of the experts; 0 when not quantized
  int64_t num_experts = 0;         // experts imported (all layers)
  std::string dense_file = "dense.safetensors";
  std::string dense_format;        // kernels::WeightFormatName of the dense weights
  int64_t num_dense_tensors = 0;
  std::string index = "index";     // the RocksDB index directory, relative to the store
};

// store_dir/manifest.json.
std::string ManifestPath(const std::string& store_dir);
// The manifest as JSON text (what WriteDenseAndManifest writes).
std::string ManifestText(const StoreManifest& manifest);
// Reads store_dir/manifest.json. NotFound when there is none (the import did not finish);
// DataLoss naming the file when it is not a JSON object, and the field when expert_format or
// num_experts is missing or any field has the wrong type.
absl::StatusOr<StoreManifest> ReadManifest(const std::string& store_dir);

}  // namespace moe::store
