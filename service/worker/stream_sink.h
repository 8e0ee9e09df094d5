// StreamSink: where the engine loop delivers one request's events.
#pragma once

#include "engine/engine.h"

namespace moe::service {

class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Called on the engine thread for each of the request's events, in order; the last one has
  // finish != kNone (a request the engine refused gets one kError event carrying the status).
  // Must not block: the whole batch waits.
  virtual void OnEvent(engine::Event event) = 0;
};

}  // namespace moe::service
