// CPU reference of the KV formats: plane layout, quantize/dequantize, attention on compressed
// tiles.
#include "kernels/kvcodec/kv_quant.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"
#include "kernels/kvcodec/kv_quant_internal.h"
#include "kernels/tensor.h"

namespace moe::kernels {
namespace {

using kv_internal::FormatInfo;
using kv_internal::Info;
using kv_internal::kF16Max;
using kv_internal::kFp8Max;
using kv_internal::Kind;
using kv_internal::kSplitOutliers;

constexpr KvFormat kAllFormats[] = {KvFormat::kBf16,    KvFormat::kFp8E4m3, KvFormat::kTq4,
                                    KvFormat::kTq3,     KvFormat::kTq2,     KvFormat::kTq1,
                                    KvFormat::kTq3p5,   KvFormat::kTq2p5,   KvFormat::kTqProd4,
                                    KvFormat::kTqProd3, KvFormat::kTqProd2, KvFormat::kTqProd1};

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Bytes per vector of each plane, in storage order (kv_quant.h).
absl::StatusOr<std::vector<int64_t>> PlaneBytes(KvFormat format, int d) {
  const FormatInfo info = Info(format);
  auto need_codebook = [&](int dim, int bits) -> absl::Status {
    if (bits == 0) return absl::OkStatus();
    if (dim * bits % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(KvFormatName(format), ": head_dim ", d, " does not pack into whole bytes"));
    }
    return CommittedCodebook(dim, bits).status();
  };
  auto annotate = [&](absl::Status s) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV format ", KvFormatName(format), " with head_dim ", d, ": ", s.message()));
  };
  if (d <= 0) return absl::InvalidArgumentError(absl::StrCat("head_dim ", d, " must be > 0"));
  switch (info.kind) {
    case Kind::kBf16:
      return std::vector<int64_t>{2 * d};
    case Kind::kFp8:
      return std::vector<int64_t>{d, 4};
    case Kind::kMse:
      if (absl::Status s = need_codebook(d, info.bits); !s.ok()) return annotate(s);
      return std::vector<int64_t>{d * info.bits / 8, 2};
    case Kind::kSplit: {
      if (d != 128) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KV format ", KvFormatName(format), " is defined for head_dim 128 only, got ", d));
      }
      const int r = d - kSplitOutliers;
      if (absl::Status s = need_codebook(kSplitOutliers, info.bits); !s.ok()) return annotate(s);
      if (absl::Status s = need_codebook(r, info.bits_r); !s.ok()) return annotate(s);
      return std::vector<int64_t>{kSplitOutliers * info.bits / 8, r * info.bits_r / 8, 2, 2};
    }
    case Kind::kProd:
      if (absl::Status s = need_codebook(d, info.bits - 1); !s.ok()) return annotate(s);
      if (d % 8 != 0) return annotate(absl::InvalidArgumentError("sign bits need D % 8 == 0"));
      return std::vector<int64_t>{d * (info.bits - 1) / 8, 2, 2, d / 8};
  }
  return absl::InternalError("unreachable");
}

void PutBits(uint8_t* p, int64_t bitpos, int bits, uint32_t v) {
  for (int i = 0; i < bits; ++i, ++bitpos) {
    if ((v >> i) & 1u) p[bitpos >> 3] |= static_cast<uint8_t>(1u << (bitpos & 7));
  }
}

void StoreF16(uint8_t* p, float f) {
  const uint16_t h = F32ToF16(f);
  std::memcpy(p, &h, 2);
}

// One part of one vector, encoded but not yet stored.
struct PartCode {
  float norm = 0.f;
  std::vector<float> y;       // Π u
  std::vector<float> ytilde;  // C[idx] (zeros when bits == 0)
  std::vector<uint32_t> idx;
};

