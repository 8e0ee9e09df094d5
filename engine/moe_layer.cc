#include "engine/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/clock.h"
#include "kernels/base/status.h"

namespace moe::engine {
namespace {

absl::Status Alloc(kernels::Backend& b, kernels::Buffer* buf, size_t bytes) {
  MOE_ASSIGN_OR_RETURN(*buf, b.Allocate(bytes));
  return absl::OkStatus();
}

// One launch of ExpertFfnRouted serves experts only when they share shapes and format.
bool SameLayout(const kernels::ExpertWeights& a, const kernels::ExpertWeights& b) {
  auto same = [](const kernels::TensorView& x, const kernels::TensorView& y) {
    return x.dtype == y.dtype && x.group_size == y.group_size && x.rank == y.rank &&
           x.dim(0) == y.dim(0) && x.dim(1) == y.dim(1);
  };
  return same(a.gate, b.gate) && same(a.up, b.up) && same(a.down, b.down);
}

// The [3][E] gate, up, down data pointers of `views` (null where an expert is absent).
std::vector<const void*> PointerTable(absl::Span<const kernels::ExpertWeights> views) {
  const size_t E = views.size();
  std::vector<const void*> ptrs(3 * E, nullptr);
  for (size_t e = 0; e < E; ++e) {
    ptrs[e] = views[e].gate.data;
    ptrs[E + e] = views[e].up.data;
    ptrs[2 * E + e] = views[e].down.data;
  }
  return ptrs;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::Create(
    const ModelConfig& config, const ModelWeights& weights, kernels::Backend& backend,
    std::unique_ptr<store::ExpertProvider> experts, store::ExpertStore* store) {
  auto moe = std::unique_ptr<MoeLayer>(new MoeLayer(config, weights, backend));
  moe->experts_ = std::move(experts);
  moe->store_ = store;
  MOE_RETURN_IF_ERROR(moe->MakeResidentTables());
  if (store != nullptr) {
    const int64_t n = config.num_hidden_layers * config.num_experts;
    moe->readable_.resize(config.num_hidden_layers);
    MOE_RETURN_IF_ERROR(Alloc(backend, &moe->readable_tables_, 3 * n * sizeof(void*)));
    MOE_RETURN_IF_ERROR(Alloc(backend, &moe->readable_in_host_, n));
  }
  return moe;
}

absl::Status MoeLayer::MakeResidentTables() {
  resident_.resize(config_.num_hidden_layers);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    ResidentLayer& r = resident_[l];
    r.views = experts_->ResidentLayer(static_cast<int32_t>(l));
    const size_t E = r.views.size();
    // One launch serves all of them: every expert in the first one's format.
    bool usable = E > 0 && static_cast<int64_t>(E) == config_.num_experts;
    for (size_t e = 0; usable && e < E; ++e) usable = SameLayout(r.views[e], r.views[0]);
    if (!usable) {
      r.views.clear();
      continue;
    }
    const std::vector<const void*> ptrs = PointerTable(r.views);
    MOE_RETURN_IF_ERROR(Alloc(backend_, &r.pointers, ptrs.size() * sizeof(void*)));
    backend_.CopyToDevice(r.pointers.data(), ptrs.data(), ptrs.size() * sizeof(void*));
    const auto* dev = static_cast<const void* const*>(r.pointers.data());
    r.table = {r.views.data(), dev, dev + E, dev + 2 * E, static_cast<int>(E)};
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::Reserve(int64_t T) {
  if (T <= scratch_tokens_) return absl::OkStatus();
  const ModelConfig& c = config_;
  const size_t f = sizeof(float);
  const int64_t K = std::max<int64_t>(c.num_experts_per_tok, 1);
  MOE_RETURN_IF_ERROR(Alloc(backend_, &router_logits_, T * c.num_experts * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &gate_, T * f));
  const size_t pairs_bytes = T * K * (sizeof(float) + sizeof(int32_t));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &route_, pairs_bytes));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &plan_, pairs_bytes));
  if (store_ != nullptr) {
    // Each layer's routed ids of the step: T K of them, at least E.
    step_ids_stride_ = std::max(c.num_experts, T * K);
    const size_t ids_bytes = c.num_hidden_layers * step_ids_stride_ * sizeof(int32_t);
    MOE_RETURN_IF_ERROR(Alloc(backend_, &step_ids_, ids_bytes));
    MOE_ASSIGN_OR_RETURN(step_ids_host_, backend_.AllocateHost(ids_bytes));
    MOE_RETURN_IF_ERROR(Alloc(backend_, &pinned_table_, 3 * c.num_experts * sizeof(void*)));
    MOE_ASSIGN_OR_RETURN(routed_host_, backend_.AllocateHost(pairs_bytes));
  }
  scratch_tokens_ = T;
  return absl::OkStatus();
}

