// Embed (a row gather), Add, SplitColumns and Sigmoid on the CPU: elementwise loops.
#include <algorithm>
#include <cmath>

#include "kernels/base/check.h"
#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::Embed(float* out, const TensorView& table, const int32_t* ids, int64_t T) {
  MOE_CHECK(table.rank == 2) << "Embed: table rank " << table.rank;
  const int64_t V = table.dim(0), H = table.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    MOE_CHECK(ids[t] >= 0 && ids[t] < V) << "Embed: id " << ids[t] << " outside vocab " << V;
    for (int64_t h = 0; h < H; ++h) out[t * H + h] = table.at(ids[t] * H + h);
  }
}

void CpuBackend::Add(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

void CpuBackend::SplitColumns(const float* src, int64_t rows, absl::Span<float* const> parts,
                              absl::Span<const int64_t> widths) {
  MOE_CHECK(parts.size() == widths.size() && parts.size() <= kMaxColumnParts)
      << "SplitColumns: " << parts.size() << " parts, " << widths.size() << " widths";
  int64_t cols = 0;
  for (const int64_t w : widths) cols += w;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::copy(row, row + widths[i], parts[i] + r * widths[i]);
      row += widths[i];
    }
  }
}

void CpuBackend::Sigmoid(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.f / (1.f + std::exp(-x[i]));
}

}  // namespace moe::kernels
