// The CPU reference backend: plain loops, fp32 accumulation, parallel over output rows only, so
// results do not depend on the thread count. Each op family's code is in the file of its name.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/base/thread_pool.h"

namespace moe::kernels {

// The paged KV ops on host memory (kernels/cpu/paged_kv_write.cc, paged_attention.cc): the CPU
// backend's implementation, and the Backend defaults' after staging tiles through host copies.
absl::Status PagedKvWriteOnHost(const PagedKvWriteArgs& args);
void PagedKvTailWriteOnHost(const PagedKvWriteArgs& args);
// (query token, head) jobs [begin, end) of args.num_tokens · args.num_heads.
void PagedAttentionOnHost(const PagedAttentionArgs& args, int64_t begin, int64_t end);
// The tile of (the block holding position pos, kv_head, role: 0 K, 1 V) in `kv`.
inline const uint8_t* PagedTileAt(const PagedKvLayer& kv, int64_t pos, int kv_head, int role) {
  const int32_t block = kv.block_table[pos / kv.block_size];
  return kv.layer_base + block * kv.block_stride + (2 * kv_head + role) * kv.tile_bytes;
}

// Whether a step of `step_tokens` tokens sums its quantized dot products (int and fp8 weights,
// MatMul and ExpertFfn) in reverse order: groups last to first, and the elements within each.
// A measurement knob, off unless MOE_CPU_REVERSE_SUMS_ABOVE=N is set (then: steps of more than N
// tokens): how far a pure change of fp32 summation order moves a batch-against-alone golden
// comparison (tests/bench/NOTES.md, "Issue 30: the four CUDA batch bounds").
bool ReverseSums(int64_t step_tokens);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads);

  BackendKind kind() const override { return BackendKind::kCpu; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override;
  absl::StatusOr<Buffer> AllocateHost(size_t bytes) override;
  base::MemoryTotals Memory() override { return base::HostMemory(); }
  absl::StatusOr<DeviceTensor> Upload(const TensorView& host) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void Zero(void* dst, size_t bytes) override;
  void Synchronize() override {}

  void Embed(float* out, const TensorView& table, const int32_t* ids, int64_t T) override;
  void MatMul(float* out, const float* x, int64_t T, const TensorView& w,
              const TensorView* bias) override;
  void RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
               float eps) override;
  void Rope(const RopeArgs& args) override;
  void Attention(const AttentionArgs& args) override;
  absl::Status PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) override;
  absl::Status PagedAttention(absl::Span<const PagedAttentionArgs> batch) override;
  absl::Status PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch) override;
  void Route(const RouteArgs& args) override;
  void ExpertFfn(const ExpertFfnArgs& args) override;
  void Add(float* out, const float* x, int64_t n) override;
  void SplitColumns(const float* src, int64_t rows, absl::Span<float* const> parts,
                    absl::Span<const int64_t> widths) override;
  void Sigmoid(float* x, int64_t n) override;
  void MulSigmoid(float* x, const float* gate, int64_t n) override;
  void Mul(float* out, const float* a, const float* b, int64_t n) override;
  void GatedRmsNorm(float* out, const float* x, const float* z, int64_t rows,
                    const TensorView& weight, float eps) override;
  void CausalConv(const CausalConvArgs& args) override;
  void GatedDeltaRule(const GatedDeltaRuleArgs& args) override;
  void Sample(const SampleArgs& args) override;

 private:
  // MatMul with ReverseSums' choice made by the caller (ExpertFfn: from the step's tokens).
  void MatMulRows(float* out, const float* x, int64_t T, const TensorView& w,
                  const TensorView* bias, bool reverse_sums);

  base::ThreadPool pool_;
};

}  // namespace moe::kernels
