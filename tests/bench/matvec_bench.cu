// Micro-benchmark of the decode matrix-vector path (MatMul with T = 1, bf16 and quantized
// weights) and the grouped expert FFN at batch 1 (and 8), against the HBM ceiling. Prints a table; see NOTES.md.
//
// Method (llm.c benchmark_kernel, METHOD.md): warm-up, then N timed runs, each bracketed by CUDA
// events on the backend's stream; median of N. L2: the weights rotate over enough copies that
// more than 4x the L2 size is read between two uses of one copy, so no run finds its weights in
// L2. (A memset scrub, as llm.c does, was tried first: it leaves L2 full of dirty lines whose
// write-back lands inside the next timed run, costing up to 60 MB of extra traffic.) A ~20 us
// spin kernel is queued before the start event, so the timed launch is already queued when the
// GPU reaches the event and host launch latency stays out of the number.
// Bytes per run (the fewest that must move): weights N*K*2 read + x K*4 read + out N*4 written.
// The ceiling is DEVICE.md's 4.26 TB/s and a device-to-device copy measured in the same run
// (bytes read + written), as METHOD.md asks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/quant.h"

namespace moe {
namespace {

using kernels::Buffer;
using kernels::DType;

constexpr double kHbmCeiling = 4.26e12;  // bytes/s, DEVICE.md (H200 device-to-device copy)
constexpr int kRuns = 50;

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

#define BENCH_CHECK(expr)                                                                    \
  do {                                                                                       \
    const cudaError_t e = (expr);                                                            \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct Bench {
  kernels::CudaBackend& gpu;
  cudaStream_t stream;
  size_t l2_bytes;
  Buffer memset_scrub;  // only with --memset-scrub: the llm.c-style scrub, kept to compare

  Buffer Alloc(size_t bytes) {
    auto b = gpu.Allocate(bytes);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(b).value();
  }
  // Random (never zero) contents: zeros run faster than real data (METHOD.md).
  void Fill(Buffer& b, uint32_t seed) {
    std::vector<uint16_t> host(b.bytes() / 2);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (uint16_t& h : host) h = kernels::F32ToBf16(d(rng));
    gpu.CopyToDevice(b.data(), host.data(), host.size() * 2);
    gpu.Synchronize();
  }
  // A random quantized [N, K] matrix (kernels/quant.h layout): random codes (every bit pattern),
  // fp16 scales in [0.001, 0.02) and offsets in [-0.1, 0.1) (finite, like a real checkpoint's).
  void FillQuant(Buffer& b, DType dtype, int64_t N, int64_t K, int32_t group, uint32_t seed) {
    std::vector<uint8_t> host(b.bytes());
    std::mt19937 rng(seed);
    const size_t params = static_cast<size_t>(kernels::QuantParamsOffset(dtype, N, K));
    for (size_t i = 0; i < params; i += 4) {
      const uint32_t r = rng();
      std::memcpy(&host[i], &r, std::min<size_t>(4, params - i));
    }
    std::uniform_real_distribution<float> sd(0.001f, 0.02f), md(-0.1f, 0.1f);
    const int64_t pairs = N * kernels::QuantGroups(K, group);
    for (int64_t i = 0; i < pairs; ++i) {
      const uint16_t sm[2] = {kernels::F32ToF16(sd(rng)), kernels::F32ToF16(md(rng))};
      std::memcpy(&host[params + i * 4], sm, 4);
    }
    gpu.CopyToDevice(b.data(), host.data(), host.size());
    gpu.Synchronize();
  }
  // Median milliseconds of `run(i)` over kRuns.
  template <typename F>
  double MedianMs(F run) {
    for (int i = 0; i < 3; ++i) run(i);  // warm-up: module load, first-touch
    cudaEvent_t start, stop;
    BENCH_CHECK(cudaEventCreate(&start));
    BENCH_CHECK(cudaEventCreate(&stop));
    std::vector<double> ms;
    for (int i = 0; i < kRuns; ++i) {
      if (memset_scrub.data() != nullptr) {
        BENCH_CHECK(cudaMemsetAsync(memset_scrub.data(), i & 0xff, memset_scrub.bytes(), stream));
      }
      SpinKernel<<<1, 1, 0, stream>>>(40000);  // ~20 us at 1.98 GHz
      BENCH_CHECK(cudaGetLastError());
      BENCH_CHECK(cudaEventRecord(start, stream));
      run(i);
      BENCH_CHECK(cudaEventRecord(stop, stream));
      BENCH_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    BENCH_CHECK(cudaEventDestroy(start));
    BENCH_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

void PrintRow(const char* what, double bytes, double ms, double copy_bps) {
  const double bps = bytes / (ms * 1e-3);
  std::printf("%-44s %10.2f %9.2f %9.0f %7.1f%% %7.1f%%\n", what, bytes / 1e6, ms * 1e3,
              bps / 1e9, 100 * bps / kHbmCeiling, 100 * bps / copy_bps);
}

// The quantized (kQ8/kQ4/kQ2) decode paths: MatMul at T = 1 and the grouped expert FFN, at the
// Qwen3-30B-A3B expert shapes. Bytes per run: the quantized matrices (codes + fp16 {s, m} pairs,
// QuantizedBytes) + x read + out written; the FFN's act round trip (R * I * 4 * 2) is left out, as
// for bf16 (it is < 0.5% of the weights).
void QuantRows(Bench& b, double copy_bps) {
  kernels::CudaBackend& gpu = b.gpu;
  std::printf("\n%-44s %10s %9s %9s %8s %8s\n", "op (quantized weights, T = 1)", "MB moved", "us",
              "GB/s", "of 4.26T", "of copy");
  struct Q {
    DType dtype;
    int32_t group;
  };
  const Q formats[] = {{DType::kQ4, 64}, {DType::kQ4, 128}, {DType::kQ8, 64}, {DType::kQ2, 64}};
  for (const Q& f : formats) {  // a large matrix: the kernel's streaming rate
    const int64_t N = 151936, K = 2048;
    const size_t w_bytes = kernels::QuantizedBytes(f.dtype, N, K, f.group);
    const int copies = static_cast<int>(std::max<size_t>(2, (4 * b.l2_bytes) / w_bytes + 1));
    std::vector<Buffer> w;
    for (int c = 0; c < copies; ++c) {
      w.push_back(b.Alloc(w_bytes));
      b.FillQuant(w.back(), f.dtype, N, K, f.group, static_cast<uint32_t>(c + 7));
    }
    Buffer x = b.Alloc(K * 4), out = b.Alloc(N * 4);
    BENCH_CHECK(cudaMemsetAsync(x.data(), 0x3c, K * 4, b.stream));
    const double ms = b.MedianMs([&](int i) {
      kernels::TensorView view = kernels::View(w[i % copies].data(), f.dtype, {N, K});
      view.group_size = f.group;
      gpu.MatMul(out.f32(), x.f32(), 1, view, nullptr);
    });
    const std::string what = std::string("MatMul N 151936 K 2048 ") +
                             kernels::WeightFormatName(f.dtype) + " g" + std::to_string(f.group);
    PrintRow(what.c_str(), static_cast<double>(w_bytes) + K * 4.0 + N * 4.0, ms, copy_bps);
  }
  // Grouped expert FFN: top-8 of one token, and 8 tokens whose 64 (token, expert) pairs all hit
  // distinct experts (a batch-8 decode step's expert layer with no sharing); int4 also 256 tokens
  // on all 128 experts, 16 rows each (a batch-256 decode step's layer, as its plan cuts it: the
  // two-n-tile kernel; 320 MB of weights, past 4x L2 without rotating copies).
  for (const Q& f : formats) {
    for (const int64_t T : {int64_t{1}, int64_t{8}, int64_t{256}}) {
      if (T == 256 && f.dtype != DType::kQ4) continue;
      const int64_t H = 2048, I = 768, K = 8, pool = 128;
      const int64_t R = T * K;                             // routed rows, one per (token, expert)
      const int64_t per_expert = T == 256 ? R / pool : 1;  // else all experts distinct
      const int64_t experts = R / per_expert;
      const size_t gate_bytes = kernels::QuantizedBytes(f.dtype, I, H, f.group);
      const size_t down_bytes = kernels::QuantizedBytes(f.dtype, H, I, f.group);
      std::vector<Buffer> mem;
      std::vector<kernels::ExpertWeights> weights(pool);
      for (int e = 0; e < pool; ++e) {
        mem.push_back(b.Alloc(2 * gate_bytes + down_bytes));
        uint8_t* base = static_cast<uint8_t*>(mem.back().data());
        // one blob per expert, as the store lays it out: gate | up | down, each 16-byte aligned
        Buffer tmp_g = b.Alloc(gate_bytes), tmp_d = b.Alloc(down_bytes);
        b.FillQuant(tmp_g, f.dtype, I, H, f.group, static_cast<uint32_t>(1000 + e));
        gpu.CopyOnDevice(base, tmp_g.data(), gate_bytes);
        b.FillQuant(tmp_g, f.dtype, I, H, f.group, static_cast<uint32_t>(2000 + e));
        gpu.CopyOnDevice(base + gate_bytes, tmp_g.data(), gate_bytes);
        b.FillQuant(tmp_d, f.dtype, H, I, f.group, static_cast<uint32_t>(3000 + e));
        gpu.CopyOnDevice(base + 2 * gate_bytes, tmp_d.data(), down_bytes);
        gpu.Synchronize();
        kernels::TensorView g = kernels::View(base, f.dtype, {I, H});
        kernels::TensorView u = kernels::View(base + gate_bytes, f.dtype, {I, H});
        kernels::TensorView d = kernels::View(base + 2 * gate_bytes, f.dtype, {H, I});
        g.group_size = u.group_size = d.group_size = f.group;
        weights[e] = {g, u, d};
      }
      Buffer x = b.Alloc(T * H * 4), out = b.Alloc(T * H * 4), rows = b.Alloc(R * 4),
             rw = b.Alloc(R * 4);
      std::vector<int32_t> row_tok(R);  // an expert's rows are distinct tokens
      for (int64_t r = 0; r < R; ++r) row_tok[r] = static_cast<int32_t>((r * 17) % T);
      const std::vector<float> row_w(R, 0.125f);
      gpu.CopyToDevice(rows.data(), row_tok.data(), R * 4);
      gpu.CopyToDevice(rw.data(), row_w.data(), R * 4);
      BENCH_CHECK(cudaMemsetAsync(x.data(), 0x3c, T * H * 4, b.stream));
      std::vector<kernels::ExpertWork> work(experts);
      const double ms = b.MedianMs([&](int i) {
        for (int64_t k = 0; k < experts; ++k) {
          work[k] = {&weights[(i * experts + k) % pool], k * per_expert, per_expert};
        }
        kernels::ExpertFfnArgs a;
        a.out = out.f32();
        a.x = x.f32();
        a.num_tokens = T;
        a.hidden_size = H;
        a.experts = work;
        a.rows = static_cast<const int32_t*>(rows.data());
        a.row_weights = rw.f32();
        gpu.ExpertFfn(a);
      });
      const std::string what = "ExpertFfn T " + std::to_string(T) + " top-8 (" +
                               std::to_string(experts) + " experts) " +
                               kernels::WeightFormatName(f.dtype) + " g" + std::to_string(f.group);
      PrintRow(what.c_str(), static_cast<double>(experts * (2 * gate_bytes + down_bytes)), ms,
               copy_bps);
    }
  }
}

int Main(bool memset_scrub) {
  auto made = kernels::CudaBackend::Create({});
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  kernels::CudaBackend& gpu = **made;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  Bench b{gpu, gpu.stream(), static_cast<size_t>(prop.l2CacheSize), Buffer()};
  if (memset_scrub) b.memset_scrub = b.Alloc(size_t{256} << 20);

  // The ceiling in this run: a 1 GiB device-to-device copy, bytes read + written.
  const size_t copy_bytes = size_t{1} << 30;
  Buffer src = b.Alloc(copy_bytes), dst = b.Alloc(copy_bytes);
  BENCH_CHECK(cudaMemsetAsync(src.data(), 1, copy_bytes, b.stream));
  const double copy_ms = b.MedianMs([&](int) {
    gpu.CopyOnDevice(dst.data(), src.data(), copy_bytes);
  });
  const double copy_bps = 2.0 * copy_bytes / (copy_ms * 1e-3);
  src = Buffer();
  dst = Buffer();

  std::printf("device: %s, %d SMs, L2 %zu MiB; %d runs per row, median%s\n", prop.name,
              prop.multiProcessorCount, b.l2_bytes >> 20, kRuns,
              memset_scrub ? "; 256 MiB memset before each run" : "");
  std::printf("measured d2d copy: %.0f GB/s (DEVICE.md ceiling %.0f GB/s)\n\n", copy_bps / 1e9,
              kHbmCeiling / 1e9);
  std::printf("%-44s %10s %9s %9s %8s %8s\n", "op (bf16 weights, T = 1)", "MB moved", "us",
              "GB/s", "of 4.26T", "of copy");

  struct Shape {
    const char* what;
    int64_t N, K;
  };
  const Shape shapes[] = {
      {"MatMul N 512 K 2048 (k/v proj)", 512, 2048},
      {"MatMul N 2048 K 2048", 2048, 2048},
      {"MatMul N 4096 K 2048 (q proj)", 4096, 2048},
      {"MatMul N 2048 K 4096 (o proj)", 2048, 4096},
      {"MatMul N 8192 K 8192", 8192, 8192},
      {"MatMul N 151936 K 2048 (lm head)", 151936, 2048},
  };
  for (const Shape& s : shapes) {
    const size_t w_bytes = static_cast<size_t>(s.N * s.K) * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (4 * b.l2_bytes) / w_bytes + 1));
    std::vector<Buffer> w;
    for (int c = 0; c < copies; ++c) {
      w.push_back(b.Alloc(w_bytes));
      b.Fill(w.back(), static_cast<uint32_t>(c + 1));
    }
    Buffer x = b.Alloc(s.K * 4), out = b.Alloc(s.N * 4);
    BENCH_CHECK(cudaMemsetAsync(x.data(), 0x3c, s.K * 4, b.stream));  // 0x3c3c3c3c ~ 0.0115
    const double ms = b.MedianMs([&](int i) {
      const kernels::TensorView view =
          kernels::View(w[i % copies].data(), DType::kBF16, {s.N, s.K});
      gpu.MatMul(out.f32(), x.f32(), 1, view, nullptr);
    });
    PrintRow(s.what, static_cast<double>(w_bytes) + s.K * 4.0 + s.N * 4.0, ms, copy_bps);
  }

  // Grouped expert FFN at batch 1 (Qwen3-30B-A3B: H 2048, I 768, top-8): two launches (gate+up+
  // SiLU*, down) plus the staged copy of the expert table; weights 8 * 3 * 768 * 2048 * 2 bytes.
  {
    const int64_t H = 2048, I = 768, K = 8, pool = 64;  // 64 experts resident = 604 MB
    std::vector<Buffer> gate, up, down;
    std::vector<kernels::ExpertWeights> weights(pool);
    for (int e = 0; e < pool; ++e) {
      gate.push_back(b.Alloc(I * H * 2));
      up.push_back(b.Alloc(I * H * 2));
      down.push_back(b.Alloc(H * I * 2));
      b.Fill(gate.back(), 100 + e);
      b.Fill(up.back(), 200 + e);
      b.Fill(down.back(), 300 + e);
      weights[e] = {kernels::View(gate.back().data(), DType::kBF16, {I, H}),
                    kernels::View(up.back().data(), DType::kBF16, {I, H}),
                    kernels::View(down.back().data(), DType::kBF16, {H, I})};
    }
    Buffer x = b.Alloc(H * 4), out = b.Alloc(H * 4), rows = b.Alloc(K * 4), rw = b.Alloc(K * 4);
    const std::vector<int32_t> zero_rows(K, 0);
    const std::vector<float> row_w(K, 0.125f);
    gpu.CopyToDevice(rows.data(), zero_rows.data(), K * 4);
    gpu.CopyToDevice(rw.data(), row_w.data(), K * 4);
    BENCH_CHECK(cudaMemsetAsync(x.data(), 0x3c, H * 4, b.stream));
    std::vector<kernels::ExpertWork> work(K);
    const double ms = b.MedianMs([&](int i) {
      for (int k = 0; k < K; ++k) work[k] = {&weights[(i * K + k) % pool], k, 1};
      kernels::ExpertFfnArgs a;
      a.out = out.f32();
      a.x = x.f32();
      a.num_tokens = 1;
      a.hidden_size = H;
      a.experts = work;
      a.rows = static_cast<const int32_t*>(rows.data());
      a.row_weights = rw.f32();
      gpu.ExpertFfn(a);
    });
    PrintRow("ExpertFfn T 1 H 2048 I 768 top-8",
             static_cast<double>(K * 3 * I * H * 2), ms, copy_bps);
  }
  QuantRows(b, copy_bps);
  return 0;
}

}  // namespace
}  // namespace moe

// --memset-scrub: also rewrite 256 MiB before each run (to measure what that scrub costs).
int main(int argc, char** argv) {
  return moe::Main(argc > 1 && std::string(argv[1]) == "--memset-scrub");
}
