// Memory budgets left to "auto" (moe-worker's and moe-generate's --kv_budget, --device_budget and
// --host_budget), sized from the machine and the model before the model loads.
//
// The rule on a GPU (the CUDA backend):
//   usable = 90% of the free VRAM - the dense weights - kWorkspace (activations, op scratch)
//   device = the expert store's VRAM tier: every expert when they take at most 75% of usable,
//            else 75% of usable (a model straight from a checkpoint holds every expert in VRAM:
//            no tier, its experts counted like dense weights)
//   kv     = the rest of usable
//   host   = pinned RAM for the experts VRAM does not hold: at most half the available RAM
// On the CPU backend, the defaults of before: KV 1 GiB, no expert tiers (experts read from the
// store's blobs, or the checkpoint's memory).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace moe::engine {

struct BudgetFacts {
  bool gpu = false;              // the CUDA backend
  bool store = false;            // experts from a model store (else straight from a checkpoint)
  uint64_t free_device = 0;      // free VRAM before the model loads
  uint64_t free_host = 0;        // available host RAM
  uint64_t dense_bytes = 0;      // what loads besides the experts
  uint64_t expert_bytes = 0;     // every expert of the model, as stored
};

struct Budgets {
  uint64_t device = 0, host = 0, kv = 0;
};

inline constexpr uint64_t kWorkspace = 2ull << 30;
inline constexpr uint64_t kCpuKvBudget = 1ull << 30;

// The rule above. FailedPrecondition when the GPU cannot hold the dense weights (or, from a
// checkpoint, every expert) with the workspace.
absl::StatusOr<Budgets> AutoBudgets(const BudgetFacts& facts);

// The facts of the model at `dir` (a model store or a Hugging Face checkpoint): dense and expert
// bytes from its files.
absl::StatusOr<BudgetFacts> ModelBudgetFacts(const std::string& dir);

}  // namespace moe::engine
