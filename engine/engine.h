// Engine: continuous batching over one Model. Requests join the running batch between steps;
// prompts are prefilled in chunks under a per-step token budget so decodes keep flowing;
// sequences leave on finish or cancel and their KV memory is freed at once. KV lives in a paged,
// optionally compressed cache (engine/kv_cache.h blocks, PagedKv storage): full blocks of a prompt
// are reused by later prompts with the same prefix, a finished session turn keeps its blocks for
// the next turn, and when blocks run out the newest running sequence is preempted (its blocks
// freed, requeued to recompute its prompt and output so far). One thread owns an
// Engine (it is not thread-safe); the worker hands it requests and cancels between steps.
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

 private:
  struct Sequence;
  Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  bool Admit(std::unique_ptr<Sequence>& seq);
  // Grows seq's blocks to cover `end` positions, dropping LRU sessions and then preempting the
  // newest running sequences without planned work as needed. False if seq itself was preempted.
  bool Reserve(Sequence& seq, int64_t end, const std::vector<const Sequence*>& planned);
  void Preempt(size_t running_index);
  bool DropLruSession();
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
    int64_t last_used = 0;
  };
  std::map<std::string, Session> sessions_;
  std::unique_ptr<PagedKv> paged_;
  std::unique_ptr<KvCache> cache_;
  int64_t bytes_per_token_ = 0;
  int64_t next_cache_id_ = 1;
  int64_t preemptions_ = 0;
  int64_t prefill_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  int64_t step_counter_ = 0;
};

}  // namespace moe::engine
