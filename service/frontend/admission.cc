// Admission: slots and a bounded FIFO.
#include "service/frontend/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace moe::service {

absl::Status AdmissionOptions::Validate() const {
  if (max_running <= 0) return absl::InvalidArgumentError("max_running must be > 0");
  if (max_queued < 0) return absl::InvalidArgumentError("max_queued must be >= 0");
  return absl::OkStatus();
}

Admission::Admission(AdmissionOptions options, Observer observer)
    : options_(options), observer_(std::move(observer)) {}

void Admission::Notify(int64_t running, int64_t queued) {
  if (observer_) observer_(running, queued);
}

absl::StatusOr<uint64_t> Admission::Enter(Start start) {
  uint64_t ticket = 0;
  int64_t running = 0, queued = 0;
  bool run_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::UnavailableError("the frontend is draining");
    ticket = next_ticket_++;
    if (running_ < options_.max_running) {
      ++running_;
      run_now = true;
    } else if (static_cast<int64_t>(queue_.size()) < options_.max_queued) {
      queue_.push_back({ticket, std::move(start)});
    } else {
      return absl::ResourceExhaustedError(
          absl::StrCat("the admission queue is full (", options_.max_running, " running, ",
                       options_.max_queued, " queued); retry later"));
    }
    running = running_;
    queued = static_cast<int64_t>(queue_.size());
  }
  // Outside mu_: start begins the worker call, which may end at once and call Leave.
  Notify(running, queued);
  if (run_now) start();
  return ticket;
}

void Admission::Leave() {
  Start next;
  int64_t running = 0, queued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty()) {
      // The slot passes straight to it, running_ unchanged: a call arriving between this Leave
      // and next() cannot take the slot and jump the FIFO.
      next = std::move(queue_.front().start);
      queue_.pop_front();
    } else {
      --running_;
    }
    running = running_;
    queued = static_cast<int64_t>(queue_.size());
  }
  Notify(running, queued);
  if (next) next();
}

bool Admission::Withdraw(uint64_t ticket) {
  int64_t running = 0, queued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = queue_.begin();
    while (it != queue_.end() && it->ticket != ticket) ++it;
    if (it == queue_.end()) return false;
    queue_.erase(it);
    running = running_;
    queued = static_cast<int64_t>(queue_.size());
  }
  Notify(running, queued);
  return true;
}

void Admission::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

int64_t Admission::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

int64_t Admission::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace moe::service
