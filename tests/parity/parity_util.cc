// Parity harness implementation: backends, random data, compare and the summary table.
#include "tests/parity/parity_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/quant.h"

namespace moe::parity {
namespace {

struct Row {
  std::string op, name;
  size_t n = 0;
  double max_abs = 0, max_rel = 0, norm_rel = 0, tol = 0;
  int64_t worst = -1;
  size_t bad = 0;  // non-finite outputs or mismatched ids
  bool pass = true;
};

std::vector<Row>& Table() {
  static std::vector<Row> rows;
  return rows;
}

std::unique_ptr<Backend> g_cpu, g_gpu;

class ParityEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto cpu = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    g_cpu = std::move(cpu).value();
    auto gpu = kernels::MakeBackend(kernels::BackendKind::kCuda, {});
    if (!gpu.ok()) {
      // gtest would mark every test skipped; a skipped GPU test must never read as a pass.
      std::fprintf(stderr, "parity: cannot create the CUDA backend: %s\n",
                   gpu.status().ToString().c_str());
      std::exit(2);
    }
    g_gpu = std::move(gpu).value();
    // Every op launches as in a one-token decode step: overlapping the kernel before it where the
    // device allows (CudaBackend::BeginStep), the mode whose stream order is the one in question.
    g_gpu->BeginStep(1, false);
  }
  void TearDown() override {
    std::printf("\n%-10s %-34s %9s %10s %10s %10s %9s %8s %s\n", "op", "case", "elements",
                "max_abs", "max_rel", "norm_rel", "worst", "tol", "result");
    size_t failed = 0;
    for (const Row& r : Table()) {
      std::printf("%-10s %-34s %9zu %10.3g %10.3g %10.3g %9lld %8.0e %s\n", r.op.c_str(),
                  r.name.c_str(), r.n, r.max_abs, r.max_rel, r.norm_rel,
                  static_cast<long long>(r.worst), r.tol,
                  r.pass ? "PASS" : (r.bad ? "FAIL(nan/ids)" : "FAIL"));
      failed += r.pass ? 0 : 1;
    }
    std::printf("parity: %zu cases, %zu failed\n", Table().size(), failed);
    g_gpu.reset();
    g_cpu.reset();
  }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new ParityEnvironment);

}  // namespace

Backend& Cpu() {
  MOE_CHECK(g_cpu != nullptr) << "cpu backend not created";
  return *g_cpu;
}
Backend& Gpu() {
  MOE_CHECK(g_gpu != nullptr) << "cuda backend not created (see the environment's failure)";
  return *g_gpu;
}

std::vector<float> Random(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

HostWeight MakeWeight(const std::vector<float>& values, DType dtype,
                      std::initializer_list<int64_t> shape) {
  HostWeight w;
  w.bytes.resize(values.size() * kernels::DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32: std::memcpy(&w.bytes[i * 4], &values[i], 4); break;
      case DType::kBF16: {
        const uint16_t h = kernels::F32ToBf16(values[i]);
        std::memcpy(&w.bytes[i * 2], &h, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t h = kernels::F32ToF16(values[i]);
        std::memcpy(&w.bytes[i * 2], &h, 2);
        break;
      }
      case DType::kQ8:
      case DType::kQ4:
      case DType::kQ2:
      case DType::kF8:
        MOE_CHECK(false) << "MakeWeight: quantized weights are made by kernels/quant.h";
    }
  }
  w.cpu = kernels::View(w.bytes.data(), dtype, shape);
  auto up = Gpu().Upload(w.cpu);
  EXPECT_TRUE(up.ok()) << up.status();
  if (up.ok()) w.gpu = std::move(up).value();
  return w;
}

HostWeight MakeAnyWeight(const std::vector<float>& values, DType dtype, int32_t group_size,
                         std::initializer_list<int64_t> shape) {
  if (!kernels::IsQuantized(dtype)) return MakeWeight(values, dtype, shape);
  const TensorView src = kernels::View(values.data(), DType::kF32, shape);
  const int64_t cols = src.shape[src.rank - 1];
  HostWeight w;
  w.bytes.resize(kernels::QuantizedBytes(dtype, src.numel() / cols, cols, group_size));
  auto q = kernels::Quantize(src, dtype, group_size, w.bytes.data());
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return w;
  w.cpu = *q;
  auto up = Gpu().Upload(w.cpu);
  EXPECT_TRUE(up.ok()) << up.status();
  if (up.ok()) w.gpu = std::move(up).value();
  return w;
}

DeviceArray<float> PoisonedOutput(size_t n) {
  return DeviceArray<float>(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}

void ExpectClose(const std::string& op, const std::string& name, const std::vector<float>& got,
                 const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << op << " " << name;
  Row r{op, name, got.size()};
  r.tol = tol;
  double sum_sq = 0, diff_sq = 0;
  for (float w : want) sum_sq += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0 : std::sqrt(sum_sq / want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g) && std::isfinite(w)) {
      if (r.bad++ == 0) r.worst = static_cast<int64_t>(i);
      continue;
    }
    const double d = std::fabs(g - w);
    diff_sq += d * d;
    const double rel = d / std::max({std::fabs(w), rms, 1e-30});
    r.max_abs = std::max(r.max_abs, d);
    if (rel > r.max_rel) {
      r.max_rel = rel;
      if (r.bad == 0) r.worst = static_cast<int64_t>(i);
    }
  }
  r.norm_rel = sum_sq > 0 ? std::sqrt(diff_sq / sum_sq) : std::sqrt(diff_sq);
  r.pass = r.bad == 0 && r.max_rel <= tol;
  Table().push_back(r);
  EXPECT_EQ(r.bad, 0u) << op << " " << name << ": " << r.bad << " non-finite outputs, first at "
                       << r.worst;
  EXPECT_LE(r.max_rel, tol) << op << " " << name << ": worst element " << r.worst << " got "
                            << (r.worst >= 0 ? got[r.worst] : 0.f) << " want "
                            << (r.worst >= 0 ? want[r.worst] : 0.f) << " (max_abs " << r.max_abs
                            << ", norm_rel " << r.norm_rel << ")";
}

void ExpectEqualIds(const std::string& op, const std::string& name,
                    const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  ASSERT_EQ(got.size(), want.size()) << op << " " << name;
  Row r{op, name, got.size()};
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (r.bad++ == 0) r.worst = static_cast<int64_t>(i);
    }
  }
  r.max_abs = r.bad;  // the table's error columns hold the mismatch count for ids
  r.pass = r.bad == 0;
  Table().push_back(r);
  EXPECT_EQ(r.bad, 0u) << op << " " << name << ": " << r.bad << " ids differ, first at "
                       << r.worst << " got " << (r.worst >= 0 ? got[r.worst] : -1) << " want "
                       << (r.worst >= 0 ? want[r.worst] : -1);
}

}  // namespace moe::parity
