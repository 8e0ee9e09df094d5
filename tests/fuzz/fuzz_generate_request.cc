// Fuzz target: request validation as the frontend runs it: protobuf bytes -> moe.v1
// GenerateRequest -> service::ValidateGenerateRequest. A request it accepts must convert to
// sampling parameters and stop conditions that the engine's own checks accept too (otherwise the
// worker would fail a request the frontend admitted).
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include "moe/v1/moe.pb.h"
#include "service/proto_convert.h"
#include "service/proto_validate.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  // Invalid UTF-8 in a string field is a parse failure; protobuf would log each one.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  moe::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const service::ModelLimits limits :
       {service::ModelLimits{}, service::ModelLimits{384, 256}}) {
    if (!service::ValidateGenerateRequest(request, limits).ok()) continue;
    MOE_FUZZ_CHECK(service::ToSamplingParams(request.sampling()).Validate().ok());
    const int64_t context = limits.context_length > 0 ? limits.context_length : 4096;
    const int64_t prompt =
        request.has_token_ids() ? request.token_ids().ids_size() : 1;
    if (prompt >= context) continue;  // the worker refuses it after tokenization
    const engine::StopConditions stop = service::ToStopConditions(request, prompt, context);
    // Ids are checked against the vocabulary only when it is known (ModelLimits: 0 = unknown);
    // both processes validate with it known.
    if (limits.vocab_size > 0) MOE_FUZZ_CHECK(stop.Validate(limits.vocab_size).ok());
  }
  return 0;
}
