// Engine with a hybrid model (a per-sequence state beside the paged KV): the Qwen3.5 hybrid
// (GatedDeltaNet layers: conv inputs and a recurrent state) and LFM2-MoE (short-conv layers: the
// conv state). For both: the state budget is carved out of the KV budget, every path that
// restores or reuses a state (snapshot prefix reuse, session turns, preemption, chunked prefill)
// gives the tokens of a cold run, and slots are freed on finish, cancel and preemption.
// The same with a 16-bit KV tail (kv_tail_tokens) in front of a compressed cache, whose rings
// live in the state slots: on the plain qwen3_moe test model (the tail its only state) and on
// LFM2 (conv state and tail in one slot).
#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

struct Case {
  std::string model_type;  // of the test model
  std::string kv_cache_dtype = "bf16";
  int kv_tail_tokens = 0;
};

class EngineHybridTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { dirs_ = new std::map<std::string, testing::TempDir>(); }
  static void TearDownTestSuite() { delete dirs_; }

  void SetUp() override {
    // Each model written once per process, on its first test.
    const std::string& kind = GetParam().model_type;
    if (!dirs_->count(kind)) {
      const std::string& dir = (*dirs_)[kind].path();
      const absl::Status written = kind == "lfm2_moe"    ? WriteLfm2Model(dir)
                                   : kind == "qwen3_moe" ? WriteDefaultModel(dir)
                                                         : WriteHybridModel(dir);
      ASSERT_TRUE(written.ok()) << written;
    }
    const std::string& dir = (*dirs_)[kind].path();
    backend_ = std::move(*kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
    auto model = Model::Load(dir, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    ASSERT_GT(StateBytes(), 0) << "the test model has no per-sequence state";
    ASSERT_EQ(model_->config().arch.model_type, kind);
    auto tok = Tokenizer::LoadFromDir(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }

  // Every engine of a test gets the case's KV format and tail.
  static EngineOptions WithCase(EngineOptions options) {
    options.kv_cache_dtype = GetParam().kv_cache_dtype;
    options.kv_tail_tokens = GetParam().kv_tail_tokens;
    return options;
  }
  std::unique_ptr<Engine> Make(const EngineOptions& options) {
    auto engine = Engine::Create(*model_, *tokenizer_, WithCase(options));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }

  // `n` pseudo-random token ids from `seed`, inside the vocabulary.
  std::vector<int32_t> Tokens(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    const int64_t vocab = std::min<int64_t>(model_->config().vocab_size, 600);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  }
  static Request Greedy(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
    Request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.f;  // greedy (the default, 1, samples)
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    return r;
  }

  struct Result {
    std::vector<int32_t> tokens;
    Event final_event;
  };
  // Runs the engine dry, checking the pools after every step.
  std::map<std::string, Result> RunAll(Engine& engine) {
    std::map<std::string, Result> out;
    for (int guard = 0; engine.HasWork() && guard < 100000; ++guard) {
      for (Event& e : engine.Step()) {
        Result& r = out[e.request_id];
        if (e.token) r.tokens.push_back(*e.token);
        if (e.finish != FinishReason::kNone) r.final_event = e;
      }
      EXPECT_TRUE(engine.state_pool()->CheckInvariants().ok())
          << engine.state_pool()->CheckInvariants();
    }
    return out;
  }
  // The tokens `prompt` gets alone on a fresh engine with roomy defaults.
  std::vector<int32_t> Cold(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    EngineOptions roomy;
    roomy.prefix_reuse = false;
    auto engine = Make(roomy);
    EXPECT_TRUE(engine->Add(Greedy("cold", prompt, max_tokens)).ok());
    Result r = RunAll(*engine)["cold"];
    EXPECT_EQ(r.final_event.finish, FinishReason::kLength);
    return r.tokens;
  }
  // A sequence's state: the model's and the tail's rings.
  int64_t StateBytes() const {
    return model_->state_bytes() + PagedKv::TailBytes(model_->config(), GetParam().kv_tail_tokens);
  }
  int64_t SlotBytes() const { return StatePool::SlotBytes(StateBytes()); }

  static std::map<std::string, testing::TempDir>* dirs_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};
std::map<std::string, testing::TempDir>* EngineHybridTest::dirs_ = nullptr;

// The engine's greedy tokens (paged KV, state slot, sampling on the backend, the prompt in one
// chunk or in chunks of 8) are those of the model driven directly (contiguous KV and its own
// state, argmax on the host), 160 tokens long.
TEST_P(EngineHybridTest, GreedyTokensAreTheModelsDrivenDirectly) {
  const std::vector<int32_t> prompt = Tokens(16, 99);
  const int64_t n = 160;
  auto kv = SequenceKv::Create(model_->config(), *backend_, 16 + n + 1);
  ASSERT_TRUE(kv.ok());
  std::vector<int32_t> direct;
  std::vector<float> logits;
  ForwardItem item{prompt, kv->get()};
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(model_->Forward({&item, 1}, false, &logits).ok());
    direct.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    item.tokens = absl::MakeConstSpan(&direct.back(), 1);
  }
  std::vector<int32_t> first;
  for (int64_t mbt : {256, 8}) {
    EngineOptions o;
    o.prefix_reuse = false;
    o.max_batch_tokens = mbt;
    auto engine = Make(o);
    ASSERT_TRUE(engine->Add(Greedy("x", prompt, n)).ok());
    const std::vector<int32_t> got = RunAll(*engine)["x"].tokens;
    // A compressed cache is not the direct run's fp32 KV: there the chunkings agree.
    if (GetParam().kv_tail_tokens == 0) {
      EXPECT_EQ(got, direct) << "max_batch_tokens " << mbt;
    }
    if (first.empty()) first = got;
    EXPECT_EQ(got, first) << "max_batch_tokens " << mbt;
  }
  EXPECT_EQ(first.size(), static_cast<size_t>(n));
}

TEST_P(EngineHybridTest, StateIsCarvedOutOfTheKvBudget) {
  EngineOptions o;
  o.max_running = 4;
  o.max_sessions = 2;
  o.kv_budget_bytes = int64_t{1} << 30;
  auto engine = Make(o);
  EngineStats s = engine->Stats();
  // Enough for max_running + max_sessions + max_running snapshots.
  EXPECT_EQ(s.state_slots_total, 10);
  EXPECT_EQ(s.state_bytes_budget, 10 * SlotBytes());
  EXPECT_EQ(s.kv_bytes_budget, o.kv_budget_bytes - s.state_bytes_budget);
  EXPECT_EQ(s.state_slots_used, 0);
  EXPECT_EQ(s.state_bytes_used, 0);
  // Capped at half the budget.
  o.kv_budget_bytes = 5 * SlotBytes();
  engine = Make(o);
  EXPECT_EQ(engine->Stats().state_slots_total, 2);
  EXPECT_LE(engine->Stats().kv_bytes_budget + engine->Stats().state_bytes_budget,
            o.kv_budget_bytes);
  // No snapshots: no snapshot slots.
  o.kv_budget_bytes = int64_t{1} << 30;
  o.state_snapshot_blocks = 0;
  EXPECT_EQ(Make(o)->Stats().state_slots_total, 6);
  // Not one slot in half the budget: no engine.
  o.kv_budget_bytes = SlotBytes();
  EXPECT_EQ(Engine::Create(*model_, *tokenizer_, WithCase(o)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(EngineHybridTest, SlotsAreFreedOnFinishAndCancel) {
  auto engine = Make({});
  ASSERT_TRUE(engine->Add(Greedy("a", Tokens(30, 1), 50)).ok());
  ASSERT_TRUE(engine->Add(Greedy("b", Tokens(30, 2), 3)).ok());
  engine->Step();
  EXPECT_EQ(engine->Stats().state_slots_used, 2);
  engine->Cancel("a");
  RunAll(*engine);
  EXPECT_EQ(engine->Stats().state_slots_used, 0);
  EXPECT_EQ(engine->Stats().kv_bytes_used, 0);
}

TEST_P(EngineHybridTest, PrefixReuseStartsFromASnapshotAndKeepsTokens) {
  EngineOptions o;
  o.block_size = 16;
  o.state_snapshot_blocks = 4;  // a snapshot every 64 tokens
  auto engine = Make(o);
  const std::vector<int32_t> prefix = Tokens(200, 3);
  std::vector<int32_t> a = prefix, b = prefix;
  a.insert(a.end(), {5, 6, 7});
  b.insert(b.end(), {8, 9});
  ASSERT_TRUE(engine->Add(Greedy("a", a, 6)).ok());
  const Result ra = RunAll(*engine)["a"];
  EXPECT_EQ(ra.final_event.usage.cached_prompt_tokens, 0);
  // The prompt's first chunk ends at 192, the last boundary within the step's 256 tokens: one
  // snapshot (the boundaries at 64 and 128 lie inside the chunk).
  EXPECT_EQ(engine->Stats().state_snapshots, 1);
  ASSERT_TRUE(engine->Add(Greedy("b", b, 6)).ok());
  const Result rb = RunAll(*engine)["b"];
  // 12 blocks of the prefix are reusable; the deepest snapshot among them is at block 12.
  EXPECT_EQ(rb.final_event.usage.cached_prompt_tokens, 192);
  EXPECT_EQ(engine->Stats().state_snapshot_hits, 1);
  EXPECT_EQ(ra.tokens, Cold(a, 6));
  EXPECT_EQ(rb.tokens, Cold(b, 6));
  EXPECT_EQ(engine->Stats().state_slots_used, 0);
  EXPECT_TRUE(engine->kv_cache()->CheckInvariants().ok());
}

TEST_P(EngineHybridTest, ReuseStopsAtTheDeepestSnapshot) {
  EngineOptions o;
  o.block_size = 16;
  o.state_snapshot_blocks = 4;
  auto engine = Make(o);
  const std::vector<int32_t> prefix = Tokens(100, 4);  // 6 full blocks: snapshot at 4 only
  std::vector<int32_t> a = prefix, b = prefix;
  a.push_back(1);
  b.push_back(2);
  ASSERT_TRUE(engine->Add(Greedy("a", a, 3)).ok());
  RunAll(*engine);
  ASSERT_TRUE(engine->Add(Greedy("b", b, 3)).ok());
  const Result rb = RunAll(*engine)["b"];
  EXPECT_EQ(rb.final_event.usage.cached_prompt_tokens, 64);
  EXPECT_EQ(rb.tokens, Cold(b, 3));
}

TEST_P(EngineHybridTest, NoSnapshotsNoPrefixReuse) {
  EngineOptions o;
  o.state_snapshot_blocks = 0;
  auto engine = Make(o);
  const std::vector<int32_t> prefix = Tokens(100, 5);
  ASSERT_TRUE(engine->Add(Greedy("a", prefix, 2)).ok());
  RunAll(*engine);
  ASSERT_TRUE(engine->Add(Greedy("b", prefix, 2)).ok());
  EXPECT_EQ(RunAll(*engine)["b"].final_event.usage.cached_prompt_tokens, 0);
}

TEST_P(EngineHybridTest, SessionTurnContinuesTheStateLikeAColdRun) {
  EngineOptions o;
  o.block_size = 4;
  auto engine = Make(o);
  const std::vector<int32_t> p1 = Tokens(23, 6);
  Request first = Greedy("t1", p1, 7);
  first.session_id = "s";
  ASSERT_TRUE(engine->Add(first).ok());
  const Result r1 = RunAll(*engine)["t1"];
  EXPECT_EQ(engine->Stats().sessions, 1);
  EXPECT_EQ(engine->Stats().state_slots_used, 1);  // the session's
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.tokens.begin(), r1.tokens.end());
  const std::vector<int32_t> more = Tokens(9, 7);
  p2.insert(p2.end(), more.begin(), more.end());
  Request second = Greedy("t2", p2, 7);
  second.session_id = "s";
  ASSERT_TRUE(engine->Add(second).ok());
  const Result r2 = RunAll(*engine)["t2"];
  // Everything the session consumed: the prompt and the output but its last token.
  EXPECT_EQ(r2.final_event.usage.cached_prompt_tokens,
            static_cast<int64_t>(p1.size() + r1.tokens.size() - 1));
  EXPECT_EQ(r2.tokens, Cold(p2, 7));
  // A turn that does not extend the session: the state cannot be truncated, so it is dropped
  // and the turn starts from a snapshot or from scratch, with a cold run's tokens.
  std::vector<int32_t> p3(p1.begin(), p1.begin() + 17);
  p3.push_back(3);
  Request third = Greedy("t3", p3, 5);
  third.session_id = "s";
  ASSERT_TRUE(engine->Add(third).ok());
  const Result r3 = RunAll(*engine)["t3"];
  EXPECT_EQ(r3.tokens, Cold(p3, 5));
  EXPECT_LE(r3.final_event.usage.cached_prompt_tokens, 16);  // a snapshot boundary at most
  ASSERT_TRUE(engine->DropSession("s").ok());
  EXPECT_EQ(engine->Stats().state_slots_used, 0);
}

// A preempted sequence is recomputed (its decoded tokens become a prefill, in other chunks than
// it first ran) and still gives the tokens it gets alone.
TEST_P(EngineHybridTest, PreemptionUnderATinyBudgetKeepsTokens) {
  EngineOptions tight;
  tight.block_size = 4;
  tight.max_running = 4;
  tight.max_sessions = 0;
  tight.state_snapshot_blocks = 0;
  // 4 slots in at most half the budget, the KV blocks in the rest: 4 slots' bytes (the
  // Qwen3.5 hybrid's large states) or 200 tokens (LFM2's small ones), less than 4 running
  // sequences of ~95 tokens need, so some are preempted.
  const int64_t kv_per_token = Make(tight)->Stats().kv_bytes_per_token;
  tight.kv_budget_bytes = 4 * SlotBytes() + std::max(4 * SlotBytes(), 200 * kv_per_token);
  auto engine = Make(tight);
  ASSERT_EQ(engine->Stats().state_slots_total, 4);
  ASSERT_LT(engine->Stats().kv_blocks_total * tight.block_size, 4 * 95);
  std::vector<Request> reqs;
  std::map<std::string, std::vector<int32_t>> solo;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(Greedy(absl::StrCat("r", i), Tokens(12 + i, 10 + i), 80));
    solo[reqs.back().id] = Cold(reqs.back().prompt, 80);
  }
  for (const Request& r : reqs) ASSERT_TRUE(engine->Add(r).ok());
  auto results = RunAll(*engine);
  for (const Request& r : reqs) {
    EXPECT_EQ(results[r.id].final_event.finish, FinishReason::kLength) << r.id;
    EXPECT_EQ(results[r.id].tokens, solo[r.id]) << r.id;
  }
  std::printf("preemptions: %lld, KV blocks %lld, state slots %lld\n",
              static_cast<long long>(engine->Stats().preemptions),
              static_cast<long long>(engine->Stats().kv_blocks_total),
              static_cast<long long>(engine->Stats().state_slots_total));
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().state_slots_used, 0);
  EXPECT_EQ(engine->Stats().kv_bytes_used, 0);
  EXPECT_TRUE(engine->kv_cache()->CheckInvariants().ok());
}

TEST_P(EngineHybridTest, FewerSlotsThanRunningMakesRequestsWait) {
  EngineOptions o;
  o.max_running = 8;
  o.max_sessions = 0;
  o.state_snapshot_blocks = 0;
  o.block_size = 4;
  o.kv_budget_bytes = 6 * SlotBytes() - 1;  // 2 slots: under half the budget
  auto engine = Make(o);
  ASSERT_EQ(engine->Stats().state_slots_total, 2);
  // The rest holds two running sequences' KV (4 + 3 positions: 2 blocks of 4 each) and a
  // waiting one's prompt block: the wait below is for slots, not blocks.
  ASSERT_GE(engine->Stats().kv_blocks_total, 5);
  std::map<std::string, std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("w", i);
    prompts[id] = Tokens(4, 20 + i);
    ASSERT_TRUE(engine->Add(Greedy(id, prompts[id], 4)).ok());
  }
  std::map<std::string, std::vector<int32_t>> first;
  for (Event& e : engine->Step()) {
    if (e.token) first[e.request_id].push_back(*e.token);
  }
  EXPECT_EQ(engine->Stats().running, 2);
  EXPECT_EQ(engine->Stats().waiting, 2);
  auto results = RunAll(*engine);
  for (auto& [id, tokens] : first) {
    results[id].tokens.insert(results[id].tokens.begin(), tokens.begin(), tokens.end());
  }
  for (const auto& [id, prompt] : prompts) EXPECT_EQ(results[id].tokens, Cold(prompt, 4)) << id;
}

