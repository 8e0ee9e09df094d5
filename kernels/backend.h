// The compute primitives of the forward pass behind one interface; cpu/ is the reference backend.
//
// Legend: T tokens in the step, H hidden size, I expert (or MLP) width, E experts, K top-k,
// NH query heads, NKV key/value heads, D head dim, S cached positions, V vocabulary.
// Activations are fp32 in the backend's memory; weights may be fp32/fp16/bf16 (see tensor.h).
// Memory contract: every pointer an op takes is the backend's memory (Allocate/Upload: VRAM on
// CUDA), except those marked "host memory" below (Embed ids, the ExpertFfnArgs::experts list and
// the ExpertWeights it points to, PagedKvLayer's block table and codecs, SampleArgs' params,
// penalties and results), which the op reads or writes on the host.
// Shapes are row-major; a linear layer's weight is [out, in] as in Hugging Face checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>


#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/base/memory.h"
#include "kernels/kvcodec/kv_quant.h"
#include "kernels/tensor.h"

namespace moe::kernels {

enum class BackendKind { kCpu, kCuda };
const char* BackendKindName(BackendKind kind);

// Memory owned by a backend (host memory for the CPU backend, VRAM for CUDA). Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), free_(std::move(free)) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    free_ = std::move(other.free_);
    return *this;
  }
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (data_ != nullptr && free_) free_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> free_;
};

// A weight resident where the backend computes: `view` points into `storage`, or, on a backend
// that computes in host memory, straight at the caller's bytes (storage empty, nothing copied).
struct DeviceTensor {
  Buffer storage;
  TensorView view;
};

// One expert's SwiGLU MLP: Down(SiLU(Gate x) * Up x). gate, up: [I, H]; down: [H, I].
struct ExpertWeights {
  TensorView gate;
  TensorView up;
  TensorView down;
};

// One expert's share of a grouped expert call: rows [row_begin, row_begin + row_count) of
// ExpertFfnArgs::rows / row_weights are the tokens routed to it.
struct ExpertWork {
  const ExpertWeights* weights = nullptr;
  int64_t row_begin = 0;
  int64_t row_count = 0;
};

// For each expert e and each of its routed rows r:
//   out[rows[r]] += row_weights[r] * Down_e(SiLU(Gate_e x[rows[r]]) * Up_e x[rows[r]])
// Experts run in the order given; the result does not depend on the thread count.
struct ExpertFfnArgs {
  float* out = nullptr;              // [T, H], accumulated into
  const float* x = nullptr;          // [T, H]
  int64_t num_tokens = 0;            // T
  int64_t hidden_size = 0;           // H
  absl::Span<const ExpertWork> experts;  // host memory; the views inside point to backend memory
  const int32_t* rows = nullptr;     // [R] token index per routed row, grouped by expert
  const float* row_weights = nullptr;  // [R]
};

// The experts of one layer resident in backend memory for as long as this lives, indexed by
// expert id: what lets ExpertFfnRouted read the router's choice where Route left it. An expert
// whose data pointers are null (views[e].gate.data and gate[e]) is not resident: ExpertFfnRouted
// skips its rows, for the caller to run once it is (the tiered store's decode path).
struct ResidentExperts {
  const ExpertWeights* views = nullptr;  // [E] host memory: shapes, dtype, group size, data
  const void* const* gate = nullptr;     // [E] backend memory: views[e].gate.data
  const void* const* up = nullptr;       // [E] backend memory
  const void* const* down = nullptr;     // [E] backend memory
  int num_experts = 0;
  // [E] backend memory, or null: 1 where expert e's data are host memory that the backend reads
  // in place (the tiered store's host tier, AllocateHost memory). CUDA copies the routed ones
  // into VRAM in one kernel at PCIe speed before the expert kernels read them (reading them
  // over PCIe from inside those kernels ran at half that); the CPU backend reads them as they are.
  const uint8_t* in_host = nullptr;
};

