// Element-wise ops on the GPU: Embed (gather), Add, SplitColumns, Sigmoid and the SwiGLU product.
// Their CPU twins are in cpu/activation.cc (Embed, Add, SplitColumns, Sigmoid) and
// cpu/expert_ffn.cc (SwiGLU).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned GridFor(int64_t n, int num_sms) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(CeilDiv(n, kThreads),
                                                                      int64_t{num_sms} * 16)));
}

#define MOE_GRID_STRIDE(i, n)                                                    \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// out[t, h] = table[ids[t], h]
template <typename W>
__global__ void EmbedKernel(float* out, const W* table, const int32_t* ids, int64_t T,
                            int64_t H) {
  WaitForPriorKernel();
  MOE_GRID_STRIDE(i, T * H) { out[i] = ToF32(table[ids[i / H] * H + i % H]); }
}

__global__ void AddKernel(float* out, const float* x, int64_t n) {
  WaitForPriorKernel();
  MOE_GRID_STRIDE(i, n) { out[i] += x[i]; }
}

struct ColumnParts {
  float* dst[Backend::kMaxColumnParts];
  int width[Backend::kMaxColumnParts];  // in units of kVec floats
  int count;
  int cols;  // the sum of the widths
};

// Block (x, y): unit x * blockDim + threadIdx of rows y, y + gridDim.y, ..., kVec floats a unit
// (4 where every width and pointer allows 16-byte accesses).
template <int kVec>
__global__ void SplitColumnsKernel(const float* src, int64_t rows, const ColumnParts parts) {
  using V = std::conditional_t<kVec == 4, float4, float>;
  WaitForPriorKernel();
  const int unit = blockIdx.x * blockDim.x + threadIdx.x;
  if (unit >= parts.cols) return;
  int p = 0, col = unit;
  while (p + 1 < parts.count && col >= parts.width[p]) col -= parts.width[p++];
  V* dst = reinterpret_cast<V*>(parts.dst[p]);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    dst[row * parts.width[p] + col] = reinterpret_cast<const V*>(src)[row * parts.cols + unit];
  }
}

__global__ void SigmoidKernel(float* x, int64_t n) {
  WaitForPriorKernel();
  MOE_GRID_STRIDE(i, n) { x[i] = 1.f / (1.f + expf(-x[i])); }
}

// gate_up[r] = [gate (I) | up (I)] -> act[r, i] = F.silu(gate) * up
__global__ void SiluMulKernel(float* act, const float* gate_up, int64_t rows, int64_t I) {
  WaitForPriorKernel();
  MOE_GRID_STRIDE(idx, rows * I) {
    const int64_t r = idx / I, i = idx % I;
    const float g = gate_up[r * 2 * I + i];
    act[idx] = g / (1.f + expf(-g)) * gate_up[r * 2 * I + I + i];
  }
}

#undef MOE_GRID_STRIDE

}  // namespace

void LaunchSiluMul(float* act, const float* gate_up, int64_t rows, int64_t I, int num_sms,
                   cudaStream_t stream) {
  if (rows * I == 0) return;
  Launch(SiluMulKernel, GridFor(rows * I, num_sms), kThreads, 0, stream, act, gate_up, rows, I);
}

}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Embed(float* out, const TensorView& table, const int32_t* ids, int64_t T) {
  MOE_CHECK(table.rank == 2) << "Embed: table rank " << table.rank;
  const int64_t V = table.dim(0), H = table.dim(1);
  // ids are host memory (backend.h): checked here, where the CPU reference checks them too.
  for (int64_t t = 0; t < T; ++t) {
    MOE_CHECK(ids[t] >= 0 && ids[t] < V) << "Embed: id " << ids[t] << " outside vocab " << V;
  }
  if (T == 0) return;
  const auto* dev_ids = static_cast<const int32_t*>(
      StageHostArgs(args_, ids, static_cast<size_t>(T) * sizeof(int32_t)));
  const unsigned grid = cuda::GridFor(T * H, num_sms_);
  switch (table.dtype) {
    case DType::kF32:
      cuda::Launch(cuda::EmbedKernel<float>, grid, cuda::kThreads, 0, stream_,
                   out, static_cast<const float*>(table.data), dev_ids, T, H);
      break;
    case DType::kBF16:
      cuda::Launch(cuda::EmbedKernel<__nv_bfloat16>, grid, cuda::kThreads, 0, stream_,
                   out, static_cast<const __nv_bfloat16*>(table.data), dev_ids, T, H);
      break;
    case DType::kF16:
      cuda::Launch(cuda::EmbedKernel<__half>, grid, cuda::kThreads, 0, stream_,
                   out, static_cast<const __half*>(table.data), dev_ids, T, H);
      break;
    default: MOE_CHECK(false) << "Embed: unsupported table dtype " << DTypeName(table.dtype);
  }
}

void CudaBackend::Add(float* out, const float* x, int64_t n) {
  if (n == 0) return;
  cuda::Launch(cuda::AddKernel, cuda::GridFor(n, num_sms_), cuda::kThreads, 0, stream_, out, x, n);
}

void CudaBackend::SplitColumns(const float* src, int64_t rows, absl::Span<float* const> parts,
                               absl::Span<const int64_t> widths) {
  MOE_CHECK(parts.size() == widths.size() && parts.size() <= kMaxColumnParts)
      << "SplitColumns: " << parts.size() << " parts, " << widths.size() << " widths";
  bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0;
  int64_t cols = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    vec = vec && widths[i] % 4 == 0 && reinterpret_cast<uintptr_t>(parts[i]) % 16 == 0;
    cols += widths[i];
  }
  MOE_CHECK(cols <= 0x7fffffff) << "SplitColumns: " << cols << " columns";
  if (rows * cols == 0) return;
  const int unit = vec ? 4 : 1;
  cuda::ColumnParts cp{};
  cp.count = static_cast<int>(parts.size());
  cp.cols = static_cast<int>(cols / unit);
  for (int i = 0; i < cp.count; ++i) {
    cp.dst[i] = parts[i];
    cp.width[i] = static_cast<int>(widths[i] / unit);
  }
  const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(int64_t{cp.cols}, int64_t{cuda::kThreads})),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  if (vec) {
    cuda::Launch(cuda::SplitColumnsKernel<4>, grid, cuda::kThreads, 0, stream_, src, rows, cp);
  } else {
    cuda::Launch(cuda::SplitColumnsKernel<1>, grid, cuda::kThreads, 0, stream_, src, rows, cp);
  }
}

void CudaBackend::Sigmoid(float* x, int64_t n) {
  if (n == 0) return;
  cuda::Launch(cuda::SigmoidKernel, cuda::GridFor(n, num_sms_), cuda::kThreads, 0, stream_, x, n);
}

}  // namespace moe::kernels
