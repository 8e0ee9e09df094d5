// Causal GQA attention over the contiguous cache on the GPU, flash-attention style (online
// softmax over key tiles in shared memory), split over keys for decode (flash-decoding).
//
// Legend: T tokens, NH query heads, NKV kv heads, G = NH / NKV, D head dim, S cached positions.
// A block takes 16 query rows of one kv head: row qi of [T * G] is token qi / G, head
// kvh * G + qi % G, so the G query heads sharing a kv head share every K/V tile it loads (decode:
// one block holds all G heads of the token). Grid (ceil(T*G / 16), NKV, splits); 4 warps, each
// owning 4 query rows; within a tile lane j scores key j, and each lane owns D/32 output columns.
// With splits > 1 every block writes an unnormalised partial (o, m, l), merged by a second kernel.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kQRows = 16, kRowsPerWarp = 4, kAttnThreads = 128, kKeys = 32;

struct AttnParams {
  AttentionArgs a;
  int group = 1;               // G
  int64_t keys_per_split = 0;  // multiple of kKeys
  int num_splits = 1;
  float* part_o = nullptr;   // [splits, T * NH, D]
  float* part_ml = nullptr;  // [splits, T * NH, 2]: running max m, denominator l
};

template <int DMAX>
size_t AttentionSmemBytes() {
  return sizeof(float) * (kQRows * DMAX + kKeys * (DMAX + 1) + kKeys * DMAX);
}

template <int DMAX>
__global__ __launch_bounds__(kAttnThreads) void AttentionKernel(const AttnParams p) {
  constexpr int kCols = DMAX / kWarp;  // output columns per lane
  extern __shared__ float smem[];
  float* q_s = smem;                      // [16, DMAX]
  float* k_s = q_s + kQRows * DMAX;       // [32, DMAX + 1], padded: lane j reads row j
  float* v_s = k_s + kKeys * (DMAX + 1);  // [32, DMAX]
  const AttentionArgs& a = p.a;
  const int D = a.head_dim, G = p.group;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t rows_total = a.num_tokens * G;
  const int64_t qi0 = static_cast<int64_t>(blockIdx.x) * kQRows;
  const int64_t kv_stride = static_cast<int64_t>(a.num_kv_heads) * D;

  for (int idx = threadIdx.x; idx < kQRows * DMAX; idx += blockDim.x) {
    const int r = idx / DMAX, d = idx % DMAX;
    const int64_t qi = qi0 + r;
    float v = 0.f;
    if (qi < rows_total && d < D) {
      const int64_t t = qi / G;
      const int h = kvh * G + static_cast<int>(qi % G);
      v = a.q[(t * a.num_heads + h) * D + d];
    }
    q_s[idx] = v;
  }

  // Keys any row of this block may see, cut to this split's share.
  const int64_t t_lo = qi0 / G;
  const int64_t t_hi = Min64(a.num_tokens - 1, (qi0 + kQRows - 1) / G);
  const int64_t first =
      a.sliding_window > 0 ? Max64(0, a.start_pos + t_lo - a.sliding_window + 1) : 0;
  const int64_t s_begin = Max64(first, split * p.keys_per_split);
  const int64_t s_end = Min64(a.start_pos + t_hi + 1, (split + 1) * p.keys_per_split);

  bool valid[kRowsPerWarp];
  int64_t pos[kRowsPerWarp], lo[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    valid[r] = qi < rows_total;
    pos[r] = a.start_pos + qi / G;
    lo[r] = a.sliding_window > 0 ? pos[r] - a.sliding_window + 1 : 0;
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) o[r][i] = 0.f;
  }

  for (int64_t s0 = s_begin; s0 < s_end; s0 += kKeys) {
    __syncthreads();  // q_s written / the previous tile consumed
    for (int idx = threadIdx.x; idx < kKeys * D; idx += blockDim.x) {
      const int j = idx / D, d = idx % D;
      const int64_t s = s0 + j;
      float kv = 0.f, vv = 0.f;
      if (s < s_end) {
        kv = a.k_cache[s * kv_stride + kvh * D + d];
        vv = a.v_cache[s * kv_stride + kvh * D + d];
      }
      k_s[j * (DMAX + 1) + d] = kv;
      v_s[j * DMAX + d] = vv;
    }
    __syncthreads();

    float sc[kRowsPerWarp] = {};  // q[row] . k[s0 + lane]
    const float* kr = k_s + lane * (DMAX + 1);
    const float* qw = q_s + warp * kRowsPerWarp * DMAX;
    for (int d = 0; d < D; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) sc[r] = fmaf(qw[r * DMAX + d], kd, sc[r]);
    }
    const int64_t s = s0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool ok = valid[r] && s < s_end && s <= pos[r] && s >= lo[r];
      const float score = ok ? sc[r] * a.scale : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(score));
      if (m_new == -INFINITY) continue;  // warp-uniform: no visible key yet
      const float corr = expf(m[r] - m_new);
      const float pr = ok ? expf(score - m_new) : 0.f;
      l[r] = l[r] * corr + WarpSum(pr);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kCols; ++i) o[r][i] *= corr;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
        if (pj == 0.f) continue;  // warp-uniform: masked key