TEST_P(EngineHybridTest, ChunkedPrefillGivesTheTokensOfOneChunk) {
  const std::vector<int32_t> prompt = Tokens(90, 30);
  auto run = [&](int64_t max_batch_tokens) {
    EngineOptions o;
    o.block_size = 4;
    o.max_batch_tokens = max_batch_tokens;
    auto engine = Make(o);
    EXPECT_TRUE(engine->Add(Greedy("x", prompt, 8)).ok());
    EXPECT_TRUE(engine->Add(Greedy("y", Tokens(40, 31), 8)).ok());
    return RunAll(*engine);
  };
  auto small = run(7);
  auto large = run(4096);
  EXPECT_EQ(small["x"].tokens, large["x"].tokens);
  EXPECT_EQ(small["y"].tokens, large["y"].tokens);
  EXPECT_EQ(large["x"].tokens, Cold(prompt, 8));
}

// Random adds, cancels and session turns under a tight budget: the pools' invariants hold after
// every step and no slot or block leaks.
TEST_P(EngineHybridTest, RandomOperationsLeakNoSlots) {
  EngineOptions o;
  o.block_size = 4;
  o.max_batch_tokens = 24;
  o.max_running = 4;
  o.max_sessions = 2;
  o.state_snapshot_blocks = 2;
  auto probe = Make(o);
  o.kv_budget_bytes = std::max<int64_t>(
      probe->Stats().kv_bytes_per_token * 4 * 40 + probe->Stats().state_bytes_budget,
      2 * 10 * SlotBytes());
  auto engine = Make(o);
  std::mt19937 rng(99);
  const std::vector<int32_t> shared = Tokens(20, 40);
  int next = 0;
  for (int step = 0; step < 300; ++step) {
    if (rng() % 3 == 0) {
      std::vector<int32_t> p(shared.begin(), shared.begin() + rng() % 20);
      const std::vector<int32_t> tail = Tokens(1 + rng() % 10, rng());
      p.insert(p.end(), tail.begin(), tail.end());
      Request r = Greedy(absl::StrCat("q", next++), p, 1 + rng() % 12);
      if (rng() % 2 == 0) r.session_id = absl::StrCat("s", rng() % 3);
      ASSERT_TRUE(engine->Add(r).ok());
    }
    if (rng() % 7 == 0 && next > 0) engine->Cancel(absl::StrCat("q", rng() % next));
    engine->Step();
    ASSERT_TRUE(engine->state_pool()->CheckInvariants().ok())
        << engine->state_pool()->CheckInvariants();
    ASSERT_TRUE(engine->kv_cache()->CheckInvariants().ok());
    const EngineStats s = engine->Stats();
    ASSERT_EQ(s.state_slots_used, s.running + s.sessions);
  }
  RunAll(*engine);
  for (const char* s : {"s0", "s1", "s2"}) (void)engine->DropSession(s);
  EXPECT_EQ(engine->Stats().state_slots_used, 0);
  EXPECT_EQ(engine->Stats().kv_bytes_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineHybridTest,
                         ::testing::Values(Case{"qwen3_5_moe"}, Case{"lfm2_moe"},
                                           Case{"qwen3_moe", "fp8_e4m3", 16},
                                           Case{"lfm2_moe", "tq4", 16}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string name = p.param.model_type;
                           if (p.param.kv_tail_tokens > 0) {
                             name += absl::StrCat("_tail", p.param.kv_tail_tokens, "_",
                                                  p.param.kv_cache_dtype);
                           }
                           return name;
                         });

}  // namespace
}  // namespace moe::engine
