// Engine::Step: cancels -> admissions -> one batched forward (decodes, then prefill chunks) ->
// sampling, detokenization and stop checks -> events.
#include "engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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
  return absl::OkStatus();
}

struct Engine::Sequence {
  Sequence(Request r, const Tokenizer& tok)
      : req(std::move(r)), sampler(req.sampling), detok(tok), stop_filter(req.stop.stop_strings) {}
  Request req;
  std::unique_ptr<SequenceKv> kv;
  int64_t kv_bytes = 0;
  int64_t cached = 0;  // prompt tokens reused from a session
  std::vector<int32_t> output;
  Sampler sampler;
  IncrementalDetokenizer detok;
  StopStringFilter stop_filter;
  int64_t added_us = 0;
  int64_t admitted_us = 0;
  bool started = false;
  int64_t prompt_done() const { return std::min<int64_t>(kv->length(), req.prompt.size()); }
  bool prefilling() const { return kv->length() < static_cast<int64_t>(req.prompt.size()); }
};

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  max_context_ = options.max_context > 0
                     ? std::min(options.max_context, model.config().max_position_embeddings)
                     : model.config().max_position_embeddings;
}

Engine::~Engine() = default;

int64_t Engine::KvBytes(int64_t capacity) const {
  return capacity * SequenceKv::BytesPerToken(model_.config());
}

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
  if (KvBytes(total) > options_.kv_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("request needs ", KvBytes(total),
                                                     " bytes of KV, more than the whole budget ",
                                                     options_.kv_budget_bytes));
  }
  if (request.top_logprobs < 0 || request.top_logprobs > 20) {
    return absl::InvalidArgumentError("top_logprobs: must be in [0, 20]");
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

absl::Status Engine::DropSession(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session '", session_id, "'"));
  kv_bytes_used_ -= KvBytes(it->second.kv->capacity());
  sessions_.erase(it);
  return absl::OkStatus();
}

// Takes a KV for `seq` from its session (prefix reuse) or the budget, evicting least recently
// used sessions as needed. False when the budget cannot hold it now.
bool Engine::Admit(std::unique_ptr<Sequence>& seq) {
  const int64_t capacity = static_cast<int64_t>(seq->req.prompt.size()) + seq->req.stop.max_tokens;
  const int64_t bytes = KvBytes(capacity);
  std::unique_ptr<SequenceKv> reuse;
  int64_t reuse_len = 0;
  if (auto it = sessions_.find(seq->req.session_id); !seq->req.session_id.empty() && it != sessions_.end()) {
    const auto& tokens = it->second.tokens;
    // Reuse only a strict prefix of the prompt: the last prompt token must run to give logits.
    if (tokens.size() < seq->req.prompt.size() &&
        std::equal(tokens.begin(), tokens.end(), seq->req.prompt.begin())) {
      reuse = std::move(it->second.kv);
      reuse_len = static_cast<int64_t>(tokens.size());
    } else {
      reuse = std::move(it->second.kv);  // a diverging turn: drop the old KV
    }
    kv_bytes_used_ -= KvBytes(reuse->capacity());
    sessions_.erase(it);
  }
  while (kv_bytes_used_ + bytes > options_.kv_budget_bytes && !sessions_.empty()) {
    auto lru = std::min_element(sessions_.begin(), sessions_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    kv_bytes_used_ -= KvBytes(lru->second.kv->capacity());
    sessions_.erase(lru);
  }
  if (kv_bytes_used_ + bytes > options_.kv_budget_bytes) {
    if (reuse != nullptr) {  // put the session back untouched
      Session& s = sessions_[seq->req.session_id];
      s.tokens.assign(seq->req.prompt.begin(), seq->req.prompt.begin() + reuse_len);
      kv_bytes_used_ += KvBytes(reuse->capacity());
      s.kv = std::move(reuse);
      s.last_used = step_counter_;
    }
    return false;
  }
  auto kv = SequenceKv::Create(model_.config(), model_.backend(), capacity);
  if (!kv.ok()) return false;
  seq->kv = std::move(*kv);
  seq->kv_bytes = bytes;
  kv_bytes_used_ += bytes;
  if (reuse_len > 0) {
    seq->kv->CopyPrefixFrom(*reuse, reuse_len, model_.backend());
    seq->cached = reuse_len;
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
  if (seq.kv != nullptr) {
    kv_bytes_used_ -= seq.kv_bytes;
    const bool keep = !seq.req.session_id.empty() && options_.max_sessions > 0 &&
                      (reason == FinishReason::kStop || reason == FinishReason::kLength);
    if (keep) {
      Session& s = sessions_[seq.req.session_id];
      s.tokens = seq.req.prompt;
      s.tokens.insert(s.tokens.end(), seq.output.begin(), seq.output.end());
      s.tokens.resize(seq.kv->length());  // the last sampled token has no K/V yet
      s.kv = std::move(seq.kv);
      s.last_used = step_counter_;
      kv_bytes_used_ += KvBytes(s.kv->capacity());
      while (static_cast<int64_t>(sessions_.size()) > options_.max_sessions) {
        auto lru = std::min_element(sessions_.begin(), sessions_.end(), [](const auto& a, const auto& b) {
          return a.second.last_used < b.second.last_used;
        });
        kv_bytes_used_ -= KvBytes(lru->second.kv->capacity());
        sessions_.erase(lru);
      }
    }
    seq.kv.reset();
  }
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
  // 1. Cancels: queued or running, final event at once, KV freed.
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

  // 2. Admissions in arrival order while the batch and the KV budget allow.
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    if (!Admit(waiting_.front())) break;
    waiting_.front()->admitted_us = base::NowMicros();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (running_.empty()) return events;

  // 3. Plan: every decode gets its one token, then prefill chunks fill the remaining budget.
  struct Planned {
    Sequence* seq;
    std::vector<int32_t> tokens;
    bool samples;  // this chunk ends at the end of the prompt, or is a decode
  };
  std::vector<Planned> plan;
  int64_t budget = options_.max_batch_tokens;
  for (auto& s : running_) {
    if (!s->prefilling() && budget > 0) {
      plan.push_back({s.get(), {s->output.back()}, true});
      --budget;
    }
  }
  for (auto& s : running_) {
    if (!s->prefilling() || budget <= 0) continue;
    const int64_t begin = s->kv->length();
    const int64_t end = std::min<int64_t>(s->req.prompt.size(), begin + budget);
    plan.push_back({s.get(), {s->req.prompt.begin() + begin, s->req.prompt.begin() + end},
                    end == static_cast<int64_t>(s->req.prompt.size())});
    budget -= end - begin;
  }
  std::vector<ForwardItem> items;
  for (Planned& p : plan) items.push_back({p.tokens, p.seq->kv.get()});

  // 4. Forward, 5. sample. An error fails every sequence of the step (it names the cause).
  std::vector<float> logits;
  const absl::Status st = model_.Forward(items, false, &logits);
  const int64_t V = model_.config().vocab_size;
  std::vector<Sequence*> done;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    if (!st.ok()) {
      Finish(s, FinishReason::kError, st, false, &events);
      done.push_back(&s);
      continue;
    }
    if (!plan[i].samples) continue;
    TokenLogprobs lp;
    const int32_t token = s.sampler.Sample(absl::MakeSpan(logits.data() + i * V, V), s.req.prompt,
                                           s.output, s.req.top_logprobs,
                                           s.req.return_logprobs ? &lp : nullptr);
    Emit(s, token, lp, &events);
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
  s.kv_bytes_used = kv_bytes_used_;
  s.kv_bytes_budget = options_.kv_budget_bytes;
  s.kv_bytes_per_token = SequenceKv::BytesPerToken(model_.config());
  s.sessions = static_cast<int64_t>(sessions_.size());
  return s;
}

}  // namespace moe::engine
