// The import's last step: dense (non-expert) weights into dense.safetensors, then manifest.json.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "expertstore/importer.h"

namespace moe::store {

// Writes store_dir/dense.safetensors (options.dense_tensors converted to options.dense_format)
// and then store_dir/manifest.json, each to a temporary name, fsynced, then renamed, so either
// file is whole or absent. NotFound names a missing dense tensor; Internal an I/O error.
// The dense.safetensors part alone, to `path` (also used by moe-bench for its synthetic models).
absl::Status WriteDenseSafetensors(const Checkpoint& checkpoint, const std::string& path,
                                   const ImportOptions& options);

absl::Status WriteDenseAndManifest(const Checkpoint& checkpoint, const std::string& store_dir,
                                   const ImportOptions& options);

}  // namespace moe::store
