// Shared device helpers of the CUDA backend: error checks, warp/block reductions, weight loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/base/check.h"

// Launch errors and sticky errors (illegal address) are fatal: the context is gone (STYLE C5.7).
#define MOE_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    const cudaError_t _moe_err = (expr);                                                  \
    MOE_CHECK(_moe_err == cudaSuccess) << #expr << ": " << cudaGetErrorName(_moe_err) << " " \
                                       << cudaGetErrorString(_moe_err);                   \
  } while (0)

namespace moe::kernels::cuda {

constexpr int kWarp = 32;

// Programmatic dependent launch (sm_90 and later): a kernel may be launched while the one before
// it in the stream still runs, so that its launch latency overlaps that kernel's work. Every
// kernel calls WaitForPriorKernel before it reads anything a kernel before it may write (only
// constant tables, such as a rotation's matrix, before it): it returns once the kernel before it
// has completed and its writes are visible (so stream order holds as without the overlap), then
// lets the next kernel launch. Launch overlaps while this is set: CudaBackend::BeginStep sets it
// per step.
inline bool g_overlap_launches = false;

__device__ __forceinline__ void WaitForPriorKernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Set while a CudaBackend records a step for a CUDA graph (step_graph.cuh): Launch on that
// backend's stream, from the thread that drives it, then records the launch instead of issuing it.
class StepGraphs;
inline thread_local StepGraphs* g_recording = nullptr;
cudaStream_t RecordingStream(const StepGraphs& graphs);
void RecordLaunch(StepGraphs& graphs, const void* kernel, const cudaLaunchConfig_t& config,
                  const void* const* args, const size_t* sizes, int count);

// kernel<<<grid, block, smem, stream>>>(args...), overlapping the kernel before it while
// g_overlap_launches is set; recorded while g_recording records `stream`; a launch error is
// fatal (MOE_CUDA_CHECK).
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args);

__host__ __device__ __forceinline__ int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = WarpSum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / kWarp;
  v = lane < num_warps ? partial[lane] : 0.f;
  return WarpSum(v);
}

// c += A B for one m16n8k16 tile (A row-major 16 x 16, B column-major 16 x 8, bf16; c fp32).
// Fragments, g = lane / 4, t = lane % 4 (PTX ISA, mma.m16n8k16): a0 = A[g][2t, 2t+1],
// a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g],
// b1 = B[2t+8, 2t+9][g]; c = C[g][2t, 2t+1], C[g+8][2t, 2t+1] (low half first).
__device__ __forceinline__ void MmaBf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weight element types as device types; ToF32 is exact for all three.
__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }

// Loads kVec = 16 / sizeof(W) consecutive weights with one 16-byte load (p 16-byte aligned).
template <typename W>
struct Vec16 {
  static constexpr int kVec = 16 / sizeof(W);
  __device__ __forceinline__ static void Load(const W* p, float (&out)[kVec]) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const W* e = reinterpret_cast<const W*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = ToF32(e[i]);
  }
};

template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute programmatic;
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &programmatic;
  config.numAttrs = g_overlap_launches ? 1 : 0;
  if (g_recording != nullptr && RecordingStream(*g_recording) == stream) {
    static_assert((std::is_trivially_copyable_v<Params> && ...));
    // The arguments as the kernel's parameter types, as cudaLaunchKernelEx would pass them.
    const std::tuple<Params...> values(std::forward<Args>(args)...);
    std::apply(
        [&](const auto&... v) {
          const void* ptrs[] = {&v..., nullptr};
          const size_t sizes[] = {sizeof(v)..., 0};
          RecordLaunch(*g_recording, reinterpret_cast<const void*>(kernel), config, ptrs, sizes,
                       static_cast<int>(sizeof...(Params)));
        },
        values);
    return;
  }
  MOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// (x, y) as N bf16 pairs (x in the low halves), each part the bf16 of what the parts before it
// left: hi + mid + lo = (x, y) to 2^-24, fp32's precision; hi + lo (N = 2) to 2^-16. How the
// tensor-core kernels take fp32 operands.
template <int N>
__device__ __forceinline__ void SplitBf16(float x, float y, uint32_t (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    out[i] = *reinterpret_cast<const uint32_t*>(&h);
    x -= hf.x, y -= hf.y;  // exact
  }
}

}  // namespace moe::kernels::cuda
