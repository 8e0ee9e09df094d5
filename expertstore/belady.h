// Cache simulation over an access sequence: Belady's MIN (the optimum: evict the expert whose
// next use is farthest away) and any EvictionPolicy, at a capacity in experts. The simulator
// (moe-store-sim) prints one next to the other so a policy's gap to the optimum is visible.
#pragma once

#include <cstdint>
#include <vector>

#include "expertstore/policy.h"
#include "expertstore/routing_trace.h"

namespace moe::store {

struct SimResult {
  uint64_t accesses = 0;
  uint64_t hits = 0;
  uint64_t bypasses = 0;  // misses not cached (EvictionPolicy::Admit said no, or MIN's bypass)
  double hit_rate() const { return accesses == 0 ? 0.0 : static_cast<double>(hits) / accesses; }
};

// MIN with demand fetching (every miss is inserted). With `bypass`, a miss whose next use is
// later than every resident's is not inserted: the optimum of a cache that may bypass, as
// next_use does (EvictionPolicy::Admit). capacity >= 0.
SimResult SimulateBelady(const std::vector<ExpertId>& accesses, int64_t capacity,
                         bool bypass = false);
// The same cache driven by `policy` (fresh), the way a SlotTier drives it: each record is a
// visit (BeginVisit, then each expert accessed or missed) or a prediction (OnPredict); a miss
// in a full cache asks for a victim and whether to admit.
SimResult SimulatePolicy(const RoutingTrace& trace, int64_t capacity, EvictionPolicy& policy);

}  // namespace moe::store
