// AlignedHostAllocator: aligned_alloc at 4 KiB.
#include "expertstore/host_allocator.h"

#include <cstdlib>

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
    return kernels::Buffer(p, bytes, [](void* q) { std::free(q); });
  }
};

}  // namespace

std::unique_ptr<HostAllocator> MakeAlignedHostAllocator() {
  return std::make_unique<AlignedHostAllocator>();
}

}  // namespace moe::store
