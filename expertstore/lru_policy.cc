// LRU: a recency list; the victim is the least recently used evictable expert.
#include <list>

#include "absl/container/flat_hash_map.h"
#include "expertstore/policy.h"

namespace moe::store {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "lru"; }
  void OnInsert(ExpertId id) override {
    order_.push_front(id);
    where_[id] = order_.begin();
  }
  void OnAccess(ExpertId id) override {
    auto it = where_.find(id);
    if (it != where_.end()) order_.splice(order_.begin(), order_, it->second);
  }
  void OnErase(ExpertId id) override {
    auto it = where_.find(id);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
  }
  std::optional<ExpertId> Victim(const std::function<bool(ExpertId)>& evictable) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (evictable(*it)) return *it;
    }
    return std::nullopt;
  }

 private:
  std::list<ExpertId> order_;  // most recent first
  absl::flat_hash_map<ExpertId, std::list<ExpertId>::iterator> where_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace moe::store
