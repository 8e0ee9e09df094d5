// Paged KV cache on the CPU: each token's K and V vectors quantized into their block tiles by
// the layer's codecs (KvCodec::Quantize); the 16-bit tail's ring (PagedKvTailWrite).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/tensor.h"

namespace moe::kernels {

absl::Status PagedKvWriteOnHost(const PagedKvWriteArgs& a) {
  const PagedKvLayer& kv = a.kv;
  const int D = kv.head_dim;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t pos = a.start_pos + t;
    const int slot = static_cast<int>(pos % kv.block_size);
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      for (int role = 0; role < 2; ++role) {
        const float* x = (role == 0 ? a.k : a.v) + (t * kv.num_kv_heads + h) * D;
        KvTile tile{const_cast<uint8_t*>(PagedTileAt(kv, pos, h, role)), kv.block_size};
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

void PagedKvTailWriteOnHost(const PagedKvWriteArgs& a) {
  const PagedKvLayer& kv = a.kv;
  if (kv.tail == nullptr || kv.tail_tokens <= 0) return;
  const int W = kv.tail_tokens, D = kv.head_dim, NKV = kv.num_kv_heads;
  // Only the last W tokens survive in a ring of W slots.
  for (int64_t t = std::max<int64_t>(0, a.num_tokens - W); t < a.num_tokens; ++t) {
    uint16_t* slot = kv.tail + ((a.start_pos + t) % W) * NKV * 2 * D;
    for (int h = 0; h < NKV; ++h) {
      for (int role = 0; role < 2; ++role) {
        const float* x = (role == 0 ? a.k : a.v) + (t * NKV + h) * D;
        uint16_t* y = slot + (2 * h + role) * D;
        for (int j = 0; j < D; ++j) y[j] = F32ToBf16(x[j]);
      }
    }
  }
}

absl::Status CpuBackend::PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch) {
  for (const PagedKvWriteArgs& a : batch) PagedKvTailWriteOnHost(a);
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) {
  for (const PagedKvWriteArgs& a : batch) MOE_RETURN_IF_ERROR(PagedKvWriteOnHost(a));
  return absl::OkStatus();
}

}  // namespace moe::kernels
