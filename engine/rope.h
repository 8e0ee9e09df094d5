// RoPE frequencies for every rope type our configs use, computed as transformers 5 computes them.
#pragma once

#include <vector>

#include "engine/model_config.h"

namespace moe::engine {

struct RopeTable {
  int rotary_dim = 0;           // head_dim * partial_rotary_factor, even
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_factor = 1.f; // multiplies cos and sin (YaRN)
};

// default: inv_freq[i] = 1 / theta^(2i / dim); linear: / factor; llama3: per-wavelength
// interpolation between inv_freq / factor and inv_freq; yarn: ramp between interpolation and
// extrapolation with beta_fast/beta_slow correction range, attention_factor from mscale.
RopeTable ComputeRopeTable(const ModelConfig& config);

}  // namespace moe::engine
