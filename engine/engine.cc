// Engine::Step: cancels -> admissions -> one batched forward (decodes, then prefill chunks) ->
// sampling, detokenization and stop checks -> events.
#include "engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/kv_storage.h"
#include "kernels/base/clock.h"
#include "kernels/base/status.h"

namespace moe::engine {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

absl::Status EngineOptions::Validate() const {
  if (max_batch_tokens <= 0) return absl::InvalidArgumentError("max_batch_tokens must be > 0");
  if (max_running <= 0) return absl::InvalidArgumentError("max_running must be > 0");
  if (kv_budget_bytes <= 0) return absl::InvalidArgumentError("kv_budget_bytes must be > 0");
  if (max_context < 0) return absl::InvalidArgumentError("max_context must be >= 0");
  if (max_sessions < 0) return absl::InvalidArgumentError("max_sessions must be >= 0");
  if (block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (state_snapshot_blocks < 0) {
    return absl::InvalidArgumentError("state_snapshot_blocks must be >= 0");
  }
  if (kv_tail_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_tail_tokens must be >= 0 (0: no tail), got ", kv_tail_tokens));
  }
  MOE_ASSIGN_OR_RETURN(const kernels::KvFormat format, ParseCacheFormat(kv_cache_dtype));
  if (kv_tail_tokens > 0 && format == kernels::KvFormat::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_tail_tokens ", kv_tail_tokens,
        ": a 16-bit tail needs a compressed kv_cache_dtype (bf16 is 16 bits already)"));
  }
  return absl::OkStatus();
}

struct Engine::Sequence {
  Sequence(Request r, const Tokenizer& tok)
      : req(std::move(r)),
        sampler(req.sampling),
        detok(tok, req.skip_special_tokens),
        stop_filter(req.stop.stop_strings) {}
  Request req;
  int64_t cache_id = 0;     // live in the KV cache when non-zero
  int64_t kv_len = 0;       // positions whose K/V is written
  int64_t cache_len = 0;    // positions the block table covers (>= kv_len)
  int64_t prefill_end = 0;  // prompt (+ output so far, after a preemption) to compute
  int64_t cached = 0;       // prompt tokens reused at the first admission
  int32_t state_slot = -1;  // hybrid models: its StatePool slot while admitted
  std::vector<uint64_t> block_hashes;  // chain hashes of its first full blocks, as computed
  bool admitted_before = false;
  std::vector<int32_t> output;
  Sampler sampler;
  IncrementalDetokenizer detok;
  StopStringFilter stop_filter;
  int64_t added_us = 0;
  int64_t admitted_us = 0;
  bool started = false;
  bool prefilling() const { return kv_len < prefill_end; }
  int32_t TokenAt(int64_t pos) const {
    const int64_t p = static_cast<int64_t>(req.prompt.size());
    return pos < p ? req.prompt[pos] : output[pos - p];
  }
  std::vector<int32_t> Tokens(int64_t begin, int64_t end) const {
    std::vector<int32_t> t;
    for (int64_t i = begin; i < end; ++i) t.push_back(TokenAt(i));
    return t;
  }
  // The KV cache's chain hash of block b (tokens [0, (b + 1)·bs) must exist). Full blocks never
  // change (output only grows), so the hashes are computed once.
  uint64_t BlockHash(int64_t b, int64_t bs) {
    while (static_cast<int64_t>(block_hashes.size()) <= b) {
      const int64_t i = static_cast<int64_t>(block_hashes.size());
      block_hashes.push_back(
          ChainHash(i == 0 ? 0 : block_hashes.back(), Tokens(i * bs, (i + 1) * bs)));
    }
    return block_hashes[b];
  }
};

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  const ModelConfig& c = model.config();
  max_context_ = options.max_context > 0
                     ? std::min(options.max_context, c.max_position_embeddings)
                     : c.max_position_embeddings;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(Model& model, const Tokenizer& tokenizer,
                                                       const EngineOptions& options) {
  MOE_RETURN_IF_ERROR(options.Validate());
  MOE_ASSIGN_OR_RETURN(const kernels::KvFormat format, ParseCacheFormat(options.kv_cache_dtype));
  const ModelConfig& c = model.config();
  KvCacheOptions o;
  o.format = format;
  o.num_layers = static_cast<int>(c.NumKvLayers());
  o.num_kv_heads = static_cast<int>(c.num_key_value_heads);
  o.head_dim = static_cast<int>(c.head_dim);
  o.block_size = options.block_size;
  // Hybrid models and a KV tail: the state slots first (the rule is in engine.h), KV gets the
  // rest.
  const int64_t state_bytes = model.state_bytes() + PagedKv::TailBytes(c, options.kv_tail_tokens);
  const bool snapshots = options.prefix_reuse && options.state_snapshot_blocks > 0;
  int64_t state_slots = 0;
  int64_t kv_budget = options.kv_budget_bytes;
  if (state_bytes > 0) {
    const int64_t slot_bytes = StatePool::SlotBytes(state_bytes);
    const int64_t want =
        options.max_running + options.max_sessions + (snapshots ? options.max_running : 0);
    state_slots = std::min(want, options.kv_budget_bytes / 2 / slot_bytes);
    if (state_slots == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV budget of ", options.kv_budget_bytes,
                       " bytes: half of it holds no per-sequence state slot of ", slot_bytes,
                       " bytes (the model's linear-attention or conv layers, the KV tail)"));
    }
    kv_budget -= state_slots * slot_bytes;
  }
  o.budget_bytes = static_cast<uint64_t>(kv_budget);
  o.prefix_reuse = options.prefix_reuse;
  MOE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(o));
  std::unique_ptr<Engine> engine(new Engine(model, tokenizer, options));
  engine->kv_bytes_budget_ = kv_budget;
  if (state_slots > 0) {
    MOE_ASSIGN_OR_RETURN(engine->states_,
                         StatePool::Create(model.backend(), state_bytes, state_slots));
    if (snapshots)
      engine->snapshot_tokens_ = int64_t{options.block_size} * options.state_snapshot_blocks;
  }
  engine->cache_ = std::make_unique<KvCache>(std::move(cache));
  engine->bytes_per_token_ = engine->cache_->Stats().bytes_per_token;
  MOE_ASSIGN_OR_RETURN(
      engine->paged_,
      PagedKv::Create(c, model.backend(), format, options.block_size,
                      engine->cache_->Stats().total_blocks, options.kv_tail_tokens));
  return engine;
}