// ExpertFfn for a step whose routing stays in backend memory:
//   out[t] += sum_k weights[t, k] * Down_e(SiLU(Gate_e x[t]) * Up_e x[t]),  e = expert_ids[t, k]
// The default copies the routing to the host and groups it as the engine does (experts in
// ascending id, each expert's rows in token order), then runs ExpertFfn: the same numbers as that
// path. CUDA plans the launch on the GPU: no host synchronisation (the summation order of the
// atomics differs, as ExpertFfn's does from run to run).
struct ExpertFfnRoutedArgs {
  float* out = nullptr;              // [T, H], accumulated into
  const float* x = nullptr;          // [T, H]
  int64_t num_tokens = 0;            // T
  int64_t hidden_size = 0;           // H
  int top_k = 0;                     // K
  const ResidentExperts* experts = nullptr;  // host memory
  const int32_t* expert_ids = nullptr;       // [T, K]; a pair outside [0, E) is skipped
  const float* weights = nullptr;            // [T, K]
  int32_t layer = 0;                         // named by Backend::TakeRoutingError
};

// Causal attention of T new tokens at positions start_pos.. over a contiguous per-sequence cache
// whose first start_pos + T positions are filled (the new tokens' keys and values included):
//   out[t, h] = sum_s softmax_s(scale * q[t, h] . k[s, h / (NH / NKV)]) v[s, h / (NH / NKV)]
// over s <= start_pos + t, and s > start_pos + t - sliding_window when sliding_window > 0.
struct AttentionArgs {
  float* out = nullptr;          // [T, NH, D]
  const float* q = nullptr;      // [T, NH, D], RoPE applied
  const float* k_cache = nullptr;  // [S, NKV, D]
  const float* v_cache = nullptr;  // [S, NKV, D]
  int64_t num_tokens = 0;
  int64_t start_pos = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.f;
  int64_t sliding_window = 0;
};

// One layer of a paged, possibly compressed KV cache (engine/kv_storage.h): the tile of (block b,
// kv-head h, K|V) is at layer_base + b·block_stride + (2h + role)·tile_bytes, block_size vectors
// in the codec's structure-of-arrays layout (kernels/kvcodec/kv_quant.h). Token p of a sequence
// is slot p % block_size of block block_table[p / block_size].
struct PagedKvLayer {
  uint8_t* layer_base = nullptr;   // backend memory
  int64_t block_stride = 0;        // bytes of one block of this layer (all kv-heads, K and V)
  int64_t tile_bytes = 0;          // block_size · bytes per vector
  int block_size = 0;
  const int32_t* block_table = nullptr;  // host memory, covers positions [0, start_pos + T)
  const KvCodec* const* codecs = nullptr;  // host memory, [NKV][2]: key codec, value codec
  int num_kv_heads = 0;
  int head_dim = 0;
  // The 16-bit tail (--kv_tail_tokens W > 0; null: none): the sequence's ring of this layer,
  // [W][NKV][2 (K, V)][D] bf16 in backend memory; slot p % W holds position p once
  // PagedKvTailWrite has stored it. Every position is also in the compressed blocks.
  uint16_t* tail = nullptr;
  int tail_tokens = 0;  // W
};

// Quantizes T new keys and values (post-RoPE and q/k-norm) into positions start_pos.. of the
// sequence's blocks. InvalidArgument when a vector is not finite (KvCodec::Quantize).
struct PagedKvWriteArgs {
  PagedKvLayer kv;
  const float* k = nullptr;  // [T, NKV, D]
  const float* v = nullptr;  // [T, NKV, D]
  int64_t num_tokens = 0;
  int64_t start_pos = 0;
};

// AttentionArgs' causal attention read straight from the compressed blocks (spec §4): per query
// head q' = Π q, logits from codebook entries, values accumulated in the rotated frame, one
// inverse rotation per head at the end (KvCodec::PrepareQuery / Score / AccumulateValues /
// FinishValues). The new tokens' K/V must have been written first (PagedKvWrite).
struct PagedAttentionArgs {
  PagedKvLayer kv;
  float* out = nullptr;      // [T, NH, D]
  const float* q = nullptr;  // [T, NH, D], RoPE applied
  int64_t num_tokens = 0;
  int64_t start_pos = 0;
  int num_heads = 0;
  float scale = 1.f;
  int64_t sliding_window = 0;
  // With a tail (kv.tail): query position p reads the keys and values of positions s > p - W
  // in 16 bits and the older ones from the compressed blocks; s >= start_pos from these (the
  // step's new K/V, [T, NKV, D], rounded to bf16), older ones from the ring, which must still
  // hold [start_pos - W, start_pos): PagedKvTailWrite runs after the attention. The rule
  // depends on p alone, so a prompt gives the same result in any chunking.
  const float* k_new = nullptr;
  const float* v_new = nullptr;
};

