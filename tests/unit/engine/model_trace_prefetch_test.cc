// Model's routing trace (set_routing_trace) and next-layer prefetch (set_prefetch_next_layer) on
// the built-in default model: the trace holds exactly what the model asked its expert provider
// for, is the same for the same run, and replays through the simulator; prefetch is counted
// (issued, used) and never changes the generated tokens.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/store_import.h"
#include "expertstore/belady.h"
#include "expertstore/checkpoint_provider.h"
#include "expertstore/importer.h"
#include "expertstore/routing_trace.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {
namespace fs = std::filesystem;

// Forwards to `inner` and remembers every Acquire: the routing as the provider saw it.
class RecordingProvider final : public store::ExpertProvider {
 public:
  explicit RecordingProvider(std::unique_ptr<store::ExpertProvider> inner)
      : inner_(std::move(inner)) {}
  absl::StatusOr<std::vector<store::ExpertHandle>> Acquire(
      int32_t layer, absl::Span<const int32_t> experts) override {
    calls_->push_back({0, layer, std::vector<int32_t>(experts.begin(), experts.end())});
    return inner_->Acquire(layer, experts);
  }
  std::shared_ptr<std::vector<store::RoutingRecord>> calls() const { return calls_; }

 private:
  std::unique_ptr<store::ExpertProvider> inner_;
  std::shared_ptr<std::vector<store::RoutingRecord>> calls_ =
      std::make_shared<std::vector<store::RoutingRecord>>();
};