Engine::~Engine() = default;

absl::Status Engine::Add(Request request) {
  const ModelConfig& c = model_.config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  MOE_RETURN_IF_ERROR(request.sampling.Validate());
  MOE_RETURN_IF_ERROR(request.stop.Validate(c.vocab_size));
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.stop.max_tokens;
  if (static_cast<int64_t>(request.prompt.size()) >= max_context_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", request.prompt.size(),
                                                   " tokens do not fit the context of ", max_context_));
  }
  if (total > max_context_) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: prompt ", request.prompt.size(), " + max_tokens ",
                                                   request.stop.max_tokens, " exceeds the context of ",
                                                   max_context_));
  }
  const int64_t bs = options_.block_size;
  const int64_t blocks = (total + bs - 1) / bs;
  if (blocks > cache_->Stats().total_blocks) {
    // Permanent for this worker: waiting frees nothing more than the whole budget, so this is
    // not ResourceExhausted (which clients retry).
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens: prompt ", request.prompt.size(), " + max_tokens ", request.stop.max_tokens,
        " needs ", blocks * bs * bytes_per_token_, " bytes of KV (", blocks, " blocks of ", bs,
        " tokens), more than the worker's whole KV budget of ", kv_bytes_budget_, " bytes (",
        cache_->Stats().total_blocks, " blocks)"));
  }
  if (request.top_logprobs < 0 || request.top_logprobs > kernels::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs: must be in [0, ", kernels::kMaxTopLogprobs, "]"));
  }
  auto same_id = [&](const std::unique_ptr<Sequence>& s) { return s->req.id == request.id; };
  if (std::any_of(waiting_.begin(), waiting_.end(), same_id) ||
      std::any_of(running_.begin(), running_.end(), same_id)) {
    return absl::InvalidArgumentError(absl::StrCat("request_id '", request.id, "' is already live"));
  }
  auto seq = std::make_unique<Sequence>(std::move(request), tokenizer_);
  seq->added_us = base::NowMicros();
  waiting_.push_back(std::move(seq));
  return absl::OkStatus();
}

