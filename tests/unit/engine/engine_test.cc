// Engine: continuous batching gives each request the tokens it gets alone, seeds reproduce,
// cancels and finishes free KV at once, sessions reuse their KV, bad requests are refused.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/default_model.h"
#include "expertstore/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

// Engine::Create, failing the test (with the status) if the engine cannot be made.
std::unique_ptr<Engine> MakeEngine(Model& model, const Tokenizer& tokenizer,
                                   const EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model, tokenizer, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    ASSERT_TRUE(WriteDefaultModel(dir_->path()).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    backend_ = std::move(*kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
    auto model = Model::Load(dir_->path(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Tokenizer::LoadFromDir(dir_->path());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }

  Request MakeRequest(const std::string& id, const std::string& text, int64_t max_tokens,
                      float temperature = 0.f, uint64_t seed = 0) {
    Request r;
    r.id = id;
    r.prompt = *tokenizer_->Encode(text);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    return r;
  }

  // Runs the engine dry; returns the tokens and final event of each request.
  struct Result {
    std::vector<int32_t> tokens;
    std::string text;
    Event final_event;
  };
  std::map<std::string, Result> RunAll(Engine& engine) {
    std::map<std::string, Result> out;
    for (int guard = 0; engine.HasWork() && guard < 10000; ++guard) {
      for (Event& e : engine.Step()) {
        Result& r = out[e.request_id];
        if (e.token) r.tokens.push_back(*e.token);
        r.text += e.text;
        if (e.finish != FinishReason::kNone) r.final_event = e;
      }
    }
    return out;
  }

  static testing::TempDir* dir_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};
testing::TempDir* EngineTest::dir_ = nullptr;

TEST_F(EngineTest, BatchedRequestsGetTheirSoloTokens) {
  EngineOptions small_steps;
  small_steps.max_batch_tokens = 5;  // forces chunked prefill interleaved with decodes
  std::map<std::string, std::vector<int32_t>> solo;
  for (const char* id : {"a", "b", "c"}) {
    auto engine_owner = MakeEngine(*model_, *tokenizer_, small_steps);
    Engine& engine = *engine_owner;
    ASSERT_TRUE(engine.Add(MakeRequest(id, std::string("The sea ") + id + " is wide and deep", 12)).ok());
    solo[id] = RunAll(engine)[id].tokens;
  }
  auto engine_owner = MakeEngine(*model_, *tokenizer_, small_steps);
  Engine& engine = *engine_owner;
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(engine.Add(MakeRequest(id, std::string("The sea ") + id + " is wide and deep", 12)).ok());
  }
  auto together = RunAll(engine);
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_EQ(together[id].tokens, solo[id]) << id;
    EXPECT_EQ(together[id].final_event.finish, FinishReason::kLength);
    EXPECT_EQ(together[id].final_event.usage.completion_tokens, 12);
  }
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
}

TEST_F(EngineTest, SameSeedSameTokens) {
  auto run = [&](uint64_t seed) {
    auto engine_owner = MakeEngine(*model_, *tokenizer_, {});
    Engine& engine = *engine_owner;
    EXPECT_TRUE(engine.Add(MakeRequest("x", "Hello", 16, 1.0f, seed)).ok());
    return RunAll(engine)["x"].tokens;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST_F(EngineTest, CancelFreesKvAtOnce) {
  auto engine_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& engine = *engine_owner;
  ASSERT_TRUE(engine.Add(MakeRequest("x", "Hello there", 100)).ok());
  engine.Step();
  engine.Step();
  EXPECT_GT(engine.Stats().kv_bytes_used, 0);
  engine.Cancel("x");
  auto events = engine.Step();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
  EXPECT_FALSE(engine.HasWork());
}

TEST_F(EngineTest, SessionTurnReusesKv) {
  auto engine_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& engine = *engine_owner;
  Request first = MakeRequest("t1", "You are a helpful assistant. Tell me about the sea.", 8);
  first.session_id = "s";
  const std::vector<int32_t> prompt1 = first.prompt;
  ASSERT_TRUE(engine.Add(first).ok());
  auto r1 = RunAll(engine)["t1"];
  EXPECT_EQ(r1.final_event.usage.cached_prompt_tokens, 0);
  EXPECT_GT(engine.Stats().kv_bytes_used, 0);  // kept for the session
  // Next turn: the whole conversation so far, then more text.
  Request second = MakeRequest("t2", "", 4);
  second.session_id = "s";
  second.prompt = prompt1;
  second.prompt.insert(second.prompt.end(), r1.tokens.begin(), r1.tokens.end());
  const auto more = *tokenizer_->Encode(" And the waves?");
  second.prompt.insert(second.prompt.end(), more.begin(), more.end());
  ASSERT_TRUE(engine.Add(second).ok());
  auto r2 = RunAll(engine)["t2"];
  // Everything but the last sampled token of turn 1 had K/V.
  EXPECT_EQ(r2.final_event.usage.cached_prompt_tokens,
            static_cast<int64_t>(prompt1.size() + r1.tokens.size() - 1));
  // The cached path gives the tokens a cold run gives.
  auto cold_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& cold = *cold_owner;
  second.session_id.clear();
  ASSERT_TRUE(cold.Add(second).ok());
  EXPECT_EQ(RunAll(cold)["t2"].tokens, r2.tokens);
  EXPECT_TRUE(engine.DropSession("s").ok());
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
}

TEST_F(EngineTest, StopStringEndsTheStreamAndIsNotEmitted) {
  auto probe_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& probe = *probe_owner;
  ASSERT_TRUE(probe.Add(MakeRequest("p", "Once upon a time", 24)).ok());
  const std::string full = RunAll(probe)["p"].text;
  ASSERT_GT(full.size(), 8u);
  const std::string stop = full.substr(4, 3);
  auto engine_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& engine = *engine_owner;
  Request r = MakeRequest("s", "Once upon a time", 24);
  r.stop.stop_strings = {stop};
  ASSERT_TRUE(engine.Add(r).ok());
  auto result = RunAll(engine)["s"];
  EXPECT_EQ(result.final_event.finish, FinishReason::kStop);
  EXPECT_EQ(result.text, full.substr(0, full.find(stop)));
}

TEST_F(EngineTest, EosFromGenerationConfigStopsUnlessIgnored) {
  constexpr int64_t kMaxTokens = 16;
  auto probe_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& probe = *probe_owner;
  ASSERT_TRUE(probe.Add(MakeRequest("p", "The sea is", kMaxTokens)).ok());
  const std::vector<int32_t> greedy = RunAll(probe)["p"].tokens;
  ASSERT_EQ(static_cast<int64_t>(greedy.size()), kMaxTokens);
  // The EOS id: the first greedy token from step 2 on that was not produced before it, so a
  // stopping run ends exactly there (greedy decoding is deterministic).
  size_t eos_step = 2;
  while (eos_step < greedy.size() &&
         std::find(greedy.begin(), greedy.begin() + eos_step, greedy[eos_step]) !=
             greedy.begin() + eos_step) {
    ++eos_step;
  }
  ASSERT_LT(eos_step + 1, greedy.size()) << "greedy output repeats itself: no fresh token";
  const int32_t eos = greedy[eos_step];
  ASSERT_FALSE(tokenizer_->Decode({&eos, 1})->empty());

  // The same model with that id as generation_config.json's only EOS.
  testing::TempDir dir;
  std::filesystem::copy(dir_->path(), dir.path(), std::filesystem::copy_options::recursive);
  dir.Write("generation_config.json", absl::StrCat("{\"eos_token_id\": [", eos, "]}"));
  auto model = Model::Load(dir.path(), *backend_);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->config().eos_token_ids, std::vector<int32_t>{eos});

  auto engine_owner = MakeEngine(**model, *tokenizer_, {});
  Engine& engine = *engine_owner;
  Request r = MakeRequest("s", "The sea is", kMaxTokens);
  r.stop.ignore_eos = false;
  ASSERT_TRUE(engine.Add(r).ok());
  const auto stopped = RunAll(engine)["s"];
  EXPECT_EQ(stopped.final_event.finish, FinishReason::kStop);
  // The EOS token ends the stream as a token event, its text is not emitted.
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + eos_step + 1));
  EXPECT_EQ(stopped.final_event.usage.completion_tokens, static_cast<int64_t>(eos_step + 1));
  EXPECT_EQ(stopped.text, *tokenizer_->Decode({greedy.data(), eos_step}));

  // ignore_eos generates through it to max_tokens.
  auto through_owner = MakeEngine(**model, *tokenizer_, {});
  Engine& through = *through_owner;
  r.stop.ignore_eos = true;
  ASSERT_TRUE(through.Add(r).ok());
  const auto full = RunAll(through)["s"];
  EXPECT_EQ(full.final_event.finish, FinishReason::kLength);
  EXPECT_EQ(full.tokens, greedy);
}

