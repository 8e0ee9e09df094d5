// Router: session affinity, else the longest remembered prompt prefix within a load slack, else
// least outstanding tokens.
#include "service/frontend/router.h"

#include <functional>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe::service {
namespace {

// SplitMix64's finalizer: spreads std::hash's bits before they are chained.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// hash_i = H(hash_{i-1}, chunk_i) over the full chunks of `bytes`, at most `max_chunks` (a worker
// remembers no more); `seed` keeps token ids, text and chat apart.
void ChainChunks(uint64_t seed, std::string_view bytes, size_t chunk_bytes, size_t max_chunks,
                 std::vector<uint64_t>* out) {
  uint64_t h = seed;
  for (size_t at = 0; at + chunk_bytes <= bytes.size() && out->size() < max_chunks;
       at += chunk_bytes) {
    h = Mix(h ^ std::hash<std::string_view>{}(bytes.substr(at, chunk_bytes)));
    out->push_back(h);
  }
}

}  // namespace

const char* RouteReasonLabel(RouteReason reason) {
  switch (reason) {
    case RouteReason::kSession:
      return "session";
    case RouteReason::kPrefix:
      return "prefix";
    case RouteReason::kLeastLoad:
      return "least_load";
  }
  return "least_load";
}

absl::Status RouterOptions::Validate() const {
  if (max_sessions < 1) return absl::InvalidArgumentError("max_sessions: must be >= 1");
  if (prefix_entries < 1) return absl::InvalidArgumentError("prefix_entries: must be >= 1");
  if (prefix_chunk_tokens < 1) {
    return absl::InvalidArgumentError("prefix_chunk_tokens: must be >= 1");
  }
  if (prefix_load_slack < 0) return absl::InvalidArgumentError("prefix_load_slack: must be >= 0");
  return absl::OkStatus();
}

Router::Router(WorkerSet& workers, RouterOptions options) : workers_(workers), options_(options) {}

std::vector<uint64_t> Router::PrefixChain(const moe::v1::GenerateRequest& r) const {
  std::vector<uint64_t> chain;
  if (!options_.prefix_routing) return chain;
  const size_t chunk_tokens = static_cast<size_t>(options_.prefix_chunk_tokens);
  const size_t max_chunks = options_.prefix_entries;
  if (r.has_token_ids()) {
    const auto& ids = r.token_ids().ids();
    const std::string_view bytes(reinterpret_cast<const char*>(ids.data()),
                                 ids.size() * sizeof(uint32_t));
    ChainChunks(1, bytes, chunk_tokens * sizeof(uint32_t), max_chunks, &chain);
  } else if (r.has_text()) {
    ChainChunks(2, r.text(), 4 * chunk_tokens, max_chunks, &chain);
  } else if (r.has_chat()) {
    // The worker renders the model's template; equal leading messages render to equal leading
    // text, so hashing the messages themselves finds the same prefixes.
    std::string rendered;
    for (const auto& m : r.chat().messages()) {
      absl::StrAppend(&rendered, m.role(), "\x1f", m.content(), "\x1e");
    }
    ChainChunks(3, rendered, 4 * chunk_tokens, max_chunks, &chain);
  }
  return chain;
}

size_t Router::MatchedChunks(const std::string& target, const std::vector<uint64_t>& prefix) const {
  auto it = prefixes_.find(target);
  if (it == prefixes_.end()) return 0;
  size_t n = 0;
  while (n < prefix.size() && it->second.index.count(prefix[n]) != 0) ++n;
  return n;
}

void Router::Remember(const WorkerEndpoint& worker, const std::vector<uint64_t>& prefix) {
  if (prefix.empty()) return;
  auto [slot, created] = prefixes_.try_emplace(worker.target());
  PrefixMemory& mem = slot->second;
  if (created) mem.restarts = worker.restarts();
  // Deepest chunk first, so that the first chunk ends most recent: eviction then drops the tails
  // of long prompts before the shared heads that every match walks through.
  for (auto h = prefix.rbegin(); h != prefix.rend(); ++h) {
    if (auto it = mem.index.find(*h); it != mem.index.end()) mem.lru.erase(it->second);
    mem.lru.push_front(*h);
    mem.index[*h] = mem.lru.begin();
  }
  while (mem.index.size() > options_.prefix_entries) {
    mem.index.erase(mem.lru.back());
    mem.lru.pop_back();
  }
}

absl::Status Router::UnknownModel(const std::string& model) const {
  std::set<std::string> served;
  bool any_reported = false;
  for (const auto& w : workers_.Snapshot()) {
    if (!w->has_model()) continue;
    any_reported = true;
    served.insert(w->model_name());
  }
  if (!any_reported) {
    return absl::UnavailableError("no worker has answered yet; try again shortly");
  }
  return absl::NotFoundError(absl::StrCat(
      "model '", model, "' is not served (models: ", absl::StrJoin(served, ", "), ")"));
}

