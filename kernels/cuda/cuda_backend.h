// The CUDA backend: every Backend op on one GPU, on one stream the backend owns.
//
// Contract beyond backend.h: every float*/int32_t* an op takes is device memory (from Allocate),
// except the host arrays backend.h names (Embed ids, the ExpertWork list, paged block tables and
// codecs); those are copied in by the op. Ops are asynchronous on stream(); CopyToHost and
// Synchronize wait for it. Bad shapes abort (MOE_CHECK); so do launch errors (MOE_CUDA_CHECK).
// Not thread-safe: one engine thread drives one backend, except CopyToDeviceOnCopyQueue,
// SynchronizeCopies and WaitForCopy, which one other thread (the expert store's copy thread) may
// call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"

struct CUstream_st;  // cudaStream_t, without making every includer a CUDA translation unit
struct CUevent_st;   // cudaEvent_t

namespace moe::kernels::cuda {
struct GemmGroup;  // launch.cuh
class StepGraphs;  // step_graph.cuh
}  // namespace moe::kernels::cuda

namespace moe::kernels {

class CudaBackend final : public Backend {
 public:
  // FailedPrecondition when no CUDA device is visible or the runtime cannot start.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  CUstream_st* stream() const { return stream_; }
  int num_sms() const { return num_sms_; }

  // ResourceExhausted naming the bytes asked for and the bytes free when cudaMalloc fails.
  absl::StatusOr<Buffer> Allocate(size_t bytes) override;
  absl::StatusOr<Buffer> AllocateHost(size_t bytes) override;  // cudaHostAlloc (pinned)
  base::MemoryTotals Memory() override;                          // cudaMemGetInfo
  absl::StatusOr<DeviceTensor> Upload(const TensorView& host) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;  // waits
  void CopyToHostQueued(void* dst, const void* src, size_t bytes) override;
  void WaitForHostCopies() override;
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void Zero(void* dst, size_t bytes) override;
  void Synchronize() override;
  // Overlapping launches (programmatic dependent launch, common.cuh) for steps of at most 8
  // tokens: decode at batch 1 +19% tokens/s, 8 sequences +6%, but 32 level and 128 sequences
  // -18%, prefill -1% (H200, tests/bench/NOTES.md). MOE_CUDA_PDL=0 never overlaps, =1 always.
  // Replayable steps of at most 8 tokens are recorded and issued as CUDA graphs
  // (step_graph.cuh); MOE_CUDA_GRAPHS=0 turns that off.
  void BeginStep(int64_t num_tokens, bool replayable) override;
  void EndStep() override;
  // Step-graph fragments since creation: launched from a cached graph, captured into a new one,
  // issued launch by launch (a signature's first sight, or graphs off).
  struct GraphStats {
    int64_t replayed = 0, built = 0, direct = 0;
  };
  GraphStats graph_stats() const;
  std::string IssueStats() const override;
  uint64_t MarkCompute() override;
  uint64_t CopyToDeviceOnCopyQueue(void* dst, const void* src, size_t bytes,
                                   uint64_t after_mark) override;
  void SynchronizeCopies() override;
  // Waits on the copy's own event for the last kCopyEvents copies, on the whole queue for older
  // ones.
  void WaitForCopy(uint64_t number) override;