void Engine::Cancel(const std::string& request_id) { cancelled_.push_back(request_id); }

void Engine::ForgetSession(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  cache_->Free(it->second.cache_id);
  if (it->second.state_slot >= 0) states_->Release(it->second.state_slot);
  sessions_.erase(it);
}

void Engine::ReleaseState(Sequence& seq) {
  if (seq.state_slot < 0) return;
  states_->Release(seq.state_slot);
  seq.state_slot = -1;
}

bool Engine::AcquireStateSlot(Sequence& seq, int32_t keep) {
  MOE_CHECK(seq.state_slot < 0) << "sequence " << seq.req.id << " holds a state slot";
  // As for KV blocks: a free slot, then snapshots (the one this sequence would start from
  // last), then kept sessions give way; a waiting request is work, they are only hopes.
  for (;;) {
    int32_t slot = states_->Acquire(keep);
    if (slot < 0) slot = states_->Acquire();
    if (slot >= 0) {
      seq.state_slot = slot;
      return true;
    }
    if (!DropLruSession()) return false;
  }
}

int64_t Engine::DeepestSnapshot(Sequence& seq, int64_t blocks, int32_t* slot) {
  *slot = -1;
  if (snapshot_tokens_ == 0) return 0;
  const int64_t n = options_.state_snapshot_blocks;
  for (int64_t k = blocks / n * n; k > 0; k -= n) {
    *slot = states_->FindSnapshot(seq.BlockHash(k - 1, options_.block_size));
    if (*slot >= 0) return k;
  }
  return 0;
}

absl::Status Engine::DropSession(const std::string& session_id) {
  if (!sessions_.contains(session_id)) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "'"));
  }
  ForgetSession(session_id);
  return absl::OkStatus();
}

bool Engine::DropLruSession() {
  if (sessions_.empty()) return false;
  auto lru = std::min_element(sessions_.begin(), sessions_.end(), [](const auto& a, const auto& b) {
    return a.second.last_used < b.second.last_used;
  });
  ForgetSession(lru->first);
  return true;
}

// Gives `seq` a block table: the continuation of its kept session when the prompt extends it,
// else the cached prefix blocks of its tokens plus one position. The rest of the table grows as
// prefill chunks run (Reserve). False when the blocks cannot be had now.
bool Engine::Admit(std::unique_ptr<Sequence>& seq_ptr) {
  Sequence& seq = *seq_ptr;
  seq.prefill_end = static_cast<int64_t>(seq.req.prompt.size() + seq.output.size());
  const std::vector<int32_t> tokens = seq.Tokens(0, seq.prefill_end);
  const int64_t id = next_cache_id_++;
  int64_t reused = 0;
  if (auto it = sessions_.find(seq.req.session_id); !seq.req.session_id.empty() && it != sessions_.end()) {
    const std::vector<int32_t>& kept = it->second.tokens;
    // Continue only a strict prefix of the prompt: the last prompt token must run to give logits.
    if (kept.size() < tokens.size() && std::equal(kept.begin(), kept.end(), tokens.begin())) {
      MOE_CHECK(cache_->Rename(it->second.cache_id, id).ok());
      reused = static_cast<int64_t>(kept.size());
      seq.state_slot = it->second.state_slot;  // the state after exactly `kept`
      sessions_.erase(it);
      seq.cache_id = id;
      seq.kv_len = seq.cache_len = reused;
    } else {
      ForgetSession(seq.req.session_id);  // a diverging turn: its full blocks stay cached
    }
  }
  if (seq.cache_id == 0) {
    // Only the cached prefix and one position are claimed now; Reserve appends the rest chunk by
    // chunk, so a long prompt does not hold blocks it will not write for many steps, and a block
    // is registered in the step that writes it. Kept sessions give way first: a kept session is
    // only the hope of a next turn, a waiting request is work.
    // Hybrid models: a state slot first (keeping, if it can, the snapshot this sequence would
    // start from), then KV reuse only up to the deepest boundary with a snapshot.
    int32_t snapshot = -1;
    if (states_ != nullptr) {
      DeepestSnapshot(seq, cache_->ReusablePrefixBlocks(tokens), &snapshot);
      if (!AcquireStateSlot(seq, snapshot)) return false;
    }
    for (;;) {
      int64_t blocks = cache_->ReusablePrefixBlocks(tokens);
      if (states_ != nullptr) blocks = DeepestSnapshot(seq, blocks, &snapshot);
      const int64_t admit_len = std::min<int64_t>(seq.prefill_end, blocks * options_.block_size + 1);
      auto admitted = cache_->Admit(id, absl::MakeConstSpan(tokens.data(), admit_len));
      if (admitted.ok()) {
        reused = admitted->num_cached_tokens;
        seq.cache_id = id;
        seq.kv_len = reused;
        seq.cache_len = admit_len;
        if (states_ != nullptr) {
          MOE_CHECK(reused == blocks * options_.block_size)
              << "reused " << reused << " tokens, the snapshot is at block " << blocks;
          if (snapshot >= 0) {
            states_->CopyFrom(seq.state_slot, snapshot);
          } else {
            states_->Zero(seq.state_slot);
          }
        }
        break;
      }
      if (!DropLruSession()) {
        ReleaseState(seq);
        return false;
      }
    }
  }
  if (!seq.admitted_before) {
    seq.admitted_before = true;
    seq.cached = std::min<int64_t>(reused, static_cast<int64_t>(seq.req.prompt.size()));
    cached_prompt_tokens_ += seq.cached;
  }
  return true;
}

