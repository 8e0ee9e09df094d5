// Paged KV cache on the CPU: causal GQA attention read straight from the compressed tiles through
// KvCodec (no dequantized copy of the cache), the newest W positions of each query from the
// 16-bit tail when there is one (PagedAttentionArgs). The writes are in paged_kv_write.cc.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/base/check.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/tensor.h"

namespace moe::kernels {
namespace {

// x[D] = the 16-bit copy of position s's key (role 0) or value (role 1) for kv-head kvh: the
// step's new vector rounded to bf16 when s is new, else the ring's.
void TailVector(const PagedAttentionArgs& a, int64_t s, int kvh, int role, float* x) {
  const PagedKvLayer& kv = a.kv;
  const int D = kv.head_dim, NKV = kv.num_kv_heads;
  if (s >= a.start_pos) {
    const float* src = (role == 0 ? a.k_new : a.v_new) + ((s - a.start_pos) * NKV + kvh) * D;
    for (int j = 0; j < D; ++j) x[j] = Bf16ToF32(F32ToBf16(src[j]));
    return;
  }
  const uint16_t* src = kv.tail + (((s % kv.tail_tokens) * NKV + kvh) * 2 + role) * D;
  for (int j = 0; j < D; ++j) x[j] = Bf16ToF32(src[j]);
}

}  // namespace

void PagedAttentionOnHost(const PagedAttentionArgs& a, int64_t begin, int64_t end) {
  const PagedKvLayer& kv = a.kv;
  MOE_CHECK(kv.num_kv_heads > 0 && a.num_heads % kv.num_kv_heads == 0)
      << "PagedAttention: heads " << a.num_heads << " kv heads " << kv.num_kv_heads;
  const int group = a.num_heads / kv.num_kv_heads;
  const int D = kv.head_dim;
  const int bs = kv.block_size;
  const int64_t W = kv.tail != nullptr ? kv.tail_tokens : 0;
  MOE_CHECK(W == 0 || (a.k_new != nullptr && a.v_new != nullptr))
      << "PagedAttention: a tail needs the step's new keys and values";
  {
    std::vector<float> scores, q_prep, acc(D), x(D);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / a.num_heads;
      const int h = static_cast<int>(job % a.num_heads);
      const int kvh = h / group;
      const KvCodec& kc = *kv.codecs[2 * kvh];
      const KvCodec& vc = *kv.codecs[2 * kvh + 1];
      const int64_t pos = a.start_pos + t;
      const int64_t first =
          a.sliding_window > 0 ? std::max<int64_t>(0, pos - a.sliding_window + 1) : 0;
      q_prep.resize(kc.query_floats());
      kc.PrepareQuery(a.q + (t * a.num_heads + h) * D, q_prep.data());
      scores.resize(pos - first + 1);
      // Positions [first, tail) from the compressed blocks, [tail, pos] in 16 bits.
      const int64_t tail = W > 0 ? std::max(first, pos - W + 1) : pos + 1;
      const float* q = a.q + (t * a.num_heads + h) * D;
      for (int64_t s = tail; s <= pos; ++s) {
        TailVector(a, s, kvh, 0, x.data());
        float dot = 0.f;
        for (int j = 0; j < D; ++j) dot += q[j] * x[j];
        scores[s - first] = a.scale * dot;
      }
      // Logits block by block from the key tiles' codebook entries.
      for (int64_t s = first; s < tail;) {
        const int slot = static_cast<int>(s % bs);
        const int count = static_cast<int>(std::min<int64_t>(bs - slot, tail - s));
        kc.Score(q_prep.data(), ConstKvTile{PagedTileAt(kv, s, kvh, 0), bs}, slot, count, a.scale,
                 scores.data() + (s - first));
        s += count;
      }
      float max_score = -INFINITY;
      for (float sc : scores) max_score = std::max(max_score, sc);
      float denom = 0.f;
      for (float& sc : scores) {
        sc = std::exp(sc - max_score);
        denom += sc;
      }
      for (float& sc : scores) sc /= denom;
      // Values accumulated in the rotated frame, one inverse rotation at the end.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s = first; s < tail;) {
        const int slot = static_cast<int>(s % bs);
        const int count = static_cast<int>(std::min<int64_t>(bs - slot, tail - s));
        vc.AccumulateValues(scores.data() + (s - first), ConstKvTile{PagedTileAt(kv, s, kvh, 1), bs},
                            slot, count, acc.data());
        s += count;
      }
      float* out = a.out + (t * a.num_heads + h) * D;
      vc.FinishValues(acc.data(), out);
      for (int64_t s = tail; s <= pos; ++s) {  // the tail's values, in the original frame
        TailVector(a, s, kvh, 1, x.data());
        const float p = scores[s - first];
        for (int j = 0; j < D; ++j) out[j] += p * x[j];
      }
    }
  }
}

absl::Status CpuBackend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  for (const PagedAttentionArgs& a : batch) {
    pool_.ParallelFor(a.num_tokens * a.num_heads,
                      [&](int64_t begin, int64_t end) { PagedAttentionOnHost(a, begin, end); });
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
