// MakeBackend: the one place that knows which backends this binary was built with.
#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(BackendKind kind,
                                                     const BackendOptions& options) {
  switch (kind) {
    case BackendKind::kCpu:
      return std::unique_ptr<Backend>(new CpuBackend(options.num_threads));
    case BackendKind::kCuda:
#if MOE_WITH_CUDA
      return absl::UnimplementedError("the CUDA backend's forward pass is not built yet");
#else
      return absl::UnimplementedError("this binary was built without CUDA (MOE_WITH_CUDA=OFF)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace moe::kernels
