// Sampling on the GPU (Backend::Sample; cpu/sample.cc is the reference): one block per sampled
// row. Penalties and temperature are applied in place; the first candidate is the largest sort
// key. The cut points of top-k, top-p and the draw, which the CPU finds by sorting and summing,
// come from a radix select over 56-bit sort keys (the logit's order bits, then the id reversed:
// every key is distinct, and descending key order is the candidates' order): 11 bits on the first
// pass, 9 on the next, counts, fixed-point masses and a key per bucket in shared memory; once the
// chosen bucket holds at most 2048 candidates they are gathered, sorted and scanned in shared
// memory (two passes over the row in all). The masses are the CPU's (backend.h: exp of the fp32
// difference to the max in fp64, then fixed point) and their sums are exact, so the cuts are the
// CPU's.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kSampleThreads = 1024;
constexpr int kIdBits = 24;  // vocabularies up to 2^24 - 1 tokens
constexpr int kKeyBits = 32 + kIdBits;
// Digits of the radix select: the first 11 bits (sign, exponent, 2 mantissa bits of the logit),
// then 9 at a time (11 + 5 * 9 = 56).
constexpr int kFirstDigitBits = 11;
constexpr int kDigitBits = 9;
constexpr int kMaxBuckets = 1 << kFirstDigitBits;
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

// fn(i, logit) for every logit of a row. A block reads a row alone on its SM: kInFlight loads per
// thread before any use keep enough bytes in flight (one at a time, a pass was latency-bound).
template <typename Fn>
__device__ __forceinline__ void ForEachLogit(const float* row, int64_t vocab, Fn&& fn) {
  constexpr int kInFlight = 8;
  for (int64_t base = threadIdx.x; base < vocab; base += kInFlight * kSampleThreads) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t i = base + u * kSampleThreads;
      v[u] = i < vocab ? row[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t i = base + u * kSampleThreads;
      if (i < vocab) fn(i, v[u]);
    }
  }
}

constexpr int kListCap = 2048;  // candidates of a chosen bucket gathered into shared memory

