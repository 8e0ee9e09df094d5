// Sampling on the GPU (Backend::Sample; cpu/sample.cc is the reference): one block per sampled
// row. Penalties and temperature are applied in place; the first candidate is the largest sort
// key. The cut points of top-k, top-p and the draw, which the CPU finds by sorting and summing,
// come from a radix select over 56-bit sort keys (the logit's order bits, then the id reversed:
// every key is distinct, and descending key order is the candidates' order), 8 bits a pass, with
// counts or masses per bucket summed in fp64 shared-memory histograms. The masses are the CPU's
// (exp of the fp32 difference to the max, in fp64), summed in another order: a cut can differ from
// the CPU's only when a cumulative mass lies within rounding (~1e-16) of its target.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kSampleThreads = 1024;
constexpr int kIdBits = 24;  // vocabularies up to 2^24 - 1 tokens
constexpr int kKeyBits = 32 + kIdBits;
constexpr int kDigitBits = 8;
constexpr int kBuckets = 1 << kDigitBits;
constexpr uint32_t kIdMask = (1u << kIdBits) - 1;

// Larger key = earlier candidate: larger logit, then lower id. Never 0 for a non-NaN logit.
__device__ __forceinline__ uint64_t SortKey(float l, int64_t id) {
  uint32_t u = l == 0.f ? 0u : __float_as_uint(l);  // -0 ties with +0, as on the CPU
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t{u} << kIdBits) | (kIdMask - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t IdOf(uint64_t key) {
  return static_cast<int32_t>(kIdMask - static_cast<uint32_t>(key & kIdMask));
}

struct SampleShared {
  double hist[kBuckets];
  double partial[kSampleThreads / kWarp];
  uint64_t keys[kSampleThreads / kWarp];
  double above;  // the chosen bucket's predecessors' weight
  int digit;     // the chosen bucket, -1: no bucket reaches the target
  int num_top;
  uint64_t top_keys[kMaxTopLogprobs];
};

template <typename T, typename Op>
__device__ T WarpReduce(T v, Op op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread gets op over the block; `partial` holds one value per warp.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T* partial) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = WarpReduce(v, op);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < kSampleThreads / kWarp; ++w) v = op(v, partial[w]);
  return v;
}

// The row being sampled and its current candidates: keys >= floor with weight >= min_p.
struct Row {
  const float* logits;
  int64_t vocab;
  float max_logit;
  uint64_t floor = 0;
  double min_p = 0;
  __device__ double Weight(float l) const { return exp(static_cast<double>(l - max_logit)); }
};

// hist[bucket] += w for each active lane, one shared atomic per distinct bucket of the warp (the
// buckets of a pass are few: logits share their leading bits). The whole warp calls this.
__device__ __forceinline__ void AddToBucket(double* hist, bool active, int bucket, double w) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, bucket);
  double sum = 0;
  for (unsigned m = peers; m != 0; m &= m - 1) sum += __shfl_sync(peers, w, __ffs(m) - 1);
  if (static_cast<int>(threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[bucket], sum);
}