// Router: probs = softmax(logits[t]) over E; the K largest (ties to the lower expert id) are kept;
// with renormalize they are divided by their sum (norm_topk_prob), else left as probabilities.
// Scores: softmax over the E logits (kSoftmax) or sigmoid of each (kSigmoid). The top-k choice
// ranks score + selection_bias[e] (no bias: the score), ties to the lower id; the weights are
// the chosen experts' unbiased scores, w / (sum w + renormalize_eps) when renormalize, then
// times scaling. LFM2: kSigmoid, expert_bias, eps 1e-6, routed_scaling_factor.
enum class RouteScoring { kSoftmax, kSigmoid };

struct RouteArgs {
  const float* logits = nullptr;  // [T, E]
  int64_t num_tokens = 0;
  int num_experts = 0;
  int top_k = 0;
  bool renormalize = false;
  float* weights = nullptr;       // [T, K] out, in choice order (backend memory, like logits)
  int32_t* expert_ids = nullptr;  // [T, K] out (backend memory: copy to the host to plan experts)
  int32_t layer = 0;              // named by Backend::TakeRoutingError
  RouteScoring scoring = RouteScoring::kSoftmax;
  const float* selection_bias = nullptr;  // [E] fp32, backend memory; null: none
  float renormalize_eps = 0.f;
  float scaling = 1.f;
};

// RoPE in the rotate-half layout: for i < rot/2 the pair (x[i], x[i + rot/2]) is rotated by
// position * inv_freq[i]; both parts are scaled by attention_factor (YaRN's mscale, else 1).
// Dimensions at or past rotary_dim pass through (partial rotary).
struct RopeArgs {
  float* x = nullptr;                // [T, heads, D], rotated in place
  const int32_t* positions = nullptr;  // [T], backend memory (uploaded once per step)
  int64_t num_tokens = 0;
  int num_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;                // even, <= head_dim
  const float* inv_freq = nullptr;   // [rotary_dim / 2], backend memory
  float attention_factor = 1.f;
};

// Sampling (Backend::Sample). The order per row is penalties -> temperature -> top-k -> top-p ->
// min-p -> draw, over the candidates sorted by descending logit, ties to the lower id:
//   penalties: each PenaltyToken of the row once: l = l > 0 ? l / rep : l * rep (the token is in
//     the prompt or the generated tokens), then l -= presence + frequency * generated when
//     generated > 0 (OpenAI's presence and frequency penalties read generated tokens only);
//   temperature 0 is greedy (the first candidate); otherwise l /= temperature and
//   p_i = exp(l_i - max l) (unnormalised: every cut below is a ratio); keep the first top_k
//   candidates (0: all); then the shortest prefix whose mass reaches top_p of theirs; then those
//   with p_i >= min_p (p of the first is 1); the draw is the first kept candidate whose cumulative
//   mass exceeds uniform * (the kept mass). Masses are fixed point, round(p_i * 2^39) as uint64
//   (p_i < 2^-40 weighs nothing), so that their sums are exact in any order: backends agree on
//   every cut. Cumulative masses are compared with the targets as doubles.
// logprob and the top alternatives are log-softmax values after penalties and temperature,
// before the cuts.
inline constexpr int kMaxTopLogprobs = 20;

struct SampleParams {
  int64_t row = 0;  // the row of SampleArgs::logits to sample
  float temperature = 1.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  double uniform = 0.;     // the draw, in [0, 1)
  bool logprobs = false;   // fill SampledToken::logprob
  int32_t top_logprobs = 0;  // alternatives wanted, <= kMaxTopLogprobs (fills logprob too)
  int32_t penalty_begin = 0;  // this row's entries of SampleArgs::penalties
  int32_t penalty_count = 0;
};

// A token of the prompt or of the generated tokens, once per row; `generated` = its occurrences
// among the generated tokens.
struct PenaltyToken {
  int32_t id = 0;
  int32_t generated = 0;
};

// GatedDeltaNet, the linear attention of qwen3_5_moe and qwen3_next (architectures.md §1.5.3).
// A step's sequences, in row order: each is a run of consecutive token rows with its own state in
// backend memory, updated in place (zeros at a sequence's start; the owner zeroes a new slot).
struct LinearAttnSeq {
  int64_t num_tokens = 0;       // rows of this sequence; they follow the previous sequence's
  float* conv_state = nullptr;  // [C, KW-1]: the last KW-1 pre-conv inputs, oldest first
  float* state = nullptr;       // [NV, DK, DV], fp32
};