void MoeLayer::BeginStep() {
  for (ReadableLayer& p : readable_) p.routed = 0;  // a failed step's ids were not copied
  ++trace_step_;  // before any layer: a step that fails half-way keeps its number
}

int64_t MoeLayer::Clock() {
  if (exact_timings_) backend_.Synchronize();
  return base::NowMicros();
}

MoeLayer::Path MoeLayer::ChoosePath(int64_t layer) {
  // A trace records the experts in the order the host acquires them: only the host path has one.
  if (trace_ != nullptr) return Path::kHostRouted;
  if (resident_[layer].table.num_experts > 0) return Path::kResident;
  if (store_ != nullptr && PrepareReadable(layer)) return Path::kReadable;
  return Path::kHostRouted;
}

void MoeLayer::DenseMlp(const kernels::ExpertWeights& mlp, float* out, const float* x, int64_t T,
                        const float* row_weights) {
  std::vector<int32_t> rows(T);
  std::iota(rows.begin(), rows.end(), 0);
  backend_.CopyToDevice(plan_.data(), rows.data(), T * sizeof(int32_t));
  const kernels::ExpertWork work{&mlp, 0, T};
  kernels::ExpertFfnArgs args;
  args.out = out;
  args.x = x;
  args.num_tokens = T;
  args.hidden_size = config_.hidden_size;
  args.experts = absl::MakeConstSpan(&work, 1);
  args.rows = static_cast<const int32_t*>(plan_.data());
  args.row_weights = row_weights;
  backend_.Zero(out, T * config_.hidden_size * sizeof(float));
  backend_.ExpertFfn(args);
}

absl::Status MoeLayer::Run(int64_t layer, int64_t T, const float* h, float* out,
                           PhaseTimes& times) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[layer];
  const int64_t K = c.num_experts_per_tok;
  const int64_t t0 = Clock();

  // Shared expert first (qwen2_moe): out = sigmoid(x . g) * SharedMlp(x); it also zeroes out.
  if (c.arch.has_shared_expert) {
    backend_.MatMul(gate_.f32(), h, T, L.shared_expert_gate.view, nullptr);
    backend_.Sigmoid(gate_.f32(), T);
    DenseMlp(L.mlp, out, h, T, gate_.f32());
  } else {
    backend_.Zero(out, T * c.hidden_size * sizeof(float));
  }

  const Path path = ChoosePath(layer);
  // kReadable's ids go where the step's end copies them from.
  const kernels::RouteArgs route = RouteTokens(
      layer, T, h,
      path == Path::kReadable ? static_cast<int32_t*>(step_ids_.data()) + layer * step_ids_stride_
                              : RouteIds(T));
  if (path == Path::kHostRouted) return RunHostRouted(layer, route, T, h, out, t0, times);

  times.routing_us += Clock() - t0;
  const int64_t c0 = Clock();
  if (path == Path::kResident) {
    RunRouted(resident_[layer].table, route, T, h, out);
  } else {
    const int64_t E = c.num_experts;
    const auto* dev = static_cast<const void* const*>(readable_tables_.data()) + layer * 3 * E;
    ReadableLayer& p = readable_[layer];
    const kernels::ResidentExperts table{
        p.readable.views.data(), dev, dev + E, dev + 2 * E, static_cast<int>(E),
        p.any_in_host ? static_cast<const uint8_t*>(readable_in_host_.data()) + layer * E
                      : nullptr};
    RunRouted(table, route, T, h, out);
    p.routed = T * K;
  }
  times.expert_compute_us += Clock() - c0;
  return absl::OkStatus();
}