class ModelTracePrefetchTest : public ::testing::Test {
 protected:
  // The default model once, as a checkpoint and imported into a model store (bf16 experts).
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    ASSERT_TRUE(WriteDefaultModel(ModelDir()).ok());
    auto ckpt = store::Checkpoint::Open(ModelDir());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto config = LoadModelConfig(ModelDir());
    ASSERT_TRUE(config.ok()) << config.status();
    auto options = ImportOptionsFor(*config, **ckpt);
    ASSERT_TRUE(options.ok()) << options.status();
    options->model = "default";
    auto imported = store::ImportModel(**ckpt, StoreDir(), *options);
    ASSERT_TRUE(imported.ok()) << imported.status();
    for (const auto& entry : fs::directory_iterator(ModelDir())) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".json")) fs::copy_file(entry.path(), StoreDir() + "/" + name);
    }
    ASSERT_TRUE(Model::IsStoreDir(StoreDir()));
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string ModelDir() { return dir_->File("model"); }
  static std::string StoreDir() { return dir_->File("store"); }

  void SetUp() override {
    backend_ = std::move(*kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
    auto tokenizer = Tokenizer::LoadFromDir(ModelDir());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }

  // Two greedy requests batched together, fixed length. Returns each request's tokens, in
  // request order; *steps counts Engine::Step calls.
  std::vector<std::vector<int32_t>> Generate(Model& model, int64_t* steps = nullptr) {
    EngineOptions options;
    absl::StatusOr<std::unique_ptr<Engine>> made = Engine::Create(model, *tokenizer_, options);
    EXPECT_TRUE(made.ok()) << made.status();
    Engine& engine = **made;
    const char* prompts[] = {"The sea is calm tonight.", "Write a short poem about the sea."};
    for (int i = 0; i < 2; ++i) {
      Request r;
      r.id = std::to_string(i);
      r.prompt = *tokenizer_->Encode(prompts[i]);
      r.sampling.temperature = 0;
      r.stop.max_tokens = 12;
      r.stop.ignore_eos = true;
      EXPECT_TRUE(engine.Add(std::move(r)).ok());
    }
    std::vector<std::vector<int32_t>> tokens(2);
    int64_t n = 0;
    while (engine.HasWork()) {
      ++n;
      for (const Event& e : engine.Step()) {
        EXPECT_NE(e.finish, FinishReason::kError) << e.error;
        if (e.token) tokens[std::stoi(e.request_id)].push_back(*e.token);
      }
    }
    if (steps != nullptr) *steps = n;
    return tokens;
  }

  static inline testing::TempDir* dir_ = nullptr;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(ModelTracePrefetchTest, TraceHoldsWhatTheModelAcquiredAndReplays) {
  const testing::TempDir out;
  std::string text[2];
  for (int run = 0; run < 2; ++run) {
    // Experts straight from the checkpoint (deterministic: every expert resident), behind a
    // provider that sees the same Acquire calls the trace should hold.
    auto ckpt = store::Checkpoint::Open(ModelDir());
    ASSERT_TRUE(ckpt.ok());
    auto config = LoadModelConfig(ModelDir());
    std::vector<kernels::DeviceTensor> storage;
    auto views = LoadExpertsFromCheckpoint(*config, **ckpt, *backend_, &storage);
    ASSERT_TRUE(views.ok()) << views.status();
    auto recording = std::make_unique<RecordingProvider>(
        std::make_unique<store::CheckpointExpertProvider>(std::move(*views)));
    const auto calls = recording->calls();
    auto model = Model::Load(ModelDir(), *backend_, std::move(recording));
    ASSERT_TRUE(model.ok()) << model.status();
    const ModelConfig& c = (*model)->config();

    const std::string path = out.File("trace" + std::to_string(run) + ".txt");
    auto writer = (*model)->RecordRoutingTrace(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    int64_t steps = 0;
    Generate(**model, &steps);
    (*model)->set_routing_trace(nullptr);
    ASSERT_TRUE((*writer)->Flush().ok());

    auto trace = store::ReadRoutingTrace(path);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(trace->num_layers, c.num_hidden_layers);
    EXPECT_EQ(trace->num_experts, c.num_experts);
    // Every layer of the default model is sparse: each step lists layers 0..L-1 in order, steps
    // run 0..steps-1, one per Engine::Step.
    ASSERT_EQ(static_cast<int64_t>(trace->records.size()), steps * c.num_hidden_layers);
    ASSERT_EQ(trace->records.size(), calls->size());
    for (size_t i = 0; i < trace->records.size(); ++i) {
      const store::RoutingRecord& r = trace->records[i];
      EXPECT_EQ(r.step, static_cast<int64_t>(i) / c.num_hidden_layers) << "record " << i;
      EXPECT_EQ(r.layer, static_cast<int64_t>(i) % c.num_hidden_layers) << "record " << i;
      EXPECT_EQ(r.layer, (*calls)[i].layer) << "record " << i;
      EXPECT_EQ(r.experts, (*calls)[i].experts) << "record " << i;
      // The union of top-k over the batch: between k and min(E, tokens * k) distinct ids.
      EXPECT_GE(static_cast<int64_t>(r.experts.size()), c.num_experts_per_tok);
      EXPECT_TRUE(std::is_sorted(r.experts.begin(), r.experts.end()));
      EXPECT_EQ(std::adjacent_find(r.experts.begin(), r.experts.end()), r.experts.end());
    }
    text[run] = ReadFile(path);
  }
  EXPECT_EQ(text[0], text[1]) << "the same run recorded a different trace";

  // The simulator's replay: MIN is an upper bound of every policy at every size, and the whole
  // model cached misses only the first touch of each expert.
  auto trace = store::ReadRoutingTrace(out.File("trace0.txt"));
  ASSERT_TRUE(trace.ok());
  const std::vector<store::ExpertId> accesses = store::TraceAccesses(*trace);
  size_t listed = 0;
  for (const auto& r : trace->records) listed += r.experts.size();
  ASSERT_EQ(accesses.size(), listed);
  const int64_t total = int64_t{trace->num_layers} * trace->num_experts;
  for (const int64_t capacity : {total / 10, total / 4, total / 2, total}) {
    const store::SimResult min = store::SimulateBelady(accesses, capacity);
    EXPECT_EQ(min.accesses, accesses.size());
    const store::SimResult min_bypass = store::SimulateBelady(accesses, capacity, true);
    for (const std::string& name : store::PolicyNames()) {
      store::PolicyOptions o;
      o.name = name;
      o.num_layers = trace->num_layers;
      o.num_experts = trace->num_experts;
      auto policy = store::MakePolicy(o);
      ASSERT_TRUE(policy.ok());
      const store::SimResult r = store::SimulatePolicy(*trace, capacity, **policy);
      EXPECT_LE(r.hits, r.bypasses > 0 ? min_bypass.hits : min.hits)
          << name << " at " << capacity;
    }
    std::printf("capacity %3lld experts: belady hit rate %.2f%%\n",
                static_cast<long long>(capacity), 100.0 * min.hit_rate());
  }
  absl::flat_hash_set<store::ExpertId> distinct(accesses.begin(), accesses.end());
  EXPECT_EQ(store::SimulateBelady(accesses, total).hits, accesses.size() - distinct.size());
}

TEST_F(ModelTracePrefetchTest, PrefetchIsCountedAndNeverChangesTokens) {
  std::vector<std::vector<int32_t>> tokens[2];
  store::StoreStats stats[2];
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    store::StoreOptions so;
    // ~25 of the 64 experts (one slot ~196 KiB): a step touches more, so layers evict each
    // other's experts, and one layer's pinned experts leave slots for the next one's prefetch.
    so.device_budget_bytes = 5 << 20;
    so.host_budget_bytes = 0;
    auto model = Model::Load(StoreDir(), *backend_, so);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_NE((*model)->expert_store(), nullptr);
    (*model)->set_prefetch_next_layer(prefetch == 1);
    tokens[prefetch] = Generate(**model);
    stats[prefetch] = (*model)->expert_store()->Stats();
    std::printf("prefetch %s: device hits %llu misses %llu, evictions %llu, transient %llu; "
                "prefetch issued %llu used %llu dropped %llu, prefetch time %.1f ms\n",
                prefetch ? "on " : "off",
                static_cast<unsigned long long>(stats[prefetch].device.hits),
                static_cast<unsigned long long>(stats[prefetch].device.misses),
                static_cast<unsigned long long>(stats[prefetch].device.evictions),
                static_cast<unsigned long long>(stats[prefetch].transient_loads),
                static_cast<unsigned long long>(stats[prefetch].prefetch_issued),
                static_cast<unsigned long long>(stats[prefetch].prefetch_used),
                static_cast<unsigned long long>(stats[prefetch].prefetch_dropped),
                (*model)->phase_times().prefetch_us / 1e3);
  }
  EXPECT_EQ(stats[0].prefetch_issued, 0u);
  EXPECT_EQ(stats[0].prefetch_used, 0u);
  const store::StoreStats& on = stats[1];
  EXPECT_GT(on.prefetch_issued, 0u);
  EXPECT_GT(on.prefetch_used, 0u);
  EXPECT_LE(on.prefetch_used, on.prefetch_issued);
  std::printf("prefetch accuracy (used / issued): %.1f%%\n",
              100.0 * on.prefetch_used / on.prefetch_issued);
  ASSERT_EQ(tokens[0].size(), 2u);
  EXPECT_EQ(tokens[0][0].size(), 12u);
  EXPECT_EQ(tokens[0], tokens[1]) << "prefetch changed the generated tokens";
}

TEST_F(ModelTracePrefetchTest, PrefetchWithoutAStoreDoesNothing) {
  auto model = Model::Load(ModelDir(), *backend_);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->expert_store(), nullptr);
  const auto off = Generate(**model);
  (*model)->set_prefetch_next_layer(true);
  EXPECT_EQ(Generate(**model), off);
  EXPECT_EQ((*model)->phase_times().prefetch_us, 0);
}

}  // namespace
}  // namespace moe::engine
