// Engine: continuous batching over one Model. Requests join the running batch between steps;
// prompts are prefilled in chunks under a per-step token budget so decodes keep flowing;
// sequences leave on finish or cancel and their KV memory is freed at once. KV lives in a paged,
// optionally compressed cache (engine/kv_cache.h blocks, PagedKv storage): full blocks of a prompt
// are reused by later prompts with the same prefix, a finished session turn keeps its blocks for
// the next turn, and when blocks run out the newest running sequence is preempted (its blocks
// freed, requeued to recompute its prompt and output so far). One thread owns an
// Engine (it is not thread-safe); the worker hands it requests and cancels between steps.
//
// Hybrid models (Model::state_bytes() > 0: GatedDeltaNet or short-conv layers keep a
// fixed-size state per sequence instead of KV) and every model with a KV tail
// (kv_tail_tokens > 0: the tail's rings, PagedKv::TailBytes, follow the model's state in the
// slot) also give every running sequence a slot of a StatePool
// (engine/state_pool.h), passed as ForwardItem::state:
// - Budget: the slots come out of kv_budget_bytes first, KV blocks get the rest. Slots wanted:
//   max_running + max_sessions, plus max_running snapshot slots when snapshots are on
//   (state_snapshot_blocks > 0 and prefix_reuse); capped at half the budget
//   (floor(kv_budget_bytes / 2 / slot_bytes)), so that at least half of it stays KV. Fewer slots
//   than max_running limit the running batch (a request waits for a slot). Create fails
//   (ResourceExhausted) when not one slot fits.
// - Lifetime: a sequence takes a slot at admission (zeroed when it starts from scratch) and
//   frees it on finish, cancel, error and preemption (restored by recomputation, as its KV). A
//   kept session keeps its slot: a next turn whose prompt extends the session's tokens (exactly
//   what the state has consumed) continues from it; any other turn drops it (the state cannot
//   be truncated) and starts as a new sequence (from a snapshot, below, or from scratch). When
//   no slot is free, the LRU snapshot is evicted, then LRU sessions are dropped, then the
//   request waits.
// - Snapshots (prefix reuse): the state after the first k·N blocks (N = state_snapshot_blocks)
//   is copied to a snapshot slot keyed by the chain hash of block k·N − 1 (kv_cache.h), taken
//   after any step that leaves a sequence exactly at such a boundary. A hybrid model's prefill
//   chunk that crosses boundaries ends at the last of them, so a snapshot is taken at least
//   every chunk (every max_batch_tokens rounded down to the boundaries, for a long prompt).
//   A new sequence reuses KV blocks only up to the deepest boundary whose blocks are reusable
//   and whose snapshot exists (copied into its slot), and prefills the rest. Snapshots are
//   evicted LRU when slots are needed.
// - Errors: a failed step fails its sequences (as for every model); their slots are freed, and
//   a session continued by that step was already taken out of the kept sessions, so no state a
//   failed step touched is continued. Snapshots are taken only after successful steps.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/paged_kv.h"
#include "engine/sampler.h"
#include "engine/state_pool.h"
#include "engine/stop.h"
#include "engine/tokenizer/detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace moe::engine {

struct EngineOptions {
  int64_t max_batch_tokens = 256;    // tokens per step, prefill chunks and decodes together
  int64_t max_running = 64;          // sequences in the running batch
  int64_t kv_budget_bytes = 1 << 30; // KV memory for all sequences (and kept sessions)
  int64_t max_context = 0;           // 0: the model's max_position_embeddings
  int64_t max_sessions = 64;         // conversations whose KV is kept between turns
  // KV cache format: bf16 (default), fp8_e4m3, tq4, tq3.5, tq3, tq2.5, tq2
  // (kernels/kvcodec/kv_quant.h; TurboQuant needs a head_dim with committed codebooks, the split
  // ones head_dim 128).
  std::string kv_cache_dtype = "bf16";
  int block_size = 16;               // tokens per KV block
  bool prefix_reuse = true;          // reuse cached full blocks of a shared prompt prefix
  // Hybrid models: a state snapshot every this many full blocks (prefix reuse of a hybrid model
  // stops at the deepest snapshot; prefill chunks end at these boundaries); 0: no snapshots (no
  // prefix reuse for hybrid models). Ignored for models without state.
  int state_snapshot_blocks = 4;
  // The 16-bit KV tail (--kv_tail_tokens): each sequence's newest this many keys and values
  // also kept in bf16 in front of a compressed cache (engine/paged_kv.h), in its state slot, so
  // that every model with a tail has state slots (and the hybrid rules below apply to it:
  // prefix reuse from snapshots). 0: off. Needs a compressed kv_cache_dtype; CPU backend only.
  int kv_tail_tokens = 0;
  absl::Status Validate() const;
};

struct Request {
  std::string id;                 // unique among live requests
  std::vector<int32_t> prompt;    // non-empty token ids
  SamplingParams sampling;
  StopConditions stop;
  int32_t top_logprobs = 0;       // 0: none
  bool return_logprobs = false;
  std::string session_id;         // empty: none. The KV of prompt + output is kept for the next turn
  bool skip_special_tokens = false;  // leave special tokens (<|im_start|>, ...) out of Event::text
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // reused (a kept session or cached prefix blocks), not prefilled
  int64_t completion_tokens = 0;
};