PartCode EncodePart(const KvCodec::Part& part, const float* x) {
  const int m = static_cast<int>(part.channels.size());
  PartCode code;
  code.y.assign(m, 0.f);
  code.ytilde.assign(m, 0.f);
  code.idx.assign(m, 0);
  float norm2 = 0.f;
  for (int c : part.channels) norm2 += x[c] * x[c];
  code.norm = std::sqrt(norm2);
  if (code.norm == 0.f) return code;  // s = 0, zero indices: decodes to the zero vector
  std::vector<float> u(m);
  for (int j = 0; j < m; ++j) u[j] = x[part.channels[j]] / code.norm;
  part.rotation.Apply(u.data(), code.y.data());
  if (part.bits == 0) return code;
  for (int j = 0; j < m; ++j) {
    code.idx[j] = static_cast<uint32_t>(CodebookIndex(part.codebook, code.y[j]));
    code.ytilde[j] = part.codebook.centroids[code.idx[j]];
  }
  return code;
}

}  // namespace

const char* KvFormatName(KvFormat format) {
  switch (format) {
    case KvFormat::kBf16:
      return "bf16";
    case KvFormat::kFp8E4m3:
      return "fp8_e4m3";
    case KvFormat::kTq4:
      return "tq4";
    case KvFormat::kTq3:
      return "tq3";
    case KvFormat::kTq2:
      return "tq2";
    case KvFormat::kTq1:
      return "tq1";
    case KvFormat::kTq3p5:
      return "tq3.5";
    case KvFormat::kTq2p5:
      return "tq2.5";
    case KvFormat::kTqProd4:
      return "tq_prod4";
    case KvFormat::kTqProd3:
      return "tq_prod3";
    case KvFormat::kTqProd2:
      return "tq_prod2";
    case KvFormat::kTqProd1:
      return "tq_prod1";
  }
  return "?";
}

absl::StatusOr<KvFormat> ParseKvFormat(absl::string_view name) {
  std::string names;
  for (KvFormat f : kAllFormats) {
    if (name == KvFormatName(f)) return f;
    absl::StrAppend(&names, names.empty() ? "" : ", ", KvFormatName(f));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV format \"", name, "\"; expected one of ", names));
}

absl::StatusOr<int64_t> KvBytesPerVector(KvFormat format, int head_dim) {
  MOE_ASSIGN_OR_RETURN(std::vector<int64_t> planes, PlaneBytes(format, head_dim));
  int64_t total = 0;
  for (int64_t b : planes) total += b;
  return total;
}

absl::StatusOr<int64_t> KvBytesPerToken(KvFormat format, int head_dim, int num_kv_heads,
                                        int num_layers) {
  MOE_ASSIGN_OR_RETURN(int64_t per_vector, KvBytesPerVector(format, head_dim));
  return per_vector * 2 * num_kv_heads * num_layers;
}

std::vector<int> SelectOutlierChannels(const float* x, int64_t num_tokens, int head_dim,
                                       int count) {
  std::vector<double> energy(head_dim, 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int j = 0; j < head_dim; ++j)
      energy[j] += double{x[t * head_dim + j]} * x[t * head_dim + j];
  }
  std::vector<int> order(head_dim);
  for (int j = 0; j < head_dim; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return energy[a] > energy[b]; });
  order.resize(std::min(count, head_dim));
  std::sort(order.begin(), order.end());
  return order;
}