kernels::RouteArgs MoeLayer::RouteTokens(int64_t layer, int64_t T, const float* h, int32_t* ids) {
  backend_.MatMul(router_logits_.f32(), h, T, weights_.layers[layer].router.view, nullptr);
  kernels::RouteArgs route;  // [T, E] -> top-k weights and ids [T, K]
  route.logits = router_logits_.f32();
  route.num_tokens = T;
  route.num_experts = static_cast<int>(config_.num_experts);
  route.top_k = static_cast<int>(config_.num_experts_per_tok);
  route.renormalize = config_.norm_topk_prob;
  if (config_.arch.sigmoid_routing) {  // LFM2 (architectures.md §3.3)
    route.scoring = kernels::RouteScoring::kSigmoid;
    route.selection_bias = static_cast<const float*>(weights_.layers[layer].expert_bias.view.data);
    route.renormalize_eps = 1e-6f;
    route.scaling = static_cast<float>(config_.routed_scaling_factor);
  }
  route.layer = static_cast<int32_t>(layer);
  route.weights = RouteWeights();
  route.expert_ids = ids;
  backend_.Route(route);
  return route;
}

void MoeLayer::RunRouted(const kernels::ResidentExperts& table, const kernels::RouteArgs& route,
                         int64_t T, const float* h, float* out) {
  kernels::ExpertFfnRoutedArgs r;
  r.out = out;
  r.x = h;
  r.num_tokens = T;
  r.hidden_size = config_.hidden_size;
  r.top_k = route.top_k;
  r.experts = &table;
  r.expert_ids = route.expert_ids;
  r.weights = route.weights;
  r.layer = route.layer;
  backend_.ExpertFfnRouted(r);
}