// What a step produced for one request: zero or one token, its text, and, on the last event,
// the finish reason and usage.
struct Event {
  std::string request_id;
  std::optional<int32_t> token;
  std::string text;            // newly completed text (never half a UTF-8 character)
  TokenLogprobs logprobs;      // when requested
  FinishReason finish = FinishReason::kNone;
  absl::Status error;          // with kError
  Usage usage;                 // on the final event
  double queue_seconds = 0;    // on the first token's event: time from Add to admission
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_bytes_used = 0, kv_bytes_budget = 0;  // used: referenced blocks (running + sessions)
  int64_t kv_bytes_per_token = 0;                    // in the chosen format
  int64_t sessions = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, kv_blocks_free = 0;
  int64_t kv_evictions = 0;            // cached blocks reclaimed, cumulative
  int64_t preemptions = 0;             // sequences preempted for KV space, cumulative
  int64_t prefill_tokens = 0;          // tokens run through prefill (recomputation included)
  int64_t cached_prompt_tokens = 0;    // prompt tokens served from the cache, cumulative
  // Hybrid models' recurrent state (all 0 otherwise). The state budget is carved out of
  // kv_budget_bytes: kv_bytes_budget + state_bytes_budget <= EngineOptions::kv_budget_bytes.
  int64_t state_bytes_used = 0, state_bytes_budget = 0;  // used: owned and snapshot slots
  int64_t state_slots_total = 0, state_slots_used = 0;   // used: running sequences and sessions
  int64_t state_snapshots = 0;                           // snapshot slots now
  int64_t state_snapshot_hits = 0;  // sequences started from a snapshot, cumulative
};

class Engine {
 public:
  // Makes the engine and its KV cache. InvalidArgument for bad options; ResourceExhausted when
  // the KV budget holds no block (an engine that could serve nothing is never made).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(Model& model, const Tokenizer& tokenizer,
                                                        const EngineOptions& options);
  ~Engine();

  // Queues a request. InvalidArgument names the bad field (empty prompt, ids outside the
  // vocabulary, prompt + max_tokens over the context or over the whole KV budget, sampling out
  // of range, duplicate id): none of these succeeds on a retry.
  absl::Status Add(Request request);
  // Cancels a queued or running request; its final event (kCancelled) comes from the next Step.
  // Unknown ids are ignored (the request may have finished already).
  void Cancel(const std::string& request_id);
  // Forgets a kept session, freeing its KV. NotFound if there is none.
  absl::Status DropSession(const std::string& session_id);

  bool HasWork() const { return !running_.empty() || !waiting_.empty() || !cancelled_.empty(); }
  // Schedules and runs one step and returns its events.
  std::vector<Event> Step();
  EngineStats Stats() const;
  // The block manager, for tests and metrics.
  const KvCache* kv_cache() const;
  // The state slots of a hybrid model; null for models without state.
  const StatePool* state_pool() const { return states_.get(); }

 private:
  struct Sequence;
  Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  bool Admit(std::unique_ptr<Sequence>& seq);
  // Grows seq's blocks to cover `end` positions, dropping LRU sessions and then preempting the
  // newest running sequences without planned work as needed. False if seq itself was preempted.
  bool Reserve(Sequence& seq, int64_t end, const std::vector<const Sequence*>& planned);
  void Preempt(size_t running_index);
  bool DropLruSession();
  // Hybrid models: a state slot for `seq` (a free one, else the LRU snapshot's, else LRU
  // sessions are dropped), ready for its cache admission; false when none can be had now.
  bool AcquireStateSlot(Sequence& seq, int32_t keep);
  // Hybrid models: the deepest snapshot boundary (in blocks) of `seq`'s first `blocks` blocks
  // whose snapshot exists; its slot in *slot (-1 and 0 when none).
  int64_t DeepestSnapshot(Sequence& seq, int64_t blocks, int32_t* slot);
  void ReleaseState(Sequence& seq);
  void ForgetSession(const std::string& session_id);  // frees its blocks (they stay cached)
  void Finish(Sequence& seq, FinishReason reason, absl::Status error, bool flush_text,
              std::vector<Event>* events);
  void Emit(Sequence& seq, int32_t token, const TokenLogprobs& lp, std::vector<Event>* events);

  Model& model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  int64_t max_context_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<std::string> cancelled_;
  struct Session {
    std::vector<int32_t> tokens;  // prompt + output whose K/V is in the blocks of cache_id
    int64_t cache_id = 0;
    int32_t state_slot = -1;  // hybrid models: the state after exactly `tokens`
    int64_t last_used = 0;
  };
  std::map<std::string, Session> sessions_;
  std::unique_ptr<PagedKv> paged_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<StatePool> states_;  // hybrid models only
  int64_t snapshot_tokens_ = 0;        // hybrid with snapshots: block_size · state_snapshot_blocks
  int64_t bytes_per_token_ = 0;
  int64_t kv_bytes_budget_ = 0;  // kv_budget_bytes less the state slots
  int64_t next_cache_id_ = 1;
  int64_t preemptions_ = 0;
  int64_t prefill_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  int64_t step_counter_ = 0;
};

}  // namespace moe::engine
