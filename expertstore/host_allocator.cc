// AlignedHostAllocator: aligned_alloc at 4 KiB.
#include "expertstore/host_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "expertstore/blob_format.h"
#include "kernels/base/bytes.h"
#include "kernels/base/status.h"

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

class BackendHostAllocator final : public HostAllocator {
 public:
  explicit BackendHostAllocator(kernels::Backend* backend) : backend_(backend) {}
  absl::StatusOr<kernels::Buffer> Allocate(uint64_t bytes) override {
    MOE_ASSIGN_OR_RETURN(kernels::Buffer buffer,
                         backend_->AllocateHost(AlignUp(bytes, kBlobAlignment)));
    if (reinterpret_cast<uintptr_t>(buffer.data()) % kBlobAlignment != 0) {
      return absl::InternalError(absl::StrCat(
          "host memory: ", kernels::BackendKindName(backend_->kind()),
          " backend returned memory not aligned to ", kBlobAlignment, " bytes"));
    }
    return buffer;
  }

 private:
  kernels::Backend* backend_;
};

}  // namespace

std::unique_ptr<HostAllocator> MakeBackendHostAllocator(kernels::Backend* backend) {
  return std::make_unique<BackendHostAllocator>(backend);
}

std::unique_ptr<HostAllocator> MakeAlignedHostAllocator() {
  return std::make_unique<AlignedHostAllocator>();
}

}  // namespace moe::store
