// Paged KV cache on the CPU: causal GQA attention read straight from the compressed tiles through
// KvCodec (no dequantized copy of the cache). The writes are in paged_kv_write.cc.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/base/check.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void PagedAttentionOnHost(const PagedAttentionArgs& a, int64_t begin, int64_t end) {
  const PagedKvLayer& kv = a.kv;
  MOE_CHECK(kv.num_kv_heads > 0 && a.num_heads % kv.num_kv_heads == 0)
      << "PagedAttention: heads " << a.num_heads << " kv heads " << kv.num_kv_heads;
  const int group = a.num_heads / kv.num_kv_heads;
  const int D = kv.head_dim;
  const int bs = kv.block_size;
  {
    std::vector<float> scores, q_prep, acc(D);
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
      // Logits block by block from the key tiles' codebook entries.
      for (int64_t s = first; s <= pos;) {
        const int slot = static_cast<int>(s % bs);
        const int count = static_cast<int>(std::min<int64_t>(bs - slot, pos + 1 - s));
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
      for (int64_t s = first; s <= pos;) {
        const int slot = static_cast<int>(s % bs);
        const int count = static_cast<int>(std::min<int64_t>(bs - slot, pos + 1 - s));
        vc.AccumulateValues(scores.data() + (s - first), ConstKvTile{PagedTileAt(kv, s, kvh, 1), bs},
                            slot, count, acc.data());
        s += count;
      }
      vc.FinishValues(acc.data(), a.out + (t * a.num_heads + h) * D);
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
