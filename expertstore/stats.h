// StoreStats: what the store counts (per tier hits/misses/bytes/evictions, blob reads, prefetch,
// load latency). Plain numbers copied out under the store's lock; the service turns them into
// Prometheus metrics (moe_store_*{tier=...}).
#pragma once

#include <array>
#include <cstdint>

namespace moe::store {

struct TierStats {
  int64_t slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t hits = 0;      // found resident (or already loading: see StoreStats::joined)
  uint64_t misses = 0;    // had to be brought in from the tier below
  uint64_t bytes_in = 0;  // bytes copied into this tier
  uint64_t evictions = 0;
  uint64_t bypasses = 0;  // misses the policy chose not to cache (EvictionPolicy::Admit)
};

// Load latency in microseconds, power-of-two buckets: bucket b counts latencies in
// [2^(b-1), 2^b) us (bucket 0: < 1 us); the last bucket is open-ended.
struct LatencyHistogram {
  static constexpr int kBuckets = 32;
  std::array<uint64_t, kBuckets> counts{};
  uint64_t total_us = 0;
  uint64_t count = 0;
  void Add(int64_t us) {
    int b = 0;
    while (b + 1 < kBuckets && (int64_t{1} << b) <= us) ++b;
    ++counts[b];
    total_us += static_cast<uint64_t>(us < 0 ? 0 : us);
    ++count;
  }
};

struct StoreStats {
  TierStats device;
  TierStats host;
  uint64_t blob_reads = 0;
  uint64_t blob_bytes_read = 0;
  uint64_t blob_errors = 0;          // reads that failed (missing, truncated, checksum, I/O)
  uint64_t joined = 0;               // requests that found their expert's load already in flight
  uint64_t transient_loads = 0;      // no slot free (all pinned) or no tiers: a pool buffer
  uint64_t transient_buffers = 0;    // transient pool buffers allocated so far (never freed)
  uint64_t transient_waits = 0;      // Acquires that waited for a transient buffer
  uint64_t transient_exhausted = 0;  // handles failed: no transient buffer freed in time
  uint64_t prefetch_issued = 0;      // loads started by Prefetch
  uint64_t prefetch_used = 0;        // of those, later acquired before being evicted
  uint64_t prefetch_dropped = 0;     // Prefetch calls that found no evictable slot
  uint64_t host_reads = 0;           // experts decode steps read from the host tier (Use)
  // Of those, experts the device tier held when the step ended: still loading, or loaded since
  // the step made its table (each is a read over PCIe that a load already in flight made moot).
  uint64_t host_reads_loading = 0, host_reads_loaded = 0;
  LatencyHistogram load_latency_us;  // Acquire -> ready, for requests that waited on a load
};

}  // namespace moe::store
