// HostAllocator: where the host tier's memory comes from. Plain 4 KiB-aligned memory today;
// the CUDA backend will provide a pinned (cudaHostAlloc) one so host->device copies run at PCIe
// speed. Alignment is 4 KiB because blobs are read into it with O_DIRECT.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace moe::store {

class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // ResourceExhausted names the size when the memory cannot be had. The Buffer is 4 KiB-aligned.
  virtual absl::StatusOr<kernels::Buffer> Allocate(uint64_t bytes) = 0;
};

std::unique_ptr<HostAllocator> MakeAlignedHostAllocator();

}  // namespace moe::store
