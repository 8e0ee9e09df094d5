// MakeBackend: the one place that knows which backends this binary was built with.
#include "kernels/backend.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/cpu/cpu_backend.h"
#if MOE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace moe::kernels {

const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

// Host-staged defaults (correct on any backend, slow: every touched tile crosses to the host and
// back each call). CUDA falls back to them for the layers its kernels do not cover
// (cuda::ChoosePath: TurboQuant at a head_dim below 32 or not a power of two, the split formats
// off head_dim 128, other rotations; the prod formats, which no KV cache takes: engine::CheckCacheFormat).
namespace {

absl::Status PagedKvWriteStaged(Backend& backend, const PagedKvWriteArgs& a) {
  if (a.num_tokens == 0) return absl::OkStatus();
  const PagedKvLayer& kv = a.kv;
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  std::vector<float> k(a.num_tokens * row), v(a.num_tokens * row);
  backend.CopyToHost(k.data(), a.k, k.size() * sizeof(float));
  backend.CopyToHost(v.data(), a.v, v.size() * sizeof(float));
  // Stage each touched block (all kv-heads, K and V) through a host copy.
  const int64_t first = a.start_pos / kv.block_size;
  const int64_t last = (a.start_pos + a.num_tokens - 1) / kv.block_size;
  std::vector<uint8_t> host((last - first + 1) * kv.block_stride);
  std::vector<int32_t> table(last + 1, 0);
  for (int64_t b = first; b <= last; ++b) {
    backend.CopyToHost(host.data() + (b - first) * kv.block_stride,
               kv.layer_base + kv.block_table[b] * kv.block_stride, kv.block_stride);
    table[b] = static_cast<int32_t>(b - first);
  }
  PagedKvWriteArgs h = a;
  h.kv.layer_base = host.data();
  h.kv.block_table = table.data();
  h.k = k.data();
  h.v = v.data();
  MOE_RETURN_IF_ERROR(PagedKvWriteOnHost(h));
  for (int64_t b = first; b <= last; ++b) {
    backend.CopyToDevice(kv.layer_base + kv.block_table[b] * kv.block_stride,
                 host.data() + (b - first) * kv.block_stride, kv.block_stride);
  }
  return absl::OkStatus();
}

// Elements of a layer's tail ring: [W][NKV][2][D].
int64_t TailElements(const PagedKvLayer& kv) {
  return static_cast<int64_t>(kv.tail_tokens) * kv.num_kv_heads * 2 * kv.head_dim;
}

void PagedAttentionStaged(Backend& backend, const PagedAttentionArgs& a) {
  if (a.num_tokens == 0) return;
  const PagedKvLayer& kv = a.kv;
  const int64_t blocks = (a.start_pos + a.num_tokens + kv.block_size - 1) / kv.block_size;
  std::vector<uint8_t> host(blocks * kv.block_stride);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    backend.CopyToHost(host.data() + b * kv.block_stride,
               kv.layer_base + kv.block_table[b] * kv.block_stride, kv.block_stride);
    table[b] = static_cast<int32_t>(b);
  }
  const int64_t n = a.num_tokens * a.num_heads * kv.head_dim;
  std::vector<float> q(n), out(n);
  backend.CopyToHost(q.data(), a.q, n * sizeof(float));
  PagedAttentionArgs h = a;
  h.kv.layer_base = host.data();
  h.kv.block_table = table.data();
  h.q = q.data();
  h.out = out.data();
  // The tail: its ring and the step's new K/V through host copies as well.
  const int64_t kv_n = a.num_tokens * kv.num_kv_heads * kv.head_dim;
  std::vector<uint16_t> ring(kv.tail != nullptr ? TailElements(kv) : 0);
  std::vector<float> k_new(kv.tail != nullptr ? kv_n : 0), v_new(k_new.size());
  if (kv.tail != nullptr) {
    backend.CopyToHost(ring.data(), kv.tail, ring.size() * sizeof(uint16_t));
    backend.CopyToHost(k_new.data(), a.k_new, kv_n * sizeof(float));
    backend.CopyToHost(v_new.data(), a.v_new, kv_n * sizeof(float));
    h.kv.tail = ring.data();
    h.k_new = k_new.data();
    h.v_new = v_new.data();
  }
  PagedAttentionOnHost(h, 0, a.num_tokens * a.num_heads);
  backend.CopyToDevice(a.out, out.data(), n * sizeof(float));
}

}  // namespace

absl::Status Backend::PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch) {
  for (const PagedKvWriteArgs& a : batch) {
    if (a.kv.tail == nullptr || a.num_tokens == 0) continue;
    const int64_t kv_n = a.num_tokens * a.kv.num_kv_heads * a.kv.head_dim;
    std::vector<uint16_t> ring(TailElements(a.kv));
    std::vector<float> k(kv_n), v(kv_n);
    CopyToHost(ring.data(), a.kv.tail, ring.size() * sizeof(uint16_t));
    CopyToHost(k.data(), a.k, kv_n * sizeof(float));
    CopyToHost(v.data(), a.v, kv_n * sizeof(float));
    PagedKvWriteArgs h = a;
    h.kv.tail = ring.data();
    h.k = k.data();
    h.v = v.data();
    PagedKvTailWriteOnHost(h);
    CopyToDevice(a.kv.tail, ring.data(), ring.size() * sizeof(uint16_t));
  }
  return absl::OkStatus();
}