#pragma unroll
        for (int i = 0; i < kCols; ++i) o[r][i] = fmaf(pj, v_s[j * DMAX + lane + i * kWarp], o[r][i]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (!valid[r]) continue;
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    const int64_t row = (qi / G) * a.num_heads + kvh * G + qi % G;  // t * NH + h
    if (p.num_splits == 1) {
      const float inv = 1.f / l[r];  // > 0: key pos[r] is always in range
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = lane + i * kWarp;
        if (d < D) a.out[row * D + d] = o[r][i] * inv;
      }
    } else {
      const int64_t prow = split * a.num_tokens * a.num_heads + row;
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = lane + i * kWarp;
        if (d < D) p.part_o[prow * D + d] = o[r][i];
      }
      if (lane == 0) {
        p.part_ml[prow * 2] = m[r];
        p.part_ml[prow * 2 + 1] = l[r];
      }
    }
  }
}

// out[row] = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z, M = max_z m_z; one block per row.
__global__ void AttentionCombineKernel(const AttnParams p) {
  const AttentionArgs& a = p.a;
  const int64_t row = blockIdx.x, rows = a.num_tokens * a.num_heads;
  float M = -INFINITY;
  for (int z = 0; z < p.num_splits; ++z) M = fmaxf(M, p.part_ml[(z * rows + row) * 2]);
  float den = 0.f;
  for (int z = 0; z < p.num_splits; ++z) {
    const float mz = p.part_ml[(z * rows + row) * 2];
    if (mz != -INFINITY) den += expf(mz - M) * p.part_ml[(z * rows + row) * 2 + 1];
  }
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float num = 0.f;
    for (int z = 0; z < p.num_splits; ++z) {
      const float mz = p.part_ml[(z * rows + row) * 2];
      if (mz != -INFINITY) num += expf(mz - M) * p.part_o[(z * rows + row) * a.head_dim + d];
    }
    a.out[row * a.head_dim + d] = num / den;
  }
}

template <int DMAX>
void LaunchAttention(const AttnParams& p, dim3 grid, cudaStream_t stream) {
  const size_t smem = AttentionSmemBytes<DMAX>();
  if (smem > 48 * 1024) {
    MOE_CUDA_CHECK(cudaFuncSetAttribute(AttentionKernel<DMAX>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  AttentionKernel<DMAX><<<grid, kAttnThreads, smem, stream>>>(p);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Attention(const AttentionArgs& a) {
  MOE_CHECK(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.head_dim > 0 &&
            a.head_dim <= 256 && a.start_pos >= 0)
      << "Attention: heads " << a.num_heads << " kv heads " << a.num_kv_heads << " head_dim "
      << a.head_dim << " start_pos " << a.start_pos;
  if (a.num_tokens == 0) return;
  cuda::AttnParams p;
  p.a = a;
  p.group = a.num_heads / a.num_kv_heads;
  const int64_t tiles = cuda::CeilDiv(a.num_tokens * p.group, cuda::kQRows);
  const int64_t blocks = tiles * a.num_kv_heads;
  const int64_t keys = a.start_pos + a.num_tokens;  // S
  // Flash-decoding: when the grid would leave SMs idle, split the keys so that about two blocks
  // run per SM, each split at least 64 keys (two tiles).
  int64_t per_split = cuda::CeilDiv(keys, cuda::kKeys) * cuda::kKeys;
  if (blocks < 2 * num_sms_ && keys >= 128) {
    const int64_t want = std::min(cuda::CeilDiv(2 * num_sms_, blocks), keys / 64);
    per_split = cuda::CeilDiv(cuda::CeilDiv(keys, want), cuda::kKeys) * cuda::kKeys;
  }
  p.keys_per_split = per_split;
  p.num_splits = static_cast<int>(cuda::CeilDiv(keys, per_split));
  MOE_CHECK(tiles <= 0x7fffffff && p.num_splits <= 65535)
      << "Attention: grid " << tiles << " x " << p.num_splits;
  if (p.num_splits > 1) {
    const size_t rows = static_cast<size_t>(a.num_tokens) * a.num_heads;
    const size_t floats = static_cast<size_t>(p.num_splits) * rows * (a.head_dim + 2);
    p.part_o = static_cast<float*>(Reserve(work_, floats * sizeof(float)));
    p.part_ml = p.part_o + static_cast<size_t>(p.num_splits) * rows * a.head_dim;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(p.num_splits));
  if (a.head_dim <= 64) {
    cuda::LaunchAttention<64>(p, grid, stream_);
  } else if (a.head_dim <= 128) {
    cuda::LaunchAttention<128>(p, grid, stream_);
  } else {
    cuda::LaunchAttention<256>(p, grid, stream_);
  }
  if (p.num_splits > 1) {
    cuda::AttentionCombineKernel<<<static_cast<unsigned>(a.num_tokens * a.num_heads), 128, 0,
                                   stream_>>>(p);
    MOE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace moe::kernels