// The one host synchronisation per layer: the store must know which experts to make resident.
// With a store, the routing's copy is queued first and the experts resident now run behind it,
// reading the routing where Route left it: the GPU computes while the host waits for the copy
// and loads what missed.
absl::Status MoeLayer::RunHostRouted(int64_t layer, const kernels::RouteArgs& route, int64_t T,
                                     const float* h, float* out, int64_t t0, PhaseTimes& times) {
  const ModelConfig& c = config_;
  const int64_t K = c.num_experts_per_tok;
  // Route's output as route_ holds it: weights [T, K], then ids [T, K].
  std::vector<uint8_t> routed(T * K * (sizeof(float) + sizeof(int32_t)));
  std::vector<bool> ran(c.num_experts, false);
  std::vector<store::ExpertHandle> pinned;
  if (store_ != nullptr && trace_ == nullptr) {
    backend_.CopyToHostQueued(routed_host_.data(), route_.data(), routed.size());
    const int64_t c0 = Clock();
    pinned = store_->PinDeviceResident(static_cast<int32_t>(layer),
                                       static_cast<int32_t>(c.num_experts));
    if (RunPinnedRouted(route, pinned, T, h, out)) {
      for (const store::ExpertHandle& handle : pinned) ran[handle.expert] = true;
    }
    const int64_t spent = Clock() - c0;
    times.expert_compute_us += spent;
    t0 += spent;  // not routing
    backend_.WaitForHostCopies();
    std::memcpy(routed.data(), routed_host_.data(), routed.size());
  } else {
    backend_.CopyToHost(routed.data(), route_.data(), routed.size());
  }
  std::vector<float> weights(T * K);
  std::vector<int32_t> ids(T * K);
  std::memcpy(weights.data(), routed.data(), T * K * sizeof(float));
  std::memcpy(ids.data(), routed.data() + T * K * sizeof(float), T * K * sizeof(int32_t));
  for (int64_t i = 0; i < T * K; ++i) {  // the store and the plan index by them
    if (ids[i] < 0 || ids[i] >= c.num_experts) {
      return absl::InternalError(absl::StrCat("layer ", layer, ": the router chose expert ",
                                              ids[i], " of ", c.num_experts, " for token ", i / K));
    }
  }

  // Group the routed (token, weight) rows by expert, experts in ascending id.
  std::map<int32_t, std::vector<int64_t>> by_expert;
  for (int64_t i = 0; i < T * K; ++i) by_expert[ids[i]].push_back(i);
  std::vector<int32_t> needed;  // every expert the step uses: Acquire counts and touches them all
  std::vector<int32_t> rows;
  std::vector<float> row_weights;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // per needed expert: [begin, count)
  for (const auto& [expert, slots] : by_expert) {
    needed.push_back(expert);
    ranges.emplace_back(static_cast<int64_t>(rows.size()), static_cast<int64_t>(slots.size()));
    for (int64_t s : slots) {
      rows.push_back(static_cast<int32_t>(s / K));
      row_weights.push_back(weights[s]);
    }
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  const bool all_ran = std::all_of(needed.begin(), needed.end(), [&](int32_t e) { return ran[e]; });
  if (!all_ran) {  // the plan of the experts still to run (all when none ran yet)
    std::vector<uint8_t> plan(R * (sizeof(int32_t) + sizeof(float)));  // rows, then weights
    std::memcpy(plan.data(), rows.data(), R * sizeof(int32_t));
    std::memcpy(plan.data() + R * sizeof(int32_t), row_weights.data(), R * sizeof(float));
    backend_.CopyToDevice(plan_.data(), plan.data(), plan.size());
  }
  times.routing_us += Clock() - t0;

  if (trace_ != nullptr) trace_->Append(trace_step_, static_cast<int32_t>(layer), needed);

  MOE_ASSIGN_OR_RETURN(std::vector<store::ExpertHandle> handles,
                       experts_->Acquire(static_cast<int32_t>(layer), needed));
  pinned.clear();  // the handles hold what is used now
  // After Acquire, so this layer's experts are pinned and cannot be the prefetch's victims.
  if (prefetch_next_layer_ && store_ != nullptr) PrefetchNextLayer(layer, T, h, times);
  kernels::ExpertFfnArgs args;
  args.out = out;
  args.x = h;
  args.num_tokens = T;
  args.hidden_size = c.hidden_size;
  args.rows = static_cast<const int32_t*>(plan_.data());
  args.row_weights = reinterpret_cast<const float*>(static_cast<const uint8_t*>(plan_.data()) +
                                                    R * sizeof(int32_t));
  // Resident experts run first; then each miss as its load completes. The order of the sum over
  // experts therefore follows residency: results may differ between budgets in the last bits.
  std::vector<size_t> ready, pending;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (ran[handles[i].expert]) continue;
    const bool done = handles[i].ready.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    (done ? ready : pending).push_back(i);
  }
  auto run = [&](absl::Span<const size_t> which) -> absl::Status {
    std::vector<kernels::ExpertWork> work;
    for (size_t i : which) {
      MOE_RETURN_IF_ERROR(handles[i].ready.get());
      work.push_back({handles[i].weights.get(), ranges[i].first, ranges[i].second});
    }
    args.experts = work;
    const int64_t c0 = Clock();
    backend_.ExpertFfn(args);
    times.expert_compute_us += Clock() - c0;
    return absl::OkStatus();
  };
  MOE_RETURN_IF_ERROR(run(ready));
  for (size_t i : pending) {
    const int64_t w0 = Clock();
    handles[i].ready.wait();
    times.expert_wait_us += Clock() - w0;
    MOE_RETURN_IF_ERROR(run(absl::MakeConstSpan(&i, 1)));
  }
  return absl::OkStatus();
}

float* MoeLayer::RouteWeights() { return static_cast<float*>(route_.data()); }

int32_t* MoeLayer::RouteIds(int64_t T) {
  return reinterpret_cast<int32_t*>(static_cast<uint8_t*>(route_.data()) +
                                    T * config_.num_experts_per_tok * sizeof(float));
}

bool MoeLayer::RunPinnedRouted(const kernels::RouteArgs& route,
                               absl::Span<const store::ExpertHandle> pinned, int64_t T,
                               const float* h, float* out) {
  if (pinned.empty()) return false;
  const int64_t E = config_.num_experts;
  pinned_views_.assign(E, kernels::ExpertWeights{});
  for (const store::ExpertHandle& handle : pinned) {
    if (!SameLayout(*handle.weights, *pinned[0].weights)) return false;
    pinned_views_[handle.expert] = *handle.weights;
  }
  const std::vector<const void*> ptrs = PointerTable(pinned_views_);
  // In stream order: the previous layer's launch has read its table before this copy lands.
  backend_.CopyToDevice(pinned_table_.data(), ptrs.data(), ptrs.size() * sizeof(void*));
  const auto* dev = static_cast<const void* const*>(pinned_table_.data());
  const kernels::ResidentExperts table{pinned_views_.data(), dev, dev + E, dev + 2 * E,
                                       static_cast<int>(E)};
  RunRouted(table, route, T, h, out);
  return true;
}