// The first candidate, in descending key order, at which the cumulative weight (1 per candidate
// when kCount, else its mass) reaches `target`: > target when `strict`, else >= target. Returns
// its key, or 0 when the candidates' total does not reach it.
template <bool kCount>
__device__ uint64_t Select(const Row& r, double target, bool strict, SampleShared& sh) {
  uint64_t prefix = 0, mask = 0;
  double above = 0;
  const int lane = threadIdx.x % kWarp;
  for (int shift = kKeyBits - kDigitBits; shift >= 0; shift -= kDigitBits) {
    for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) sh.hist[b] = 0;
    __syncthreads();
    for (int64_t base = 0; base < r.vocab; base += blockDim.x) {  // uniform trip count
      const int64_t i = base + threadIdx.x;
      bool active = false;
      uint64_t key = 0;
      double w = 1;
      if (i < r.vocab) {
        const float l = r.logits[i];
        key = SortKey(l, i);
        active = (key & mask) == prefix && key >= r.floor;
        if (active && (!kCount || r.min_p > 0)) {
          const double p = r.Weight(l);
          active = p >= r.min_p;
          if (!kCount) w = p;
        }
      }
      AddToBucket(sh.hist, active, static_cast<int>((key >> shift) & (kBuckets - 1)), w);
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {  // warp 0: lane j scans buckets 255 - 8j down to 248 - 8j
      constexpr int kPerLane = kBuckets / kWarp;
      const int top = kBuckets - 1 - lane * kPerLane;
      double mine = 0;
      for (int j = 0; j < kPerLane; ++j) mine += sh.hist[top - j];
      double before = mine;  // inclusive scan over lanes, lane 0 first
#pragma unroll
      for (int o = 1; o < kWarp; o <<= 1) {
        const double v = __shfl_up_sync(0xffffffffu, before, o);
        if (lane >= o) before += v;
      }
      double run = above + before - mine;
      int digit = -1;
      for (int j = 0; j < kPerLane && digit < 0; ++j) {
        const double next = run + sh.hist[top - j];
        if (strict ? next > target : next >= target) {
          digit = top - j;
        } else {
          run = next;
        }
      }
      const unsigned hit = __ballot_sync(0xffffffffu, digit >= 0);
      if (hit == 0 && lane == 0) sh.digit = -1;
      if (hit != 0 && lane == __ffs(hit) - 1) {
        sh.digit = digit;
        sh.above = run;
      }
    }
    __syncthreads();
    if (sh.digit < 0) return 0;
    prefix |= static_cast<uint64_t>(sh.digit) << shift;
    mask |= static_cast<uint64_t>(kBuckets - 1) << shift;
    above = sh.above;
  }
  return prefix;
}

// Sum of the candidates' masses, and their smallest key.
__device__ double Mass(const Row& r, SampleShared& sh) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < r.vocab; i += blockDim.x) {
    const float l = r.logits[i];
    if (SortKey(l, i) < r.floor) continue;
    const double p = r.Weight(l);
    if (p >= r.min_p) sum += p;
  }
  return BlockReduce(sum, [](double a, double b) { return a + b; }, sh.partial);
}
__device__ uint64_t LastCandidate(const Row& r, SampleShared& sh) {
  uint64_t last = ~uint64_t{0};
  for (int64_t i = threadIdx.x; i < r.vocab; i += blockDim.x) {
    const float l = r.logits[i];
    const uint64_t key = SortKey(l, i);
    if (key >= r.floor && r.Weight(l) >= r.min_p && key < last) last = key;
  }
  return BlockReduce(last, [](uint64_t a, uint64_t b) { return a < b ? a : b; }, sh.keys);
}

