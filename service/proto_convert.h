// Conversion of moe.v1 requests, once validated (proto_validate.h), to engine types. The
// worker's half: the frontend never builds engine parameters.
#pragma once

#include <cstdint>

#include "engine/sampler.h"
#include "engine/stop.h"
#include "moe/v1/moe.pb.h"

namespace moe::service {

// Unset fields take the defaults documented in moe.proto (and engine/sampler.h).
engine::SamplingParams ToSamplingParams(const moe::v1::SamplingParams& sampling);

// `prompt_tokens` decides the default max_tokens: min(kDefaultMaxTokens, context - prompt).
engine::StopConditions ToStopConditions(const moe::v1::GenerateRequest& request,
                                        int64_t prompt_tokens, int64_t context_length);

}  // namespace moe::service
