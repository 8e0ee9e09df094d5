// ScoredPolicy: the shared shape of policies that evict the lowest score (weighted LRU, LFU):
// an ordered set of (score, id) plus each resident id's bookkeeping.
#pragma once

#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "expertstore/policy.h"

namespace moe::store {

class ScoredPolicy : public EvictionPolicy {
 public:
  void OnInsert(ExpertId id) override {
    OnErase(id);
    Touch(id, entries_[id]);
  }
  void OnAccess(ExpertId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    order_.erase({it->second.score, it->second.last_used, id});
    Touch(id, it->second);
  }
  void OnErase(ExpertId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    order_.erase({it->second.score, it->second.last_used, id});
    entries_.erase(it);
  }
  std::optional<ExpertId> Victim(const std::function<bool(ExpertId)>& evictable) override {
    for (const auto& [score, last, id] : order_) {
      if (evictable(id)) return id;
    }
    return std::nullopt;
  }

 protected:
  struct Entry {
    double count = 0;
    int64_t last_used = 0;
    double score = 0;
  };
  virtual double Score(const Entry& e) const = 0;
  // Called after every access; may rescore everything (aging).
  virtual void AfterAccess() {}
  void Rescore(const std::function<void(Entry&)>& change) {
    order_.clear();
    for (auto& [id, e] : entries_) {
      change(e);
      e.score = Score(e);
      order_.insert({e.score, e.last_used, id});
    }
  }
  int64_t clock() const { return clock_; }

 private:
  void Touch(ExpertId id, Entry& e) {
    e.count += 1;
    e.last_used = ++clock_;
    e.score = Score(e);
    order_.insert({e.score, e.last_used, id});
    AfterAccess();
  }
  int64_t clock_ = 0;
  absl::flat_hash_map<ExpertId, Entry> entries_;
  std::set<std::tuple<double, int64_t, ExpertId>> order_;  // lowest score (then oldest) first
};

}  // namespace moe::store
