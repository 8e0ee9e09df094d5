// ComputeRopeTable: mirrors transformers' rope init functions, in float32 where they are float32.
#include "engine/rope.h"

#include <algorithm>
#include <cmath>

namespace moe::engine {
namespace {

// transformers: base ** (arange(0, dim, 2).float() / dim), in float32.
std::vector<float> DefaultInvFreq(double theta, int dim) {
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  return inv;
}

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

void Yarn(const RopeConfig& r, int dim, RopeTable* t) {
  const double base = r.rope_theta, factor = r.factor;
  const double original = static_cast<double>(r.original_max_position_embeddings);
  double attention_factor = r.attention_factor;
  if (attention_factor == 0.0) {
    attention_factor = (r.mscale != 0.0 && r.mscale_all_dim != 0.0)
                           ? YarnMscale(factor, r.mscale) / YarnMscale(factor, r.mscale_all_dim)
                           : YarnMscale(factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a division by zero in the ramp
  t->inv_freq.resize(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / dim);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.f, 1.f);
    const float extrapolation_weight = 1.0f - ramp;
    t->inv_freq[i] = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  t->attention_factor = static_cast<float>(attention_factor);
}

void Llama3(const RopeConfig& r, int dim, RopeTable* t) {
  t->inv_freq = DefaultInvFreq(r.rope_theta, dim);
  const double factor = r.factor, low = r.low_freq_factor, high = r.high_freq_factor;
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  for (float& f : t->inv_freq) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f = static_cast<float>(f / factor);
    } else if (wavelen >= high_freq_wavelen) {  // medium: smooth between the two
      const double smooth = (old_context / wavelen - low) / (high - low);
      f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
    }
  }
}

}  // namespace

RopeTable ComputeRopeTable(const ModelConfig& config) {
  RopeTable t;
  const RopeConfig& r = config.rope;
  t.rotary_dim = static_cast<int>(config.head_dim * r.partial_rotary_factor) / 2 * 2;
  if (r.rope_type == "yarn") {
    Yarn(r, t.rotary_dim, &t);
  } else if (r.rope_type == "llama3") {
    Llama3(r, t.rotary_dim, &t);
  } else {
    t.inv_freq = DefaultInvFreq(r.rope_theta, t.rotary_dim);
    if (r.rope_type == "linear") {
      for (float& f : t.inv_freq) f = static_cast<float>(f / r.factor);
    }
  }
  return t;
}

}  // namespace moe::engine
