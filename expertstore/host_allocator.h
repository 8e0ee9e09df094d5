// HostAllocator: where the host tier's memory comes from: the backend's host memory
// (Backend::AllocateHost: pinned, cudaHostAlloc, on CUDA, so host->device copies run at PCIe
// speed), or plain 4 KiB-aligned memory. Alignment is 4 KiB because blobs are read into it with
// O_DIRECT.
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

// Memory from backend.AllocateHost (pinned on CUDA, plain touched memory on the CPU backend),
// sizes rounded up to 4 KiB; `backend` must outlive the allocator. ExpertStore::Open uses it when
// given a backend and no allocator.
std::unique_ptr<HostAllocator> MakeBackendHostAllocator(kernels::Backend* backend);

}  // namespace moe::store
