// Paged KV cache on the CPU: quantized writes into block tiles and causal GQA attention read
// straight from the compressed tiles through KvCodec (no dequantized copy of the cache).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {
namespace {

const uint8_t* TileAt(const PagedKvLayer& kv, int64_t pos, int kv_head, int role) {
  const int32_t block = kv.block_table[pos / kv.block_size];
  return kv.layer_base + block * kv.block_stride + (2 * kv_head + role) * kv.tile_bytes;
}

}  // namespace

absl::Status PagedKvWriteOnHost(const PagedKvWriteArgs& a) {
  const PagedKvLayer& kv = a.kv;
  const int D = kv.head_dim;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t pos = a.start_pos + t;
    const int slot = static_cast<int>(pos % kv.block_size);
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      for (int role = 0; role < 2; ++role) {
        const float* x = (role == 0 ? a.k : a.v) + (t * kv.num_kv_heads + h) * D;
        KvTile tile{const_cast<uint8_t*>(TileAt(kv, pos, h, role)), kv.block_size};
        const absl::Status st = kv.codecs[2 * h + role]->Quantize(x, tile, slot);
        if (!st.ok()) {
          return absl::Status(st.code(), absl::StrCat("KV write at position ", pos, ", kv-head ",
                                                      h, role == 0 ? " key: " : " value: ",
                                                      st.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

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
        kc.Score(q_prep.data(), ConstKvTile{TileAt(kv, s, kvh, 0), bs}, slot, count, a.scale,
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
        vc.AccumulateValues(scores.data() + (s - first), ConstKvTile{TileAt(kv, s, kvh, 1), bs},
                            slot, count, acc.data());
        s += count;
      }
      vc.FinishValues(acc.data(), a.out + (t * a.num_heads + h) * D);
    }
  }
}

absl::Status CpuBackend::PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) {
  for (const PagedKvWriteArgs& a : batch) MOE_RETURN_IF_ERROR(PagedKvWriteOnHost(a));
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  for (const PagedAttentionArgs& a : batch) {
    pool_.ParallelFor(a.num_tokens * a.num_heads,
                      [&](int64_t begin, int64_t end) { PagedAttentionOnHost(a, begin, end); });
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
