// WorkerSet: discovery (static or DNS) and health polling of workers.
#include "service/frontend/worker_set.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/base/clock.h"
#include "kernels/base/log.h"

namespace moe::service {
namespace {

// Worker restarts must be noticed within about a poll period, so reconnect backoff stays short
// (gRPC's default grows to two minutes).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const WorkerChannelOptions& options) {
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(
      target, options.credentials ? options.credentials : grpc::InsecureChannelCredentials(), args);
}

// host:port -> every "ip:port" getaddrinfo gives (IPv6 in brackets). Empty on failure.
std::vector<std::string> ResolveAll(const std::string& host_port) {
  std::vector<std::string> out;
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return out;
  const std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return out;
  std::set<std::string> seen;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof buf);
      seen.insert(absl::StrCat(buf, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf, sizeof buf);
      seen.insert(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(res);
  out.assign(seen.begin(), seen.end());
  return out;
}

}  // namespace

WorkerEndpoint::WorkerEndpoint(std::string target, const WorkerChannelOptions& options)
    : target_(std::move(target)),
      token_(options.token),
      down_after_failed_polls_(std::max(1, options.down_after_failed_polls)),
      channel_(MakeChannel(target_, options)),
      stub_(moe::internal::v1::Worker::NewStub(channel_)) {}

bool WorkerEndpoint::has_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_model_;
}

moe::v1::ModelInfo WorkerEndpoint::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

std::string WorkerEndpoint::model_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_.name();
}

int64_t WorkerEndpoint::restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

void WorkerEndpoint::Authorize(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

void WorkerEndpoint::MarkDown(const std::string& why) {
  if (up_.exchange(false)) {
    MOE_LOG(WARNING) << "[workers] " << target_ << " down: " << why;
  }
}

bool WorkerEndpoint::Update(const grpc::Status& status, const moe::internal::v1::WorkerInfo& info) {
  const bool was_up = up_.load();
  bool now_up = false;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      failed_polls_ = 0;
      if (has_model_ && info.instance_id() != instance_id_) ++restarts_;
      instance_id_ = info.instance_id();
      model_ = info.model();
      has_model_ = true;
      now_up = info.serving();
      why = info.not_serving_reason().empty() ? "not serving"
                                              : "not serving: " + info.not_serving_reason();
    } else {
      ++failed_polls_;
      // One lost poll does not move a worker's traffic away: it stays up until
      // down_after_failed_polls fail in a row. A failed poll never brings a worker up, while one
      // good poll does (above): a worker that answers and says it serves is usable now.
      now_up = was_up && failed_polls_ < down_after_failed_polls_;
      why = absl::StrCat(status.error_message(), " (", failed_polls_, " polls in a row failed)");
      // A worker that never answered would otherwise go unmentioned while clients hear that
      // no worker is up: say so at the first failure and now and then after.
      if (!has_model_ && failed_polls_ % 60 == 1) {
        MOE_LOG(WARNING) << "[workers] " << target_ << " does not answer: " << why;
      }
    }
  }
  up_ = now_up;
  if (was_up != now_up) {
    if (now_up) {
      MOE_LOG(INFO) << "[workers] " << target_ << " up (model '" << info.model().name() << "')";
    } else {
      MOE_LOG(WARNING) << "[workers] " << target_ << " down: " << why;
    }
  }
  return was_up != now_up;
}

absl::Status WorkerSetOptions::Validate() const {
  bool any_static = false;
  for (const std::string& t : static_targets) any_static = any_static || !t.empty();
  if (!any_static && dns_target.empty()) {
    return absl::InvalidArgumentError("workers: give a static list or a DNS name");
  }
  if (!dns_target.empty() && dns_target.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers_dns: '", dns_target, "' must be host:port"));
  }
  if (poll_seconds <= 0 || poll_timeout_seconds <= 0 || dns_refresh_seconds <= 0) {
    return absl::InvalidArgumentError("worker poll and refresh periods must be > 0");
  }
  if (channel.down_after_failed_polls < 1) {
    return absl::InvalidArgumentError("down_after_failed_polls must be >= 1");
  }
  return absl::OkStatus();
}

WorkerSet::WorkerSet(WorkerSetOptions options, Observer observer)
    : options_(std::move(options)), observer_(std::move(observer)) {
  for (const std::string& t : options_.static_targets) {
    if (!t.empty()) workers_[t] = std::make_shared<WorkerEndpoint>(t, options_.channel);
  }
}

WorkerSet::~WorkerSet() { Stop(); }

void WorkerSet::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerSet::Start() {
  // One round before the thread starts, so the frontend begins knowing which workers are up
  // instead of answering its first calls UNAVAILABLE.
  Resolve();
  PollAll();
  thread_ = std::thread([this] { Loop(); });
}

std::vector<std::shared_ptr<WorkerEndpoint>> WorkerSet::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<WorkerEndpoint>> out;
  for (const auto& [target, w] : workers_) out.push_back(w);
  return out;
}

void WorkerSet::Resolve() {
  next_resolve_ = base::NowSeconds() + options_.dns_refresh_seconds;
  if (options_.dns_target.empty()) return;
  const std::vector<std::string> targets = ResolveAll(options_.dns_target);
  if (targets.empty()) {
    // Keep the last answer: a DNS hiccup must not empty the pool.
    MOE_LOG(WARNING) << "[workers] cannot resolve " << options_.dns_target;
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::shared_ptr<WorkerEndpoint>> next;
  for (const auto& [t, w] : workers_) {
    if (std::find(options_.static_targets.begin(), options_.static_targets.end(), t) !=
        options_.static_targets.end()) {
      next[t] = w;
    }
  }
  // Addresses still listed keep their endpoint (channel, health, restart count); only new ones get
  // a fresh one.
  for (const std::string& t : targets) {
    auto it = workers_.find(t);
    if (it == workers_.end()) {
      MOE_LOG(INFO) << "[workers] found " << t;
    }
    next[t] = it != workers_.end() ? it->second
                                   : std::make_shared<WorkerEndpoint>(t, options_.channel);
  }
  for (const auto& [t, w] : workers_) {
    if (next.count(t) == 0) {
      MOE_LOG(INFO) << "[workers] " << t << " left DNS";
    }
  }
  workers_ = std::move(next);
}

void WorkerSet::PollAll() {
  int64_t up = 0, down = 0;
  // On a snapshot, without mu_: a slow or unreachable worker's poll must not hold up the
  // Snapshot calls that route requests.
  for (const std::shared_ptr<WorkerEndpoint>& w : Snapshot()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(options_.poll_timeout_seconds * 1e6)));
    w->Authorize(&ctx);
    moe::internal::v1::WorkerInfo info;
    const grpc::Status status = w->stub().GetInfo(&ctx, moe::internal::v1::GetInfoRequest(), &info);
    w->Update(status, info);
    (w->up() ? up : down) += 1;
  }
  if (observer_) observer_(up, down);
}

void WorkerSet::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto period =
          std::chrono::microseconds(static_cast<int64_t>(options_.poll_seconds * 1e6));
      if (cv_.wait_for(lock, period, [&] { return stop_; })) return;
    }
    if (base::NowSeconds() >= next_resolve_) Resolve();
    PollAll();
  }
}

}  // namespace moe::service
