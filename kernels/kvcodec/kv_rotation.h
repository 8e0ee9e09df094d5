// The seeded random rotations of TurboQuant (turboquant.md §3.3), specified bit for bit so the CUDA
// kernels reproduce them: SplitMix64 stream, FNV-1a-64 seed, sign bits, Hadamard butterfly order.
//
// Seed of the rotation of (layer ℓ, kv-head h), shared by K and V and by every query head of the
// group:  FNV-1a-64("tq1|" + model_fingerprint + "|" + ℓ + "|" + h + suffix), ℓ and h in decimal;
// suffix "" for the head's rotation, "|o" / "|r" for the outlier / rest partitions of the split
// formats, "|qjl" for the QJL matrix (the suffixes are ours; the spec names only the first).
// The stream is SplitMix64 from that seed; its bits are read word by word, bit i of the stream
// being bit (i % 64) of word i / 64 (LSB first). Bit 1 means the sign −1.
//
// Kinds (Π is what Apply computes, y = Π x):
//   kRht2 (default): Π = H·D₂·H·D₁, D₁ from stream bits 0..d−1, D₂ from bits d..2d−1, computed as
//         D₁ → unnormalised FWHT → D₂ → unnormalised FWHT → × (1/d); 1/d is a power of two, so
//         the only roundings are the butterfly adds (in the order of Fwht below).
//   kRht1 (tests only, the spec forbids it as default): Π = D₂·H·D₁, scaled by float(1/√d).
//   kHaar: dense Haar Π. Gaussians g[i][j], row-major, by Box–Muller from pairs of 53-bit uniforms
//         u = ((word >> 11) + 1)·2^−53 ∈ (0, 1]: (√(−2 ln u₁) cos 2πu₂, √(−2 ln u₁) sin 2πu₂);
//         Householder QR in fp64; Π = Q with column j times sign(R_jj); stored as fp32. It is made
//         on the host and uploaded (libm differs between CPU and GPU, the matrix does not).
//   Applying a dense Π sums over j in ascending order in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace moe::kernels {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

uint64_t Fnv1a64(absl::string_view bytes);
uint64_t RotationSeed(absl::string_view model_fingerprint, int layer, int kv_head,
                      absl::string_view suffix = "");

// Standard normals from the stream, Box–Muller as documented above, in order.
std::vector<double> GaussianStream(uint64_t seed, int64_t count);

// In-place unnormalised Walsh–Hadamard transform, H_ij = (−1)^popcount(i & j). Butterfly order:
// for h = 1, 2, 4, …: for each block i of 2h: for j in [i, i + h): (t[j], t[j+h]) = (a + b, a − b).
void Fwht(float* t, int n);

enum class RotationKind : uint8_t { kRht2, kRht1, kHaar };
const char* RotationKindName(RotationKind kind);

class Rotation {
 public:
  // dim must be a power of two for the Hadamard kinds (MOE_CHECK: the codec validates first).
  Rotation(RotationKind kind, int dim, uint64_t seed);

  int dim() const { return dim_; }
  RotationKind kind() const { return kind_; }
  // y[dim] = Π x[dim]. x and y must not alias.
  void Apply(const float* x, float* y) const;
  // x[dim] = Πᵀ y[dim]. x and y must not alias.
  void ApplyTranspose(const float* y, float* x) const;
  // The dense matrix, row-major [dim, dim] (kHaar only; empty otherwise).
  const std::vector<float>& matrix() const { return matrix_; }
  // The sign diagonals D₁, D₂ as ±1 (Hadamard kinds; empty for kHaar): the CUDA kernels upload them.
  const std::vector<float>& signs1() const { return d1_; }
  const std::vector<float>& signs2() const { return d2_; }

 private:
  RotationKind kind_;
  int dim_;
  std::vector<float> d1_, d2_;  // ±1 (Hadamard kinds)
  std::vector<float> matrix_;   // [dim, dim] (kHaar)
};

}  // namespace moe::kernels
