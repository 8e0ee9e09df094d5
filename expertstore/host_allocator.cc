// AlignedHostAllocator: aligned_alloc at 4 KiB.
#include "expertstore/host_allocator.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "expertstore/blob_format.h"
#include "kernels/base/bytes.h"

namespace moe::store {
namespace {

class AlignedHostAllocator final : public HostAllocator {
 public:
  absl::StatusOr<kernels::Buffer> Allocate(uint64_t bytes) override {
    const uint64_t rounded = AlignUp(bytes, kBlobAlignment);
    void* p = rounded == 0 ? nullptr : std::aligned_alloc(kBlobAlignment, rounded);
    if (p == nullptr && rounded != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: cannot allocate ", base::FormatBytes(bytes)));
    }
    // Touch every page now: the tier is a fixed, resident budget (as pinned memory will be), and
    // first-touch faults during O_DIRECT reads halved cold-load throughput (tests/bench/NOTES.md).
    if (p != nullptr) std::memset(p, 0, rounded);
    return kernels::Buffer(p, bytes, [](void* q) { std::free(q); });
  }
};

}  // namespace

std::unique_ptr<HostAllocator> MakeAlignedHostAllocator() {
  return std::make_unique<AlignedHostAllocator>();
}

}  // namespace moe::store