TEST_F(EngineTest, BadRequestsAreRefusedWithTheField) {
  auto engine_owner = MakeEngine(*model_, *tokenizer_, {});
  Engine& engine = *engine_owner;
  Request r = MakeRequest("x", "Hi", 4);
  r.prompt.clear();
  EXPECT_NE(engine.Add(r).message().find("prompt"), std::string::npos);
  r = MakeRequest("x", "Hi", 4);
  r.prompt.push_back(static_cast<int32_t>(model_->config().vocab_size));
  EXPECT_EQ(engine.Add(r).code(), absl::StatusCode::kInvalidArgument);
  r = MakeRequest("x", "Hi", 1 << 20);
  EXPECT_NE(engine.Add(r).message().find("max_tokens"), std::string::npos);
  r = MakeRequest("x", "Hi", 0);
  EXPECT_NE(engine.Add(r).message().find("max_tokens"), std::string::npos);
  r = MakeRequest("x", "Hi", 4);
  r.sampling.top_p = 2;
  EXPECT_NE(engine.Add(r).message().find("top_p"), std::string::npos);
  r = MakeRequest("x", "Hi", 4);
  ASSERT_TRUE(engine.Add(r).ok());
  EXPECT_EQ(engine.Add(r).code(), absl::StatusCode::kInvalidArgument);  // duplicate live id
}

