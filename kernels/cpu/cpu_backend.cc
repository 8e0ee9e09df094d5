// CpuBackend: memory is the heap; copies are memcpy. The ops are in the file of their family.
#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/base/bytes.h"

namespace moe::kernels {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

absl::StatusOr<Buffer> CpuBackend::Allocate(size_t bytes) {
  // 64-byte alignment for vector loads; aligned_alloc wants a multiple of the alignment.
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
  if (p == nullptr && rounded != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu backend: cannot allocate ", base::FormatBytes(bytes)));
  }
  return Buffer(p, bytes, [](void* q) { std::free(q); });
}

absl::StatusOr<Buffer> CpuBackend::AllocateHost(size_t bytes) {
  constexpr size_t kAlign = 4096;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(kAlign, rounded);
  if (p == nullptr && rounded != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: cannot allocate ", base::FormatBytes(bytes)));
  }
  // Touch every page now: a staging tier is a fixed, resident budget (as pinned memory is), and
  // first-touch faults during O_DIRECT reads halved cold-load throughput (tests/bench/NOTES.md).
  if (p != nullptr) std::memset(p, 0, rounded);
  return Buffer(p, bytes, [](void* q) { std::free(q); });
}

absl::StatusOr<DeviceTensor> CpuBackend::Upload(const TensorView& host) {
  DeviceTensor t;
  t.view = host;  // host memory is where this backend computes: no copy
  return t;
}

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

void CpuBackend::Zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }

}  // namespace moe::kernels