absl::Status Backend::PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) {
  for (const PagedKvWriteArgs& a : batch) MOE_RETURN_IF_ERROR(PagedKvWriteStaged(*this, a));
  return absl::OkStatus();
}

absl::Status Backend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  for (const PagedAttentionArgs& a : batch) PagedAttentionStaged(*this, a);
  return absl::OkStatus();
}

void Backend::NoteRoutingFault(int32_t layer, RoutingFault fault) {
  routing_fault_ = std::min(routing_fault_, 2 * static_cast<uint32_t>(std::max(layer, 0)) + fault);
}

absl::Status Backend::RoutingError(uint32_t code) {
  if (code == kNoRoutingFault) return absl::OkStatus();
  const uint32_t layer = code / 2;
  return absl::InvalidArgumentError(
      code % 2 == kNonFiniteLogits
          ? absl::StrCat("layer ", layer, ": a token's router logits are not finite (NaN or "
                         "infinity); its experts were not run")
          : absl::StrCat("layer ", layer, ": an expert id outside the layer's experts was routed; "
                         "that pair was skipped"));
}

absl::Status Backend::TakeRoutingError() {
  const uint32_t code = routing_fault_;
  routing_fault_ = kNoRoutingFault;
  return RoutingError(code);
}

void Backend::ExpertFfnRouted(const ExpertFfnRoutedArgs& a) {
  const int64_t n = a.num_tokens * a.top_k;
  if (n == 0) return;
  std::vector<int32_t> ids(n);
  std::vector<float> weights(n);
  CopyToHost(ids.data(), a.expert_ids, n * sizeof(int32_t));
  CopyToHost(weights.data(), a.weights, n * sizeof(float));
  // A pair naming no expert of the layer is left out (reported by TakeRoutingError).
  const int32_t E = a.experts->num_experts;
  std::vector<int64_t> valid;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < E) {
      valid.push_back(i);
    } else {
      NoteRoutingFault(a.layer, kExpertOutOfRange);
    }
  }
  // Slots grouped by expert in ascending id, each expert's slots in order (MoeLayer's host plan).
  std::vector<int64_t> order = valid;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t i, int64_t j) { return ids[i] < ids[j]; });
  std::vector<int32_t> rows(n);
  std::vector<float> row_weights(n);
  std::vector<ExpertWork> work;
  for (int64_t r = 0; r < static_cast<int64_t>(order.size()); ++r) {
    const int32_t e = ids[order[r]];
    if (a.experts->views[e].gate.data == nullptr) continue;  // not resident: skipped
    if (work.empty() || work.back().weights != &a.experts->views[e]) {
      work.push_back({&a.experts->views[e], r, 0});
    }
    ++work.back().row_count;
    rows[r] = static_cast<int32_t>(order[r] / a.top_k);
    row_weights[r] = weights[order[r]];
  }
  auto dev_rows = Allocate(n * sizeof(int32_t));
  auto dev_weights = Allocate(n * sizeof(float));
  MOE_CHECK(dev_rows.ok() && dev_weights.ok()) << "ExpertFfnRouted: " << n << " routed rows";
  CopyToDevice(dev_rows->data(), rows.data(), n * sizeof(int32_t));
  CopyToDevice(dev_weights->data(), row_weights.data(), n * sizeof(float));
  ExpertFfnArgs f;
  f.out = a.out;
  f.x = a.x;
  f.num_tokens = a.num_tokens;
  f.hidden_size = a.hidden_size;
  f.experts = work;
  f.rows = static_cast<const int32_t*>(dev_rows->data());
  f.row_weights = dev_weights->f32();
  ExpertFfn(f);
  Synchronize();  // the staged rows are freed on return
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(BackendKind kind,
                                                     const BackendOptions& options) {
  switch (kind) {
    case BackendKind::kCpu:
      return std::unique_ptr<Backend>(new CpuBackend(options.num_threads));
    case BackendKind::kCuda:
#if MOE_WITH_CUDA
    {
      MOE_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda, CudaBackend::Create(options));
      return std::unique_ptr<Backend>(std::move(cuda));
    }
#else
      return absl::UnimplementedError("this binary was built without CUDA (MOE_WITH_CUDA=OFF)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

absl::Status ValidateSampleArgs(const SampleArgs& a) {
  if (a.vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: vocabulary ", a.vocab_size));
  }
  for (const SampleParams& p : a.params) {
    const int64_t end = p.penalty_begin + int64_t{p.penalty_count};
    if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs || p.penalty_begin < 0 ||
        p.penalty_count < 0 || end > static_cast<int64_t>(a.penalties.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling row ", p.row, ": top_logprobs ", p.top_logprobs, ", penalty entries [",
          p.penalty_begin, ", +", p.penalty_count, ") of ", a.penalties.size()));
    }
  }
  for (const PenaltyToken& t : a.penalties) {
    if (t.id < 0 || t.id >= a.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "penalty token ", t.id, " is outside the vocabulary [0, ", a.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
