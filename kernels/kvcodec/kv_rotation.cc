// Seeded rotations for TurboQuant: randomized Hadamard (default) and dense Haar via Householder QR.
#include "kernels/kvcodec/kv_rotation.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"

namespace moe::kernels {

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t RotationSeed(absl::string_view model_fingerprint, int layer, int kv_head,
                      absl::string_view suffix) {
  return Fnv1a64(absl::StrCat("tq1|", model_fingerprint, "|", layer, "|", kv_head, suffix));
}

std::vector<double> GaussianStream(uint64_t seed, int64_t count) {
  SplitMix64 rng(seed);
  std::vector<double> out;
  out.reserve(count + 1);
  while (static_cast<int64_t>(out.size()) < count) {
    const double u1 = static_cast<double>((rng.Next() >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>((rng.Next() >> 11) + 1) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out.push_back(r * std::cos(2.0 * std::numbers::pi * u2));
    out.push_back(r * std::sin(2.0 * std::numbers::pi * u2));
  }
  out.resize(count);
  return out;
}

void Fwht(float* t, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = t[j];
        const float b = t[j + h];
        t[j] = a + b;
        t[j + h] = a - b;
      }
    }
  }
}

const char* RotationKindName(RotationKind kind) {
  switch (kind) {
    case RotationKind::kRht2:
      return "rht2";
    case RotationKind::kRht1:
      return "rht1";
    case RotationKind::kHaar:
      return "haar";
  }
  return "?";
}

namespace {

// Q of the QR decomposition of g [n, n] (row-major, fp64), columns signed so that diag(R) > 0,
// which makes Q Haar-distributed for Gaussian g (Mezzadri 2007).
std::vector<double> HaarFromGaussian(const std::vector<double>& g, int n) {
  // Work on columns: col[j * n + i] = A[i][j], so the Householder loops run over contiguous memory.
  std::vector<double> col(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) col[j * n + i] = g[i * n + j];
  }
  std::vector<std::vector<double>> vs(n);
  std::vector<double> r_diag(n);
  for (int k = 0; k < n; ++k) {
    const double* x = &col[k * n];
    double norm2 = 0;
    for (int i = k; i < n; ++i) norm2 += x[i] * x[i];
    const double alpha = x[k] > 0 ? -std::sqrt(norm2) : std::sqrt(norm2);
    std::vector<double> v(x + k, x + n);  // v = x[k:] − alpha e_k, normalised
    v[0] -= alpha;
    double vnorm2 = 0;
    for (double e : v) vnorm2 += e * e;
    if (vnorm2 > 0) {
      const double inv = 1.0 / std::sqrt(vnorm2);
      for (double& e : v) e *= inv;
      for (int j = k; j < n; ++j) {  // A[k:, j] −= 2 v (vᵀ A[k:, j])
        double* a = &col[j * n];
        double dot = 0;
        for (int i = k; i < n; ++i) dot += v[i - k] * a[i];
        for (int i = k; i < n; ++i) a[i] -= 2.0 * v[i - k] * dot;
      }
    }
    r_diag[k] = col[k * n + k];
    vs[k] = std::move(v);
  }
  // Q = H_0 H_1 … H_{n−1} I, built column by column (qcol[j * n + i] = Q[i][j]).
  std::vector<double> qcol(static_cast<size_t>(n) * n, 0.0);
  for (int j = 0; j < n; ++j) qcol[j * n + j] = 1.0;
  for (int k = n - 1; k >= 0; --k) {
    const std::vector<double>& v = vs[k];
    for (int j = 0; j < n; ++j) {
      double* q = &qcol[j * n];
      double dot = 0;
      for (int i = k; i < n; ++i) dot += v[i - k] * q[i];
      for (int i = k; i < n; ++i) q[i] -= 2.0 * v[i - k] * dot;
    }
  }
  std::vector<double> q(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) q[i * n + j] = r_diag[j] < 0 ? -qcol[j * n + i] : qcol[j * n + i];
  }
  return q;
}

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

Rotation::Rotation(RotationKind kind, int dim, uint64_t seed) : kind_(kind), dim_(dim) {
  if (kind == RotationKind::kHaar) {
    const std::vector<double> q = HaarFromGaussian(GaussianStream(seed, int64_t{dim} * dim), dim);
    matrix_.assign(q.begin(), q.end());
    return;
  }
  MOE_CHECK(IsPowerOfTwo(dim)) << "Hadamard rotation needs a power-of-two dim, got " << dim;
  SplitMix64 rng(seed);
  uint64_t word = 0;
  auto sign = [&](int bit) {
    if (bit % 64 == 0) word = rng.Next();
    return ((word >> (bit % 64)) & 1u) ? -1.f : 1.f;
  };
  for (int i = 0; i < dim; ++i) d1_.push_back(sign(i));
  for (int i = 0; i < dim; ++i) d2_.push_back(sign(dim + i));
}

void Rotation::Apply(const float* x, float* y) const {
  const int n = dim_;
  if (kind_ == RotationKind::kHaar) {
    for (int i = 0; i < n; ++i) {
      float acc = 0.f;
      for (int j = 0; j < n; ++j) acc += matrix_[i * n + j] * x[j];
      y[i] = acc;
    }
    return;
  }
  for (int i = 0; i < n; ++i) y[i] = d1_[i] * x[i];
  Fwht(y, n);
  if (kind_ == RotationKind::kRht1) {
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (int i = 0; i < n; ++i) y[i] = d2_[i] * y[i] * scale;
    return;
  }
  for (int i = 0; i < n; ++i) y[i] *= d2_[i];
  Fwht(y, n);
  const float inv_n = 1.f / static_cast<float>(n);  // exact: n is a power of two
  for (int i = 0; i < n; ++i) y[i] *= inv_n;
}

void Rotation::ApplyTranspose(const float* y, float* x) const {
  const int n = dim_;
  if (kind_ == RotationKind::kHaar) {
    for (int j = 0; j < n; ++j) x[j] = 0.f;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) x[j] += matrix_[i * n + j] * y[i];
    }
    return;
  }
  if (kind_ == RotationKind::kRht1) {  // Πᵀ = D₁·H·D₂
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (int i = 0; i < n; ++i) x[i] = d2_[i] * y[i];
    Fwht(x, n);
    for (int i = 0; i < n; ++i) x[i] = d1_[i] * x[i] * scale;
    return;
  }
  // Πᵀ = D₁·H·D₂·H (H and D are symmetric).
  for (int i = 0; i < n; ++i) x[i] = y[i];
  Fwht(x, n);
  for (int i = 0; i < n; ++i) x[i] *= d2_[i];
  Fwht(x, n);
  const float inv_n = 1.f / static_cast<float>(n);
  for (int i = 0; i < n; ++i) x[i] *= d1_[i] * inv_n;
}

}  // namespace moe::kernels