  void Embed(float* out, const TensorView& table, const int32_t* ids, int64_t T) override;
  void MatMul(float* out, const float* x, int64_t T, const TensorView& w,
              const TensorView* bias) override;
  void AddRmsNorm(float* x, const float* residual, float* out, int64_t rows,
                  const TensorView& weight, float eps) override;
  void RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
               float eps) override;
  void Rope(const RopeArgs& args) override;
  void HeadNormRope(const RopeArgs& q, const TensorView& q_norm, const RopeArgs& k,
                    const TensorView& k_norm, float eps) override;
  void Attention(const AttentionArgs& args) override;
  // bf16, fp8-e4m3, the single-part TurboQuant formats with the RHT2 rotation (tq1..tq4) and the
  // split ones (tq2.5, tq3.5 at head_dim 128) on the GPU (paged_kv_write.cu, paged_attention.cu);
  // the prod formats and other rotations fall back to the host-staged defaults of backend.cc. PagedKvWrite does not wait for the stream: its finiteness verdict is kept on the
  // device until TakeKvWriteError.
  absl::Status PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) override;
  absl::Status TakeKvWriteError() override;
  absl::Status PagedAttention(absl::Span<const PagedAttentionArgs> batch) override;
  // The 16-bit tail's ring write, one launch a batch (paged_kv_write.cu); the attention's tail in
  // paged_attention.cu, for every format.
  absl::Status PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch) override;
  void Route(const RouteArgs& args) override;
  void ExpertFfn(const ExpertFfnArgs& args) override;
  void ExpertFfnRouted(const ExpertFfnRoutedArgs& args) override;
  absl::Status TakeRoutingError() override;
  void Add(float* out, const float* x, int64_t n) override;
  void SplitColumns(const float* src, int64_t rows, absl::Span<float* const> parts,
                    absl::Span<const int64_t> widths) override;
  void Sigmoid(float* x, int64_t n) override;
  // GatedDeltaNet (linear_attention.cu).
  void MulSigmoid(float* x, const float* gate, int64_t n) override;
  void Mul(float* out, const float* a, const float* b, int64_t n) override;
  void GatedRmsNorm(float* out, const float* x, const float* z, int64_t rows,
                    const TensorView& weight, float eps) override;
  void CausalConv(const CausalConvArgs& args) override;          // kernel_size <= 8
  void GatedDeltaRule(const GatedDeltaRuleArgs& args) override;  // head dims <= 256
  void Sample(const SampleArgs& args) override;  // sample.cu

 private:
  // A device buffer that only grows; reused by every call of the op that owns it. Growing
  // synchronises the stream first, so queued kernels never read freed memory. Freed with the
  // backend, after the destructor's body has waited for its streams.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
    std::vector<unsigned char> staged;  // the host bytes StageHostArgs last copied in
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch();
  };
  enum class OverlapLaunches { kNever, kSmallSteps, kAlways };
  CudaBackend(CUstream_st* stream, int num_sms, OverlapLaunches overlap, bool graphs);
  void* Reserve(Scratch& s, size_t bytes);
  // out[t, n] += bias[n] for MatMul (nothing when bias is null).
  void AddBias(float* out, int64_t T, int64_t N, const TensorView* bias);
  // Copies `bytes` of host memory into `s` (grown as needed), ordered on stream(); returns it.
  // Bytes equal to the ones `s` holds already are not copied again: the layers of a step stage
  // the same block tables, and a copy between two kernels stops the next one's early launch.
  void* StageHostArgs(Scratch& s, const void* host, size_t bytes);
  // The groups of an expert FFN's launches: a device table [gate | up | down] of `count` groups
  // each (ExpertFfn), or Route's expert ids read directly with the layer's device pointer tables
  // (ExpertFfnRouted: group y is routed pair y).
  struct ExpertGroups {
    int count = 0;
    const cuda::GemmGroup* table = nullptr;
    const int32_t* routed_ids = nullptr;
    const void* const* gate = nullptr;
    const void* const* up = nullptr;
    const void* const* down = nullptr;
    int routed_experts = 0;  // routed ids outside [0, routed_experts) are faults
    unsigned int* routing_verdict = nullptr;
    unsigned int routing_code = 0;
  };
  // ExpertFfn's and ExpertFfnRouted's launches (expert_ffn.cu).
  // ExpertFfnRouted with more routed pairs than experts (expert_ffn.cu): planned on the GPU.
  void PlannedExpertFfnRouted(const ExpertFfnRoutedArgs& a, const ExpertWeights& w0);
  // x: [x_rows, H], the rows `rows` index.
  void LaunchExpertFfn(const ExpertGroups& groups, int64_t max_rows, int64_t total_rows,
                       const ExpertWeights& w0, const float* x, int64_t x_rows, const int32_t* rows,
                       const float* row_weights, float* out, int64_t H);

  // The TurboQuant rotation signs and codebook of a cache layer as the kernels read them
  // (paged_kv.cuh), uploaded once per layer: keyed by the layer's codec array and uploaded again
  // only if its codecs are not the ones uploaded (KvCodec::id; a new cache may reuse an array's
  // address). Checking ids costs nothing; rebuilding the tables on the host to compare them cost
  // ~2 us twice a layer.
  struct UploadedTables {
    std::vector<uint64_t> codec_ids;
    size_t bytes = 0;
    void* dev = nullptr;
  };
  const float* TqTablesOnDevice(const PagedKvLayer& kv);

  CUstream_st* stream_ = nullptr;
  CUstream_st* copy_stream_ = nullptr;  // CopyToDeviceOnCopyQueue
  // Mark n is recorded on stream_ in compute_marks_[n % kComputeMarks]; a copy waiting for a mark
  // recorded again since waits for later compute: longer, never too short.
  static constexpr uint64_t kComputeMarks = 64;
  CUevent_st* compute_marks_[kComputeMarks] = {};
  uint64_t marks_ = 0;
  // Recorded on copy_stream_ after copy n in copy_done_[n % kCopyEvents]; copies_ numbers them.
  static constexpr uint64_t kCopyEvents = 64;
  CUevent_st* copy_done_[kCopyEvents] = {};
  uint64_t copies_ = 0;
  CUevent_st* host_copies_done_ = nullptr;  // recorded after CopyToHostQueued's copies
  int num_sms_ = 0;
  OverlapLaunches overlap_ = OverlapLaunches::kNever;
  // Every copy, memset and launch on stream_ goes through it: recorded during replayable steps,
  // issued at once otherwise. Whatever waits for stream_ or uses it unrecorded flushes it first.
  std::unique_ptr<cuda::StepGraphs> graphs_;
  bool use_graphs_ = false;
  // Steps of at most this many tokens are recorded (MOE_CUDA_GRAPH_TOKENS overrides, to measure).
  int64_t graph_max_tokens_ = 8;
  bool split_k_ = true;  // MatMul's K split for small-tile GEMMs (MOE_GEMM_SPLITK=0: off)
  Scratch args_;       // small host arrays copied in per call (ids, positions, expert table)
  Scratch args2_;      // a second one for ops that stage two arrays
  Scratch work_;       // intermediates: expert activations, attention partials
  Scratch paged_;      // TurboQuant paged attention: rotated queries and outputs
  Scratch sampled_;    // Sample's results before their copy to the host
  // The paged write's slots, the attention's block tables and sequences: the same for every
  // layer of a step, so each has its own buffer and is staged once a step (StageHostArgs).
  Scratch kv_slots_;
  Scratch kv_tables_;
  Scratch kv_seqs_;
  // The 16-bit tail: the compressed part's row max and denominator, the attention's sequences
  // (ring, new K/V) and the ring writes.
  Scratch kv_tail_ml_;
  Scratch kv_tail_seqs_;
  Scratch kv_tail_writes_;
  // CausalConv's and GatedDeltaRule's sequence table (row, tokens, state pointer), staged per call.
  Scratch linear_seqs_;
  // ExpertFfnRouted's rows: routed pair y is token y / top_k; made once per top_k.
  Scratch routed_rows_;
  // ExpertFfnRouted with experts in host memory: the pointer table [3][E] the launches read,
  // then the routed host experts copied into VRAM, one slot a routed pair.
  Scratch staged_experts_;
  // The routing kernels' fault word (Backend::RoutingFault), in StepVerdicts()[1]; pending while
  // a kernel that may write it ran since it was last read.
  unsigned int* RoutingVerdict();
  bool routing_verdict_pending_ = false;
  // PlannedExpertFfnRouted's plan: group tables, rows, row weights, per-expert counts.
  Scratch routed_plan_;
  // MOE_ROUTED_CHUNK=n: the plan's rows per group (measurements; 0: chosen by the batch).
  int64_t routed_chunk_override_ = 0;
  // GEMMs on A split once a call (LaunchSplitForGemm; MOE_GEMM_SPLIT=0: the GEMM that converts
  // A in every block, for measurements), MatMul's split in gemm_split_.
  bool split_gemm_ = true;
  Scratch gemm_split_;
  int routed_rows_top_k_ = 0;
  int64_t routed_rows_count_ = 0;
  // The smallest KvBadCode of the paged writes since the last TakeKvWriteError (all ones: none).
  // The step's device verdicts, allocated on first use, all ones meaning none: [0] the paged KV
  // writes' smallest KvBadCode (until TakeKvWriteError), [1] the routing kernels' fault code in
  // its low 32 bits (until TakeRoutingError, or fetched by TakeKvWriteError's copy).
  unsigned long long* StepVerdicts();
  unsigned long long* verdicts_ = nullptr;
  bool kv_verdict_pending_ = false;
  // A routing verdict fetched from the device (`slot`: verdicts_[1]): kept for TakeRoutingError,
  // the device word reset if it held a fault.
  void KeepRoutingVerdict(unsigned long long slot);
  std::unordered_map<const void*, UploadedTables> tq_tables_;
  KvFormat kv_verdict_format_ = KvFormat::kBf16;
};

}  // namespace moe::kernels
