// CPU reference of attention on compressed KV tiles: rotated query, scores from codebook entries,
// values accumulated in the rotated frame with one inverse rotation per part at the end.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/kvcodec/kv_quant_internal.h"

namespace moe::kernels {

using kv_internal::GetBits;
using kv_internal::Info;
using kv_internal::Kind;
using kv_internal::LoadF16;

void KvCodec::Dequantize(ConstKvTile tile, int slot, float* x) const {
  // Reconstruction = FinishValues of a single value accumulated with weight 1.
  std::vector<float> acc(head_dim(), 0.f);
  const float one = 1.f;
  AccumulateValues(&one, tile, slot, 1, acc.data());
  FinishValues(acc.data(), x);
}

void KvCodec::PrepareQuery(const float* q, float* q_prep) const {
  const int d = head_dim();
  if (parts_.empty()) {
    std::copy(q, q + d, q_prep);
    return;
  }
  int offset = 0;
  for (const Part& part : parts_) {
    const int m = static_cast<int>(part.channels.size());
    std::vector<float> sub(m);
    for (int j = 0; j < m; ++j) sub[j] = q[part.channels[j]];
    part.rotation.Apply(sub.data(), q_prep + offset);
    offset += m;
  }
  if (!qjl_.empty()) {  // w = S' q'
    for (int i = 0; i < d; ++i) {
      float w = 0.f;
      for (int j = 0; j < d; ++j) w += qjl_[i * d + j] * q_prep[j];
      q_prep[d + i] = w;
    }
  }
}

void KvCodec::Score(const float* q_prep, ConstKvTile tile, int slot_begin, int count, float scale,
                    float* logits) const {
  MOE_CHECK(slot_begin >= 0 && count >= 0 && slot_begin + count <= tile.tokens)
      << "slots [" << slot_begin << ", " << slot_begin + count << ") of a " << tile.tokens
      << "-token tile";
  const int d = head_dim();
  const Kind kind = Info(options_.format).kind;
  for (int i = 0; i < count; ++i) {
    const int slot = slot_begin + i;
    auto plane = [&](int64_t p) {
      return tile.data + PlaneOffset(static_cast<int>(p), tile.tokens, slot);
    };
    float logit = 0.f;
    if (kind == Kind::kBf16) {
      const uint8_t* k = plane(0);
      for (int j = 0; j < d; ++j) {
        uint16_t h;
        std::memcpy(&h, k + 2 * j, 2);
        logit += q_prep[j] * Bf16ToF32(h);
      }
    } else if (kind == Kind::kFp8) {
      const uint8_t* k = plane(0);
      float s;
      std::memcpy(&s, plane(1), 4);
      float dot = 0.f;
      for (int j = 0; j < d; ++j) dot += q_prep[j] * E4m3ToF32(k[j]);
      logit = s * dot;
    } else {
      int offset = 0;
      for (const Part& part : parts_) {
        const int m = static_cast<int>(part.channels.size());
        const uint8_t* idx = plane(part.index_plane);
        float dot = 0.f;
        for (int j = 0; j < m && part.bits > 0; ++j) {
          dot += q_prep[offset + j] *
                 part.codebook.centroids[GetBits(idx, int64_t{j} * part.bits, part.bits)];
        }
        logit += LoadF16(plane(part.scale_plane)) * dot;
        offset += m;
      }
      if (kind == Kind::kProd) {  // + n · (√(π/2)/d) · γ · ⟨w, z⟩
        const uint8_t* signs = plane(sign_plane_);
        float wz = 0.f;
        for (int j = 0; j < d; ++j) {
          wz += ((signs[j >> 3] >> (j & 7)) & 1u) ? q_prep[d + j] : -q_prep[d + j];
        }
        const float c = static_cast<float>(std::sqrt(std::numbers::pi / 2) / d);
        logit += LoadF16(plane(parts_[0].scale_plane)) * c * LoadF16(plane(gamma_plane_)) * wz;
      }
    }
    logits[i] = scale * logit;
  }
}

void KvCodec::AccumulateValues(const float* p, ConstKvTile tile, int slot_begin, int count,
                               float* acc) const {
  MOE_CHECK(slot_begin >= 0 && count >= 0 && slot_begin + count <= tile.tokens)
      << "slots [" << slot_begin << ", " << slot_begin + count << ") of a " << tile.tokens
      << "-token tile";
  const int d = head_dim();
  const Kind kind = Info(options_.format).kind;
  for (int i = 0; i < count; ++i) {
    const int slot = slot_begin + i;
    auto plane = [&](int64_t pl) {
      return tile.data + PlaneOffset(static_cast<int>(pl), tile.tokens, slot);
    };
    if (kind == Kind::kBf16) {
      const uint8_t* v = plane(0);
      for (int j = 0; j < d; ++j) {
        uint16_t h;
        std::memcpy(&h, v + 2 * j, 2);
        acc[j] += p[i] * Bf16ToF32(h);
      }
    } else if (kind == Kind::kFp8) {
      float s;
      std::memcpy(&s, plane(1), 4);
      const float ps = p[i] * s;  // p_t · scale_t once per token
      for (int j = 0; j < d; ++j) acc[j] += ps * E4m3ToF32(plane(0)[j]);
    } else {
      int offset = 0;
      for (const Part& part : parts_) {
        const int m = static_cast<int>(part.channels.size());
        const uint8_t* idx = plane(part.index_plane);
        const float ps = p[i] * LoadF16(plane(part.scale_plane));
        for (int j = 0; j < m && part.bits > 0; ++j) {
          acc[offset + j] +=
              ps * part.codebook.centroids[GetBits(idx, int64_t{j} * part.bits, part.bits)];
        }
        offset += m;
      }
      if (kind ==
          Kind::kProd) {  // test-only path (prod is for keys): + p n c γ S'ᵀ z, d² per token
        const uint8_t* signs = plane(sign_plane_);
        const float c = static_cast<float>(std::sqrt(std::numbers::pi / 2) / d);
        const float coef =
            p[i] * LoadF16(plane(parts_[0].scale_plane)) * c * LoadF16(plane(gamma_plane_));
        for (int r = 0; r < d; ++r) {
          const float z = ((signs[r >> 3] >> (r & 7)) & 1u) ? coef : -coef;
          for (int j = 0; j < d; ++j) acc[j] += z * qjl_[r * d + j];
        }
      }
    }
  }
}

void KvCodec::FinishValues(const float* acc, float* out) const {
  if (parts_.empty()) {
    std::copy(acc, acc + head_dim(), out);
    return;
  }
  int offset = 0;
  for (const Part& part : parts_) {
    const int m = static_cast<int>(part.channels.size());
    std::vector<float> sub(m);
    part.rotation.ApplyTranspose(acc + offset, sub.data());
    for (int j = 0; j < m; ++j) out[part.channels[j]] = sub[j];
    offset += m;
  }
}

}  // namespace moe::kernels
