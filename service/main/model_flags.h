// The model, store and KV flags moe-worker and moe-generate share, and the one load they both run
// from them: backend, budgets ("auto" sized by engine/budgets.h, printed), model, tokenizer,
// routing trace.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "expertstore/routing_trace.h"
#include "kernels/backend.h"

namespace moe::service {

struct LoadedModel {
  std::string dir;  // --model
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Tokenizer> tokenizer;
  std::unique_ptr<store::RoutingTraceWriter> trace;  // --record_trace, else null
  uint64_t device_budget = 0, host_budget = 0;       // as resolved (0 where no store)
  int64_t kv_budget = 0;
  std::string kv_cache_dtype;
  int32_t kv_block_size = 0;
  int32_t state_snapshot_blocks = 0;
  int32_t kv_tail_tokens = 0;
  bool gpu = false;
};

// Writes the built-in default model first when --model is its directory and it is missing.
// `who` prefixes the log lines ("[worker]"). Errors name the flag or the file.
absl::StatusOr<LoadedModel> LoadModelFromFlags(const char* who);

}  // namespace moe::service