absl::StatusOr<KvCodec> KvCodec::Create(const KvCodecOptions& options) {
  const int d = options.head_dim;
  MOE_ASSIGN_OR_RETURN(std::vector<int64_t> planes, PlaneBytes(options.format, d));
  const FormatInfo info = Info(options.format);
  if (info.kind == Kind::kProd && options.role == KvRole::kValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV format ", KvFormatName(options.format), " is for keys only (spec §3.6)"));
  }
  if (info.kind != Kind::kSplit && !options.outlier_channels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("outlier_channels given for KV format ",
                                                   KvFormatName(options.format),
                                                   ", which has no split"));
  }
  KvCodec codec(options);
  static std::atomic<uint64_t> next_id{1};
  codec.id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  codec.plane_bytes_ = std::move(planes);
  auto make_part = [&](std::vector<int> channels, int bits, absl::string_view seed_suffix,
                       int64_t index_plane, int64_t scale_plane) -> absl::Status {
    Part part;
    const int m = static_cast<int>(channels.size());
    part.channels = std::move(channels);
    part.bits = bits;
    if (bits > 0) {
      MOE_ASSIGN_OR_RETURN(part.codebook, CommittedCodebook(m, bits));
    }
    const RotationKind kind = IsPowerOfTwo(m) ? options.rotation : RotationKind::kHaar;
    part.rotation = Rotation(
        kind, m,
        RotationSeed(options.model_fingerprint, options.layer, options.kv_head, seed_suffix));
    part.index_plane = index_plane;
    part.scale_plane = scale_plane;
    codec.parts_.push_back(std::move(part));
    return absl::OkStatus();
  };
  std::vector<int> all(d);
  for (int j = 0; j < d; ++j) all[j] = j;
  switch (info.kind) {
    case Kind::kBf16:
    case Kind::kFp8:
      break;
    case Kind::kMse:
      MOE_RETURN_IF_ERROR(make_part(all, info.bits, "", 0, 1));
      break;
    case Kind::kProd:
      MOE_RETURN_IF_ERROR(make_part(all, info.bits - 1, "", 0, 1));
      codec.gamma_plane_ = 2;
      codec.sign_plane_ = 3;
      {
        const std::vector<double> g = GaussianStream(
            RotationSeed(options.model_fingerprint, options.layer, options.kv_head, "|qjl"),
            int64_t{d} * d);
        codec.qjl_.assign(g.begin(), g.end());
      }
      break;
    case Kind::kSplit: {
      std::vector<int> outliers = options.outlier_channels;
      std::sort(outliers.begin(), outliers.end());
      const bool distinct = std::adjacent_find(outliers.begin(), outliers.end()) == outliers.end();
      if (outliers.size() != kSplitOutliers || !distinct || outliers.front() < 0 ||
          outliers.back() >= d) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KV format ", KvFormatName(options.format), " needs ", kSplitOutliers,
            " distinct outlier channels in [0, ", d, "), got ", options.outlier_channels.size()));
      }
      std::vector<int> rest;
      for (int j = 0; j < d; ++j) {
        if (!std::binary_search(outliers.begin(), outliers.end(), j)) rest.push_back(j);
      }
      MOE_RETURN_IF_ERROR(make_part(outliers, info.bits, "|o", 0, 2));
      MOE_RETURN_IF_ERROR(make_part(rest, info.bits_r, "|r", 1, 3));
      break;
    }
  }
  return codec;
}

int64_t KvCodec::bytes_per_vector() const {
  int64_t total = 0;
  for (int64_t b : plane_bytes_) total += b;
  return total;
}

int KvCodec::query_floats() const {
  return Info(options_.format).kind == Kind::kProd ? 2 * head_dim() : head_dim();
}

int64_t KvCodec::PlaneOffset(int plane, int tokens, int slot) const {
  int64_t offset = 0;
  for (int p = 0; p < plane; ++p) offset += plane_bytes_[p] * tokens;
  return offset + plane_bytes_[plane] * slot;
}

float KvCodec::PartScale(const Part& part, float norm, const float* centroid_vec) const {
  if (Info(options_.format).kind == Kind::kProd) return norm;
  switch (options_.norm) {
    case TqNorm::kPlain:
      return norm;
    case TqNorm::kDebiased:
      return norm / static_cast<float>(part.codebook.alpha());
    case TqNorm::kNormCorrected: {
      float e = 0.f;
      for (size_t j = 0; j < part.channels.size(); ++j) e += centroid_vec[j] * centroid_vec[j];
      return e > 0.f ? norm / std::sqrt(e) : 0.f;
    }
  }
  return norm;
}

