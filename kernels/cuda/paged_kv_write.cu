// PagedKvWrite on the GPU: each token's K and V vectors quantized into their cache slots exactly
// as KvCodec::Quantize (bf16, fp8-e4m3: PagedKvWriteKernel; TurboQuant one part: TqWriteKernel;
// the split formats: TqSplitWriteKernel), the codecs' tables uploaded once per layer
// (TqTablesOnDevice) and the step's verdict on rejected vectors (TakeKvWriteError); the 16-bit
// tail's ring (PagedKvTailWrite).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/step_graph.cuh"

namespace moe::kernels::cuda {
namespace {

// A rejected vector as one number, smallest first by position: position << 16 | kv-head << 1 |
// role (kv-heads < 2^15).
__host__ __device__ __forceinline__ unsigned long long KvBadCode(int64_t pos, int h, int role) {
  return static_cast<unsigned long long>(pos) << 16 | static_cast<unsigned long long>(h) << 1 |
         static_cast<unsigned long long>(role);
}

// One block per (token, kv-head, role): checks finiteness, then bf16 bits or fp8 amax, scale and
// codes exactly as KvCodec::Quantize. A non-finite vector is not written; the smallest such
// (position, kv-head, role) goes to *bad (KvBadCode).
template <bool kFp8>
__global__ void PagedKvWriteKernel(PagedGeom g, const float* k, const float* v,
                                   const int2* where, unsigned long long* bad) {
  WaitForPriorKernel();
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, D = g.head_dim;
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * D;
  bool finite = true;
  float amax = 0.f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    finite = finite && isfinite(x[j]);
    amax = fmaxf(amax, fabsf(x[j]));
  }
  const bool all_finite = __syncthreads_and(finite);
  if (!all_finite) {
    if (threadIdx.x == 0) atomicMin(bad, KvBadCode(where[t].y, h, role));
    return;
  }
  const int slot = where[t].x % g.block_size;
  uint8_t* tile = g.TileOfSlot(where[t].x, h, role);
  if constexpr (kFp8) {
    __shared__ float warp_max[32];
    amax = WarpMax(amax);
    if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = amax;
    __syncthreads();
    amax = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) amax = fmaxf(amax, warp_max[w]);
    const float scale = __fdiv_rn(amax, 448.f);
    uint8_t* codes = tile + static_cast<int64_t>(slot) * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
      codes[j] = scale > 0.f ? F32ToE4m3Bits(__fdiv_rn(x[j], scale)) : 0;
    }
    if (threadIdx.x == 0) {
      uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * D + 4 * slot;
      const uint32_t bits = __float_as_uint(scale);
      for (int i = 0; i < 4; ++i) sp[i] = static_cast<uint8_t>(bits >> (8 * i));
    }
  } else {
    uint16_t* dst = reinterpret_cast<uint16_t*>(tile) + static_cast<int64_t>(slot) * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) dst[j] = F32ToBf16Bits(x[j]);
  }
}

// KvCodec::Quantize for a single-part MSE format, one warp per (token, kv-head, K|V): n =
// sqrt(Σ x_j² ascending), u = x / n, y = Π u, idx = #boundaries <= y, scale, fp16 scale; indices
// packed b bits each, little-endian; scale plane after the index plane. Lane holds elements
// lane + 32k; everything it reads is loaded up front; the sum of squares is one lane's, in the
// CPU's order. (One block of D threads with block barriers between the steps, a run-time b and
// one thread summing from shared memory took 5.5 us for one token's 8 vectors, H200.)
template <int D, int kBits>  // g.head_dim, tb.bits
__global__ __launch_bounds__(kWarp) void TqWriteKernel(PagedGeom g, TqTables tb, const float* k,
                                                       const float* v, const int2* where,
                                                       unsigned long long* bad) {
  WaitForPriorKernel();
  constexpr int b = kBits, kPer = D / kWarp, kLevels = 1 << kBits, kIndexBytes = D * kBits / 8;
  __shared__ __align__(16) float squares[D];
  __shared__ uint8_t idx[D];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, lane = threadIdx.x;
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * D;
  const int2 at = where[t];
  float y[kPer], d1[kPer], d2[kPer], bounds[kLevels - 1];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    y[e] = x[lane + kWarp * e];
    d1[e] = tb.D1(h, role, D)[lane + kWarp * e];
    d2[e] = tb.D2(h, role, D)[lane + kWarp * e];
  }