// Depthwise causal convolution over time per channel c of C, then SiLU when `silu`:
//   out[t, c] = act(sum_j weight[c, j] * x[t - KW + 1 + j, c] + bias[c]),
// with the inputs before a sequence's first row taken from its conv_state, which then holds the
// sequence's last KW-1 inputs (raw x, not activated). GatedDeltaNet: SiLU, no bias; LFM2's short
// conv: no activation, bias with conv_bias.
struct CausalConvArgs {
  float* out = nullptr;      // [T, C]; may not alias x
  const float* x = nullptr;  // [T, C]
  TensorView weight;         // [C, 1, KW] (Hugging Face's conv1d layout) or [C, KW]
  TensorView bias;           // [C], or data null: none
  bool silu = true;
  int64_t channels = 0;                  // C
  int kernel_size = 0;                   // KW >= 2
  absl::Span<const LinearAttnSeq> seqs;  // host memory; their num_tokens sum to T
};

// The gated delta rule per value head h (key head h / (NV / NK)), in fp32:
//   q, k L2-normalised over DK (x / sqrt(sum x^2 + 1e-6)), q scaled by DK^-0.5,
//   beta = sigmoid(b[t, h]), g = -exp(a_log[h]) * softplus(a[t, h] + dt_bias[h]),
//   S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  out[t, h] = S^T q.
// A sequence of one row takes this recurrent step; longer ones may run the chunked form
// (architectures.md §1.6), the same function of the inputs to fp32 rounding.
struct GatedDeltaRuleArgs {
  float* out = nullptr;        // [T, NV * DV]
  const float* qkv = nullptr;  // [T, 2 NK DK + NV DV]: q [NK, DK] | k [NK, DK] | v [NV, DV]
  const float* b = nullptr;    // [T, NV]
  const float* a = nullptr;    // [T, NV]
  TensorView a_log;            // [NV]
  TensorView dt_bias;          // [NV]
  int num_k_heads = 0;         // NK
  int num_v_heads = 0;         // NV, a multiple of NK
  int k_head_dim = 0;          // DK
  int v_head_dim = 0;          // DV
  absl::Span<const LinearAttnSeq> seqs;  // host memory; their num_tokens sum to T
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.f;
  int32_t top_ids[kMaxTopLogprobs] = {};  // the first SampleParams::top_logprobs, most likely first
  float top_logprobs[kMaxTopLogprobs] = {};
};

