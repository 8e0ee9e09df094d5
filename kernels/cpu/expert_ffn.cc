// Grouped expert SwiGLU MLP on the CPU: per expert, gather its tokens, Gate/Up, SiLU*, Down,
// then scatter-add weighted into out. Parallel over weight rows inside each projection.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::ExpertFfn(const ExpertFfnArgs& a) {
  const int64_t H = a.hidden_size;
  const bool reverse = ReverseSums(a.num_tokens);  // the step's tokens, not the expert's rows
  std::vector<float> xs, gate, up, down;
  for (const ExpertWork& work : a.experts) {
    const ExpertWeights& w = *work.weights;
    const int64_t n = work.row_count, I = w.gate.dim(0);
    MOE_CHECK(w.gate.dim(1) == H && w.up.dim(0) == I && w.down.dim(0) == H && w.down.dim(1) == I)
        << "ExpertFfn: shapes gate [" << w.gate.dim(0) << "," << w.gate.dim(1) << "] down ["
        << w.down.dim(0) << "," << w.down.dim(1) << "] H " << H;
    if (n == 0) continue;
    xs.resize(n * H);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t row = a.rows[work.row_begin + r];
      MOE_CHECK(row >= 0 && row < a.num_tokens) << "ExpertFfn: row " << row;
      std::copy(a.x + row * H, a.x + (row + 1) * H, xs.begin() + r * H);
    }
    gate.resize(n * I);
    up.resize(n * I);
    down.resize(n * H);
    MatMulRows(gate.data(), xs.data(), n, w.gate, nullptr, reverse);
    MatMulRows(up.data(), xs.data(), n, w.up, nullptr, reverse);
    for (int64_t i = 0; i < n * I; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.f + std::exp(-g)) * up[i];  // F.silu(gate(x)) * up(x)
    }
    MatMulRows(down.data(), gate.data(), n, w.down, nullptr, reverse);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t row = a.rows[work.row_begin + r];
      const float weight = a.row_weights[work.row_begin + r];
      for (int64_t h = 0; h < H; ++h) a.out[row * H + h] += weight * down[r * H + h];
    }
  }
}

}  // namespace moe::kernels
