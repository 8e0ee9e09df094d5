// Conversion of validated moe.v1 requests to engine parameters.
#include "service/proto_convert.h"

#include <algorithm>

#include "service/proto_validate.h"

namespace moe::service {

engine::SamplingParams ToSamplingParams(const moe::v1::SamplingParams& s) {
  engine::SamplingParams p;
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_min_p()) p.min_p = s.min_p();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) p.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) p.seed = s.seed();
  return p;
}

engine::StopConditions ToStopConditions(const moe::v1::GenerateRequest& r, int64_t prompt_tokens,
                                        int64_t context_length) {
  engine::StopConditions stop;
  if (r.has_max_tokens()) {
    stop.max_tokens = r.max_tokens();
  } else {
    // The default never makes a valid prompt fail: it shrinks to what the context has left.
    stop.max_tokens =
        std::max<int64_t>(1, std::min<int64_t>(kDefaultMaxTokens, context_length - prompt_tokens));
  }
  stop.stop_strings.assign(r.stop().strings().begin(), r.stop().strings().end());
  stop.stop_token_ids.assign(r.stop().token_ids().begin(), r.stop().token_ids().end());
  stop.ignore_eos = r.stop().ignore_eos();
  return stop;
}

}  // namespace moe::service
