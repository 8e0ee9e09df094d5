// Router: session first, then the longest remembered prompt prefix within the load slack, then
// least load; the per-worker prefix memory is bounded and forgotten when a worker goes down.
#include "service/frontend/router.h"

#include <gtest/gtest.h>

#include <numeric>

namespace moe::service {
namespace {

// Two workers serving "m", up and idle. Endpoints never connect: nothing here polls them.
class RouterTest : public ::testing::Test {
 protected:
  RouterTest() : workers_(Options(), nullptr) {
    for (const auto& w : workers_.Snapshot()) Serve(*w, true);
    w0_ = workers_.Snapshot()[0];
    w1_ = workers_.Snapshot()[1];
  }
  static WorkerSetOptions Options() {
    WorkerSetOptions o;
    o.static_targets = {"127.0.0.1:1", "127.0.0.1:2"};
    return o;
  }
  static void Serve(WorkerEndpoint& w, bool serving, const std::string& instance = "i") {
    moe::internal::v1::WorkerInfo info;
    info.mutable_model()->set_name("m");
    info.set_serving(serving);
    info.set_instance_id(instance);
    w.Update(grpc::Status::OK, info);
  }
  // Token ids [first, first + n).
  static moe::v1::GenerateRequest Ids(int first, int n) {
    moe::v1::GenerateRequest r;
    r.set_model("m");
    for (int i = 0; i < n; ++i) r.mutable_token_ids()->add_ids(static_cast<uint32_t>(first + i));
    return r;
  }
  // Picks for `r` (no session, nothing excluded); returns the target and sets `reason_`.
  std::string PickFor(Router& router, const moe::v1::GenerateRequest& r,
                      const std::set<std::string>& exclude = {}) {
    auto w = router.Pick("m", "", exclude, router.PrefixChain(r), &reason_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? (*w)->target() : "";
  }

  WorkerSet workers_;
  std::shared_ptr<WorkerEndpoint> w0_, w1_;
  RouteReason reason_ = RouteReason::kSession;
};

TEST_F(RouterTest, PrefixChainCoversFullChunksAndExtends) {
  Router router(workers_, {});
  EXPECT_TRUE(router.PrefixChain(Ids(0, 15)).empty());  // shorter than one 16-token chunk
  const std::vector<uint64_t> a = router.PrefixChain(Ids(0, 40)),
                              b = router.PrefixChain(Ids(0, 64));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  // A different first chunk changes every later hash (chained).
  const std::vector<uint64_t> c = router.PrefixChain(Ids(1, 64));
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NE(c[i], b[i]) << i;
  // Text and chat: 64-byte chunks, and never the same hashes as each other.
  moe::v1::GenerateRequest text, chat;
  text.set_text(std::string(130, 'x'));
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(std::string(130, 'x'));
  EXPECT_EQ(router.PrefixChain(text).size(), 2u);
  ASSERT_EQ(router.PrefixChain(chat).size(), 2u);
  EXPECT_NE(router.PrefixChain(text)[0], router.PrefixChain(chat)[0]);
  RouterOptions off;
  off.prefix_routing = false;
  EXPECT_TRUE(Router(workers_, off).PrefixChain(Ids(0, 64)).empty());
}

TEST_F(RouterTest, LongestPrefixWins) {
  Router router(workers_, {});
  // w0 was sent the first 2 chunks of the prompt, w1 all 4 (the other is excluded each time).
  EXPECT_EQ(PickFor(router, Ids(0, 32), {w1_->target()}), w0_->target());
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w0_->target()}), w1_->target());
  w1_->outstanding_tokens = 100;  // more loaded, within the default slack
  EXPECT_EQ(PickFor(router, Ids(0, 80)), w1_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
  // Both hold the first 2 chunks of a prompt that diverges after them: the less loaded wins.
  moe::v1::GenerateRequest fork = Ids(0, 32);
  for (int i = 0; i < 32; ++i) fork.mutable_token_ids()->add_ids(1000);
  EXPECT_EQ(PickFor(router, fork), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
  // Nothing in common with anything sent: least load.
  EXPECT_EQ(PickFor(router, Ids(500, 64)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kLeastLoad);
}

TEST_F(RouterTest, LoadSlackRespected) {
  RouterOptions o;
  o.prefix_load_slack = 100;
  Router router(workers_, o);
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w1_->target()}), w0_->target());
  w0_->outstanding_tokens = 100;  // exactly the slack above w1's 0: still the prefix worker
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
  w0_->outstanding_tokens = 101;  // beyond it: the least loaded
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w1_->target());
  EXPECT_EQ(reason_, RouteReason::kLeastLoad);
}