struct SampleShared {
  union {
    // Per bucket of a pass: the summed mass as two words (shared atomics on 32 bits are native,
    // on 64 a CAS loop), the candidates (mass_lo in a count select), and a key (the bucket's key
    // when it holds one candidate).
    struct {
      uint32_t mass_lo[kMaxBuckets];
      uint32_t mass_hi[kMaxBuckets];
      int count[kMaxBuckets];
      uint64_t key[kMaxBuckets];
    } hist;
    // The chosen bucket's candidates, once few enough: sorted by key, then scanned.
    struct {
      uint64_t key[kListCap];
      uint64_t mass[kListCap];
    } list;
  };
  uint64_t partial_mass[kSampleThreads / kWarp];
  double partial[kSampleThreads / kWarp];
  uint64_t keys[kSampleThreads / kWarp];
  double target;   // the pass's target (scaled on the first pass when relative to the total)
  uint64_t above;  // the chosen bucket's predecessors' mass
  int bucket;      // the chosen bucket, -1: no bucket reaches the target
  int list_size;
  uint64_t found;
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

// The row being sampled and its current candidates: keys >= floor with p >= min_p.
struct Row {
  const float* logits;
  int64_t vocab;
  float max_logit;
  uint64_t floor = 0;
  double min_p = 0;
  __device__ double P(float l) const { return exp(static_cast<double>(l - max_logit)); }
};

// backend.h's fixed-point mass, rounded to nearest even as the CPU's nearbyint.
__device__ __forceinline__ uint64_t Mass(double p) { return __double2ull_rn(p * 0x1p39); }

// Adds a candidate to its bucket: the mass in two 32-bit words (shared atomics on 32 bits are
// native, on 64 a CAS loop), the carry of the low one taken from the value it had (exact in any
// order); the count when it is not the mass. `key` is stored without an atomic: it is read only
// when the bucket holds one candidate, which then was its only writer.
template <bool kCount>
__device__ __forceinline__ void AddToBucket(SampleShared& sh, int bucket, uint64_t mass,
                                            uint64_t key) {
  const uint32_t lo = static_cast<uint32_t>(mass);
  const uint32_t before = atomicAdd(&sh.hist.mass_lo[bucket], lo);
  const uint32_t hi = static_cast<uint32_t>(mass >> 32) + (before + lo < before ? 1u : 0u);
  if (hi != 0) atomicAdd(&sh.hist.mass_hi[bucket], hi);
  if (!kCount) atomicAdd(&sh.hist.count[bucket], 1);
  sh.hist.key[bucket] = key;
}

// Whether logit l (key `key`) is a candidate of the row with key & mask == prefix; its mass (1 in
// a count select) goes to *mass.
template <bool kCount>
__device__ __forceinline__ bool InBucket(const Row& r, uint64_t key, float l, uint64_t prefix,
                                         uint64_t mask, uint64_t* mass) {
  if ((key & mask) != prefix || key < r.floor) return false;
  *mass = 1;
  if (!kCount || r.min_p > 0) {
    const double p = r.P(l);
    if (p < r.min_p) return false;
    if (!kCount) *mass = Mass(p);
  }
  return true;
}

// Select's end game once the chosen bucket (candidates with key & mask == prefix) holds at most
// kListCap: one pass gathers them into shared memory, a bitonic sort orders them, and a scan of
// their masses after `above` finds the candidate that reaches `target`.
template <bool kCount>
__device__ uint64_t SelectInList(const Row& r, uint64_t prefix, uint64_t mask, uint64_t above,
                                 double target, bool strict, SampleShared& sh) {
  if (threadIdx.x == 0) sh.list_size = 0;
  __syncthreads();
  ForEachLogit(r.logits, r.vocab, [&](int64_t i, float l) {
    const uint64_t key = SortKey(l, i);
    uint64_t mass;
    if (!InBucket<kCount>(r, key, l, prefix, mask, &mass)) return;
    const int at = atomicAdd(&sh.list_size, 1);
    sh.list.key[at] = key;
    sh.list.mass[at] = mass;
  });
  __syncthreads();
  const int n = sh.list_size;
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + static_cast<int>(threadIdx.x); i < size; i += blockDim.x) {
    sh.list.key[i] = 0;  // padding sorts last and weighs nothing
    sh.list.mass[i] = 0;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {  // bitonic sort, descending
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const bool descending = (i & k) == 0;
          const uint64_t a = sh.list.key[i], b = sh.list.key[partner];
          if (descending ? a < b : a > b) {
            sh.list.key[i] = b;
            sh.list.key[partner] = a;
            const uint64_t m = sh.list.mass[i];
            sh.list.mass[i] = sh.list.mass[partner];
            sh.list.mass[partner] = m;
          }
        }
      }
      __syncthreads();
    }
  }
  // Inclusive scan of the masses: thread t owns the contiguous run [t * per, (t + 1) * per).
  const int per = (size + kSampleThreads - 1) / kSampleThreads;
  const int begin = static_cast<int>(threadIdx.x) * per;
  uint64_t mine = 0;
  for (int i = begin; i < begin + per && i < size; ++i) mine += sh.list.mass[i];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  uint64_t incl = mine;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (threadIdx.x == 0) sh.found = 0;
  if (lane == kWarp - 1) sh.partial_mass[warp] = incl;
  __syncthreads();
  uint64_t run = above + incl - mine;
  for (int w = 0; w < warp; ++w) run += sh.partial_mass[w];
  auto reaches = [&](uint64_t cum) {
    return strict ? static_cast<double>(cum) > target : static_cast<double>(cum) >= target;
  };
  for (int i = begin; i < begin + per && i < n; ++i) {
    const uint64_t next = run + sh.list.mass[i];
    if (reaches(next)) {
      if (!reaches(run)) sh.found = sh.list.key[i];  // the one candidate where it turns
      break;
    }
    run = next;
  }
  __syncthreads();
  const uint64_t found = sh.found;
  __syncthreads();
  return found;
}