absl::StatusOr<ModelLimits> Router::Limits(const std::string& model) const {
  for (const auto& w : workers_.Snapshot()) {
    if (!w->has_model()) continue;
    const moe::v1::ModelInfo info = w->model();
    if (info.name() == model) {
      return ModelLimits{static_cast<int64_t>(info.vocab_size()),
                         static_cast<int64_t>(info.context_length())};
    }
  }
  return UnknownModel(model);
}

absl::StatusOr<std::shared_ptr<WorkerEndpoint>> Router::Pick(const std::string& model,
                                                             const std::string& session_id,
                                                             const std::set<std::string>& exclude,
                                                             const std::vector<uint64_t>& prefix,
                                                             RouteReason* reason) {
  const std::vector<std::shared_ptr<WorkerEndpoint>> all = workers_.Snapshot();
  // Start the scan at a rotating offset so that equally loaded workers take turns.
  const size_t offset = all.empty() ? 0 : rotation_.fetch_add(1) % all.size();
  const bool use_prefix = options_.prefix_routing && !prefix.empty();
  std::lock_guard<std::mutex> lock(mu_);
  std::string session_target;
  if (!session_id.empty()) {
    if (auto it = sessions_.find(session_id); it != sessions_.end()) {
      session_target = it->second.first;
    }
  }
  std::shared_ptr<WorkerEndpoint> least, longest;
  int64_t least_load = std::numeric_limits<int64_t>::max(), longest_load = 0;
  size_t longest_match = 0;
  int known = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::shared_ptr<WorkerEndpoint>& w = all[(offset + i) % all.size()];
    // A restarted worker's cache is empty: forget what it was sent. One that was only down or
    // unreachable for a while (same instance) keeps its cache, and so does the memory.
    if (auto it = prefixes_.find(w->target());
        it != prefixes_.end() && it->second.restarts != w->restarts()) {
      prefixes_.erase(it);
    }
    if (!w->has_model() || w->model_name() != model) continue;
    ++known;
    if (!w->up() || exclude.count(w->target()) != 0) continue;
    if (w->target() == session_target) {
      if (use_prefix) Remember(*w, prefix);
      if (reason != nullptr) *reason = RouteReason::kSession;
      return w;
    }
    const int64_t load = w->outstanding_tokens.load();
    if (load < least_load) {
      least = w;
      least_load = load;
    }
    if (use_prefix) {
      const size_t match = MatchedChunks(w->target(), prefix);
      if (match > longest_match || (match == longest_match && match > 0 && load < longest_load)) {
        longest = w;
        longest_match = match;
        longest_load = load;
      }
    }
  }
  // Workers that left the set (DNS) take their memory with them.
  if (prefixes_.size() > all.size()) {
    std::set<std::string> present;
    for (const auto& w : all) present.insert(w->target());
    for (auto it = prefixes_.begin(); it != prefixes_.end();) {
      it = present.count(it->first) != 0 ? std::next(it) : prefixes_.erase(it);
    }
  }
  if (least == nullptr) {
    if (known == 0) return UnknownModel(model);
    return absl::UnavailableError(absl::StrCat("no worker serving '", model, "' is up (", known,
                                               " known", exclude.empty() ? "" : ", some failed",
                                               ")"));
  }
  std::shared_ptr<WorkerEndpoint> chosen = least;
  RouteReason why = RouteReason::kLeastLoad;
  // The longest prefix wins unless its worker has more than the slack over the least loaded.
  if (longest != nullptr && longest_load - least_load <= options_.prefix_load_slack) {
    chosen = longest;
    why = RouteReason::kPrefix;
  }
  if (use_prefix) Remember(*chosen, prefix);
  if (reason != nullptr) *reason = why;
  return chosen;
}

void Router::Bind(const std::string& session_id, const std::string& target) {
  if (session_id.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sessions_.find(session_id); it != sessions_.end()) {
    lru_.erase(it->second.second);
    sessions_.erase(it);
  }
  lru_.push_front(session_id);
  sessions_[session_id] = {target, lru_.begin()};
  while (sessions_.size() > options_.max_sessions) {
    sessions_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::shared_ptr<WorkerEndpoint> Router::SessionWorker(const std::string& session_id) {
  std::string target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return nullptr;
    target = it->second.first;
  }
  for (const auto& w : workers_.Snapshot()) {
    if (w->target() == target) return w;
  }
  return nullptr;
}

void Router::Unbind(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sessions_.find(session_id); it != sessions_.end()) {
    lru_.erase(it->second.second);
    sessions_.erase(it);
  }
}

}  // namespace moe::service
