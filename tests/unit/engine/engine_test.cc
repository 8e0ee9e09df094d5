// Engine: continuous batching gives each request the tokens it gets alone, seeds reproduce,
// cancels and finishes free KV at once, sessions reuse their KV, bad requests are refused.
#include "engine/engine.h"

#include <map>

#include "engine/default_model.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

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
    Engine engine(*model_, *tokenizer_, small_steps);
    ASSERT_TRUE(engine.Add(MakeRequest(id, std::string("The sea ") + id + " is wide and deep", 12)).ok());
    solo[id] = RunAll(engine)[id].tokens;
  }
  Engine engine(*model_, *tokenizer_, small_steps);
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
    Engine engine(*model_, *tokenizer_, {});
    EXPECT_TRUE(engine.Add(MakeRequest("x", "Hello", 16, 1.0f, seed)).ok());
    return RunAll(engine)["x"].tokens;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST_F(EngineTest, CancelFreesKvAtOnce) {
  Engine engine(*model_, *tokenizer_, {});
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
  Engine engine(*model_, *tokenizer_, {});
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
  Engine cold(*model_, *tokenizer_, {});
  second.session_id.clear();
  ASSERT_TRUE(cold.Add(second).ok());
  EXPECT_EQ(RunAll(cold)["t2"].tokens, r2.tokens);
  EXPECT_TRUE(engine.DropSession("s").ok());
  EXPECT_EQ(engine.Stats().kv_bytes_used, 0);
}

TEST_F(EngineTest, StopStringEndsTheStreamAndIsNotEmitted) {
  Engine probe(*model_, *tokenizer_, {});
  ASSERT_TRUE(probe.Add(MakeRequest("p", "Once upon a time", 24)).ok());
  const std::string full = RunAll(probe)["p"].text;
  ASSERT_GT(full.size(), 8u);
  const std::string stop = full.substr(4, 3);
  Engine engine(*model_, *tokenizer_, {});
  Request r = MakeRequest("s", "Once upon a time", 24);
  r.stop.stop_strings = {stop};
  ASSERT_TRUE(engine.Add(r).ok());
  auto result = RunAll(engine)["s"];
  EXPECT_EQ(result.final_event.finish, FinishReason::kStop);
  EXPECT_EQ(result.text, full.substr(0, full.find(stop)));
}

TEST_F(EngineTest, BadRequestsAreRefusedWithTheField) {
  Engine engine(*model_, *tokenizer_, {});
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
  EngineOptions tiny;
  tiny.kv_budget_bytes = 1024;
  Engine small(*model_, *tokenizer_, tiny);
  EXPECT_EQ(small.Add(MakeRequest("y", "Hi", 4)).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(EngineTest, KvBudgetQueuesInsteadOfFailing) {
  EngineOptions opts;
  // Room for one request's KV at a time: the second waits, then runs when the first is done.
  const int64_t per_token = SequenceKv::BytesPerToken(model_->config());
  Request a = MakeRequest("a", "One two three", 6), b = MakeRequest("b", "Four five six", 6);
  opts.kv_budget_bytes = per_token * static_cast<int64_t>(std::max(a.prompt.size(), b.prompt.size()) + 6);
  Engine engine(*model_, *tokenizer_, opts);
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

}  // namespace
}  // namespace moe::engine