void Engine::Preempt(size_t index) {
  std::unique_ptr<Sequence> seq = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  cache_->Free(seq->cache_id);  // its written full blocks stay cached: recompute may reuse them
  seq->cache_id = 0;
  ReleaseState(*seq);  // snapshots of its boundaries stay: recompute may start from them
  seq->kv_len = seq->cache_len = 0;
  ++preemptions_;
  waiting_.push_front(std::move(seq));
}

bool Engine::Reserve(Sequence& seq, int64_t end, const std::vector<const Sequence*>& planned) {
  while (seq.cache_len < end) {
    const std::vector<int32_t> more = seq.Tokens(seq.cache_len, end);
    if (cache_->AppendTokens(seq.cache_id, more).ok()) {
      seq.cache_len = end;
      return true;
    }
    if (DropLruSession()) continue;
    // Preempt the newest running sequence that has no work planned in this step (seq has none).
    // Newest: it has the least to recompute and the oldest keep their place (arrival order). Not a
    // planned one: its entry in the step's plan would be left pointing at freed blocks.
    size_t victim = running_.size();
    while (victim-- > 0) {
      if (std::find(planned.begin(), planned.end(), running_[victim].get()) == planned.end()) break;
    }
    const bool self = running_[victim].get() == &seq;
    Preempt(victim);
    if (self) return false;
  }
  return true;
}

void Engine::Finish(Sequence& seq, FinishReason reason, absl::Status error, bool flush_text,
                    std::vector<Event>* events) {
  Event e;
  e.request_id = seq.req.id;
  e.finish = reason;
  e.error = std::move(error);
  if (flush_text) {  // text held back for a stop string that never completed
    bool stopped = false;
    e.text = seq.stop_filter.Push(seq.detok.Flush(), &stopped);
    if (!stopped) e.text += seq.stop_filter.Flush();
  }
  e.usage = {static_cast<int64_t>(seq.req.prompt.size()), seq.cached,
             static_cast<int64_t>(seq.output.size())};
  if (seq.cache_id != 0) {
    // A session keeps its table only when every reserved position holds written KV
    // (cache_len == kv_len): the next turn continues from the table, so it must match s.tokens.
    const bool keep = !seq.req.session_id.empty() && options_.max_sessions > 0 &&
                      (reason == FinishReason::kStop || reason == FinishReason::kLength) &&
                      seq.cache_len == seq.kv_len;
    if (keep) {
      ForgetSession(seq.req.session_id);
      Session& s = sessions_[seq.req.session_id];
      s.tokens = seq.Tokens(0, seq.kv_len);  // the last sampled token has no K/V yet
      s.cache_id = seq.cache_id;
      s.state_slot = std::exchange(seq.state_slot, -1);  // has consumed exactly s.tokens
      s.last_used = step_counter_;
      while (static_cast<int64_t>(sessions_.size()) > options_.max_sessions) DropLruSession();
    } else {
      cache_->Free(seq.cache_id);
    }
    seq.cache_id = 0;
  }
  ReleaseState(seq);  // an error leaves it undefined: nothing continues from it
  events->push_back(std::move(e));
}

