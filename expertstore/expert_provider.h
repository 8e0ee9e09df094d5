// ExpertProvider: the interface through which the forward pass gets expert weights, one layer's
// set at a time, so that a tiered store can serve hits at once and load misses behind them.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace moe::store {

// A claim on one expert's weights. While the handle (or a copy) lives, the provider keeps the
// expert's bytes where `weights` points: a tiered store cannot evict its slot.
struct ExpertHandle {
  int32_t layer = 0;
  int32_t expert = 0;
  // Becomes ready when the weights are resident; an error (DataLoss, NotFound, ...) names the
  // expert and the file, and then `weights` must not be read.
  std::shared_future<absl::Status> ready;
  // Views readable by the backend the provider was built for. Releasing the last copy of this
  // pointer releases the slot.
  std::shared_ptr<const kernels::ExpertWeights> weights;
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // Returns one handle per entry of `experts`, in the same order. Hits are ready at once; misses
  // complete asynchronously. Errors that concern the whole call (layer out of range) come back
  // here; errors loading one expert come back through that handle's `ready`.
  // Thread-safe.
  virtual absl::StatusOr<std::vector<ExpertHandle>> Acquire(int32_t layer,
                                                            absl::Span<const int32_t> experts) = 0;
  // Every expert of `layer`, indexed by id, when the provider keeps all of them resident in
  // backend memory for its whole lifetime (the views stay valid), so that the forward pass may
  // leave the routing on the device (Backend::ExpertFfnRouted); empty when residency can change
  // (a tiered store) or the layer has no experts.
  virtual std::vector<kernels::ExpertWeights> ResidentLayer(int32_t layer) const { return {}; }
};

}  // namespace moe::store