#pragma unroll
  for (int i = 0; i < kLevels - 1; ++i) bounds[i] = tb.boundaries[i];
  bool finite = true;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    finite = finite && isfinite(y[e]);
    squares[lane + kWarp * e] = __fmul_rn(y[e], y[e]);
  }
  if (!__all_sync(0xffffffffu, finite)) {
    if (lane == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  __syncwarp();
  float n = 0.f;
  if (lane == 0) {
    const float4* sq4 = reinterpret_cast<const float4*>(squares);
    float n2 = 0.f;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) {
      const float4 q = sq4[i];
      n2 = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(n2, q.x), q.y), q.z), q.w);
    }
    n = __fsqrt_rn(n2);
  }
  n = __shfl_sync(0xffffffffu, n, 0);
  if (n != 0.f) {  // warp-uniform; n == 0: zero indices and scale
#pragma unroll
    for (int e = 0; e < kPer; ++e) y[e] = __fdiv_rn(y[e], n);
    WarpRht2<D>(y, d1, d2, true);
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    int c = 0;
    if (n != 0.f) {
#pragma unroll
      for (int i = 0; i < kLevels - 1; ++i) c += bounds[i] <= y[e] ? 1 : 0;
    }
    idx[lane + kWarp * e] = static_cast<uint8_t>(c);
  }
  __syncwarp();
  float s = 0.f;
  if (lane == 0 && n != 0.f) {
    if (tb.norm == static_cast<int>(TqNorm::kPlain)) {
      s = n;
    } else if (tb.norm == static_cast<int>(TqNorm::kDebiased)) {
      s = __fdiv_rn(n, tb.alpha);
    } else {
      float e2 = 0.f;
      for (int i = 0; i < D; ++i) {
        const float c = tb.centroids[idx[i]];
        e2 = __fadd_rn(e2, __fmul_rn(c, c));
      }
      s = e2 > 0.f ? __fdiv_rn(n, __fsqrt_rn(e2)) : 0.f;
    }
  }
  s = __shfl_sync(0xffffffffu, s, 0);
  if (!(s <= 65504.f)) {
    if (lane == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const int slot = at.x % g.block_size;
  uint8_t* tile = g.TileOfSlot(at.x, h, role);
  for (int j = lane; j < kIndexBytes; j += kWarp) {
    uint32_t out = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int bit = j * 8 + i;
      out |= ((static_cast<uint32_t>(idx[bit / b]) >> (bit % b)) & 1u) << i;
    }
    tile[static_cast<int64_t>(slot) * kIndexBytes + j] = static_cast<uint8_t>(out);
  }
  if (lane == 0) {
    const uint16_t hb = F32ToF16Bits(s);
    uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * kIndexBytes + 2 * slot;
    sp[0] = static_cast<uint8_t>(hb & 0xff);
    sp[1] = static_cast<uint8_t>(hb >> 8);
  }
}