void Engine::Emit(Sequence& seq, int32_t token, const TokenLogprobs& lp, std::vector<Event>* events) {
  const ModelConfig& c = model_.config();
  seq.output.push_back(token);
  Event e;
  e.request_id = seq.req.id;
  e.token = token;
  if (seq.req.return_logprobs) e.logprobs = lp;
  if (!seq.started) {
    seq.started = true;
    e.queue_seconds = static_cast<double>(seq.admitted_us - seq.added_us) * 1e-6;
  }
  const bool eos = !seq.req.stop.ignore_eos &&
                   std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), token) != c.eos_token_ids.end();
  const bool stop_id = std::find(seq.req.stop.stop_token_ids.begin(), seq.req.stop.stop_token_ids.end(),
                                 token) != seq.req.stop.stop_token_ids.end();
  bool stopped_on_string = false;
  if (!eos && !stop_id) e.text = seq.stop_filter.Push(seq.detok.Push(token), &stopped_on_string);
  events->push_back(std::move(e));
  if (eos || stop_id || stopped_on_string) {
    Finish(seq, FinishReason::kStop, absl::OkStatus(), /*flush_text=*/!stopped_on_string, events);
  } else if (static_cast<int64_t>(seq.output.size()) >= seq.req.stop.max_tokens) {
    Finish(seq, FinishReason::kLength, absl::OkStatus(), /*flush_text=*/true, events);
  }
}

