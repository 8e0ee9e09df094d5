// Free and total memory, for budgets sized from the machine ("auto").
#pragma once

#include <cstdint>

namespace moe::base {

struct MemoryTotals {
  uint64_t free_bytes = 0;   // what can be allocated now (Linux: MemAvailable)
  uint64_t total_bytes = 0;
};

// The host's RAM from /proc/meminfo (zeros where it cannot be read).
MemoryTotals HostMemory();

}  // namespace moe::base
