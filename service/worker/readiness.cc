// Readiness: consecutive worker faults -> NOT_SERVING, with the reason.
#include "service/worker/readiness.h"

#include "absl/strings/str_cat.h"

namespace moe::service {

bool Readiness::IsWorkerFault(absl::StatusCode code) {
  return code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInternal ||
         code == absl::StatusCode::kUnknown;
}

void Readiness::SetListener(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void Readiness::RequestEnded(const absl::Status& status) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      consecutive_faults_ = 0;
      return;
    }
    if (!IsWorkerFault(status.code())) return;
    if (++consecutive_faults_ < max_faults_ || !serving_) return;
    reason = absl::StrCat(consecutive_faults_, " requests in a row failed on this worker, the last: ",
                          status.ToString());
  }
  StopServing(std::move(reason));
}

void Readiness::StartDrain() { StopServing("draining"); }

void Readiness::StopServing(std::string reason) {
  Listener listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!serving_) return;
    serving_ = false;
    reason_ = reason;
    listener = listener_;
  }
  if (listener) listener(reason);
}

bool Readiness::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return serving_;
}

std::string Readiness::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

}  // namespace moe::service