std::vector<Event> Engine::Step() {
  std::vector<Event> events;
  ++step_counter_;
  // 1. Cancels: queued or running, final event at once, KV freed. First, so that their blocks are
  // free for this step's admissions.
  for (const std::string& id : cancelled_) {
    auto match = [&](const std::unique_ptr<Sequence>& s) { return s->req.id == id; };
    if (auto it = std::find_if(waiting_.begin(), waiting_.end(), match); it != waiting_.end()) {
      Finish(**it, FinishReason::kCancelled, absl::CancelledError("cancelled"), false, &events);
      waiting_.erase(it);
    } else if (auto r = std::find_if(running_.begin(), running_.end(), match); r != running_.end()) {
      Finish(**r, FinishReason::kCancelled, absl::CancelledError("cancelled"), false, &events);
      running_.erase(r);
    }
  }
  cancelled_.clear();

  // 2. Admissions in arrival order while the batch and the KV blocks allow.
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    if (!Admit(waiting_.front())) break;
    waiting_.front()->admitted_us = base::NowMicros();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (running_.empty()) return events;

  // 3. Plan: every decode gets its one token, then prefill chunks fill the remaining budget.
  // Decodes first so that a long prompt arriving never stalls the streams already generating: it
  // takes what the step's token budget leaves, chunk by chunk.
  // Blocks are reserved oldest first; when they run out the newest sequences are preempted.
  struct Planned {
    Sequence* seq;
    std::vector<int32_t> tokens;
    bool samples;  // this chunk ends at the end of the prompt, or is a decode
    bool prefill;
    std::vector<int32_t> table;
  };
  std::vector<Planned> plan;
  std::vector<const Sequence*> planned;
  int64_t budget = options_.max_batch_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    if (s->prefilling()) continue;
    if (!Reserve(*s, s->kv_len + 1, planned)) break;  // s was preempted: it was the newest
    plan.push_back({s, {s->output.back()}, true, false, {}});
    planned.push_back(s);
    --budget;
  }
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    if (!s->prefilling()) continue;
    const int64_t begin = s->kv_len;
    int64_t end = std::min<int64_t>(s->prefill_end, begin + budget);
    // Hybrid models: a chunk that crosses snapshot boundaries ends at the last of them, so the
    // state there exists (the boundaries inside it get none: snapshots come every chunk, not
    // every boundary, and a long prompt is not cut into boundary-sized chunks).
    if (snapshot_tokens_ > 0 && end / snapshot_tokens_ * snapshot_tokens_ > begin) {
      end = end / snapshot_tokens_ * snapshot_tokens_;
    }
    if (!Reserve(*s, end, planned)) break;
    plan.push_back({s, s->Tokens(begin, end), end == s->prefill_end, true, {}});
    planned.push_back(s);
    budget -= end - begin;
  }
  if (plan.empty()) return events;  // everything runnable was preempted this step
  std::vector<ForwardItem> items;
  // Tables are copied only after every Reserve of the step: a reservation appends blocks and may
  // preempt, so earlier copies could be out of date.
  for (Planned& p : plan) {
    const auto table = cache_->BlockTable(p.seq->cache_id);
    MOE_CHECK(table.ok()) << table.status();
    p.table.assign(table->begin(), table->end());
  }
  for (Planned& p : plan) {
    ForwardItem item;
    item.tokens = p.tokens;
    item.paged = paged_.get();
    item.block_table = p.table;
    item.start = p.seq->kv_len;
    if (states_ != nullptr) item.state = states_->data(p.seq->state_slot);
    items.push_back(item);
    if (p.prefill) prefill_tokens_ += static_cast<int64_t>(p.tokens.size());
  }

  // 4. Forward and sample (on the backend: only token ids come back). An error fails every
  // sequence of the step (it names the cause).
  std::vector<kernels::SampleParams> params;
  std::vector<kernels::PenaltyToken> penalties;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    if (!plan[i].samples) continue;
    params.push_back(s.sampler.Next(static_cast<int64_t>(i), s.req.prompt, s.output,
                                    s.req.return_logprobs, s.req.top_logprobs, &penalties));
  }
  std::vector<kernels::SampledToken> sampled;
  const absl::Status st = model_.ForwardSample(items, params, penalties, &sampled);
  std::vector<Sequence*> done;
  size_t next_sample = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    if (!st.ok()) {
      // The step's K/V were not (all) written: the blocks it filled must serve no later prompt.
      cache_->ForgetUnwritten(s.cache_id, s.kv_len);
      Finish(s, FinishReason::kError, st, false, &events);
      done.push_back(&s);
      continue;
    }
    s.kv_len += static_cast<int64_t>(plan[i].tokens.size());
    if (snapshot_tokens_ > 0 && s.kv_len % snapshot_tokens_ == 0) {
      // Before Emit, which may finish the sequence and give its slot away.
      states_->TakeSnapshot(s.BlockHash(s.kv_len / options_.block_size - 1, options_.block_size),
                            s.state_slot);
    }
    if (!plan[i].samples) continue;
    const kernels::SampledToken& t = sampled[next_sample++];
    Emit(s, t.id, ToLogprobs(t, s.req.top_logprobs), &events);
    if (events.back().finish != FinishReason::kNone) done.push_back(&s);
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const std::unique_ptr<Sequence>& s) {
                                  return std::find(done.begin(), done.end(), s.get()) != done.end();
                                }),
                 running_.end());
  return events;
}

EngineStats Engine::Stats() const {
  EngineStats s;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.kv_bytes_budget = kv_bytes_budget_;
  s.kv_bytes_per_token = bytes_per_token_;
  s.sessions = static_cast<int64_t>(sessions_.size());
  s.preemptions = preemptions_;
  s.prefill_tokens = prefill_tokens_;
  s.cached_prompt_tokens = cached_prompt_tokens_;
  if (cache_ != nullptr) {
    const KvCacheStats k = cache_->Stats();
    s.kv_bytes_used = int64_t{k.used_blocks} * k.block_bytes;
    s.kv_blocks_total = k.total_blocks;
    s.kv_blocks_used = k.used_blocks;
    s.kv_blocks_cached = k.cached_blocks;
    s.kv_blocks_free = k.free_blocks;
    s.kv_evictions = k.evictions;
  }
  if (states_ != nullptr) {
    const StatePoolStats p = states_->Stats();
    s.state_bytes_budget = p.total_slots * p.slot_bytes;
    s.state_bytes_used = (p.owned_slots + p.snapshots) * p.slot_bytes;
    s.state_slots_total = p.total_slots;
    s.state_slots_used = p.owned_slots;
    s.state_snapshots = p.snapshots;
    s.state_snapshot_hits = p.snapshot_hits;
  }
  return s;
}

const KvCache* Engine::kv_cache() const { return cache_.get(); }

}  // namespace moe::engine