// KvCodec::Quantize for a split format: one block of 128 threads per (token, kv-head, K|V); thread
// t owns rotated position t (t < 32 the outlier part, the first warp; the rest the other three).
template <int kBitsO, int kBitsR>
__global__ __launch_bounds__(kSplitD) void TqSplitWriteKernel(PagedGeom g, TqSplitTables tb,
                                                              const float* k, const float* v,
                                                              const int2* where,
                                                              unsigned long long* bad) {
  using Planes = SplitPlanes<kBitsO, kBitsR>;
  extern __shared__ __align__(16) float haar_t_s[];  // Π_Rᵀ [96 · 96]
  __shared__ float x_s[kSplitD], u_s[kSplitD], norms[2], scales[2];
  __shared__ uint8_t idx[kSplitD];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, p = threadIdx.x;
  const bool outlier = p < kSplitO;
  const int part = outlier ? 0 : 1;
  // The constant tables before the wait: loaded while the kernel before runs.
  StageSplitMatrix(haar_t_s, tb.HaarT(h, role));
  const int channel = tb.Channel(h, role, p);
  const SplitSigns signs = LoadSplitSigns(tb, h, role);
  constexpr int kMaxBounds = (1 << (kBitsO > kBitsR ? kBitsO : kBitsR)) - 1;
  const int num_bounds = (outlier ? 1 << kBitsO : 1 << kBitsR) - 1;
  float bounds[kMaxBounds];
#pragma unroll
  for (int i = 0; i < kMaxBounds; ++i) {
    bounds[i] = i < num_bounds ? (outlier ? tb.boundaries_o : tb.boundaries_r)[i] : INFINITY;
  }
  WaitForPriorKernel();
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * kSplitD;
  const int2 at = where[t];
  x_s[p] = x[p];
  if (!__syncthreads_and(isfinite(x_s[p]))) {
    if (p == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const float gathered = x_s[channel];
  u_s[p] = gathered;
  __syncthreads();
  // n = sqrt(Σ x_c² over the part's channels, ascending); loops of fixed length, so that the
  // loads go out ahead of the adds.
  auto sum_squares = [&](auto begin, auto end) {
    float n2 = 0.f;
#pragma unroll
    for (int j = decltype(begin)::value; j < decltype(end)::value; ++j) {
      n2 = __fadd_rn(n2, __fmul_rn(u_s[j], u_s[j]));
    }
    return __fsqrt_rn(n2);
  };
  if (p == 0) norms[0] = sum_squares(std::integral_constant<int, 0>{},
                                     std::integral_constant<int, kSplitO>{});
  if (p == kSplitO) norms[1] = sum_squares(std::integral_constant<int, kSplitO>{},
                                           std::integral_constant<int, kSplitD>{});
  __syncthreads();
  const float n = norms[part];
  u_s[p] = n != 0.f ? __fdiv_rn(gathered, n) : 0.f;
  __syncthreads();
  int c = 0;
  if (n != 0.f) {  // warp-uniform
    const float y = SplitRotatePosition(haar_t_s, u_s, signs, true);
#pragma unroll
    for (int i = 0; i < kMaxBounds; ++i) c += bounds[i] <= y ? 1 : 0;  // +inf past the part's
  }
  idx[p] = static_cast<uint8_t>(c);
  __syncthreads();
  if (p == 0 || p == kSplitO) {
    const float alpha = outlier ? tb.alpha_o : tb.alpha_r;
    float s = 0.f;
    if (n != 0.f) {
      if (tb.norm == static_cast<int>(TqNorm::kPlain)) {
        s = n;
      } else if (tb.norm == static_cast<int>(TqNorm::kDebiased)) {
        s = __fdiv_rn(n, alpha);
      } else {
        const float* centroids = outlier ? tb.centroids_o : tb.centroids_r;
        const int end = outlier ? kSplitO : kSplitD;
        float e2 = 0.f;
        for (int j = p; j < end; ++j) {
          const float cj = centroids[idx[j]];
          e2 = __fadd_rn(e2, __fmul_rn(cj, cj));
        }
        s = e2 > 0.f ? __fdiv_rn(n, __fsqrt_rn(e2)) : 0.f;
      }
    }
    scales[part] = s;
  }
  __syncthreads();
  if (!(scales[0] <= 65504.f && scales[1] <= 65504.f)) {
    if (p == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const int slot = at.x % g.block_size, bs = g.block_size;
  uint8_t* tile = g.TileOfSlot(at.x, h, role);
  // Byte j of a part's index plane: bits 8j .. 8j + 7, index i at bit offset b · i.
  auto pack = [&](int first, int b, int j) {
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i) {
      const int bit = j * 8 + i;
      out |= ((static_cast<uint32_t>(idx[first + bit / b]) >> (bit % b)) & 1u) << i;
    }
    return static_cast<uint8_t>(out);
  };
  if (p < Planes::kBytesO) tile[Planes::IndexO(bs, slot) + p] = pack(0, kBitsO, p);
  if (p >= kSplitO && p - kSplitO < Planes::kBytesR) {
    tile[Planes::IndexR(bs, slot) + (p - kSplitO)] = pack(kSplitO, kBitsR, p - kSplitO);
  }
  if (p == 0 || p == kSplitO) {
    const uint16_t hb = F32ToF16Bits(scales[part]);
    uint8_t* sp = tile + (outlier ? Planes::ScaleO(bs, slot) : Planes::ScaleR(bs, slot));
    sp[0] = static_cast<uint8_t>(hb & 0xff);
    sp[1] = static_cast<uint8_t>(hb >> 8);
  }
}

// The 16-bit tail's ring write of one element (PagedKvTailWrite): tokens first.. of its k and v
// into ring slots (start_pos + t) % W in bf16, [slot][NKV][2 (K, V)][D]. Offsets (elements) from
// the batch's first ring, k and v: the same in every layer, so the table is staged once a step.
struct TailWrite {
  int64_t ring = 0, k = 0, v = 0;
  int64_t start_pos = 0, first = 0, num_tokens = 0;
};

struct TailWriteParams {
  const TailWrite* writes = nullptr;
  uint16_t* ring = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int tail_tokens = 0, num_kv_heads = 0, head_dim = 0;
};

// Block (element x, token first + y): that token's K and V of every kv-head.
__global__ void PagedKvTailWriteKernel(const TailWriteParams p) {
  WaitForPriorKernel();
  const TailWrite w = p.writes[blockIdx.x];
  const int64_t t = w.first + blockIdx.y;
  if (t >= w.num_tokens) return;
  const int D = p.head_dim, NKV = p.num_kv_heads;
  uint16_t* slot = p.ring + w.ring + ((w.start_pos + t) % p.tail_tokens) * NKV * 2 * D;
  for (int i = threadIdx.x; i < NKV * 2 * D; i += blockDim.x) {
    const int h = i / (2 * D), role = i / D % 2, d = i % D;
    const int64_t src = (role == 0 ? w.k : w.v) + (t * NKV + h) * D + d;
    slot[i] = F32ToBf16Bits((role == 0 ? p.k : p.v)[src]);
  }
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

namespace {

// True when the batch can be one launch: every element writes the same layer of the same cache
// and its rows of k/v follow the previous element's.
bool OneLaunch(absl::Span<const PagedKvWriteArgs> batch) {
  const PagedKvWriteArgs& a = batch[0];
  const int64_t row = static_cast<int64_t>(a.kv.num_kv_heads) * a.kv.head_dim;
  int64_t tokens = 0;
  for (const PagedKvWriteArgs& e : batch) {
    if (!SameLayer(a.kv, e.kv) || e.k != a.k + tokens * row || e.v != a.v + tokens * row) {
      return false;
    }
    tokens += e.num_tokens;
  }
  return true;
}

}  // namespace

absl::Status CudaBackend::PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) {
  if (batch.empty()) return absl::OkStatus();
  const cuda::PagedPath path = cuda::ChoosePath(batch[0].kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedKvWrite(batch);  // prod formats
  if (batch.size() > 1 && !OneLaunch(batch)) {
    for (const PagedKvWriteArgs& a : batch) MOE_RETURN_IF_ERROR(PagedKvWrite({a}));
    return absl::OkStatus();
  }
  const PagedKvLayer& kv = batch[0].kv;
  // Each token's cache slot (block · block_size + slot) and position.
  std::vector<int2> where;
  for (const PagedKvWriteArgs& a : batch) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int64_t pos = a.start_pos + t;
      MOE_CHECK(pos <= 0x7fffffff) << "PagedKvWrite: position " << pos;
      where.push_back(make_int2(a.kv.block_table[pos / kv.block_size] * kv.block_size +
                                    static_cast<int32_t>(pos % kv.block_size),
                                static_cast<int32_t>(pos)));
    }
  }
  if (where.empty()) return absl::OkStatus();
  MOE_CHECK(static_cast<int64_t>(where.size()) <= 0x7fffffff) << "PagedKvWrite: too many tokens";
  cuda::PagedGeom g{kv.layer_base, kv.block_stride, kv.tile_bytes, kv.block_size,
                    kv.num_kv_heads, kv.head_dim, nullptr};
  const auto* dev_where = static_cast<const int2*>(
      StageHostArgs(kv_slots_, where.data(), where.size() * sizeof(int2)));
  unsigned long long* kv_verdict = StepVerdicts();
  kv_verdict_pending_ = true;
  kv_verdict_format_ = kv.codecs[0]->format();
  const dim3 grid(static_cast<unsigned>(where.size()), static_cast<unsigned>(kv.num_kv_heads), 2);
  const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
  const float* k = batch[0].k;
  const float* v = batch[0].v;
  if (path == cuda::PagedPath::kFp8) {
    cuda::Launch(cuda::PagedKvWriteKernel<true>, grid, threads, 0, stream_,
                 g, k, v, dev_where, kv_verdict);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::Launch(cuda::PagedKvWriteKernel<false>, grid, threads, 0, stream_,
                 g, k, v, dev_where, kv_verdict);
  } else if (path == cuda::PagedPath::kTqSplit) {
    const cuda::TqSplitTables tb = cuda::TqSplitDeviceTables(kv, TqTablesOnDevice(kv));
    auto launch = [&](auto kernel) {
      cuda::Launch(kernel, grid, cuda::kSplitD, cuda::kSplitMatrixBytes, stream_, g, tb, k, v,
                   dev_where, kv_verdict);
    };
    if (kv.codecs[0]->format() == KvFormat::kTq3p5) {
      launch(cuda::TqSplitWriteKernel<4, 3>);
    } else {
      launch(cuda::TqSplitWriteKernel<3, 2>);
    }
  } else {
    const cuda::TqTables tb = cuda::TqDeviceTables(kv, TqTablesOnDevice(kv));
    // TqWriteKernel<D, b> for this layer (ChoosePath: D a power of two 32 .. 256, b 1 .. 4).
    auto with_bits = [&](auto d) {
      constexpr int D = decltype(d)::value;
      auto launch = [&](auto kernel) {
        cuda::Launch(kernel, grid, cuda::kWarp, 0, stream_, g, tb, k, v, dev_where, kv_verdict);
      };
      switch (tb.bits) {
        case 1: launch(cuda::TqWriteKernel<D, 1>); break;
        case 2: launch(cuda::TqWriteKernel<D, 2>); break;
        case 3: launch(cuda::TqWriteKernel<D, 3>); break;
        case 4: launch(cuda::TqWriteKernel<D, 4>); break;
        default: MOE_CHECK(false) << "PagedKvWrite: TurboQuant with " << tb.bits << " bits";
      }
    };
    switch (kv.head_dim) {
      case 32: with_bits(std::integral_constant<int, 32>{}); break;
      case 64: with_bits(std::integral_constant<int, 64>{}); break;
      case 128: with_bits(std::integral_constant<int, 128>{}); break;
      case 256: with_bits(std::integral_constant<int, 256>{}); break;
      default: MOE_CHECK(false) << "PagedKvWrite: TurboQuant head_dim " << kv.head_dim;
    }
  }
  return absl::OkStatus();  // the verdict: TakeKvWriteError
}

absl::Status CudaBackend::PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch) {
  const PagedKvWriteArgs* a = nullptr;  // the first element with a tail
  std::vector<cuda::TailWrite> writes;
  int64_t max_tokens = 0;  // of one element: grid.y
  for (const PagedKvWriteArgs& e : batch) {
    const PagedKvLayer& kv = e.kv;
    if (kv.tail == nullptr || e.num_tokens == 0) continue;
    if (a == nullptr) a = &e;
    if (kv.tail_tokens <= 0 || kv.tail_tokens != a->kv.tail_tokens ||
        kv.num_kv_heads != a->kv.num_kv_heads || kv.head_dim != a->kv.head_dim) {
      return absl::InvalidArgumentError(
          "PagedKvTailWrite: a tail needs tail_tokens > 0, the same rings in every element");
    }
    // Only the last W tokens survive in a ring of W slots.
    const int64_t first = std::max<int64_t>(0, e.num_tokens - kv.tail_tokens);
    writes.push_back({ElementOffset(a->kv.tail, kv.tail), ElementOffset(a->k, e.k),
                      ElementOffset(a->v, e.v), e.start_pos, first, e.num_tokens});
    max_tokens = std::max(max_tokens, e.num_tokens - first);
  }
  if (writes.empty()) return absl::OkStatus();
  cuda::TailWriteParams p;
  p.writes = static_cast<const cuda::TailWrite*>(
      StageHostArgs(kv_tail_writes_, writes.data(), writes.size() * sizeof(cuda::TailWrite)));
  p.ring = a->kv.tail;
  p.k = a->k;
  p.v = a->v;
  p.tail_tokens = a->kv.tail_tokens;
  p.num_kv_heads = a->kv.num_kv_heads;
  p.head_dim = a->kv.head_dim;
  const dim3 grid(static_cast<unsigned>(writes.size()), static_cast<unsigned>(max_tokens));
  cuda::Launch(cuda::PagedKvTailWriteKernel, grid, 256, 0, stream_, p);
  return absl::OkStatus();
}

const float* CudaBackend::TqTablesOnDevice(const PagedKvLayer& kv) {
  UploadedTables& t = tq_tables_[kv.codecs];
  const int n = 2 * kv.num_kv_heads;
  bool same = t.dev != nullptr && static_cast<int>(t.codec_ids.size()) == n;
  for (int i = 0; same && i < n; ++i) same = kv.codecs[i]->id() == t.codec_ids[i];
  if (same) return static_cast<const float*>(t.dev);
  const std::vector<float> host = cuda::IsSplit(kv.codecs[0]->format())
                                      ? cuda::TqSplitHostTables(kv)
                                      : cuda::TqHostTables(kv);
  const size_t bytes = host.size() * sizeof(float);
  if (t.bytes != bytes) {
    Synchronize();  // queued (or recorded) kernels may read the old copy
    cuda::StepGraphs::MemoryFreed();
    MOE_CUDA_CHECK(cudaFree(t.dev));
    t.dev = nullptr;
    MOE_CUDA_CHECK(cudaMalloc(&t.dev, bytes));
    t.bytes = bytes;
  }
  graphs_->CopyFromHost(t.dev, host.data(), bytes, bytes);  // `host` may go on return
  t.codec_ids.resize(n);
  for (int i = 0; i < n; ++i) t.codec_ids[i] = kv.codecs[i]->id();
  return static_cast<const float*>(t.dev);
}

absl::Status CudaBackend::TakeKvWriteError() {
  if (!kv_verdict_pending_) return absl::OkStatus();
  kv_verdict_pending_ = false;
  // One copy a step: the routing verdict beside it comes along (TakeRoutingError reads it then).
  unsigned long long codes[2] = {~0ull, ~0ull};
  CopyToHost(codes, verdicts_, sizeof(codes));
  KeepRoutingVerdict(codes[1]);
  const unsigned long long code = codes[0];
  if (code == ~0ull) return absl::OkStatus();
  graphs_->Memset(verdicts_, 0xff, sizeof(unsigned long long));
  return absl::InvalidArgumentError(absl::StrCat(
      "KV write at position ", code >> 16, ", kv-head ", (code >> 1) & 0x7fff,
      code % 2 == 0 ? " key: " : " value: ", "KV ", KvFormatName(kv_verdict_format_),
      " quantization: the vector has a non-finite element or its scale exceeds the fp16 range "
      "(not written)"));
}

}  // namespace moe::kernels
