#include "engine/budgets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "expertstore/blob_format.h"
#include "kernels/base/bytes.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

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
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) {  // a model store
    f.store = true;
    std::ifstream in(fs::path(dir) / "manifest.json");
    const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (m.is_discarded() || !m.contains("num_experts") || !m.contains("expert_format")) {
      return absl::DataLossError(absl::StrCat(dir, "/manifest.json: unreadable"));
    }
    MOE_ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(dir));
    MOE_ASSIGN_OR_RETURN(const kernels::DType format,
                         kernels::ParseWeightFormat(m["expert_format"].get<std::string>()));
    const auto group = m.value("group_size", 0);
    const store::BlobLayout blob =
        store::ComputeBlobLayout(format, group, c.hidden_size, c.moe_intermediate_size);
    f.expert_bytes = m["num_experts"].get<uint64_t>() * blob.length;
    f.dense_bytes = fs::file_size(fs::path(dir) / m.value("dense_file", "dense.safetensors"), ec);
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