// A budget that holds no block makes no engine (a worker must not start and then fail every
// request); a request that needs more KV than the whole budget is refused for good
// (InvalidArgument naming the limit), not ResourceExhausted, which clients retry forever.
TEST_F(EngineTest, KvBudgetLimitsArePermanentErrors) {
  EngineOptions tiny;
  tiny.kv_budget_bytes = 1024;
  absl::StatusOr<std::unique_ptr<Engine>> none = Engine::Create(*model_, *tokenizer_, tiny);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted) << none.status();
  EXPECT_NE(none.status().message().find("holds no block"), std::string::npos) << none.status();

  EngineOptions two_blocks;
  two_blocks.block_size = 4;
  two_blocks.kv_budget_bytes = SequenceKv::BytesPerToken(model_->config()) * 4 * 2;
  auto small_owner = MakeEngine(*model_, *tokenizer_, two_blocks);
  Engine& small = *small_owner;
  const absl::Status too_big = small.Add(MakeRequest("y", "Hi", 16));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  EXPECT_NE(too_big.message().find("whole KV budget"), std::string::npos) << too_big;
  EXPECT_TRUE(small.Add(MakeRequest("z", "Hi", 2)).ok());
}

TEST_F(EngineTest, KvBudgetQueuesInsteadOfFailing) {
  EngineOptions opts;
  // Room for one request's KV at a time: the second waits, then runs when the first is done.
  const int64_t per_token = SequenceKv::BytesPerToken(model_->config());
  Request a = MakeRequest("a", "One two three", 6), b = MakeRequest("b", "Four five six", 6);
  opts.kv_budget_bytes = per_token * static_cast<int64_t>(std::max(a.prompt.size(), b.prompt.size()) + 6);
  auto engine_owner = MakeEngine(*model_, *tokenizer_, opts);
  Engine& engine = *engine_owner;
  ASSERT_TRUE(engine.Add(a).ok());
  ASSERT_TRUE(engine.Add(b).ok());
  engine.Step();
  EXPECT_EQ(engine.Stats().running, 1);
  EXPECT_EQ(engine.Stats().waiting, 1);
  auto results = RunAll(engine);
  EXPECT_EQ(results["a"].final_event.usage.completion_tokens, 6);  // its first token came above
  EXPECT_EQ(results["b"].tokens.size(), 6u);
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
}

