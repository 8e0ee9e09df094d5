// The metrics: store counters become counters and a histogram; the text is well formed.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "service/metrics/frontend_metrics.h"
#include "service/metrics/worker_metrics.h"

namespace moe::service::metrics {
namespace {

std::string Text(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

TEST(WorkerMetrics, ExpertStoreCountersPlugIn) {
  prometheus::Registry r;
  WorkerMetrics m(r);
  EXPECT_NE(Text(r).find("moe_store_lookups_total{result=\"hit\",tier=\"device\"} 0"),
            std::string::npos);
  StoreCounters s;
  s.device.hits = 10;
  s.device.misses = 2;
  s.host.bytes_in = 4096;
  s.blob_reads = 3;
  s.host_reads = 7;
  s.load_latency_us_buckets.assign(32, 0);
  s.load_latency_us_buckets[11] = 2;  // [1024, 2048) us
  s.load_total_us = 3000;
  m.UpdateExpertStore(s);
  s.device.hits = 15;  // cumulative: only the difference is added
  m.UpdateExpertStore(s);
  const std::string text = Text(r);
  EXPECT_NE(text.find("moe_store_lookups_total{result=\"hit\",tier=\"device\"} 15"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("moe_store_bytes_in_total{tier=\"host\"} 4096"), std::string::npos);
  EXPECT_NE(text.find("moe_store_blob_reads_total 3"), std::string::npos);
  EXPECT_NE(text.find("moe_store_host_reads_total 7"), std::string::npos);
  EXPECT_NE(text.find("moe_store_load_latency_seconds_count 2"), std::string::npos);
  EXPECT_NE(text.find("moe_store_load_latency_seconds_bucket{le=\"0.002048\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("moe_store_load_latency_seconds_sum 0.003"), std::string::npos);
}

TEST(WorkerMetrics, PhaseTimesAdvanceCounters) {
  prometheus::Registry r;
  WorkerMetrics m(r);
  engine::PhaseTimes t;
  t.attention_us = 2'000'000;
  m.SetPhaseTimes(t, 7);
  m.SetPhaseTimes(t, 7);  // same totals: no change
  const std::string text = Text(r);
  EXPECT_NE(text.find("moe_engine_phase_seconds_total{phase=\"attention\"} 2"), std::string::npos);
  EXPECT_NE(text.find("moe_engine_steps_total 7"), std::string::npos);
}

TEST(WorkerMetrics, StateGaugesAndSnapshotHits) {
  prometheus::Registry r;
  WorkerMetrics m(r);
  EngineGauges g;
  g.state_bytes_used = 512;
  g.state_bytes_budget = 4096;
  g.state_slots = 16;
  g.state_slots_used = 1;
  g.state_snapshots = 1;
  g.state_snapshot_hits = 3;
  m.SetEngine(g);
  m.SetEngine(g);  // cumulative hits: no change
  const std::string text = Text(r);
  EXPECT_NE(text.find("moe_state_used_bytes 512"), std::string::npos) << text;
  EXPECT_NE(text.find("moe_state_budget_bytes 4096"), std::string::npos);
  EXPECT_NE(text.find("moe_state_slots 16"), std::string::npos);
  EXPECT_NE(text.find("moe_state_slots_used 1"), std::string::npos);
  EXPECT_NE(text.find("moe_state_snapshots 1"), std::string::npos);
  EXPECT_NE(text.find("moe_state_snapshot_hits_total 3"), std::string::npos);
}

}  // namespace
}  // namespace moe::service::metrics
