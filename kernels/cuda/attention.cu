// Attention over the contiguous cache (CudaBackend::Attention): the flash kernel of
// attention_common.cuh reading ContiguousKv, split over keys for decode.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels {

void CudaBackend::Attention(const AttentionArgs& a) {
  MOE_CHECK(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.head_dim > 0 &&
            a.head_dim <= 256 && a.start_pos >= 0)
      << "Attention: heads " << a.num_heads << " kv heads " << a.num_kv_heads << " head_dim "
      << a.head_dim << " start_pos " << a.start_pos;
  if (a.num_tokens == 0) return;
  cuda::ContiguousKv src{a.k_cache, a.v_cache, static_cast<int64_t>(a.num_kv_heads) * a.head_dim,
                         a.head_dim};
  cuda::SeqDesc sq;
  sq.start_pos = a.start_pos;
  sq.num_tokens = a.num_tokens;
  cuda::RunAttention(
      a, {sq}, src, num_sms_, [this](size_t bytes) { return Reserve(work_, bytes); },
      [this](const void* host, size_t bytes) { return StageHostArgs(args2_, host, bytes); },
      stream_);
}

}  // namespace moe::kernels
