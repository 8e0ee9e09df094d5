// KV-cache vector formats (bf16, fp8-e4m3, TurboQuant) and the reference of quantization and of
// attention read straight from the compressed form, shared by the engine and every backend (the
// CUDA kernels match it bit for bit). Spec: TurboQuant (turboquant.md, cited by section; not in
// this repository); summary and byte counts: KV_FORMATS.md beside this file.
//
// Unit: one vector = one (layer, kv-head, token, K|V) slice of length D = head_dim, post-RoPE.
// A tile is the vectors of `tokens` consecutive slots of one (layer, kv-head, K|V) (one paged KV
// block), stored structure-of-arrays: the format's planes one after another, plane p holding
// `tokens` entries of plane_bytes[p] each (slot t at offset tokens·Σ_{q<p} plane_bytes[q] +
// t·plane_bytes[p]). A vector therefore costs bytes_per_vector() = Σ plane_bytes. Planes:
//   bf16          [D] bf16
//   fp8-e4m3      [D] E4M3FN codes (RNE, saturating to ±448), then [1] fp32 scale = max|x| / 448
//   tq{1,2,3,4}   [D·b/8] indices, then [1] fp16 scale s
//   tq2.5, tq3.5  outlier part O (32 channels @ 3 | 4 b) indices, rest R (96 @ 2 | 3 b) indices,
//                 s_O fp16, s_R fp16                                   (D = 128 only)
//   tq-prod b     [D·(b−1)/8] indices, n fp16, γ fp16, [D/8] QJL sign bits (keys only, tests)
// Index j of a b-bit plane sits at bit offset b·j, little-endian across bytes. Sign bit 1 = +1.
//
// TurboQuant part quantization (all fp32): n = ‖x_P‖, u = x_P / n, y = Π u, idx_j = number of
// codebook boundaries <= y_j (kv_codebook.h), ỹ = C[idx]; reconstruction x̂_P = s·Πᵀ ỹ
// with s = n / α_b (debiased, default), n (plain) or n / ‖ỹ‖ (norm-corrected). n == 0 stores
// s = 0 and zero indices. Channels of a part are in ascending order; for the unsplit formats the
// part is all D channels. Rotations and their seeds: kv_rotation.h.
//
// Attention without decompression (spec §4), per query head:
//   PrepareQuery: q' = Π q per part (and w = S' q' for prod)
//   Score:        logit_t = scale · Σ_parts s_t ⟨q', C[idx_t]⟩  (+ prod QJL term)
//   AccumulateValues: acc += Σ_t p_t · s_t · C[idx_t]      (rotated frame)
//   FinishValues: out = Πᵀ acc per part, scattered to the part's channels
// For bf16 and fp8 the "rotated frame" is the identity.
//
// Arithmetic order (what a CUDA port must match; T9 allows index flips only from summation
// order): n = sqrtf(Σ_j x_j²) summed in ascending j; u_j = x_j / n (a division, not a reciprocal
// multiply); debiased s = n / float(α_b); norm-corrected s = n / sqrtf(Σ_j ỹ_j²); fp8 scale =
// amax / 448 and code_j = E4M3(x_j / scale). Scales are rounded to fp16 round-to-nearest-even.
// No FMA contraction (the CPU build has none; nvcc needs --fmad=false for bit-exact parity).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kvcodec/kv_codebook.h"
#include "kernels/kvcodec/kv_rotation.h"
#include "kernels/tensor.h"