// The first candidate, in descending key order, at which the cumulative weight (1 per candidate
// when kCount, else its mass) reaches the target: > target when `strict`, else >= target. The
// target is `target`, or, when `of_total`, `target` times the candidates' total weight (summed
// from the first pass's buckets). Returns its key, or 0 when the total does not reach it.
template <bool kCount>
__device__ uint64_t Select(const Row& r, double target, bool of_total, bool strict,
                           SampleShared& sh) {
  uint64_t prefix = 0, mask = 0, above = 0;
  const int lane = threadIdx.x % kWarp;
  for (int bits = kFirstDigitBits, shift = kKeyBits - kFirstDigitBits;; bits = kDigitBits) {
    const int buckets = 1 << bits;
    for (int b = threadIdx.x; b < buckets; b += blockDim.x) {
      sh.hist.mass_lo[b] = 0;
      sh.hist.mass_hi[b] = 0;
      sh.hist.count[b] = 0;
    }
    __syncthreads();
    ForEachLogit(r.logits, r.vocab, [&](int64_t i, float l) {
      const uint64_t key = SortKey(l, i);
      uint64_t mass;
      if (!InBucket<kCount>(r, key, l, prefix, mask, &mass)) return;
      AddToBucket<kCount>(sh, static_cast<int>((key >> shift) & (buckets - 1)), mass, key);
    });
    __syncthreads();
    if (threadIdx.x < kWarp) {  // warp 0: lane j scans its share of the buckets, largest first
      const int per_lane = buckets / kWarp;
      const int top = buckets - 1 - lane * per_lane;
      auto bucket_mass = [&](int b) {
        return (static_cast<uint64_t>(sh.hist.mass_hi[b]) << 32) + sh.hist.mass_lo[b];
      };
      uint64_t mine = 0;
      for (int j = 0; j < per_lane; ++j) mine += bucket_mass(top - j);
      uint64_t before = mine;  // inclusive scan over lanes, lane 0 first
#pragma unroll
      for (int o = 1; o < kWarp; o <<= 1) {
        const uint64_t v = __shfl_up_sync(0xffffffffu, before, o);
        if (lane >= o) before += v;
      }
      if (of_total) {  // first pass: every candidate is in some bucket
        target *= static_cast<double>(__shfl_sync(0xffffffffu, before, kWarp - 1));
      }
      if (lane == 0) sh.target = target;
      uint64_t run = above + before - mine;
      int bucket = -1;
      for (int j = 0; j < per_lane && bucket < 0; ++j) {
        const uint64_t next = run + bucket_mass(top - j);
        const double cum = static_cast<double>(next);
        if (strict ? cum > target : cum >= target) {
          bucket = top - j;
        } else {
          run = next;
        }
      }
      const unsigned hit = __ballot_sync(0xffffffffu, bucket >= 0);
      if (hit == 0 && lane == 0) sh.bucket = -1;
      if (hit != 0 && lane == __ffs(hit) - 1) {
        sh.bucket = bucket;
        sh.above = run;
      }
    }
    __syncthreads();
    const int bucket = sh.bucket;
    const int count =
        bucket < 0 ? 0 : kCount ? static_cast<int>(sh.hist.mass_lo[bucket]) : sh.hist.count[bucket];
    const uint64_t found = bucket < 0 ? 0 : sh.hist.key[bucket];
    above = sh.above;
    target = sh.target;
    __syncthreads();  // everyone has read the buckets before they are cleared again
    if (bucket < 0 || count == 1 || shift == 0) return found;
    prefix |= static_cast<uint64_t>(bucket) << shift;
    mask |= static_cast<uint64_t>(buckets - 1) << shift;
    if (count <= kListCap) return SelectInList<kCount>(r, prefix, mask, above, target, strict, sh);
    of_total = false;
    shift -= kDigitBits;
  }
}