// A second request with the same 1,000-token prefix is served 992 of them from cached blocks
// (62 full blocks of 16; the 63rd is partial) and prefills only the rest.
TEST_F(EngineTest, SharedPrefixReusesBlocks) {
  std::mt19937 rng(7);
  std::vector<int32_t> prefix(1000);
  for (int32_t& t : prefix) t = static_cast<int32_t>(rng() % 600);
  EngineOptions opts;
  opts.max_batch_tokens = 256;
  auto engine_owner = MakeEngine(*model_, *tokenizer_, opts);
  Engine& engine = *engine_owner;
  auto run = [&](const std::string& id, std::vector<int32_t> prompt) {
    Request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.stop.max_tokens = 4;
    r.stop.ignore_eos = true;
    const absl::Status added = engine.Add(r);
    EXPECT_TRUE(added.ok()) << added;
    const int64_t prefill0 = engine.Stats().prefill_tokens;
    const auto t0 = std::chrono::steady_clock::now();
    int steps = 0;
    Result result;
    bool first = false;
    double ttft = 0;
    while (engine.HasWork()) {
      ++steps;
      for (Event& e : engine.Step()) {
        if (e.token) result.tokens.push_back(*e.token);
        if (e.token && !first) {
          first = true;
          ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        if (e.finish != FinishReason::kNone) result.final_event = e;
      }
    }
    std::printf("%s: %d steps, %lld tokens prefilled, time to first token %.1f ms, cached %lld\n",
                id.c_str(), steps, static_cast<long long>(engine.Stats().prefill_tokens - prefill0),
                ttft * 1e3, static_cast<long long>(result.final_event.usage.cached_prompt_tokens));
    return result;
  };
  std::vector<int32_t> a = prefix, b = prefix;
  a.insert(a.end(), {5, 6, 7});
  b.insert(b.end(), {8, 9});
  const Result ra = run("a", a);
  EXPECT_EQ(ra.final_event.usage.cached_prompt_tokens, 0);
  const Result rb = run("b", b);
  EXPECT_EQ(rb.final_event.usage.cached_prompt_tokens, 992);
  EXPECT_EQ(rb.final_event.usage.prompt_tokens, 1002);
  // The cached path gives what a cold engine gives.
  auto cold_owner = MakeEngine(*model_, *tokenizer_, opts);
  Engine& cold = *cold_owner;
  Request r;
  r.id = "b";
  r.prompt = b;
  r.stop.max_tokens = 4;
  r.stop.ignore_eos = true;
  ASSERT_TRUE(cold.Add(r).ok());
  EXPECT_EQ(RunAll(cold)["b"].tokens, rb.tokens);
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
  EXPECT_TRUE(engine.kv_cache()->CheckInvariants().ok());
}

// A step that fails (here: a prompt token whose embedding row is NaN, which the first router
// refuses) fails its sequences, and the blocks it filled, registered before their KV was written,
// serve no later prompt: the next prompt with the same 64-token prefix is computed in full and
// gets what a cold engine gives. (They were reused before, reading KV that was never written.)
TEST_F(EngineTest, FailedStepLeavesNoBlocksForPrefixReuse) {
  constexpr int32_t kPoisoned = 77;
  testing::TempDir poisoned;
  for (const auto& entry : std::filesystem::directory_iterator(dir_->path())) {
    std::filesystem::copy(entry.path(), poisoned.path() + "/" + entry.path().filename().string());
  }
  {
    auto ckpt = store::Checkpoint::Open(poisoned.path());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const store::TensorInfo& embed = (*ckpt)->tensors().at("model.embed_tokens.weight");
    ASSERT_EQ(embed.dtype, kernels::DType::kBF16);
    const std::vector<uint16_t> nan_row(embed.shape[1], 0x7FC0);
    std::fstream io(poisoned.path() + "/model.safetensors",
                    std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(embed.offset + kPoisoned * nan_row.size() * 2));
    io.write(reinterpret_cast<const char*>(nan_row.data()),
             static_cast<std::streamsize>(nan_row.size() * 2));
  }
  auto model = Model::Load(poisoned.path(), *backend_);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> prefix(64);
  for (int32_t i = 0; i < 64; ++i) prefix[i] = 100 + i;
  std::vector<int32_t> bad = prefix, good = prefix;
  bad.push_back(kPoisoned);
  good.push_back(5);
  auto request = [&](const std::string& id, const std::vector<int32_t>& prompt) {
    Request r;
    r.id = id;
    r.prompt = prompt;
    r.stop.max_tokens = 6;
    r.stop.ignore_eos = true;
    return r;
  };
  auto engine = MakeEngine(**model, *tokenizer_, EngineOptions{});
  ASSERT_TRUE(engine->Add(request("bad", bad)).ok());
  const Event failed = RunAll(*engine)["bad"].final_event;
  EXPECT_EQ(failed.finish, FinishReason::kError);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kInvalidArgument) << failed.error;
  ASSERT_TRUE(engine->Add(request("good", good)).ok());
  const Result after = RunAll(*engine)["good"];
  EXPECT_EQ(after.final_event.finish, FinishReason::kLength) << after.final_event.error;
  EXPECT_EQ(after.final_event.usage.cached_prompt_tokens, 0);
  auto cold = MakeEngine(**model, *tokenizer_, EngineOptions{});
  ASSERT_TRUE(cold->Add(request("good", good)).ok());
  EXPECT_EQ(RunAll(*cold)["good"].tokens, after.tokens);
  EXPECT_EQ(engine->Stats().kv_bytes_used, 0);
  EXPECT_TRUE(engine->kv_cache()->CheckInvariants().ok());
}

