// Router: session affinity, else least outstanding tokens.
#include "service/frontend/router.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe::service {

Router::Router(WorkerSet& workers, size_t max_sessions)
    : workers_(workers), max_sessions_(max_sessions) {}

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
                                                             const std::set<std::string>& exclude) {
  std::string session_target;
  if (!session_id.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = sessions_.find(session_id); it != sessions_.end()) {
      session_target = it->second.first;
    }
  }
  std::shared_ptr<WorkerEndpoint> best;
  int64_t best_load = std::numeric_limits<int64_t>::max();
  int known = 0;
  // Start the scan at a rotating offset so that equally loaded workers take turns.
  const std::vector<std::shared_ptr<WorkerEndpoint>> all = workers_.Snapshot();
  const size_t offset = all.empty() ? 0 : rotation_.fetch_add(1) % all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    const std::shared_ptr<WorkerEndpoint>& w = all[(offset + i) % all.size()];
    if (!w->has_model() || w->model_name() != model) continue;
    ++known;
    if (!w->up() || exclude.count(w->target()) != 0) continue;
    if (w->target() == session_target) return w;
    const int64_t load = w->outstanding_tokens.load();
    if (load < best_load) {
      best = w;
      best_load = load;
    }
  }
  if (best != nullptr) return best;
  if (known == 0) return UnknownModel(model);
  return absl::UnavailableError(absl::StrCat("no worker serving '", model, "' is up (", known,
                                             " known", exclude.empty() ? "" : ", some failed",
                                             ")"));
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
  while (sessions_.size() > max_sessions_) {
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
