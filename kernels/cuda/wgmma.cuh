// Hopper's warpgroup matrix multiply (wgmma, sm_90a) for the tensor-core GEMM (gemm_mma.cu).
// Four consecutive warps (a warpgroup, the first warp's index a multiple of 4) issue one
// m64nNk16 product together: A (64 x 16) from registers, in each warp mma.m16n8k16's A fragment
// for its 16 rows; B (16 x N) from shared memory through a descriptor; D (64 x N, fp32) in
// registers, in each warp mma's C fragment repeated over the N / 8 column blocks. The products run
// asynchronously: Fence before issuing (registers written since the last wait), Commit after, Wait
// before reading D or changing A, then KeepRegisters on both so that the compiler neither reads
// nor reuses them early.
//
// Compiled only for sm_90a (CMAKE_CUDA_ARCHITECTURES 90a): MOE_WGMMA is defined in the device
// passes that have the instructions; elsewhere the callers keep their mma.sync kernels.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_WGMMA 1
#endif

namespace moe::kernels::cuda {
namespace {

// A K-major tile of rows x 64 bf16 (128 bytes a row) at a 1024-byte-aligned shared address, in the
// 128-byte-swizzle layout: 16-byte chunk c of row r at r * 128 + 16 (c ^ (r % 8)). Its descriptor
// for the k-step s (columns 16 s .. 16 s + 15) is SwizzledTile(tile) + 2 s (32 bytes further).
__device__ __forceinline__ int SwizzledChunk(int row, int chunk) { return chunk ^ (row & 7); }

__device__ __forceinline__ uint64_t SwizzledTile(const void* tile) {
  const uint64_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  return ((addr & 0x3ffffu) >> 4)  // start address, 16-byte units
         | (uint64_t{1} << 16)     // leading byte offset: unused by swizzled K-major tiles
         | (uint64_t{64} << 32)    // stride byte offset: 1024 bytes from one 8 rows to the next
         | (uint64_t{1} << 62);    // 128-byte swizzle
}

#ifdef MOE_WGMMA
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared memory written by this thread through the generic proxy (stores, cp.async) made visible
// to wgmma's reads (the async proxy); a barrier after it orders the other threads.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int n>
__device__ __forceinline__ void KeepRegisters(float (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int n>
__device__ __forceinline__ void KeepRegisters(uint32_t (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// d (+)= a b for a 64 x 16 A (bf16, registers) and a 16 x N B (bf16, K-major tile at b_desc);
// accumulate false: d = a b. N = 16, 32 or 64.
__device__ __forceinline__ void WgmmaM64NK16(float (&d)[8], const uint32_t (&a)[4], uint64_t b_desc,
                                             bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate ? 1 : 0));
}
__device__ __forceinline__ void WgmmaM64NK16(float (&d)[16], const uint32_t (&a)[4],
                                             uint64_t b_desc, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate ? 1 : 0));
}
__device__ __forceinline__ void WgmmaM64NK16(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t b_desc, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate ? 1 : 0));
}
#endif  // MOE_WGMMA

}  // namespace
}  // namespace moe::kernels::cuda
