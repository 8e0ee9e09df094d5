#include "kernels/base/memory.h"

#include <fstream>
#include <string>

namespace moe::base {

MemoryTotals HostMemory() {
  MemoryTotals m;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);  // " kB"
    if (key == "MemTotal:") m.total_bytes = kib * 1024;
    if (key == "MemAvailable:") m.free_bytes = kib * 1024;
  }
  return m;
}

}  // namespace moe::base
