// Cache simulation over an access sequence: Belady's MIN (the optimum: evict the expert whose
// next use is farthest away) and any EvictionPolicy, at a capacity in experts. The simulator
// (moe-store-sim) prints one next to the other so a policy's gap to the optimum is visible.
#pragma once

#include <cstdint>
#include <vector>

#include "expertstore/policy.h"

namespace moe::store {

struct SimResult {
  uint64_t accesses = 0;
  uint64_t hits = 0;
  double hit_rate() const { return accesses == 0 ? 0.0 : static_cast<double>(hits) / accesses; }
};

// MIN with demand fetching (every miss is inserted, as the store does). capacity >= 0.
SimResult SimulateBelady(const std::vector<ExpertId>& accesses, int64_t capacity);
// The same cache driven by `policy` (fresh; it is fed the whole sequence).
SimResult SimulatePolicy(const std::vector<ExpertId>& accesses, int64_t capacity,
                         EvictionPolicy& policy);

}  // namespace moe::store
