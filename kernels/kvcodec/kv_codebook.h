// Lloyd–Max scalar codebooks for TurboQuant: the committed tables and the generator that makes
// them.
//
// A coordinate of a uniformly random unit vector in R^d has density
//   f(x) ∝ (1 − x²)^((d−3)/2) on [−1, 1]       (turboquant.md §1.1)
// and the b-bit codebook is the optimal 2^b-level quantizer of that density (§3.4). Values are in
// raw units (not scaled by √d). Index order is ascending: index 0 is the most negative centroid.
#pragma once

#include <vector>

#include "absl/status/statusor.h"

namespace moe::kernels {

struct Codebook {
  int dim = 0;                    // d of the vector (or partition) this codebook was solved for
  int bits = 0;                   // b, 1..4
  std::vector<float> centroids;   // [2^b] ascending, symmetric around 0
  std::vector<float> boundaries;  // [2^b − 1] ascending midpoints; 0 is the middle one
  double mse = 0;  // D_b(d) = E‖u − ũ‖² for a unit u (whole vector, not per coordinate)
  double alpha() const { return 1.0 - mse; }  // E⟨u, ũ⟩ = E‖ũ‖²: the shrinkage of plain MSE
};

// Solves the Lloyd–Max fixed point for (dim, bits) in fp64 with closed-form cell integrals
// (no grid): the result is exact to ~1e-14. dim >= 3, 1 <= bits <= 4. Takes milliseconds.
Codebook SolveLloydMax(int dim, int bits);

// The committed table for (dim, bits), dim in {16, 24, 32, 64, 96, 128, 256}, bits in 1..4.
// NotFound otherwise. The tables are what quantization uses; SolveLloydMax is the check that
// regenerates them (tests/unit/kernels/kv_quant_test.cc, T1).
absl::StatusOr<Codebook> CommittedCodebook(int dim, int bits);

// Index of the cell of y: the number of boundaries <= y (ties go to the upper cell).
inline int CodebookIndex(const Codebook& cb, float y) {
  int idx = 0;
  for (float t : cb.boundaries) idx += (t <= y) ? 1 : 0;
  return idx;
}

}  // namespace moe::kernels