absl::Status KvCodec::Quantize(const float* x, KvTile tile, int slot) const {
  MOE_CHECK(slot >= 0 && slot < tile.tokens)
      << "slot " << slot << " of a " << tile.tokens << "-token tile";
  const int d = head_dim();
  for (int j = 0; j < d; ++j) {
    if (!std::isfinite(x[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV ", KvFormatName(options_.format), " quantization: element ", j,
                       " of layer ", options_.layer, " kv-head ", options_.kv_head, " is ", x[j]));
    }
  }
  auto plane = [&](int64_t p) {
    return tile.data + PlaneOffset(static_cast<int>(p), tile.tokens, slot);
  };
  const Kind kind = Info(options_.format).kind;
  if (kind == Kind::kBf16) {
    for (int j = 0; j < d; ++j) {
      const uint16_t h = F32ToBf16(x[j]);
      std::memcpy(plane(0) + 2 * j, &h, 2);
    }
    return absl::OkStatus();
  }
  if (kind == Kind::kFp8) {
    float amax = 0.f;
    for (int j = 0; j < d; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float scale = amax / kFp8Max;
    for (int j = 0; j < d; ++j) plane(0)[j] = scale > 0.f ? F32ToE4m3(x[j] / scale) : 0;
    std::memcpy(plane(1), &scale, 4);
    return absl::OkStatus();
  }
  // TurboQuant: encode every part first so that a failure writes nothing.
  std::vector<PartCode> codes;
  std::vector<float> scales;
  for (const Part& part : parts_) {
    codes.push_back(EncodePart(part, x));
    scales.push_back(PartScale(part, codes.back().norm, codes.back().ytilde.data()));
    if (!(scales.back() <= kF16Max)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV ", KvFormatName(options_.format), " quantization: layer ",
                       options_.layer, " kv-head ", options_.kv_head, ": scale ", scales.back(),
                       " (norm ", codes.back().norm, ") exceeds the fp16 range"));
    }
  }
  for (size_t p = 0; p < parts_.size(); ++p) {
    const Part& part = parts_[p];
    uint8_t* idx = plane(part.index_plane);
    std::memset(idx, 0, plane_bytes_[part.index_plane]);
    for (size_t j = 0; j < part.channels.size(); ++j) {
      PutBits(idx, static_cast<int64_t>(j) * part.bits, part.bits, codes[p].idx[j]);
    }
    StoreF16(plane(part.scale_plane), scales[p]);
  }
  if (kind == Kind::kProd) {
    // Residual in the rotated frame ρ = y − ỹ; γ = ‖ρ‖; z = sign(S'ρ), sign(0) = +1.
    const PartCode& code = codes[0];
    std::vector<float> rho(d);
    float gamma2 = 0.f;
    for (int j = 0; j < d; ++j) {
      rho[j] = code.y[j] - code.ytilde[j];
      gamma2 += rho[j] * rho[j];
    }
    StoreF16(plane(gamma_plane_), std::sqrt(gamma2));
    uint8_t* signs = plane(sign_plane_);
    std::memset(signs, 0, d / 8);
    for (int i = 0; i < d; ++i) {
      float dot = 0.f;
      for (int j = 0; j < d; ++j) dot += qjl_[i * d + j] * rho[j];
      if (dot >= 0.f) signs[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    }
  }
  return absl::OkStatus();
}

uint8_t F32ToE4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kFp8Max) return sign | 0x7e;  // satfinite
  if (a < 0x1.0p-6f) {                   // subnormal: multiples of 2^−9; 8·2^−9 = min normal
    return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1.0p9f));
  }
  int e;
  const float fr = std::frexp(a, &e);  // a = fr · 2^e, fr ∈ [0.5, 1)
  int exponent = e - 1;                // a = (2 fr) · 2^exponent, 2 fr ∈ [1, 2)
  int mantissa = static_cast<int>(std::nearbyint((2.f * fr - 1.f) * 8.f));  // exact product, RNE
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  const int code = ((exponent + 7) << 3) | mantissa;
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

}  // namespace moe::kernels
