// Belady's MIN: precompute each access's next use, keep residents ordered by next use.
#include "expertstore/belady.h"

#include <limits>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace moe::store {

SimResult SimulateBelady(const std::vector<ExpertId>& accesses, int64_t capacity, bool bypass) {
  const int64_t n = static_cast<int64_t>(accesses.size());
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> next_use(n);
  absl::flat_hash_map<ExpertId, int64_t> seen;
  for (int64_t i = n - 1; i >= 0; --i) {
    auto it = seen.find(accesses[i]);
    next_use[i] = it == seen.end() ? kNever : it->second;
    seen[accesses[i]] = i;
  }
  SimResult r;
  std::set<std::pair<int64_t, ExpertId>> by_next;   // farthest next use last
  absl::flat_hash_map<ExpertId, int64_t> resident;  // id -> its next use
  for (int64_t i = 0; i < n; ++i) {
    const ExpertId id = accesses[i];
    ++r.accesses;
    if (auto it = resident.find(id); it != resident.end()) {
      ++r.hits;
      by_next.erase({it->second, id});
      it->second = next_use[i];
      by_next.insert({next_use[i], id});
      continue;
    }
    if (capacity == 0) continue;
    if (static_cast<int64_t>(resident.size()) >= capacity) {
      auto victim = std::prev(by_next.end());
      if (bypass && next_use[i] >= victim->first) {
        ++r.bypasses;
        continue;
      }
      resident.erase(victim->second);
      by_next.erase(victim);
    }
    resident[id] = next_use[i];
    by_next.insert({next_use[i], id});
  }
  return r;
}

SimResult SimulatePolicy(const RoutingTrace& trace, int64_t capacity, EvictionPolicy& policy) {
  SimResult r;
  absl::flat_hash_set<ExpertId> resident;
  for (const RoutingRecord& record : trace.records) {
    if (record.prediction) {
      policy.OnPredict(record.layer, record.experts);
      continue;
    }
    policy.BeginVisit(record.layer, record.experts);
    for (const int32_t e : record.experts) {
      const ExpertId id{record.layer, e};
      ++r.accesses;
      if (resident.contains(id)) {
        ++r.hits;
        policy.OnAccess(id);
        continue;
      }
      if (capacity == 0) continue;
      if (static_cast<int64_t>(resident.size()) >= capacity) {
        std::optional<ExpertId> victim = policy.Victim([](ExpertId) { return true; });
        if (!victim || !policy.Admit(id, *victim)) {  // nullopt: pinned layers fill the cache
          ++r.bypasses;
          continue;
        }
        policy.OnErase(*victim);
        resident.erase(*victim);
      }
      resident.insert(id);
      policy.OnInsert(id);
    }
  }
  return r;
}

}  // namespace moe::store
