// Scratch: error of the GPU kernels' arithmetic (emulated) against the CPU reference's, on the
// parity case's inputs: int8 codes q - z + 16 (m = -16 s), int4 codes 0..15 (m = -8 s).
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
static float Hi(float f) { uint32_t b; std::memcpy(&b, &f, 4); b += 0x7fffu + ((b >> 16) & 1u); b &= 0xffff0000u; std::memcpy(&f, &b, 4); return f; }
int main() {
  for (int B : {8, 4}) for (int G : {64, 128}) for (int T : {1, 5, 12, 24, 64}) {
    const int N = 256, K = 2048, groups = K / G;
    std::mt19937 rng(T * 7 + G + B);
    std::uniform_real_distribution<float> u(XLO, 1.f);
    std::vector<float> x(T * K); for (auto& v : x) v = u(rng);
    std::vector<int> code(N * K); std::vector<float> s(N * groups), m(N * groups);
    for (int n = 0; n < N; ++n) for (int g = 0; g < groups; ++g) {
      const int z = 1 + rng() % 14;
      s[n * groups + g] = (64 + rng() % 64) * std::ldexp(1.f, -14);
      m[n * groups + g] = (B == 8 ? -16.f : -8.f) * s[n * groups + g];
      for (int k = g * G; k < (g + 1) * G; ++k) code[n * K + k] = B == 8 ? int(rng() % 5) - 2 + 16 + 0 * z : int(rng() % 5) - 2 + 8;
    }
    double e_old = 0, e_new = 0, e_cpu = 0, x_old = 0, x_new = 0;
    std::vector<double> exact(T * N); std::vector<float> cpu(T * N), old(T * N), nw(T * N);
    double rms = 0;
    for (int t = 0; t < T; ++t) for (int n = 0; n < N; ++n) {
      const float* xr = &x[t * K]; const int* c = &code[n * K];
      double ex = 0; float acc = 0, acc_old = 0, acc_new = 0;
      for (int g = 0; g < groups; ++g) {
        const float sg = s[n * groups + g], mg = m[n * groups + g];
        float xq = 0, xs = 0;
        for (int k = g * G; k < (g + 1) * G; ++k) { xq += xr[k] * float(c[k]); xs += xr[k]; ex += double(xr[k]) * (double(c[k]) * sg + mg); }
        acc += sg * xq + mg * xs;
      }
      if (B == 8) {  // SIMT: per 32-bit word of 4 codes
        for (int k0 = 0; k0 < K; k0 += 4) {
          const int g = k0 / G; const float sg = s[n * groups + g], mg = m[n * groups + g];
          const float xs = (xr[k0] + xr[k0 + 1]) + (xr[k0 + 2] + xr[k0 + 3]);
          float d = 0, dq = 0;
          for (int e = 0; e < 4; ++e) { d = std::fma(xr[k0 + e], 1.f + c[k0 + e] / 256.f, d); dq = std::fma(xr[k0 + e], float(c[k0 + e]), dq); }
          acc_old = std::fma(sg * 256.f, d - xs, std::fma(mg, xs, acc_old));
          acc_new = std::fma(sg, dq, std::fma(mg, xs, acc_new));
        }
      } else {  // tensor-core matvec: chunks of 64, x as bf16 hi + lo; codes 128 + q (old) or q
        for (int k0 = 0; k0 < K; k0 += 64) {
          const int g = k0 / G; const float sg = s[n * groups + g], mg = m[n * groups + g];
          float d_old = 0, d_new = 0, sx = 0;
          for (int k = k0; k < k0 + 64; ++k) {
            const float hi = Hi(xr[k]), lo = Hi(xr[k] - hi);
            d_old += hi * float(128 + c[k]) + lo * float(128 + c[k]);
            d_new += hi * float(c[k]) + lo * float(c[k]);
            sx += hi + lo;
          }
          acc_old = std::fma(sg, d_old, std::fma(std::fma(-128.f, sg, mg), sx, acc_old));
          acc_new = std::fma(sg, d_new, std::fma(mg, sx, acc_new));
        }
      }
      exact[t * N + n] = ex; cpu[t * N + n] = acc; old[t * N + n] = acc_old; nw[t * N + n] = acc_new;
      rms += double(acc) * acc;
    }
    rms = std::sqrt(rms / (T * N));
    for (int i = 0; i < T * N; ++i) {
      const double den = std::max<double>(std::abs(cpu[i]), rms);
      e_old = std::max(e_old, std::abs(old[i] - cpu[i]) / den);
      e_new = std::max(e_new, std::abs(nw[i] - cpu[i]) / den);
      e_cpu = std::max(e_cpu, std::abs(cpu[i] - exact[i]) / den);
      x_old = std::max(x_old, std::abs(old[i] - exact[i]) / den);
      x_new = std::max(x_new, std::abs(nw[i] - exact[i]) / den);
    }
    std::printf("B %d G %3d T %2d: vs CPU: old %.3g new %.3g | vs exact: CPU %.3g old %.3g new %.3g\n", B, G, T, e_old, e_new, e_cpu, x_old, x_new);
  }
}