struct SampleArgs {
  float* logits = nullptr;  // [rows of the batch, V]; penalised and tempered in place
  int64_t vocab_size = 0;   // V
  absl::Span<const SampleParams> params;     // host memory, one per sampled row
  absl::Span<const PenaltyToken> penalties;  // host memory
  SampledToken* out = nullptr;               // host memory, [params.size()]
};
// The contract above: V > 0, top_logprobs in [0, kMaxTopLogprobs], penalty entries in range and
// their ids in [0, V); InvalidArgument names the first breach. Model::ForwardSample returns it to
// its caller; both backends' Sample abort on it (a caller's bug by then).
absl::Status ValidateSampleArgs(const SampleArgs& args);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;

  // Memory. ResourceExhausted names the request when the backend cannot allocate it.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  // Makes a host weight readable by this backend's ops (a copy, or the same bytes on the CPU).
  virtual absl::StatusOr<DeviceTensor> Upload(const TensorView& host) = 0;
  // Host memory that this backend's CopyToDevice reads at full speed, for staging tiers such as
  // the expert store's host tier: page-locked (cudaHostAlloc) on CUDA, so host->device copies run
  // at PCIe speed and can overlap compute; plain memory, every page touched, on the CPU backend.
  // 4 KiB-aligned (O_DIRECT reads land in it). Costly to allocate on CUDA (pinning): allocate
  // budgets once, not per copy. ResourceExhausted names the request.
  virtual absl::StatusOr<Buffer> AllocateHost(size_t bytes) = 0;
  // The memory Allocate draws from, free now and in all: the GPU's (CUDA), the host's RAM (CPU).
  // What budgets left to "auto" are sized from.
  virtual base::MemoryTotals Memory() = 0;
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Zero(void* dst, size_t bytes) = 0;
  // Waits for all queued work (a no-op for the synchronous CPU backend).
  virtual void Synchronize() = 0;
  // Called before each forward pass with the number of tokens it runs: a backend may pick its
  // launch mode by step size (CUDA overlaps kernel launches for small decode steps only).
  // `replayable`: until EndStep, results are read only through the ops that wait (CopyToHost,
  // Synchronize, ...), and copy-queue work that must follow the step's compute waits for a
  // MarkCompute: CUDA may then record the step's launches and replay them as CUDA graphs (every
  // op that waits, and MarkCompute, first issues what is recorded).
  virtual void BeginStep(int64_t num_tokens, bool replayable) {}
  // Called when a forward pass ends, done or failed: every op it called is issued to the device
  // (CUDA: what is still recorded is launched), so the caller may free what they read once the
  // device is done, as after any op.
  virtual void EndStep() {}
  // How the backend issued its work, for benchmarks (CUDA: step-graph fragments replayed, built,
  // issued directly); empty when there is nothing to say.
  virtual std::string IssueStats() const { return ""; }
  // Marks the compute queued so far (a device slot's old contents are read by no work queued
  // after the expert store claimed the slot); returns the mark's number (0: nothing to mark).
  virtual uint64_t MarkCompute() { return 0; }
  // Host->device copies on a queue of their own (the expert store's loads from its pinned host
  // tier), so that they overlap the compute; each starts only once the compute queued before mark
  // `after_mark` is done (it may overwrite memory that compute still reads: a device slot just
  // released by the engine); 0 waits for none. Returns the copy's number on the queue (1, 2, ...;
  // 0 when the copy is already done). SynchronizeCopies waits for these copies only,
  // WaitForCopy(n) for copy n and those queued before it. `src` must stay valid until then. The
  // CPU backend copies at once.
  virtual uint64_t CopyToDeviceOnCopyQueue(void* dst, const void* src, size_t bytes,
                                           uint64_t after_mark) {
    CopyToDevice(dst, src, bytes);
    return 0;
  }
  virtual void SynchronizeCopies() { Synchronize(); }
  virtual void WaitForCopy(uint64_t number) { SynchronizeCopies(); }
  // A device->host copy queued behind the work queued so far, without waiting for it: `dst`
  // (host memory from AllocateHost) holds the bytes once WaitForHostCopies returns, which waits
  // for these copies only, not for the work queued after them (the tiered store's decode step
  // reads its routing while the GPU runs the resident experts). The CPU backend copies at once.
  virtual void CopyToHostQueued(void* dst, const void* src, size_t bytes) {
    CopyToHost(dst, src, bytes);
  }
  virtual void WaitForHostCopies() {}

  // out[t] = table[ids[t]]. table: [V, H]; ids: [T] host memory, each < V.
  virtual void Embed(float* out, const TensorView& table, const int32_t* ids, int64_t T) = 0;
  // out[T, N] = x[T, K] w[N, K]^T (+ bias[N] when bias is non-null).
  virtual void MatMul(float* out, const float* x, int64_t T, const TensorView& w,
                      const TensorView* bias) = 0;
  // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of length weight.numel().
  virtual void RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
                       float eps) = 0;
  // The residual add and the next norm in one pass: x[r] += residual[r], then out[r] =
  // RmsNorm(x[r]). out may alias residual (not x). The default is Add, then RmsNorm.
  virtual void AddRmsNorm(float* x, const float* residual, float* out, int64_t rows,
                          const TensorView& weight, float eps) {
    Add(x, residual, rows * weight.numel());
    RmsNorm(out, x, rows, weight, eps);
  }
  virtual void Rope(const RopeArgs& args) = 0;
  // Qwen3's per-head q/k norm and RoPE in one pass: every head of q.x is RmsNorm'ed with q_norm
  // ([head_dim]) and every head of k.x with k_norm, then rotated. The default is RmsNorm, then
  // Rope, on q and then on k; CUDA runs both in one launch when k's rows follow q's.
  virtual void HeadNormRope(const RopeArgs& q, const TensorView& q_norm, const RopeArgs& k,
                            const TensorView& k_norm, float eps) {
    RmsNorm(q.x, q.x, q.num_tokens * q.num_heads, q_norm, eps);
    Rope(q);
    RmsNorm(k.x, k.x, k.num_tokens * k.num_heads, k_norm, eps);
    Rope(k);
  }
  virtual void Attention(const AttentionArgs& args) = 0;
  // Paged KV cache ops over a batch of sequences (a step's items), with the result of one call
  // per element in order. When the elements share one layer of one cache and each one's rows of
  // k/v (write) or q/out (attention) follow the previous one's, CUDA runs the whole batch in one
  // launch (and, for the write, one wait for its verdict). The CPU backend implements both; CUDA
  // implements bf16, fp8 and the single-part TurboQuant formats. The defaults stage the touched
  // tiles through host copies and run the CPU code: correct but slow; CUDA falls back to them
  // for the other formats. A write error names the position; elements before it are written.
  virtual absl::Status PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch);
  virtual absl::Status PagedAttention(absl::Span<const PagedAttentionArgs> batch);
  // The tail's write: each element's last min(T, W) new tokens' K/V into its ring (kv.tail) in
  // bf16, after the step's PagedAttention (which reads the ring's older positions). Elements
  // without a tail are skipped. CPU and CUDA implement the tail (the defaults stage the ring and
  // the new K/V through the host as well).
  virtual absl::Status PagedKvTailWrite(absl::Span<const PagedKvWriteArgs> batch);
  // A backend whose PagedKvWrite cannot know its verdict without waiting for the device (CUDA)
  // returns OK there and reports here the first rejected vector of the writes since the last
  // call (InvalidArgument naming position, kv-head and key/value); this waits for the device.
  // Others report from PagedKvWrite itself and return OK here.
  virtual absl::Status TakeKvWriteError() { return absl::OkStatus(); }
  virtual void Route(const RouteArgs& args) = 0;
  virtual void ExpertFfn(const ExpertFfnArgs& args) = 0;
  virtual void ExpertFfnRouted(const ExpertFfnRoutedArgs& args);
  // Routing faults of the Route and ExpertFfnRouted calls since the last call: InvalidArgument
  // naming the lowest layer at fault (RouteArgs::layer), else OK. Route gives a token whose
  // router logits are not all finite experts 0..K-1 with weight 0; ExpertFfnRouted skips a pair
  // whose expert id is outside [0, E); neither writes out of bounds. CUDA keeps the verdict on
  // the device until here (a 4-byte copy: this waits for the device).
  virtual absl::Status TakeRoutingError();
  // out[i] += x[i]
  virtual void Add(float* out, const float* x, int64_t n) = 0;
  // x[i] = 1 / (1 + exp(-x[i]))
  virtual void Sigmoid(float* x, int64_t n) = 0;
  // x[i] *= sigmoid(gate[i]) (the output gate of qwen3_5_moe's full attention)
  virtual void MulSigmoid(float* x, const float* gate, int64_t n) = 0;
  // out[i] = a[i] * b[i]; out may alias a or b (LFM2's short-conv gates)
  virtual void Mul(float* out, const float* a, const float* b, int64_t n) = 0;
  // The gated RMSNorm of GatedDeltaNet, per row of weight.numel():
  //   out[r] = RmsNorm(x[r]) * weight * silu(z[r]). out may alias x.
  virtual void GatedRmsNorm(float* out, const float* x, const float* z, int64_t rows,
                            const TensorView& weight, float eps) = 0;
  virtual void CausalConv(const CausalConvArgs& args) = 0;
  virtual void GatedDeltaRule(const GatedDeltaRuleArgs& args) = 0;
  // Draws one token per SampleParams (see above) where the logits are: only the SampledTokens
  // cross to the host. Waits for the result.
  virtual void Sample(const SampleArgs& args) = 0;
  // The columns of src [rows, sum of widths] in consecutive parts: parts[i] [rows, widths[i]]
  // gets columns [widths[0] + ... + widths[i - 1], + widths[i]). At most kMaxColumnParts parts;
  // none may overlap src.
  static constexpr int kMaxColumnParts = 4;
  virtual void SplitColumns(const float* src, int64_t rows, absl::Span<float* const> parts,
                            absl::Span<const int64_t> widths) = 0;

  // A routing fault's code: 2 * layer + fault, the lowest kept (what TakeRoutingError reports).
  enum RoutingFault : uint32_t { kNonFiniteLogits = 0, kExpertOutOfRange = 1 };
  static constexpr uint32_t kNoRoutingFault = ~0u;
  static absl::Status RoutingError(uint32_t code);

 protected:
  void NoteRoutingFault(int32_t layer, RoutingFault fault);
  uint32_t routing_fault_ = kNoRoutingFault;  // host-side faults since TakeRoutingError
};

struct BackendOptions {
  // CPU backend threads; 0 = all hardware threads. Default: 0.
  int num_threads = 0;
};

// Unimplemented when the kind was not built into this binary.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(BackendKind kind,
                                                     const BackendOptions& options);

}  // namespace moe::kernels