// Under a budget too small for everyone, sequences are preempted and recomputed, never failed,
// and each gets the tokens it gets alone.
TEST_F(EngineTest, PreemptionRecomputesAndKeepsTokens) {
  EngineOptions roomy;
  std::map<std::string, std::vector<int32_t>> solo;
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(MakeRequest(absl::StrCat("r", i), absl::StrCat("Tell story number ", i, " about the sea"), 40));
    auto engine_owner = MakeEngine(*model_, *tokenizer_, roomy);
    Engine& engine = *engine_owner;
    ASSERT_TRUE(engine.Add(reqs.back()).ok());
    solo[reqs.back().id] = RunAll(engine)[reqs.back().id].tokens;
  }
  EngineOptions tight;
  tight.block_size = 4;
  auto probe_owner = MakeEngine(*model_, *tokenizer_, roomy);
  Engine& probe = *probe_owner;
  tight.kv_budget_bytes = probe.Stats().kv_bytes_per_token * 4 * 24;  // 24 blocks of 4 tokens
  auto engine_owner = MakeEngine(*model_, *tokenizer_, tight);
  Engine& engine = *engine_owner;
  for (const Request& r : reqs) ASSERT_TRUE(engine.Add(r).ok());
  auto results = RunAll(engine);
  for (const Request& r : reqs) {
    EXPECT_EQ(results[r.id].final_event.finish, FinishReason::kLength) << r.id;
    EXPECT_EQ(results[r.id].tokens, solo[r.id]) << r.id;
  }
  EXPECT_GT(engine.Stats().preemptions, 0);
  std::printf("preemptions: %lld\n", static_cast<long long>(engine.Stats().preemptions));
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
  EXPECT_TRUE(engine.kv_cache()->CheckInvariants().ok());
}

