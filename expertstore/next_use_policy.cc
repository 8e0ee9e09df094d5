// Next use: Belady's rule (evict the expert needed latest) on estimated next uses.
//
// A step walks the layers in order, so the next chance to use an expert of layer l is a known
// number d of layer visits away (1..L, L for the layer being visited now), and at each visit of l
// it is chosen with a probability p that the layer's history estimates. Its expected next use is
// then d + L * (1 - p) / p visits away (the first chance, then one more pass per failure), and
// the victim is the resident with the latest one. p is the expert's own rate of being chosen
// after a visit that chose it and after one that did not (routing repeats itself from step to
// step), from decayed counts kept for every expert, resident or not, and shrunk towards the
// layers' rate while the expert has little history; raised to the predictor's measured accuracy
// for an expert predicted for the next visit (OnPredict). A miss whose own expected next use is
// later than the victim's is not cached (Admit): when the budget is under one pass's working set
// this keeps a stable set of likely experts instead of churning everything (the cyclic scan that
// defeats LRU).
//
// Cost: each layer keeps its residents sorted by p (p changes only when that layer is visited or
// predicted), so a victim is the best of L candidates, and bookkeeping is O(L + residents of one
// layer) per miss, O(experts of the layer) per visit.
#include <algorithm>
#include <vector>

#include "expertstore/policy.h"

namespace moe::store {
namespace {

// A running ratio that forgets slowly (a state's rate over the layers, the predictor's accuracy).
class Ratio {
 public:
  explicit Ratio(double prior) : hits_(prior), total_(1) {}
  void Add(double hits, double total) {
    hits_ = hits_ * kKeep + hits;
    total_ = total_ * kKeep + total;
  }
  double value() const { return total_ > 0 ? hits_ / total_ : 0; }

 private:
  static constexpr double kKeep = 0.999;
  double hits_, total_;
};

class NextUsePolicy final : public EvictionPolicy {
 public:
  NextUsePolicy(int32_t num_layers, int32_t num_experts, double alpha)
      : L_(num_layers),
        E_(num_experts),
        keep_(1 - alpha),
        experts_(static_cast<size_t>(num_layers) * num_experts),
        layers_(num_layers) {}
  std::string name() const override { return "next_use"; }

  void BeginVisit(int32_t layer, absl::Span<const int32_t> experts) override {
    if (layer < 0 || layer >= L_) return;
    Layer& ly = layers_[layer];
    const int64_t now = ++ly.visits;
    int64_t predicted = 0;
    for (const int32_t e : experts) {
      if (!Valid(layer, e) || at(layer, e).chosen_in == now) continue;  // listed twice
      Expert& x = at(layer, e);
      x.chosen_in = now;
      predicted += x.predicted_for == now;
    }
    if (ly.predicted_for == now && ly.predicted_size > 0) {
      accuracy_.Add(static_cast<double>(predicted), ly.predicted_size);
    }
    // Each expert's chance to be chosen, kept apart by how many visits ago it was last chosen
    // (routing repeats itself from step to step), for the expert and for the layer.
    double seen[kStates] = {}, hits[kStates] = {};
    for (int32_t e = 0; e < E_; ++e) {
      Expert& x = at(layer, e);
      const int s = State(now - x.last_chosen);
      const bool hit = x.chosen_in == now;
      x.seen[s] = x.seen[s] * keep_ + 1;
      x.chosen[s] = x.chosen[s] * keep_ + hit;
      seen[s] += 1;
      hits[s] += hit;
      if (hit) x.last_chosen = now;
    }
    for (int s = 0; s < kStates; ++s) rate_[s].Add(hits[s], seen[s]);
    current_ = layer;
    ly.dirty = true;
  }

  void OnPredict(int32_t layer, absl::Span<const int32_t> experts) override {
    if (layer < 0 || layer >= L_) return;
    Layer& ly = layers_[layer];
    ly.predicted_for = ly.visits + 1;
    ly.predicted_size = 0;
    for (const int32_t e : experts) {
      if (!Valid(layer, e) || at(layer, e).predicted_for == ly.predicted_for) continue;
      at(layer, e).predicted_for = ly.predicted_for;
      ++ly.predicted_size;
    }
    ly.dirty = true;
  }

  void OnInsert(ExpertId id) override {
    if (!Valid(id.layer, id.expert) || at(id.layer, id.expert).resident) return;
    at(id.layer, id.expert).resident = true;
    Layer& ly = layers_[id.layer];
    if (ly.dirty) return;  // sorted when next needed
    const Candidate c{Probability(id.layer, at(id.layer, id.expert)), id.expert};
    ly.by_probability.insert(
        std::upper_bound(ly.by_probability.begin(), ly.by_probability.end(), c), c);
  }
  void OnAccess(ExpertId) override {}  // BeginVisit learned the visit
  void OnErase(ExpertId id) override {
    if (!Valid(id.layer, id.expert) || !at(id.layer, id.expert).resident) return;
    at(id.layer, id.expert).resident = false;
    Layer& ly = layers_[id.layer];
    if (ly.dirty) return;
    auto it = std::find_if(ly.by_probability.begin(), ly.by_probability.end(),
                           [&](const Candidate& c) { return c.expert == id.expert; });
    if (it != ly.by_probability.end()) ly.by_probability.erase(it);
  }