namespace moe::kernels {

enum class KvFormat : uint8_t {
  kBf16,
  kFp8E4m3,
  kTq4,
  kTq3,
  kTq2,
  kTq1,      // tests only
  kTq3p5,    // 32 outlier channels @ 4 b + 96 @ 3 b (+ two fp16 scales = 3.5 bits/value)
  kTq2p5,    // 32 @ 3 b + 96 @ 2 b (the paper's "2.5-bit")
  kTqProd4,  // TurboQuant_prod: 3-bit MSE + 1-bit QJL; keys only, tests and comparison
  kTqProd3,
  kTqProd2,
  kTqProd1,
};
const char* KvFormatName(KvFormat format);  // "bf16", "fp8_e4m3", "tq4", "tq3.5", "tq_prod4", …
// InvalidArgument naming the text and the accepted names.
absl::StatusOr<KvFormat> ParseKvFormat(absl::string_view name);

enum class KvRole : uint8_t { kKey, kValue };
enum class TqNorm : uint8_t { kDebiased, kPlain, kNormCorrected };

// Bytes of one quantized vector; InvalidArgument for a (format, head_dim) pair the format does not
// support (TurboQuant: D a power of two with committed codebooks; split formats: D = 128).
absl::StatusOr<int64_t> KvBytesPerVector(KvFormat format, int head_dim);
// Cache bytes per token: num_layers · num_kv_heads · 2 (K, V) · bytes per vector.
absl::StatusOr<int64_t> KvBytesPerToken(KvFormat format, int head_dim, int num_kv_heads,
                                        int num_layers);

struct KvCodecOptions {
  KvFormat format = KvFormat::kBf16;
  int head_dim = 128;
  KvRole role = KvRole::kKey;
  // Stored-scale variant of the MSE formats (spec §3.5). Default: kDebiased. The MSE stage of the
  // prod formats is always plain (the QJL term removes the bias).
  TqNorm norm = TqNorm::kDebiased;
  // Default: kRht2. Parts whose size is not a power of two (the 96-channel rest) are always Haar.
  RotationKind rotation = RotationKind::kRht2;
  // Seed inputs (kv_rotation.h). Default: "", 0, 0.
  std::string model_fingerprint;
  int layer = 0;
  int kv_head = 0;
  // Split formats only: the 32 outlier channels of this (layer, kv-head, K|V), distinct, < D
  // (SelectOutlierChannels). Must be empty otherwise.
  std::vector<int> outlier_channels;
};

// A tile of `tokens` vectors (see the header comment).
struct KvTile {
  uint8_t* data = nullptr;
  int tokens = 0;
};
struct ConstKvTile {
  const uint8_t* data = nullptr;
  int tokens = 0;
};

// The `count` channels with the largest mean x² over x[num_tokens, head_dim] (ties to the lower
// channel), ascending: the static outlier set of a split format, chosen over the first prefill.
std::vector<int> SelectOutlierChannels(const float* x, int64_t num_tokens, int head_dim, int count);

// Everything needed to encode and read one (layer, kv-head, K|V) stream: codebooks, rotations,
// plane layout. Immutable after Create, so one codec may be used from many threads.
class KvCodec {
 public:
  // InvalidArgument for an unsupported (format, head_dim), a prod format with role kValue, or a
  // bad outlier channel list.
  static absl::StatusOr<KvCodec> Create(const KvCodecOptions& options);

  KvFormat format() const { return options_.format; }
  int head_dim() const { return options_.head_dim; }
  TqNorm norm() const { return options_.norm; }
  int64_t bytes_per_vector() const;
  int64_t tile_bytes(int tokens) const { return bytes_per_vector() * tokens; }
  // Floats of a prepared query: D, or 2·D for prod (q' then w).
  int query_floats() const;

  // Encodes x[D] into slot `slot` of `tile`. InvalidArgument if x has a non-finite element or a
  // scale overflows its storage type; then nothing is written.
  absl::Status Quantize(const float* x, KvTile tile, int slot) const;
  // x[D] = the reconstruction of slot `slot` (tests and debugging; attention does not use it).
  void Dequantize(ConstKvTile tile, int slot, float* x) const;

  // q_prep[query_floats()] from a post-RoPE query q[D] (once per query head per step).
  void PrepareQuery(const float* q, float* q_prep) const;
  // logits[i] = scale · ⟨q, x̂_{slot_begin + i}⟩ for i < count, computed from codebook entries.
  void Score(const float* q_prep, ConstKvTile tile, int slot_begin, int count, float scale,
             float* logits) const;
  // acc[D] += Σ_i p[i] · (x̂_{slot_begin + i} in the rotated frame), i < count.
  void AccumulateValues(const float* p, ConstKvTile tile, int slot_begin, int count,
                        float* acc) const;
  // out[D] = the accumulator taken back to the original frame (one inverse rotation per part).
  void FinishValues(const float* acc, float* out) const;

  // One TurboQuant partition (all D channels unless split). Public for tests.
  struct Part {
    std::vector<int> channels;                     // ascending
    int bits = 0;                                  // MSE index bits (0 for prod1)
    Codebook codebook;                             // empty when bits == 0
    Rotation rotation{RotationKind::kRht2, 1, 0};  // replaced in Create
    int64_t index_plane = 0;                       // plane numbers (see plane_bytes_)
    int64_t scale_plane = 0;
  };
  const std::vector<Part>& parts() const { return parts_; }
  // Identity of what this codec holds, unique per Create (a copy keeps it; codecs are immutable):
  // a backend may key device copies of the tables by it.
  uint64_t id() const { return id_; }

 private:
  explicit KvCodec(const KvCodecOptions& options) : options_(options) {}
  int64_t PlaneOffset(int plane, int tokens, int slot) const;
  float PartScale(const Part& part, float norm, const float* centroid_vec) const;

  KvCodecOptions options_;
  std::vector<int64_t> plane_bytes_;  // bytes per vector of each plane, in storage order
  std::vector<Part> parts_;
  // prod only: S' [D, D] row-major, and the planes of γ and the sign bits.
  std::vector<float> qjl_;
  int64_t gamma_plane_ = 0;
  int64_t sign_plane_ = 0;
  uint64_t id_ = 0;
};

// OCP E4M3FN: bias 7, max ±448, no infinities; round to nearest even, saturating (what
// cvt.rn.satfinite.e4m3x2.f32 does). Input must be finite.
uint8_t F32ToE4m3(float f);
// (E4m3ToF32, the inverse: kernels/tensor.h.)

}  // namespace moe::kernels