// Thousands of random admit / finish / cancel / session operations through the Engine under a
// tight budget (preemption, eviction, prefix sharing, sessions): the block manager's invariants
// hold after every step and nothing leaks at the end.
TEST_F(EngineTest, RandomOperationsLeakNoBlocks) {
  EngineOptions opts;
  opts.block_size = 4;
  opts.max_batch_tokens = 24;
  opts.max_running = 8;
  opts.max_sessions = 3;
  auto probe_owner = MakeEngine(*model_, *tokenizer_, opts);
  Engine& probe = *probe_owner;
  opts.kv_budget_bytes = probe.Stats().kv_bytes_per_token * 4 * 40;  // 40 blocks of 4
  auto engine_owner = MakeEngine(*model_, *tokenizer_, opts);
  Engine& engine = *engine_owner;
  std::mt19937 rng(1234);
  const std::vector<int32_t> shared = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  std::vector<std::string> live;
  int64_t ops = 0, next = 0;
  for (int step = 0; step < 1200; ++step) {
    const int n_new = static_cast<int>(rng() % 3);
    for (int k = 0; k < n_new; ++k, ++ops) {
      Request r;
      r.id = absl::StrCat("q", next++);
      if (rng() % 2) r.prompt = shared;
      const int extra = 1 + static_cast<int>(rng() % 20);
      for (int j = 0; j < extra; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 500));
      r.stop.max_tokens = 1 + static_cast<int64_t>(rng() % 30);
      r.stop.ignore_eos = true;
      if (rng() % 4 == 0) r.session_id = absl::StrCat("s", rng() % 5);
      ASSERT_TRUE(engine.Add(r).ok());
      live.push_back(r.id);
    }
    if (!live.empty() && rng() % 3 == 0) {
      engine.Cancel(live[rng() % live.size()]);
      ++ops;
    }
    if (rng() % 50 == 0) {
      (void)engine.DropSession(absl::StrCat("s", rng() % 5));
      ++ops;
    }
    for (const Event& e : engine.Step()) {
      if (e.finish != FinishReason::kNone) {
        EXPECT_NE(e.finish, FinishReason::kError) << e.error;
        live.erase(std::remove(live.begin(), live.end(), e.request_id), live.end());
      }
    }
    const absl::Status inv = engine.kv_cache()->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv;
  }
  for (const std::string& id : live) engine.Cancel(id);
  RunAll(engine);
  for (int s = 0; s < 5; ++s) (void)engine.DropSession(absl::StrCat("s", s));
  const EngineStats st = engine.Stats();
  std::printf("%lld operations, %lld preemptions, %lld evictions\n", static_cast<long long>(ops),
              static_cast<long long>(st.preemptions), static_cast<long long>(st.kv_evictions));
  EXPECT_GT(ops, 1000);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.kv_bytes_used, 0);
  EXPECT_EQ(st.kv_blocks_used + st.kv_blocks_cached + st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_TRUE(engine.kv_cache()->CheckInvariants().ok());
}

// Every KV format runs end to end through the engine (compressed formats the head_dim allows).
TEST_F(EngineTest, CompressedFormatsRun) {
  for (const char* dtype : {"bf16", "fp8_e4m3", "tq4", "tq3", "tq2"}) {
    EngineOptions opts;
    opts.kv_cache_dtype = dtype;
    auto engine_owner = MakeEngine(*model_, *tokenizer_, opts);
    Engine& engine = *engine_owner;
    ASSERT_TRUE(engine.Add(MakeRequest("x", "The sea is wide and deep", 8)).ok()) << dtype;
    auto r = RunAll(engine)["x"];
    EXPECT_EQ(r.final_event.finish, FinishReason::kLength) << dtype << " " << r.final_event.error;
    EXPECT_EQ(r.tokens.size(), 8u) << dtype;
  }
  EngineOptions bad;
  bad.kv_cache_dtype = "int3";
  EXPECT_EQ(Engine::Create(*model_, *tokenizer_, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The KV tail's options: a negative length and a tail in front of a bf16 cache are refused,
// naming the option.
TEST_F(EngineTest, KvTailOptionsAreChecked) {
  EngineOptions o;
  o.kv_cache_dtype = "fp8_e4m3";
  o.kv_tail_tokens = -1;
  absl::Status st = Engine::Create(*model_, *tokenizer_, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kv_tail_tokens must be >= 0"), std::string::npos) << st;
  o.kv_cache_dtype = "bf16";
  o.kv_tail_tokens = 8;
  st = Engine::Create(*model_, *tokenizer_, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("compressed kv_cache_dtype"), std::string::npos) << st;
  o.kv_cache_dtype = "tq4";
  EXPECT_TRUE(Engine::Create(*model_, *tokenizer_, o).ok());
}

}  // namespace
}  // namespace moe::engine