// The candidates' smallest key (the last candidate).
__device__ uint64_t LastCandidate(const Row& r, SampleShared& sh) {
  uint64_t last = ~uint64_t{0};
  ForEachLogit(r.logits, r.vocab, [&](int64_t i, float l) {
    const uint64_t key = SortKey(l, i);
    if (key >= r.floor && key < last && r.P(l) >= r.min_p) last = key;
  });
  return BlockReduce(last, [](uint64_t a, uint64_t b) { return a < b ? a : b; }, sh.keys);
}

__global__ __launch_bounds__(kSampleThreads) void SampleKernel(float* logits, int64_t vocab,
                                                               const SampleParams* params,
                                                               const PenaltyToken* penalties,
                                                               SampledToken* out) {
  WaitForPriorKernel();
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
  ForEachLogit(l, vocab, [&](int64_t i, float x) {
    if (!greedy) l[i] = x = __fdiv_rn(x, p.temperature);
    const uint64_t key = SortKey(x, i);
    if (key > first) first = key;
  });
  first = BlockReduce(first, [](uint64_t a, uint64_t b) { return a > b ? a : b; }, sh.keys);
  Row r{l, vocab, l[IdOf(first)]};

  SampledToken res;
  res.id = IdOf(first);
  if (!greedy) {
    if (p.top_k > 0 && p.top_k < vocab) r.floor = Select<true>(r, p.top_k, false, false, sh);
    if (p.top_p < 1.f) {
      const uint64_t cut = Select<false>(r, p.top_p, true, false, sh);
      if (cut != 0) r.floor = cut;  // else rounding put the target past every candidate: keep all
    }
    r.min_p = p.min_p;
    const uint64_t drawn = Select<false>(r, p.uniform, true, true, sh);
    res.id = IdOf(drawn != 0 ? drawn : LastCandidate(r, sh));
  }

  if (p.logprobs || p.top_logprobs > 0) {
    double sum = 0;
    ForEachLogit(l, vocab, [&](int64_t, float x) { sum += r.P(x); });
    sum = BlockReduce(sum, [](double a, double b) { return a + b; }, sh.partial);
    const float log_norm = r.max_logit + static_cast<float>(log(sum));
    res.logprob = l[res.id] - log_norm;
    const int n = static_cast<int>(Min64(p.top_logprobs, vocab));
    if (n > 0) {
      const Row all{l, vocab, r.max_logit};
      const uint64_t nth = Select<true>(all, n, false, false, sh);
      if (threadIdx.x == 0) sh.num_top = 0;
      __syncthreads();
      ForEachLogit(l, vocab, [&](int64_t i, float x) {
        const uint64_t key = SortKey(x, i);
        if (key >= nth) sh.top_keys[atomicAdd(&sh.num_top, 1)] = key;
      });
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
  MOE_CHECK(a.vocab_size <= cuda::kIdMask)
      << "Sample: vocabulary " << a.vocab_size << " (at most " << cuda::kIdMask << " on CUDA)";
  const absl::Status valid = ValidateSampleArgs(a);
  MOE_CHECK(valid.ok()) << "Sample: " << valid;
  const auto* params = static_cast<const SampleParams*>(
      StageHostArgs(args_, a.params.data(), rows * sizeof(SampleParams)));
  const size_t penalty_bytes = a.penalties.size() * sizeof(PenaltyToken);
  const auto* penalties = a.penalties.empty() ? nullptr
                                              : static_cast<const PenaltyToken*>(StageHostArgs(
                                                    args2_, a.penalties.data(), penalty_bytes));
  auto* out = static_cast<SampledToken*>(Reserve(sampled_, rows * sizeof(SampledToken)));
  cuda::Launch(cuda::SampleKernel, static_cast<unsigned>(rows), cuda::kSampleThreads, 0, stream_,
               a.logits, a.vocab_size, params, penalties, out);
  CopyToHost(a.out, out, rows * sizeof(SampledToken));
}

}  // namespace moe::kernels