__global__ __launch_bounds__(kSampleThreads) void SampleKernel(float* logits, int64_t vocab,
                                                               const SampleParams* params,
                                                               const PenaltyToken* penalties,
                                                               SampledToken* out) {
  __shared__ SampleShared sh;
  const SampleParams p = params[blockIdx.x];
  float* l = logits + p.row * vocab;
  // The CPU's float expressions, rounded the same way (no FMA contraction).
  for (int j = threadIdx.x; j < p.penalty_count; j += blockDim.x) {
    const PenaltyToken t = penalties[p.penalty_begin + j];
    float x = l[t.id];
    if (p.repetition_penalty != 1.f) {
      x = x > 0 ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
    }
    if (t.generated > 0 && (p.presence_penalty != 0.f || p.frequency_penalty != 0.f)) {
      x = __fsub_rn(x, __fadd_rn(p.presence_penalty,
                                 __fmul_rn(p.frequency_penalty, static_cast<float>(t.generated))));
    }
    l[t.id] = x;
  }
  __syncthreads();
  const bool greedy = p.temperature == 0.f;
  uint64_t first = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float x = l[i];
    if (!greedy) l[i] = x = __fdiv_rn(x, p.temperature);
    const uint64_t key = SortKey(x, i);
    if (key > first) first = key;
  }
  first = BlockReduce(first, [](uint64_t a, uint64_t b) { return a > b ? a : b; }, sh.keys);
  Row r{l, vocab, l[IdOf(first)]};

  SampledToken res;
  res.id = IdOf(first);
  if (!greedy) {
    if (p.top_k > 0 && p.top_k < vocab) r.floor = Select<true>(r, p.top_k, false, sh);
    if (p.top_p < 1.f) {
      const double target = p.top_p * Mass(r, sh);
      const uint64_t cut = Select<false>(r, target, false, sh);
      if (cut != 0) r.floor = cut;  // else rounding put the target past every candidate: keep all
    }
    r.min_p = p.min_p;
    const uint64_t drawn = Select<false>(r, p.uniform * Mass(r, sh), true, sh);
    res.id = IdOf(drawn != 0 ? drawn : LastCandidate(r, sh));
  }

  if (p.logprobs || p.top_logprobs > 0) {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += r.Weight(l[i]);
    sum = BlockReduce(sum, [](double a, double b) { return a + b; }, sh.partial);
    const float log_norm = r.max_logit + static_cast<float>(log(sum));
    res.logprob = l[res.id] - log_norm;
    const int n = static_cast<int>(Min64(p.top_logprobs, vocab));
    if (n > 0) {
      const Row all{l, vocab, r.max_logit};
      const uint64_t nth = Select<true>(all, n, false, sh);
      if (threadIdx.x == 0) sh.num_top = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const uint64_t key = SortKey(l[i], i);
        if (key >= nth) sh.top_keys[atomicAdd(&sh.num_top, 1)] = key;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int a = 1; a < n; ++a) {  // insertion sort, descending
          const uint64_t key = sh.top_keys[a];
          int b = a;
          for (; b > 0 && sh.top_keys[b - 1] < key; --b) sh.top_keys[b] = sh.top_keys[b - 1];
          sh.top_keys[b] = key;
        }
        for (int a = 0; a < n; ++a) {
          res.top_ids[a] = IdOf(sh.top_keys[a]);
          res.top_logprobs[a] = l[res.top_ids[a]] - log_norm;
        }
      }
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = res;
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Sample(const SampleArgs& a) {
  const size_t rows = a.params.size();
  if (rows == 0) return;
  MOE_CHECK(a.vocab_size > 0 && a.vocab_size <= cuda::kIdMask)
      << "Sample: vocabulary " << a.vocab_size << " (at most " << cuda::kIdMask << " on CUDA)";
  for (const SampleParams& p : a.params) {
    MOE_CHECK(p.top_logprobs >= 0 && p.top_logprobs <= kMaxTopLogprobs)
        << "Sample: top_logprobs " << p.top_logprobs;
    MOE_CHECK(p.penalty_begin >= 0 && p.penalty_count >= 0 &&
              p.penalty_begin + p.penalty_count <= static_cast<int64_t>(a.penalties.size()))
        << "Sample: penalty entries out of range";
  }
  const auto* params = static_cast<const SampleParams*>(
      StageHostArgs(args_, a.params.data(), rows * sizeof(SampleParams)));
  const PenaltyToken* penalties =
      a.penalties.empty() ? nullptr
                          : static_cast<const PenaltyToken*>(StageHostArgs(
                                args2_, a.penalties.data(), a.penalties.size() * sizeof(PenaltyToken)));
  auto* out = static_cast<SampledToken*>(Reserve(sampled_, rows * sizeof(SampledToken)));
  cuda::SampleKernel<<<static_cast<unsigned>(rows), cuda::kSampleThreads, 0, stream_>>>(
      a.logits, a.vocab_size, params, penalties, out);
  MOE_CUDA_CHECK(cudaGetLastError());
  CopyToHost(a.out, out, rows * sizeof(SampledToken));
}

}  // namespace moe::kernels