bool MoeLayer::PrepareReadable(int64_t layer) {
  const int64_t E = config_.num_experts;
  ReadableLayer& p = readable_[layer];
  const auto l = static_cast<int32_t>(layer);
  if (!p.readable.views.empty() && p.readable.version == store_->ReadableVersion(l)) return true;
  // The pins of the old set go once the new one holds its own: an expert in both stays put.
  p.readable = store_->PinReadable(l, static_cast<int32_t>(E));
  bool usable = p.readable.complete();
  for (int64_t e = 0; usable && e < E; ++e) usable = SameLayout(p.readable.views[e], p.readable.views[0]);
  if (!usable) {
    p.readable = {};
    return false;
  }
  std::vector<const void*> ptrs = PointerTable(p.readable.views);
  if (ptrs != p.table) {  // in stream order: the kernels that read the old table come first
    backend_.CopyToDevice(static_cast<const void**>(readable_tables_.data()) + layer * 3 * E,
                          ptrs.data(), ptrs.size() * sizeof(void*));
    const std::vector<uint8_t> in_host(p.readable.in_host.begin(), p.readable.in_host.end());
    backend_.CopyToDevice(static_cast<uint8_t*>(readable_in_host_.data()) + layer * E,
                          in_host.data(), E);
    p.table = std::move(ptrs);
    p.any_in_host = std::find(in_host.begin(), in_host.end(), 1) != in_host.end();
  }
  return true;
}

void MoeLayer::QueueStepUse() {
  const bool used = std::any_of(readable_.begin(), readable_.end(),
                                [](const ReadableLayer& p) { return p.routed > 0; });
  if (used) backend_.CopyToHostQueued(step_ids_host_.data(), step_ids_.data(), step_ids_.bytes());
}

void MoeLayer::ReportStepUse(PhaseTimes& times) {
  const bool used = std::any_of(readable_.begin(), readable_.end(),
                                [](const ReadableLayer& p) { return p.routed > 0; });
  if (!used) return;
  const int64_t t0 = Clock();
  backend_.WaitForHostCopies();  // the layers are done; the GPU runs the lm head meanwhile
  const int64_t E = config_.num_experts;
  for (size_t l = 0; l < readable_.size(); ++l) {
    ReadableLayer& p = readable_[l];
    if (p.routed == 0) continue;
    const int32_t* ids = static_cast<const int32_t*>(step_ids_host_.data()) + l * step_ids_stride_;
    std::vector<int32_t> used_ids(ids, ids + p.routed);
    std::sort(used_ids.begin(), used_ids.end());
    used_ids.erase(std::unique(used_ids.begin(), used_ids.end()), used_ids.end());
    std::vector<int32_t> from_host;
    for (const int32_t e : used_ids) {
      if (e >= 0 && e < E && p.readable.in_host[e]) from_host.push_back(e);
    }
    store_->Use(static_cast<int32_t>(l), used_ids, from_host);
    p.routed = 0;
  }
  times.routing_us += Clock() - t0;
}

// The next layer's router on this layer's h (post-attention norm) guesses which experts it will
// need: the residual stream changes little from one layer to the next. Scratch used here (router
// logits, route ids/weights) is free again once RunHostRouted copied this layer's routing.
void MoeLayer::PrefetchNextLayer(int64_t layer, int64_t T, const float* h, PhaseTimes& times) {
  const int64_t next = layer + 1;
  if (next >= config_.num_hidden_layers || !weights_.layers[next].sparse) return;
  const int64_t t0 = Clock();
  const int64_t K = config_.num_experts_per_tok;
  const kernels::RouteArgs route = RouteTokens(next, T, h, RouteIds(T));
  std::vector<int32_t> ids(T * K);
  backend_.CopyToHost(ids.data(), route.expert_ids, ids.size() * sizeof(int32_t));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  // Recorded, so that the simulator replays what the policy was told (OnPredict).
  if (trace_ != nullptr) trace_->AppendPrediction(trace_step_, static_cast<int32_t>(next), ids);
  store_->Prefetch(static_cast<int32_t>(next), ids);
  times.prefetch_us += Clock() - t0;
}

}  // namespace moe::engine