  std::optional<ExpertId> Victim(const std::function<bool(ExpertId)>& evictable) override {
    std::optional<ExpertId> victim;
    double latest = -1;
    for (int32_t l = 0; l < L_; ++l) {
      Layer& ly = layers_[l];
      if (ly.dirty) Sort(l);
      // The least likely evictable expert of the layer; those of the visit in progress are used
      // now (the ones not yet acquired are not pinned yet).
      for (const Candidate& c : ly.by_probability) {
        if (l == current_ && at(l, c.expert).last_chosen == ly.visits) continue;
        if (!evictable(ExpertId{l, c.expert})) continue;
        const double next_use = ExpectedNextUse(l, c.p);
        if (next_use > latest) {
          latest = next_use;
          victim = ExpertId{l, c.expert};
        }
        break;
      }
    }
    return victim;
  }

  bool Admit(ExpertId incoming, ExpertId victim) override {
    if (!Valid(incoming.layer, incoming.expert) || !Valid(victim.layer, victim.expert)) {
      return true;
    }
    return ExpectedNextUse(incoming.layer, Probability(incoming.layer, at(incoming))) <
           ExpectedNextUse(victim.layer, Probability(victim.layer, at(victim)));
  }

 private:
  // How many visits of evidence the layer-wide rate counts for in an expert's estimate: enough
  // that a few chance picks do not make an expert look likely (flat routing, many experts).
  static constexpr double kPriorWeight = 8;
  // An expert's state at a visit: chosen at the visit before, or not. (Finer states, by visits
  // since chosen, measured no better on the simulator's grid.)
  static constexpr int kStates = 2;
  static constexpr int64_t kNever = int64_t{1} << 40;
  static int State(int64_t visits_since_chosen) { return visits_since_chosen <= 1 ? 0 : 1; }
  static constexpr double kMinProbability = 1e-6;

  struct Expert {
    // Decayed counts of its layer's visits per State, and of those that chose it.
    double seen[kStates] = {};
    double chosen[kStates] = {};
    int64_t chosen_in = -1;      // the visit in progress chose it (BeginVisit's bookkeeping)
    int64_t last_chosen = -kNever;  // the visit of its layer that last chose it
    int64_t predicted_for = -1;  // the visit of its layer it is predicted for
    bool resident = false;
  };
  struct Candidate {
    double p;
    int32_t expert;
    bool operator<(const Candidate& o) const { return p != o.p ? p < o.p : expert < o.expert; }
  };
  struct Layer {
    int64_t visits = 0;
    int64_t predicted_for = -1;
    int64_t predicted_size = 0;
    // Residents by p, least likely first; rebuilt when dirty (p changed: a visit or prediction).
    std::vector<Candidate> by_probability;
    bool dirty = false;
  };

  bool Valid(int32_t layer, int32_t expert) const {
    return layer >= 0 && layer < L_ && expert >= 0 && expert < E_;
  }
  Expert& at(int32_t layer, int32_t expert) {
    return experts_[static_cast<size_t>(layer) * E_ + expert];
  }
  Expert& at(ExpertId id) { return at(id.layer, id.expert); }

  // The chance that the next visit of `layer` chooses the expert: its own rate in the state the
  // latest visit left it in, shrunk towards the layer-wide rate while it has little history.
  double Probability(int32_t layer, const Expert& x) const {
    const Layer& ly = layers_[layer];
    const int s = State(ly.visits + 1 - x.last_chosen);
    double p = (x.chosen[s] + kPriorWeight * rate_[s].value()) / (x.seen[s] + kPriorWeight);
    if (x.predicted_for == ly.visits + 1) p = std::max(p, accuracy_.value());
    return std::clamp(p, kMinProbability, 1.0);
  }
  // In layer visits from now: the first chance, then a pass per expected failure.
  double ExpectedNextUse(int32_t layer, double p) const {
    int32_t d = current_ < 0 ? layer + 1 : (layer - current_ + L_) % L_;
    if (d == 0) d = L_;
    return d + L_ * (1 - p) / p;
  }
  void Sort(int32_t layer) {
    Layer& ly = layers_[layer];
    ly.by_probability.clear();
    for (int32_t e = 0; e < E_; ++e) {
      const Expert& x = at(layer, e);
      if (x.resident) ly.by_probability.push_back({Probability(layer, x), e});
    }
    std::sort(ly.by_probability.begin(), ly.by_probability.end());
    ly.dirty = false;
  }

  const int32_t L_, E_;
  const double keep_;  // per visit, of each expert's counts
  std::vector<Expert> experts_;  // [layer * E_ + expert]
  std::vector<Layer> layers_;
  int32_t current_ = -1;  // the layer visited last
  Ratio rate_[kStates] = {Ratio(0.5), Ratio(0.05)};  // the layers' rates per state
  Ratio accuracy_{0.5};   // of the experts predicted for a visit, the share it chose
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeNextUsePolicy(int32_t num_layers, int32_t num_experts,
                                                  double frequency_alpha) {
  return std::make_unique<NextUsePolicy>(num_layers, num_experts, frequency_alpha);
}

}  // namespace moe::store
