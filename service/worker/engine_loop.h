// EngineLoop: the one thread that owns an Engine. Other threads hand it adds and cancels
// through a mutex-guarded inbox; it applies them between steps, runs steps while there is work,
// and delivers each step's events to the requests' sinks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "engine/engine.h"
#include "service/worker/stream_sink.h"

namespace moe::service {

class EngineLoop {
 public:
  // Called on the engine thread after every step (and when it goes idle), with the engine's
  // stats and the number of steps run so far. For metrics; must be quick.
  using StepObserver = std::function<void(const engine::EngineStats& stats, int64_t steps)>;

  // `engine` must outlive the loop, and no other thread may touch it. Starts the thread.
  EngineLoop(engine::Engine& engine, StepObserver observer);
  // Cancels what is still live (final kCancelled events) and joins the thread.
  ~EngineLoop();

  // Thread-safe. Queues `request` (its id unique among live ones); `sink` gets every event,
  // including a kError event if Engine::Add refuses it. The loop holds `sink` until then.
  void Add(engine::Request request, std::shared_ptr<StreamSink> sink);
  // Thread-safe. Cancels a live request (final event kCancelled; KV freed at the next step).
  // Unknown or finished ids are ignored.
  void Cancel(const std::string& request_id);
  // Thread-safe. Cancels every live request (the end of a drain).
  void CancelAll();
  // Thread-safe. Runs Engine::DropSession on the engine thread; `done` gets its status there.
  void DropSession(std::string session_id, std::function<void(absl::Status)> done);

  // Thread-safe. Requests added and not yet finished.
  int64_t live() const;
  // Thread-safe. The engine's stats after the last step.
  engine::EngineStats stats() const;

 private:
  struct AddOp {
    engine::Request request;
    std::shared_ptr<StreamSink> sink;
  };
  struct CancelOp {
    std::string id;  // empty: all
  };
  struct DropSessionOp {
    std::string session_id;
    std::function<void(absl::Status)> done;
  };
  using Op = std::variant<AddOp, CancelOp, DropSessionOp>;

  void Run();
  void Apply(Op& op);
  void Deliver(std::vector<engine::Event> events);

  engine::Engine& engine_;
  StepObserver observer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Op> inbox_;      // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  int64_t live_ = 0;           // guarded by mu_
  engine::EngineStats stats_;  // guarded by mu_

  // Engine thread only.
  std::map<std::string, std::shared_ptr<StreamSink>> sinks_;
  int64_t steps_ = 0;
  std::thread thread_;
};

}  // namespace moe::service
