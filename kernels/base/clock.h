// Monotonic time in the units our metrics and CLIs print.
#pragma once

#include <chrono>
#include <cstdint>

namespace moe::base {

inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double NowSeconds() { return static_cast<double>(NowMicros()) * 1e-6; }

}  // namespace moe::base
