// Router: picks the worker for a request. Order of preference:
//   1. session: the up worker that holds the request's session (its KV is kept there);
//   2. prefix:  the up worker that was sent the longest prefix of this prompt, if its outstanding
//               tokens are at most `prefix_load_slack` above the least loaded worker's;
//   3. least_load: the fewest outstanding tokens (ties rotate).
//
// Prefix affinity without running the model: per worker, the router remembers chained hashes of
// the prompts it sent there, one per full chunk of `prefix_chunk_tokens` token ids (or 4x that
// many bytes of text / chat messages), hash_i = H(hash_{i-1}, chunk_i). A worker whose memory
// holds the first k hashes of a new prompt was sent those k chunks before, so its KV cache
// (prefix reuse in full blocks) likely still holds them. The memory is an LRU bounded per worker
// (`prefix_entries`) and is an estimate: the worker may have evicted blocks the router still
// remembers, which costs a prefill, never a wrong answer.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/v1/moe.pb.h"
#include "service/frontend/worker_set.h"
#include "service/proto_validate.h"

namespace moe::service {

struct RouterOptions {
  size_t max_sessions = 100000;  // session -> worker entries kept (LRU). Default: 100000
  bool prefix_routing = true;    // step 2 above. Default: on
  // Chain hashes remembered per worker (LRU). Set it near a worker's KV capacity in blocks:
  // remembering more than the worker can cache only sends requests to cold caches.
  // Default: 16384 (262144 tokens at 16 tokens per chunk).
  size_t prefix_entries = 16384;
  // Token ids per chunk; text and chat are hashed in 4x this many bytes (the frontend's
  // 4-bytes-per-token estimate). Match the workers' --kv_block_size. Default: 16
  int prefix_chunk_tokens = 16;
  // How many more outstanding tokens than the least loaded worker the prefix worker may have and
  // still be picked. Default: 2048 (a few requests of the default 256 new tokens).
  int64_t prefix_load_slack = 2048;
  absl::Status Validate() const;
};

enum class RouteReason { kSession, kPrefix, kLeastLoad };
// "session", "prefix", "least_load" (the metric's label).
const char* RouteReasonLabel(RouteReason reason);

class Router {
 public:
  explicit Router(WorkerSet& workers, RouterOptions options = {});

  // The request's prompt as a chain of chunk hashes (full chunks only, at most prefix_entries;
  // empty when prefix routing is off or the prompt is shorter than one chunk). Token ids, text
  // and chat never share hashes.
  std::vector<uint64_t> PrefixChain(const moe::v1::GenerateRequest& request) const;

  // Picks by the order above among workers serving `model` that are up and not in `exclude` (the
  // targets this request already failed on), and remembers `prefix` (from PrefixChain) for the
  // picked worker. `reason`, when given, says which step decided.
  // NotFound: no known worker serves `model` (the message lists the models that are served).
  // Unavailable: workers serve it but none is up (or all are excluded).
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> Pick(const std::string& model,
                                                       const std::string& session_id,
                                                       const std::set<std::string>& exclude,
                                                       const std::vector<uint64_t>& prefix = {},
                                                       RouteReason* reason = nullptr);
  // The limits validation needs, from any worker that reported `model`. NotFound as above;
  // Unavailable when no worker has reported at all yet.
  absl::StatusOr<ModelLimits> Limits(const std::string& model) const;
  // Remembers that `session_id` now lives on `target`.
  void Bind(const std::string& session_id, const std::string& target);
  // The worker `session_id` was bound to, if any is still known; and forgetting it.
  std::shared_ptr<WorkerEndpoint> SessionWorker(const std::string& session_id);
  void Unbind(const std::string& session_id);

 private:
  // One worker's remembered chain hashes, most recently sent first.
  struct PrefixMemory {
    std::list<uint64_t> lru;
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index;
    int64_t restarts = 0;  // the worker's restarts() when this was learnt
  };

  absl::Status UnknownModel(const std::string& model) const;
  // Leading entries of `prefix` that `target`'s memory holds. Requires mu_.
  size_t MatchedChunks(const std::string& target, const std::vector<uint64_t>& prefix) const;
  // Adds `prefix` to `target`'s memory, evicting the least recently sent beyond the bound.
  // Requires mu_.
  void Remember(const WorkerEndpoint& worker, const std::vector<uint64_t>& prefix);

  WorkerSet& workers_;
  const RouterOptions options_;
  std::atomic<uint64_t> rotation_{0};
  std::mutex mu_;
  std::list<std::string> lru_;  // session ids, most recent first
  std::map<std::string, std::pair<std::string, std::list<std::string>::iterator>> sessions_;
  std::map<std::string, PrefixMemory> prefixes_;  // by worker target
};

}  // namespace moe::service
