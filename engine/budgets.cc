#include "engine/budgets.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "expertstore/blob_format.h"
#include "expertstore/manifest.h"
#include "kernels/base/bytes.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"

namespace moe::engine {

absl::StatusOr<Budgets> AutoBudgets(const BudgetFacts& f) {
  Budgets b;
  if (!f.gpu) {
    b.kv = kCpuKvBudget;
    return b;
  }
  const uint64_t fixed = f.dense_bytes + kWorkspace;
  const uint64_t avail = f.free_device / 10 * 9;
  if (avail <= fixed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "auto budgets: 90% of the free VRAM (", base::FormatBytes(avail), ") does not hold ",
        f.store ? "the dense weights" : "the model", " (", base::FormatBytes(f.dense_bytes),
        ") and the workspace (", base::FormatBytes(kWorkspace), "); set the budgets by hand"));
  }
  const uint64_t usable = avail - fixed;
  b.device = std::min(f.expert_bytes, usable / 4 * 3);
  b.kv = usable - b.device;
  b.host = std::min(f.expert_bytes - b.device, f.free_host / 2);
  return b;
}

absl::StatusOr<BudgetFacts> ModelBudgetFacts(const std::string& dir) {
  namespace fs = std::filesystem;
  BudgetFacts f;
  std::error_code ec;
  if (fs::exists(store::ManifestPath(dir), ec)) {  // a model store
    f.store = true;
    MOE_ASSIGN_OR_RETURN(const store::StoreManifest m, store::ReadManifest(dir));
    MOE_ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(dir));
    MOE_ASSIGN_OR_RETURN(const kernels::DType format, kernels::ParseWeightFormat(m.expert_format));
    const store::BlobLayout blob = store::ComputeBlobLayout(
        format, static_cast<int>(m.group_size), c.hidden_size, c.moe_intermediate_size);
    f.expert_bytes = static_cast<uint64_t>(m.num_experts) * blob.length;
    f.dense_bytes = fs::file_size(fs::path(dir) / m.dense_file, ec);
    return f;
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {  // a checkpoint: all of it loads
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) == 0 && entry.path().extension() == ".safetensors") {
      f.dense_bytes += entry.file_size(ec);  // model.safetensors, model-00001-of-00002...
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  return f;
}

}  // namespace moe::engine