TEST_F(RouterTest, MemoryIsBoundedPerWorker) {
  RouterOptions o;
  o.prefix_entries = 4;  // chunks per worker
  Router router(workers_, o);
  w0_->outstanding_tokens = 10;  // without a prefix match, w1 is picked
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w1_->target()}), w0_->target());
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
  // 4 other chunks sent to w0 push all of the first prompt's out.
  EXPECT_EQ(PickFor(router, Ids(100, 64), {w1_->target()}), w0_->target());
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w1_->target());
  EXPECT_EQ(reason_, RouteReason::kLeastLoad);
  // A chain never holds more chunks than a worker remembers.
  EXPECT_EQ(router.PrefixChain(Ids(200, 128)).size(), 4u);
  // Eviction takes a prompt's tail before its head (which every match walks through first).
  EXPECT_EQ(PickFor(router, Ids(200, 64), {w1_->target()}), w0_->target());
  EXPECT_EQ(PickFor(router, Ids(500, 32), {w1_->target()}), w0_->target());  // 2 of 4 go
  EXPECT_EQ(PickFor(router, Ids(200, 32)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
}

TEST_F(RouterTest, DownWorkersSkippedAndForgottenWhenRestarted) {
  Router router(workers_, {});
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w1_->target()}), w0_->target());
  w1_->outstanding_tokens = 10;
  w0_->MarkDown("test");
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w1_->target());
  EXPECT_EQ(reason_, RouteReason::kLeastLoad);
  // Back up restarted (a new instance, cache empty): what it was sent is forgotten, w1 learnt it.
  Serve(*w0_, true, "restarted");
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w1_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
  w1_->MarkDown("test");
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kLeastLoad);
  w0_->MarkDown("test");
  EXPECT_EQ(router.Pick("m", "", {}, {}).status().code(), absl::StatusCode::kUnavailable);
}

// A worker that missed polls (or failed a stream) but did not restart keeps its cache, and the
// router its memory of it: a flap costs no prefills.
TEST_F(RouterTest, PrefixMemorySurvivesAFlap) {
  Router router(workers_, {});
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w1_->target()}), w0_->target());
  w0_->MarkDown("test");
  EXPECT_EQ(PickFor(router, Ids(100, 64)), w1_->target());
  Serve(*w0_, true);  // the same instance
  w0_->outstanding_tokens = 10;
  EXPECT_EQ(PickFor(router, Ids(0, 64)), w0_->target());
  EXPECT_EQ(reason_, RouteReason::kPrefix);
}

// One failed poll is not a dead worker: down after down_after_failed_polls in a row, up again
// after one good poll. A worker that says it is not serving is down at once.
TEST(WorkerEndpoint, DownAfterConsecutiveFailedPolls) {
  WorkerChannelOptions options;
  options.down_after_failed_polls = 3;
  WorkerEndpoint w("127.0.0.1:1", options);
  moe::internal::v1::WorkerInfo info;
  info.mutable_model()->set_name("m");
  info.set_serving(true);
  const grpc::Status timeout(grpc::StatusCode::DEADLINE_EXCEEDED, "poll timed out");
  EXPECT_FALSE(w.up());
  w.Update(timeout, {});
  EXPECT_FALSE(w.up());  // never answered: stays down
  w.Update(grpc::Status::OK, info);
  EXPECT_TRUE(w.up());
  for (int round = 0; round < 2; ++round) {
    w.Update(timeout, {});
    w.Update(timeout, {});
    EXPECT_TRUE(w.up()) << round;
    w.Update(grpc::Status::OK, info);  // resets the count
  }
  for (int i = 0; i < 3; ++i) w.Update(timeout, {});
  EXPECT_FALSE(w.up());
  w.Update(grpc::Status::OK, info);
  EXPECT_TRUE(w.up());
  info.set_serving(false);
  info.set_not_serving_reason("draining");
  w.Update(grpc::Status::OK, info);
  EXPECT_FALSE(w.up());
  EXPECT_EQ(w.restarts(), 0);
}

TEST_F(RouterTest, SessionComesFirst) {
  Router router(workers_, {});
  EXPECT_EQ(PickFor(router, Ids(0, 64), {w1_->target()}), w0_->target());
  router.Bind("s", w1_->target());
  w1_->outstanding_tokens = 1 << 20;
  RouteReason reason = RouteReason::kLeastLoad;
  auto w = router.Pick("m", "s", {}, router.PrefixChain(Ids(0, 64)), &reason);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->target(), w1_->target());
  EXPECT_EQ(reason, RouteReason::kSession);
  EXPECT_EQ(router.Pick("x", "", {}, {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(RouterOptions, Validate) {
  EXPECT_TRUE(RouterOptions{}.Validate().ok());
  RouterOptions o;
  o.prefix_chunk_tokens = 0;
  EXPECT_NE(o.Validate().message().find("prefix_chunk_tokens"), std::string::npos);
  o = {};
  o.prefix_load_slack = -1;
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace moe::service
