// EngineLoop: inbox -> Engine::Add/Cancel -> Engine::Step -> sinks.
#include "service/worker/engine_loop.h"

#include <utility>

namespace moe::service {

EngineLoop::EngineLoop(engine::Engine& engine, StepObserver observer)
    : engine_(engine), observer_(std::move(observer)), stats_(engine.Stats()) {
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void EngineLoop::Add(engine::Request request, std::shared_ptr<StreamSink> sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_;
    inbox_.push_back(AddOp{std::move(request), std::move(sink)});
  }
  cv_.notify_one();
}

void EngineLoop::Cancel(const std::string& request_id) {
  if (request_id.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(CancelOp{request_id});
  }
  cv_.notify_one();
}

void EngineLoop::CancelAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(CancelOp{});
  }
  cv_.notify_one();
}

void EngineLoop::DropSession(std::string session_id, std::function<void(absl::Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(DropSessionOp{std::move(session_id), std::move(done)});
  }
  cv_.notify_one();
}

int64_t EngineLoop::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

engine::EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::Apply(Op& op) {
  if (auto* add = std::get_if<AddOp>(&op)) {
    const std::string id = add->request.id;
    if (absl::Status st = engine_.Add(std::move(add->request)); !st.ok()) {
      engine::Event e;
      e.request_id = id;
      e.finish = engine::FinishReason::kError;
      e.error = std::move(st);
      // Registered even when refused, so that Deliver finds the sink, tells it why and counts it
      // finished (Add counted it live).
      std::vector<engine::Event> events;
      events.push_back(std::move(e));
      sinks_[id] = std::move(add->sink);
      Deliver(std::move(events));
      return;
    }
    sinks_[id] = std::move(add->sink);
    return;
  }
  if (auto* drop = std::get_if<DropSessionOp>(&op)) {
    const absl::Status status = engine_.DropSession(drop->session_id);
    // Gauges before the answer: a caller that sees OK also sees the KV freed.
    const engine::EngineStats stats = engine_.Stats();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
    }
    if (observer_) observer_(stats, steps_);
    drop->done(status);
    return;
  }
  const std::string& id = std::get<CancelOp>(op).id;
  if (!id.empty()) {
    if (sinks_.count(id) != 0) engine_.Cancel(id);
    return;
  }
  for (const auto& [live_id, sink] : sinks_) engine_.Cancel(live_id);
}

void EngineLoop::Deliver(std::vector<engine::Event> events) {
  int64_t finished = 0;
  for (engine::Event& e : events) {
    auto it = sinks_.find(e.request_id);
    if (it == sinks_.end()) continue;  // MOE_CHECK-worthy? The engine only reports ids we added.
    const bool last = e.finish != engine::FinishReason::kNone;
    std::shared_ptr<StreamSink> sink = last ? std::move(it->second) : it->second;
    if (last) {
      sinks_.erase(it);
      ++finished;
    }
    sink->OnEvent(std::move(e));
  }
  if (finished > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= finished;
  }
}

void EngineLoop::Run() {
  bool idle_reported = false;
  for (;;) {
    std::vector<Op> ops;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // HasWork() is read on this thread only; the others just wake us.
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || engine_.HasWork(); });
      if (stop_) break;
      ops.swap(inbox_);
    }
    // Applied on this thread, between steps and without mu_: only this thread touches the Engine,
    // and a gRPC thread calling Add or Cancel never waits for a step.
    for (Op& op : ops) Apply(op);
    if (!engine_.HasWork()) {
      if (!idle_reported) {
        const engine::EngineStats stats = engine_.Stats();
        {
          std::lock_guard<std::mutex> lock(mu_);
          stats_ = stats;
        }
        if (observer_) observer_(stats, steps_);
        idle_reported = true;
      }
      continue;
    }
    idle_reported = false;
    std::vector<engine::Event> events = engine_.Step();
    ++steps_;
    const engine::EngineStats stats = engine_.Stats();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
    }
    // Gauges first: a client that sees its final message also sees its KV freed.
    if (observer_) observer_(stats, steps_);
    Deliver(std::move(events));
  }
  // Shutting down: finish what is live so every sink hears its end, then report the empty engine.
  for (const auto& [id, sink] : sinks_) engine_.Cancel(id);
  while (engine_.HasWork()) Deliver(engine_.Step());
  if (observer_) observer_(engine_.Stats(), steps_);
}

}  // namespace moe::service
