// MakeBackend: the one place that knows which backends this binary was built with.
#include "kernels/backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#if MOE_WITH_CUDA
#include "kernels/base/status.h"
#include "kernels/cuda/cuda_backend.h"
#endif

namespace moe::kernels {

const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

absl::Status Backend::PagedKvWrite(const PagedKvWriteArgs&) {
  return absl::UnimplementedError(absl::StrCat("the ", BackendKindName(kind()),
                                               " backend has no paged KV cache write yet"));
}

absl::Status Backend::PagedAttention(const PagedAttentionArgs&) {
  return absl::UnimplementedError(absl::StrCat("the ", BackendKindName(kind()),
                                               " backend has no paged KV cache attention yet"));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(BackendKind kind,
                                                     const BackendOptions& options) {
  switch (kind) {
    case BackendKind::kCpu:
      return std::unique_ptr<Backend>(new CpuBackend(options.num_threads));
    case BackendKind::kCuda:
#if MOE_WITH_CUDA
    {
      MOE_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda, CudaBackend::Create(options));
      return std::unique_ptr<Backend>(std::move(cuda));
    }
#else
      return absl::UnimplementedError("this binary was built without CUDA (MOE_WITH_CUDA=OFF)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace moe::kernels
