// Long file (~1,250 lines) on purpose: one case table + TEST_P per op family, same pattern each.
// CPU vs CUDA parity for every Backend op: table-driven cases, one TEST_P per op family.
//
// Each case draws fresh seeded inputs, runs the CPU reference and the CUDA backend with the same
// parameters, and compares every element (parity_util.h). Outputs the op writes (not in-place
// ones) are poisoned with NaN on the GPU first. Tolerances sit beside the cases: fp32 weights
// 1e-4; bf16/fp16 weights 1e-3 (both backends read the same rounded weights and accumulate in
// fp32, so the bound is the fp32 one with headroom for the different summation order).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <tuple>

#include "kernels/quant.h"
#include "tests/parity/parity_util.h"

namespace moe::parity {
namespace {

using kernels::DTypeName;

constexpr double kTolF32 = 1e-4;
constexpr double kTolHalf = 1e-3;
// Quantized weights: both backends read the same codes, scales and offsets and accumulate in fp32;
// the GPU's int4/int2 SIMT kernel regroups the sum (s 2^B sum x f + (m - s 2^B) sum x,
// matmul_quant.cu) and its tensor-core kernels take x as bf16 hi + lo, so the bound is the fp32
// one with headroom for both. QuantMatMulExactCodes holds the exact-code paths far tighter.
constexpr double kTolQuant = 1e-3;
// Paged attention over a TurboQuant cache: the tensor-core kernel takes each centroid as bf16
// hi + lo (exact to 2^-16 relative, decode_attention.cuh), the CPU in fp32: outputs differ by up to
// ~2e-4 of their rms on 1.5 M-element prefills (RESULTS.md), so the bound is the 1e-3 that spec
// T9 sets for dequantized values. bf16 and fp8 elements are exact operands: kTolF32.
double PagedTolFor(kernels::KvFormat f) {
  return f == kernels::KvFormat::kBf16 || f == kernels::KvFormat::kFp8E4m3 ? kTolF32 : 1e-3;
}
double TolFor(DType t) {
  return t == DType::kF32 ? kTolF32 : kernels::IsQuantized(t) ? kTolQuant : kTolHalf;
}

template <typename... A>
std::string Name(const A&... parts) {
  std::ostringstream s;
  ((s << parts << ' '), ...);
  std::string out = s.str();
  out.pop_back();
  return out;
}

// "g64" for a quantized case's group size, "" for dense ones (group 0).
std::string GroupTag(int32_t group) {
  if (group == 0) return "";
  std::ostringstream s;
  s << 'g' << group;
  return s.str();
}

// ---- MatMul: out[T, N] = x[T, K] w[N, K]^T (+ bias) --------------------------------------------
struct MatMulCase {
  int64_t T, N, K;
  DType dtype;
  bool bias;
};
class MatMulParity : public ::testing::TestWithParam<MatMulCase> {};

void RunMatMul(const MatMulCase& c, int32_t group) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 7919 + c.N * 31 + c.K + group));
  const std::vector<float> x = Random(rng, c.T * c.K);
  const HostWeight w = MakeAnyWeight(Random(rng, c.N * c.K), c.dtype, group, {c.N, c.K});
  const DType bias_dtype = kernels::IsQuantized(c.dtype) ? DType::kF32 : c.dtype;
  const HostWeight b = MakeWeight(Random(rng, c.N), bias_dtype, {c.N});
  std::vector<float> want(c.T * c.N);
  Cpu().MatMul(want.data(), x.data(), c.T, w.cpu, c.bias ? &b.cpu : nullptr);
  DeviceArray<float> dx(x);
  DeviceArray<float> out = PoisonedOutput(want.size());
  Gpu().MatMul(out.get(), dx.get(), c.T, w.gpu.view, c.bias ? &b.gpu.view : nullptr);
  ExpectClose("MatMul",
              Name("T", c.T, "N", c.N, "K", c.K, DTypeName(c.dtype),
                   GroupTag(group), c.bias ? "bias" : ""),
              out.Read(), want, TolFor(c.dtype));
}

TEST_P(MatMulParity, MatchesCpu) { RunMatMul(GetParam(), 0); }

INSTANTIATE_TEST_SUITE_P(
    Cases, MatMulParity,
    ::testing::Values(MatMulCase{1, 2048, 2048, DType::kBF16, false},  // decode projection
                      MatMulCase{1, 8192, 2048, DType::kBF16, false},
                      MatMulCase{1, 2048, 4096, DType::kBF16, false},  // o proj: 2 rounds a row
                      MatMulCase{1, 40001, 1536, DType::kBF16, true},  // rows a warp, part rounds
                      MatMulCase{3, 40001, 1536, DType::kBF16, true},
                      MatMulCase{1, 733, 7, DType::kF32, false},
                      MatMulCase{1, 7, 733, DType::kBF16, true},
                      MatMulCase{1, 1, 1, DType::kF32, false},
                      MatMulCase{1, 733, 4099, DType::kBF16, false},  // K split over 4 warps, scalar
                      MatMulCase{1, 512, 2048, DType::kBF16, false},  // K split, vector loads
                      MatMulCase{2, 8191, 8192, DType::kF16, false},
                      MatMulCase{5, 100, 2048, DType::kF32, true},  // K split, 5 rows
                      MatMulCase{3, 733, 257, DType::kF16, true},
                      MatMulCase{7, 129, 2048, DType::kBF16, false},
                      // tensor-core matvec: q of 8 sequences, o (one block an SM), a part tile
                      MatMulCase{8, 4096, 2048, DType::kBF16, false},
                      MatMulCase{8, 2048, 4096, DType::kBF16, false},
                      MatMulCase{4, 2048, 4096, DType::kBF16, true},
                      MatMulCase{5, 1100, 2048, DType::kBF16, false},
                      // K in 8 slices a cluster, the last short (67 chunks), a part row-block
                      MatMulCase{6, 200, 4288, DType::kBF16, true},
                      MatMulCase{8, 64, 733, DType::kF32, false},
                      MatMulCase{9, 733, 129, DType::kBF16, false},  // two passes of 8 rows
                      MatMulCase{16, 2048, 2048, DType::kBF16, false},  // GEMM from 9 rows
                      // one tile column past 8 rows: matrix-vector in chunks of 8 (the router)
                      MatMulCase{64, 128, 2048, DType::kBF16, false},
                      MatMulCase{21, 100, 768, DType::kBF16, true},  // a part chunk, bias
                      MatMulCase{24, 512, 2048, DType::kBF16, true},
                      MatMulCase{33, 257, 67, DType::kF32, true},
                      MatMulCase{64, 2048, 2048, DType::kBF16, false},  // last matrix-vector size
                      MatMulCase{65, 733, 129, DType::kBF16, false},  // first tiled size
                      MatMulCase{130, 300, 2048, DType::kBF16, false},
                      MatMulCase{733, 733, 733, DType::kF32, false},
                      MatMulCase{512, 2048, 2048, DType::kBF16, false},  // prefill, K split 2
                      MatMulCase{256, 512, 2048, DType::kBF16, true},  // k proj: K split 8
                      // tensor-core GEMM: partial tiles of rows and columns, K of 3 k-tiles
                      MatMulCase{100, 200, 96, DType::kBF16, true},
                      MatMulCase{2048, 5120, 2048, DType::kBF16, false}));  // Qwen3-30B q/k/v

// ---- RmsNorm -----------------------------------------------------------------------------------
struct NormCase {
  int64_t rows, H;
  DType dtype;
};
class RmsNormParity : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormParity, MatchesCpu) {
  const NormCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 131 + c.H));
  const std::vector<float> x = Random(rng, c.rows * c.H, -3.f, 3.f);
  const HostWeight w = MakeWeight(Random(rng, c.H, 0.5f, 1.5f), c.dtype, {c.H});
  const float eps = 1e-6f;
  std::vector<float> want(x.size());
  Cpu().RmsNorm(want.data(), x.data(), c.rows, w.cpu, eps);
  DeviceArray<float> dx(x);
  DeviceArray<float> out = PoisonedOutput(want.size());
  Gpu().RmsNorm(out.get(), dx.get(), c.rows, w.gpu.view, eps);
  ExpectClose("RmsNorm", Name("rows", c.rows, "H", c.H, DTypeName(c.dtype)), out.Read(), want,
              kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Cases, RmsNormParity,
                         ::testing::Values(NormCase{1, 2048, DType::kBF16},
                                           NormCase{7, 733, DType::kF32},
                                           NormCase{733, 2048, DType::kBF16},
                                           NormCase{3, 7, DType::kF16},
                                           NormCase{1, 1, DType::kF32},
                                           NormCase{64, 128, DType::kF32}));  // q/k norm

// AddRmsNorm: x += residual, out = RmsNorm(x); both x (in place) and out compared, out written
// over the residual as the engine does.
class AddRmsNormParity : public ::testing::TestWithParam<NormCase> {};

TEST_P(AddRmsNormParity, MatchesCpu) {
  const NormCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 71 + c.H));
  std::vector<float> x = Random(rng, c.rows * c.H, -3.f, 3.f);
  std::vector<float> residual = Random(rng, c.rows * c.H, -3.f, 3.f);
  const HostWeight w = MakeWeight(Random(rng, c.H, 0.5f, 1.5f), c.dtype, {c.H});
  const float eps = 1e-6f;
  DeviceArray<float> dx(x), dres(residual);
  Cpu().AddRmsNorm(x.data(), residual.data(), residual.data(), c.rows, w.cpu, eps);
  Gpu().AddRmsNorm(dx.get(), dres.get(), dres.get(), c.rows, w.gpu.view, eps);
  const std::string name = Name("rows", c.rows, "H", c.H, DTypeName(c.dtype));
  ExpectClose("AddRmsNorm x", name, dx.Read(), x, kTolF32);
  ExpectClose("AddRmsNorm out", name, dres.Read(), residual, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Cases, AddRmsNormParity,
                         ::testing::Values(NormCase{1, 2048, DType::kBF16},
                                           NormCase{7, 733, DType::kF32},
                                           NormCase{733, 2048, DType::kBF16}));

// ---- Rope (in place: no poison; every element is compared) -------------------------------------
struct RopeCase {
  int64_t T;
  int heads, head_dim, rotary_dim;
  float attention_factor;
};
class RopeParity : public ::testing::TestWithParam<RopeCase> {};

// Runs op(backend, args, on_gpu) on the CPU over x and on the GPU over a copy of it, with the same
// random positions and frequencies; x then holds the CPU's result, and the GPU's is returned.
template <typename Op>
std::vector<float> RopeOnBoth(const RopeCase& c, std::vector<float>& x, std::mt19937& rng, Op op) {
  std::vector<int32_t> positions(c.T);
  std::uniform_int_distribution<int32_t> pos(0, 40000);
  for (int32_t& p : positions) p = pos(rng);
  std::vector<float> inv_freq(c.rotary_dim / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = 1.f / std::pow(1e6f, 2.f * static_cast<float>(i) / c.rotary_dim);
  }
  DeviceArray<float> dx(x), dinv_freq(inv_freq);
  DeviceArray<int32_t> dpositions(positions);
  kernels::RopeArgs a;
  a.positions = positions.data();
  a.num_tokens = c.T;
  a.num_heads = c.heads;
  a.head_dim = c.head_dim;
  a.rotary_dim = c.rotary_dim;
  a.inv_freq = inv_freq.data();
  a.attention_factor = c.attention_factor;
  a.x = x.data();
  op(Cpu(), a, false);
  a.x = dx.get();
  a.positions = dpositions.get();
  a.inv_freq = dinv_freq.get();
  op(Gpu(), a, true);
  return dx.Read();
}

TEST_P(RopeParity, MatchesCpu) {
  const RopeCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 17 + c.heads * 5 + c.head_dim));
  std::vector<float> x = Random(rng, c.T * c.heads * c.head_dim);
  const std::vector<float> got =
      RopeOnBoth(c, x, rng, [](Backend& be, const kernels::RopeArgs& a, bool) { be.Rope(a); });
  ExpectClose("Rope", Name("T", c.T, "heads", c.heads, "D", c.head_dim, "rot", c.rotary_dim), got,
              x, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeParity,
                         ::testing::Values(RopeCase{1, 32, 128, 128, 1.f},
                                           RopeCase{7, 4, 64, 32, 1.2f},  // partial rotary, YaRN
                                           RopeCase{733, 16, 128, 128, 1.f},
                                           RopeCase{3, 3, 80, 40, 1.f},
                                           RopeCase{2, 5, 256, 192, 1.f}));  // D past 128

// HeadNormRope: per-head RmsNorm then RoPE in one pass (CUDA) vs RmsNorm, then Rope (CPU). The
// case's heads split into a "q" of heads - heads/4 and a "k" of the rest, with their own weights:
// k's rows right after q's (CUDA: one launch), and the two passed the other way round (two).
TEST_P(RopeParity, HeadNormRopeMatchesCpu) {
  const RopeCase c = GetParam();
  const int hk = std::max(1, c.heads / 4), hq = c.heads - hk;
  ASSERT_GE(hq, 1);
  for (const bool k_follows_q : {true, false}) {
    std::mt19937 rng(static_cast<uint32_t>(c.T * 23 + c.heads * 7 + c.head_dim + k_follows_q));
    std::vector<float> x = Random(rng, c.T * c.heads * c.head_dim, -3.f, 3.f);
    const HostWeight wq =
        MakeWeight(Random(rng, c.head_dim, 0.5f, 1.5f), DType::kBF16, {c.head_dim});
    const HostWeight wk =
        MakeWeight(Random(rng, c.head_dim, 0.5f, 1.5f), DType::kBF16, {c.head_dim});
    const std::vector<float> got =
        RopeOnBoth(c, x, rng, [&](Backend& be, const kernels::RopeArgs& a, bool on_gpu) {
          kernels::RopeArgs first = a, second = a;
          first.num_heads = hq;
          second.num_heads = hk;
          second.x = a.x + a.num_tokens * hq * a.head_dim;
          const TensorView& q_norm = on_gpu ? wq.gpu.view : wq.cpu;
          const TensorView& k_norm = on_gpu ? wk.gpu.view : wk.cpu;
          if (k_follows_q) {
            be.HeadNormRope(first, q_norm, second, k_norm, 1e-6f);
          } else {
            be.HeadNormRope(second, k_norm, first, q_norm, 1e-6f);
          }
        });
    ExpectClose("HeadNormRope",
                Name("T", c.T, "heads", c.heads, "D", c.head_dim, "rot", c.rotary_dim,
                     "k follows q", k_follows_q),
                got, x, kTolF32);
  }
}

// ---- Attention ---------------------------------------------------------------------------------
struct AttnCase {
  int64_t T, start_pos;
  int heads, kv_heads, head_dim;
  int64_t window;
};
class AttentionParity : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionParity, MatchesCpu) {
  const AttnCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 101 + c.start_pos * 7 + c.heads + c.head_dim));
  const int64_t S = c.start_pos + c.T;
  const std::vector<float> q = Random(rng, c.T * c.heads * c.head_dim);
  const std::vector<float> k = Random(rng, S * c.kv_heads * c.head_dim);
  const std::vector<float> v = Random(rng, S * c.kv_heads * c.head_dim);
  kernels::AttentionArgs a;
  a.num_tokens = c.T;
  a.start_pos = c.start_pos;
  a.num_heads = c.heads;
  a.num_kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  a.sliding_window = c.window;
  std::vector<float> want(q.size());
  a.out = want.data();
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  Cpu().Attention(a);
  DeviceArray<float> dq(q), dk(k), dv(v);
  DeviceArray<float> out = PoisonedOutput(want.size());
  a.out = out.get();
  a.q = dq.get();
  a.k_cache = dk.get();
  a.v_cache = dv.get();
  Gpu().Attention(a);
  ExpectClose("Attention",
              Name("T", c.T, "start", c.start_pos, "H", c.heads, "/", c.kv_heads, "D", c.head_dim,
                   c.window ? "win" : "", c.window ? std::to_string(c.window) : ""),
              out.Read(), want, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionParity,
    ::testing::Values(AttnCase{1, 511, 32, 4, 128, 0},    // Qwen3-30B-A3B decode at 512
                      AttnCase{1, 4095, 32, 4, 128, 0},   // split-K decode
                      AttnCase{1, 0, 8, 8, 64, 0},        // first token
                      AttnCase{1, 100, 4, 4, 128, 0},     // short: one split
                      AttnCase{1, 732, 16, 16, 80, 0},    // MHA, odd head_dim
                      AttnCase{1, 5000, 16, 2, 256, 1024},  // sliding window, D 256
                      AttnCase{7, 0, 4, 2, 64, 0},
                      AttnCase{5, 3, 6, 3, 40, 0},
                      AttnCase{37, 500, 8, 2, 128, 0},    // chunked prefill
                      AttnCase{64, 1000, 4, 1, 128, 256},
                      AttnCase{733, 0, 16, 4, 128, 0}));  // prefill

// ---- Paged KV cache: PagedKvWrite (codes bit for bit) + PagedAttention (fp32 tolerance) --------
// The history [0, start_pos) is written in one call and the T new tokens in a second (chunked
// prefill / decode), into blocks scattered at random over a pool that starts as the same random
// bytes on both backends; then every byte of the pool is compared, and the attention output
// (poisoned on the GPU) element by element. With a 16-bit tail of W tokens the history's ring
// write follows its cache write, the attention reads the ring and the new K/V, and the new
// tokens' ring write follows it (the engine's order); then every byte of the ring is compared.
struct PagedCase {
  int64_t T, start_pos;
  int heads, kv_heads, head_dim, block_size;
  int64_t window;
  kernels::KvFormat format;
  int tail = 0;  // W; 0: none
};
class PagedKvParity : public ::testing::TestWithParam<PagedCase> {};

// A tail ring [W][NKV][2][D] of random bf16 bits (NaN among them): a slot read before it is
// written shows up in the output.
std::vector<uint16_t> RandomRing(std::mt19937& rng, int W, int NKV, int D) {
  std::vector<uint16_t> ring(static_cast<size_t>(W) * NKV * 2 * D);
  for (uint16_t& x : ring) x = static_cast<uint16_t>(rng());
  return ring;
}

std::vector<kernels::KvCodec> MakeCodecs(kernels::KvFormat format, int kv_heads, int head_dim) {
  std::vector<kernels::KvCodec> codecs;
  for (int h = 0; h < kv_heads; ++h) {
    for (kernels::KvRole role : {kernels::KvRole::kKey, kernels::KvRole::kValue}) {
      kernels::KvCodecOptions o;
      o.format = format;
      o.head_dim = head_dim;
      o.role = role;
      o.kv_head = h;
      if (format == kernels::KvFormat::kTq3p5 || format == kernels::KvFormat::kTq2p5) {
        // Each codec its own outlier set, as the model picks them per (layer, kv-head, K|V).
        std::vector<int> channels(head_dim);
        std::iota(channels.begin(), channels.end(), 0);
        std::mt19937 pick(static_cast<uint32_t>(2 * h + static_cast<int>(role)));
        std::shuffle(channels.begin(), channels.end(), pick);
        o.outlier_channels.assign(channels.begin(), channels.begin() + 32);
      }
      auto codec = kernels::KvCodec::Create(o);
      EXPECT_TRUE(codec.ok()) << codec.status();
      codecs.push_back(std::move(codec).value());
    }
  }
  return codecs;
}

TEST_P(PagedKvParity, MatchesCpu) {
  const PagedCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.start_pos * 3 + c.heads * 17 +
                                         c.head_dim + static_cast<int>(c.format) * 1000));
  const int D = c.head_dim, NKV = c.kv_heads, bs = c.block_size;
  const int64_t S = c.start_pos + c.T;
  const int64_t used = (S + bs - 1) / bs, pool_blocks = 2 * used + 3;
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> table(perm.begin(), perm.begin() + used);

  const std::vector<kernels::KvCodec> codecs = MakeCodecs(c.format, NKV, D);
  std::vector<const kernels::KvCodec*> codec_ptrs;
  for (const auto& cd : codecs) codec_ptrs.push_back(&cd);
  auto bpv = kernels::KvBytesPerVector(c.format, D);
  ASSERT_TRUE(bpv.ok()) << bpv.status();
  const int64_t tile_bytes = *bpv * bs, block_stride = tile_bytes * 2 * NKV;
  std::vector<uint8_t> pool(pool_blocks * block_stride);
  for (auto& b : pool) b = static_cast<uint8_t>(rng());
  DeviceArray<uint8_t> dpool(pool);

  // Keys and values with per-vector magnitudes spread over 1e-3..1e1 (fp8 and TurboQuant scales
  // span four decades; larger keys make logits of ~±70, whose fp32 dot-product rounding alone
  // moves softmax weights by ~1e-4: RESULTS.md).
  std::vector<float> k = Random(rng, S * NKV * D), v = Random(rng, S * NKV * D);
  std::uniform_real_distribution<float> mag(-3.f, 1.f);
  for (int64_t i = 0; i < S * NKV; ++i) {
    const float mk = std::pow(10.f, mag(rng)), mv = std::pow(10.f, mag(rng));
    for (int d = 0; d < D; ++d) {
      k[i * D + d] *= mk;
      v[i * D + d] *= mv;
    }
  }
  const std::vector<float> q = Random(rng, c.T * c.heads * D, -2.f, 2.f);
  DeviceArray<float> dk(k), dv(v), dq(q);
  std::vector<uint16_t> ring = RandomRing(rng, c.tail, NKV, D);
  DeviceArray<uint16_t> dring(ring);

  kernels::PagedKvLayer layer;
  layer.block_stride = block_stride;
  layer.tile_bytes = tile_bytes;
  layer.block_size = bs;
  layer.block_table = table.data();
  layer.codecs = codec_ptrs.data();
  layer.num_kv_heads = NKV;
  layer.head_dim = D;
  layer.tail_tokens = c.tail;
  const int64_t row = int64_t{NKV} * D;
  // The new tokens' write, the history's before it (cache and ring) in one call each.
  auto write = [&](Backend& be, uint8_t* base, uint16_t* tail, const float* kp, const float* vp) {
    kernels::PagedKvWriteArgs w;
    w.kv = layer;
    w.kv.layer_base = base;
    w.kv.tail = c.tail > 0 ? tail : nullptr;
    if (c.start_pos > 0) {  // history in one call
      w.k = kp;
      w.v = vp;
      w.num_tokens = c.start_pos;
      w.start_pos = 0;
      ASSERT_TRUE(be.PagedKvWrite({w}).ok());
      ASSERT_TRUE(be.PagedKvTailWrite({w}).ok());
    }
    w.k = kp + c.start_pos * row;
    w.v = vp + c.start_pos * row;
    w.num_tokens = c.T;
    w.start_pos = c.start_pos;
    ASSERT_TRUE(be.PagedKvWrite({w}).ok());
  };
  write(Cpu(), pool.data(), ring.data(), k.data(), v.data());
  write(Gpu(), dpool.get(), dring.get(), dk.get(), dv.get());
  const std::string name = Name(kernels::KvFormatName(c.format), "T", c.T, "start", c.start_pos,
                                "H", c.heads, "/", c.kv_heads, "D", D, "bs", bs,
                                c.window ? "win" : "", c.window ? std::to_string(c.window) : "",
                                c.tail ? "tail" : "", c.tail ? std::to_string(c.tail) : "");
  {
    const std::vector<uint8_t> got = dpool.Read();
    ExpectEqualIds("PagedKvWrite bytes", name, std::vector<int32_t>(got.begin(), got.end()),
                   std::vector<int32_t>(pool.begin(), pool.end()));
  }

  kernels::PagedAttentionArgs a;
  a.kv = layer;
  a.kv.layer_base = pool.data();
  a.num_tokens = c.T;
  a.start_pos = c.start_pos;
  a.num_heads = c.heads;
  a.scale = 1.f / std::sqrt(static_cast<float>(D));
  a.sliding_window = c.window;
  if (c.tail > 0) {
    a.kv.tail = ring.data();
    a.k_new = k.data() + c.start_pos * row;
    a.v_new = v.data() + c.start_pos * row;
  }
  std::vector<float> want(q.size());
  a.out = want.data();
  a.q = q.data();
  ASSERT_TRUE(Cpu().PagedAttention({a}).ok());
  DeviceArray<float> out = PoisonedOutput(want.size());
  a.kv.layer_base = dpool.get();
  a.out = out.get();
  a.q = dq.get();
  if (c.tail > 0) {
    a.kv.tail = dring.get();
    a.k_new = dk.get() + c.start_pos * row;
    a.v_new = dv.get() + c.start_pos * row;
  }
  ASSERT_TRUE(Gpu().PagedAttention({a}).ok());
  ExpectClose("PagedAttention", name, out.Read(), want, PagedTolFor(c.format));
  if (c.tail > 0) {  // the new tokens into the ring, after the attention
    for (Backend* be : {&Cpu(), &Gpu()}) {
      const bool cpu = be == &Cpu();
      kernels::PagedKvWriteArgs w;
      w.kv = a.kv;
      w.kv.tail = cpu ? ring.data() : dring.get();
      w.k = (cpu ? k.data() : dk.get()) + c.start_pos * row;
      w.v = (cpu ? v.data() : dv.get()) + c.start_pos * row;
      w.num_tokens = c.T;
      w.start_pos = c.start_pos;
      ASSERT_TRUE(be->PagedKvTailWrite({w}).ok());
    }
    const std::vector<uint16_t> got = dring.Read();
    ExpectEqualIds("PagedKvTailWrite bytes", name, std::vector<int32_t>(got.begin(), got.end()),
                   std::vector<int32_t>(ring.begin(), ring.end()));
  }
}

constexpr kernels::KvFormat kBf16Kv = kernels::KvFormat::kBf16;
constexpr kernels::KvFormat kFp8Kv = kernels::KvFormat::kFp8E4m3;
INSTANTIATE_TEST_SUITE_P(
    Cases, PagedKvParity,
    ::testing::Values(PagedCase{1, 0, 8, 8, 64, 16, 0, kBf16Kv},      // first token
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kBf16Kv},  // decode at 733
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kFp8Kv},
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kFp8Kv},  // split-K decode
                      PagedCase{1, 6, 4, 2, 64, 16, 0, kFp8Kv},       // length 7
                      PagedCase{7, 0, 4, 2, 64, 16, 0, kBf16Kv},      // prefill of 7
                      PagedCase{7, 0, 6, 3, 128, 32, 0, kFp8Kv},
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kBf16Kv},  // chunked prefill
                      PagedCase{37, 500, 8, 2, 64, 16, 0, kFp8Kv},
                      PagedCase{1, 2000, 16, 2, 128, 16, 256, kBf16Kv},  // sliding window
                      PagedCase{64, 1000, 4, 1, 128, 32, 256, kFp8Kv},
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kBf16Kv},  // prefill of 733
                      PagedCase{733, 0, 16, 4, 64, 16, 0, kFp8Kv},
                      // The prefill kernel: the Qwen3-30B-A3B heads (bf16, fp8), head_dim 64 with
                      // history in blocks of 32, one head a kv head, odd rows (G = 2).
                      PagedCase{300, 0, 32, 4, 128, 16, 0, kBf16Kv},
                      PagedCase{300, 0, 32, 4, 128, 16, 0, kFp8Kv},
                      PagedCase{200, 777, 32, 4, 64, 32, 0, kBf16Kv},
                      PagedCase{130, 0, 16, 16, 128, 16, 0, kBf16Kv},
                      PagedCase{65, 19, 6, 3, 64, 16, 0, kBf16Kv},
                      PagedCase{1, 732, 32, 4, 128, 15, 0, kFp8Kv},  // unaligned: per element
                      PagedCase{7, 100, 4, 2, 36, 16, 0, kBf16Kv},   // head_dim 36: per element
                      PagedCase{5, 300, 8, 2, 72, 16, 0, kFp8Kv},    // head_dim 72: chunks
                      // TurboQuant (spec T9): codes and fp16 scales bit for bit
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kernels::KvFormat::kTq4},
                      PagedCase{1, 6, 4, 2, 64, 16, 0, kernels::KvFormat::kTq3},
                      PagedCase{7, 0, 6, 3, 128, 32, 0, kernels::KvFormat::kTq2},
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kernels::KvFormat::kTq3},
                      PagedCase{64, 1000, 4, 1, 64, 32, 256, kernels::KvFormat::kTq4},
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kernels::KvFormat::kTq2},
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kernels::KvFormat::kTq4},
                      // 32 query heads per kv head: past the tensor-core kernel (<= 16), the
                      // SIMT kernel, for TurboQuant between its two rotation kernels
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kBf16Kv},
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kernels::KvFormat::kTq3},
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kernels::KvFormat::kTq2p5},
                      // split formats (head_dim 128 only)
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kernels::KvFormat::kTq3p5},
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kernels::KvFormat::kTq2p5},
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kernels::KvFormat::kTq2p5},
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kernels::KvFormat::kTq3p5},
                      PagedCase{64, 1000, 4, 1, 128, 32, 256, kernels::KvFormat::kTq3p5},
                      PagedCase{1, 900, 16, 1, 128, 16, 0, kernels::KvFormat::kTq2p5},  // G 16
                      PagedCase{1, 2000, 32, 4, 128, 16, 256, kernels::KvFormat::kTq3p5},
                      // decode kernel shapes: 16 query heads per kv head, head_dim 64 and 256
                      PagedCase{1, 1500, 32, 2, 128, 16, 0, kBf16Kv},
                      PagedCase{1, 900, 16, 1, 64, 16, 0, kernels::KvFormat::kTq4},
                      PagedCase{1, 3000, 8, 2, 256, 16, 0, kFp8Kv},
                      PagedCase{1, 1000, 8, 1, 256, 16, 300, kernels::KvFormat::kTq3},
                      PagedCase{1, 40, 12, 1, 64, 16, 0, kFp8Kv},
                      // TurboQuant at head_dims the CUDA kernels do not cover (16, 24, 96: the
                      // golden fixtures' and a Haar-rotated one): the host-staged path
                      PagedCase{1, 40, 4, 2, 16, 16, 0, kernels::KvFormat::kTq4},
                      PagedCase{7, 30, 4, 1, 24, 16, 0, kernels::KvFormat::kTq3},
                      PagedCase{1, 300, 8, 2, 96, 16, 0, kernels::KvFormat::kTq2}));

// The same with a 16-bit tail (--kv_tail_tokens W): decode and prefill chunks for every
// compressed format on the tensor-core kernel and on the SIMT one (32 heads a kv head, an
// unaligned block size), a window larger than the sequence, a sliding window shorter than the
// tail (no compressed position), W = 1, and the host-staged path (head_dim 16).
constexpr kernels::KvFormat kTq4Kv = kernels::KvFormat::kTq4;
constexpr kernels::KvFormat kTq3p5Kv = kernels::KvFormat::kTq3p5;
constexpr kernels::KvFormat kTq2p5Kv = kernels::KvFormat::kTq2p5;
INSTANTIATE_TEST_SUITE_P(
    Tail, PagedKvParity,
    ::testing::Values(PagedCase{1, 732, 32, 4, 128, 16, 0, kFp8Kv, 64},   // decode
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kFp8Kv, 64},  // split-K decode
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kFp8Kv, 64},   // chunked prefill
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kFp8Kv, 64},   // prefill of 733
                      PagedCase{7, 0, 6, 3, 128, 32, 0, kFp8Kv, 64},      // W > sequence
                      PagedCase{1, 6, 4, 2, 64, 16, 0, kernels::KvFormat::kTq3, 16},
                      PagedCase{1, 732, 32, 4, 128, 15, 0, kFp8Kv, 64},   // unaligned: SIMT
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kFp8Kv, 64},  // G 32: SIMT
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kernels::KvFormat::kTq3, 64},
                      PagedCase{37, 500, 32, 1, 128, 16, 0, kTq2p5Kv, 64},
                      PagedCase{5, 300, 8, 2, 72, 16, 0, kFp8Kv, 1},        // W 1, head_dim 72
                      PagedCase{64, 1000, 4, 1, 128, 32, 256, kFp8Kv, 64},  // window 256
                      PagedCase{1, 2000, 16, 2, 128, 16, 32, kFp8Kv, 64},   // window < W
                      PagedCase{1, 3000, 8, 2, 256, 16, 0, kFp8Kv, 64},     // head_dim 256
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kTq4Kv, 64},
                      PagedCase{1, 900, 16, 1, 64, 16, 0, kTq4Kv, 64},
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kTq4Kv, 128},
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kernels::KvFormat::kTq3, 32},
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kernels::KvFormat::kTq2, 64},
                      PagedCase{7, 0, 6, 3, 128, 32, 0, kernels::KvFormat::kTq2, 64},
                      PagedCase{1, 732, 32, 4, 128, 16, 0, kTq3p5Kv, 64},
                      PagedCase{37, 500, 8, 2, 128, 16, 0, kTq2p5Kv, 64},
                      PagedCase{733, 0, 16, 4, 128, 16, 0, kTq3p5Kv, 128},
                      PagedCase{1, 4095, 32, 4, 128, 16, 0, kTq2p5Kv, 64},
                      PagedCase{1, 40, 4, 2, 16, 16, 0, kTq4Kv, 8}));  // host-staged

// A step's sequences in one call (the engine's per-layer batch; one launch on CUDA): decodes at
// several lengths, a split-K decode and an empty item (kDecode); with a short prefill and a
// 3-token chunk among them (kMixed); prefill chunks alone, with and without history (kPrefill: on
// a bf16 cache, the prefill kernel's sequences and query tiles); or two chunks between decodes
// (kChunksAndDecodes: the chunks on the prefill kernel, the decodes in three runs on the decode
// kernel), over one pool; every byte of the pool and every output element against the CPU, which
// runs the elements one by one. The tensor-core decode kernel takes the first two on CUDA (a
// prefill as one-token rows). With a tail (W > 0) each sequence has its ring, written with its
// history and after the attention.
enum class BatchMix { kDecode, kMixed, kPrefill, kChunksAndDecodes };
class PagedKvBatchParity
    : public ::testing::TestWithParam<std::tuple<kernels::KvFormat, BatchMix, int>> {};

TEST_P(PagedKvBatchParity, MatchesCpu) {
  const auto [format, mix, W] = GetParam();
  const int D = 128, NKV = 4, NH = 32, bs = 16;
  struct Seq {
    int64_t start_pos, T;
  };
  const std::vector<Seq> seqs =
      mix == BatchMix::kDecode
          ? std::vector<Seq>{{732, 1}, {4000, 1}, {16, 1}, {10, 0}, {0, 1}, {300, 1}}
      : mix == BatchMix::kMixed
          ? std::vector<Seq>{{0, 5}, {732, 1}, {4000, 1}, {16, 1}, {10, 0}, {100, 3}}
      : mix == BatchMix::kPrefill
          ? std::vector<Seq>{{0, 40}, {732, 17}, {100, 64}, {5, 9}, {0, 200}}
          : std::vector<Seq>{{732, 1}, {0, 40}, {4000, 1}, {16, 1}, {10, 0}, {100, 24}, {300, 1}};
  std::mt19937 rng(static_cast<uint32_t>(7 + static_cast<int>(format)));
  int64_t pool_blocks = 3, tokens = 0;
  for (const Seq& q : seqs) {
    pool_blocks += (q.start_pos + q.T + bs - 1) / bs;
    tokens += q.T;
  }
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  int64_t next = 0;
  for (const Seq& q : seqs) {
    const int64_t n = (q.start_pos + q.T + bs - 1) / bs;
    tables.emplace_back(perm.begin() + next, perm.begin() + next + n);
    next += n;
  }
  const std::vector<kernels::KvCodec> codecs = MakeCodecs(format, NKV, D);
  std::vector<const kernels::KvCodec*> codec_ptrs;
  for (const auto& cd : codecs) codec_ptrs.push_back(&cd);
  auto bpv = kernels::KvBytesPerVector(format, D);
  ASSERT_TRUE(bpv.ok()) << bpv.status();
  const int64_t tile_bytes = *bpv * bs, block_stride = tile_bytes * 2 * NKV;
  std::vector<uint8_t> pool(pool_blocks * block_stride);
  for (auto& b : pool) b = static_cast<uint8_t>(rng());
  kernels::PagedKvLayer layer;
  layer.block_stride = block_stride;
  layer.tile_bytes = tile_bytes;
  layer.block_size = bs;
  layer.codecs = codec_ptrs.data();
  layer.num_kv_heads = NKV;
  layer.head_dim = D;
  layer.tail_tokens = W;
  const int64_t row = int64_t{NKV} * D;

  // History of each sequence, written one sequence at a time (same on both backends).
  std::vector<std::vector<float>> hk, hv;
  std::vector<std::vector<uint16_t>> rings;
  std::vector<DeviceArray<uint16_t>> drings;
  for (const Seq& q : seqs) {
    hk.push_back(Random(rng, q.start_pos * row));
    hv.push_back(Random(rng, q.start_pos * row));
    rings.push_back(RandomRing(rng, W, NKV, D));
    drings.emplace_back(rings.back());
  }
  const std::vector<float> k = Random(rng, tokens * row), v = Random(rng, tokens * row);
  const std::vector<float> qv = Random(rng, tokens * NH * D, -2.f, 2.f);
  DeviceArray<uint8_t> dpool(pool);
  DeviceArray<float> dk(k), dv(v), dq(qv);
  DeviceArray<float> out = PoisonedOutput(qv.size());
  std::vector<float> want(qv.size());
  for (int which = 0; which < 2; ++which) {
    Backend& be = which == 0 ? Cpu() : Gpu();
    uint8_t* base = which == 0 ? pool.data() : dpool.get();
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].start_pos == 0) continue;
      DeviceArray<float> dhk(hk[i]), dhv(hv[i]);
      kernels::PagedKvWriteArgs w;
      w.kv = layer;
      w.kv.layer_base = base;
      w.kv.block_table = tables[i].data();
      if (W > 0) w.kv.tail = which == 0 ? rings[i].data() : drings[i].get();
      w.k = which == 0 ? hk[i].data() : dhk.get();
      w.v = which == 0 ? hv[i].data() : dhv.get();
      w.num_tokens = seqs[i].start_pos;
      ASSERT_TRUE(be.PagedKvWrite({w}).ok());
      ASSERT_TRUE(be.PagedKvTailWrite({w}).ok());
    }
    std::vector<kernels::PagedKvWriteArgs> writes;
    std::vector<kernels::PagedAttentionArgs> reads;
    int64_t offset = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      kernels::PagedKvWriteArgs w;
      w.kv = layer;
      w.kv.layer_base = base;
      w.kv.block_table = tables[i].data();
      if (W > 0) w.kv.tail = which == 0 ? rings[i].data() : drings[i].get();
      w.k = (which == 0 ? k.data() : dk.get()) + offset * row;
      w.v = (which == 0 ? v.data() : dv.get()) + offset * row;
      w.num_tokens = seqs[i].T;
      w.start_pos = seqs[i].start_pos;
      writes.push_back(w);
      kernels::PagedAttentionArgs a;
      a.kv = w.kv;
      a.q = (which == 0 ? qv.data() : dq.get()) + offset * NH * D;
      a.out = (which == 0 ? want.data() : out.get()) + offset * NH * D;
      a.num_tokens = seqs[i].T;
      a.start_pos = seqs[i].start_pos;
      a.num_heads = NH;
      a.scale = 1.f / std::sqrt(static_cast<float>(D));
      a.k_new = w.k;
      a.v_new = w.v;
      reads.push_back(a);
      offset += seqs[i].T;
    }
    ASSERT_TRUE(be.PagedKvWrite(writes).ok());
    ASSERT_TRUE(be.PagedAttention(reads).ok());
    ASSERT_TRUE(be.PagedKvTailWrite(writes).ok());
  }
  const char* mix_name = mix == BatchMix::kDecode    ? "decode"
                         : mix == BatchMix::kMixed   ? "mixed"
                         : mix == BatchMix::kPrefill ? "prefill"
                                                     : "chunks and decodes";
  const std::string name =
      Name(kernels::KvFormatName(format), mix_name, "batch of", seqs.size(), "tail", W);
  const std::vector<uint8_t> got = dpool.Read();
  ExpectEqualIds("PagedKvWrite batch bytes", name, std::vector<int32_t>(got.begin(), got.end()),
                 std::vector<int32_t>(pool.begin(), pool.end()));
  ExpectClose("PagedAttention batch", name, out.Read(), want, PagedTolFor(format));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<uint16_t> ring = drings[i].Read();
    ExpectEqualIds("PagedKvTailWrite batch bytes", Name(name, "sequence", i),
                   std::vector<int32_t>(ring.begin(), ring.end()),
                   std::vector<int32_t>(rings[i].begin(), rings[i].end()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, PagedKvBatchParity,
    ::testing::Combine(::testing::Values(kBf16Kv, kFp8Kv, kernels::KvFormat::kTq4,
                                         kernels::KvFormat::kTq3, kernels::KvFormat::kTq2,
                                         kernels::KvFormat::kTq3p5, kernels::KvFormat::kTq2p5),
                       ::testing::Values(BatchMix::kDecode, BatchMix::kMixed, BatchMix::kPrefill,
                                         BatchMix::kChunksAndDecodes),
                       ::testing::Values(0)));
INSTANTIATE_TEST_SUITE_P(
    Tail, PagedKvBatchParity,
    ::testing::Combine(::testing::Values(kFp8Kv, kTq4Kv, kernels::KvFormat::kTq2, kTq3p5Kv),
                       ::testing::Values(BatchMix::kDecode, BatchMix::kMixed, BatchMix::kPrefill,
                                         BatchMix::kChunksAndDecodes),
                       ::testing::Values(64)));

TEST(PagedKvErrors, NonFiniteVectorIsInvalidArgumentOnBothBackends) {
  const int D = 128, NKV = 2, bs = 16;
  for (kernels::KvFormat f : {kBf16Kv, kFp8Kv, kernels::KvFormat::kTq3, kernels::KvFormat::kTq2p5}) {
    const std::vector<kernels::KvCodec> codecs = MakeCodecs(f, NKV, D);
    std::vector<const kernels::KvCodec*> ptrs;
    for (const auto& cd : codecs) ptrs.push_back(&cd);
    const int64_t tile = *kernels::KvBytesPerVector(f, D) * bs;
    std::vector<uint8_t> pool(tile * 2 * NKV, 0);
    DeviceArray<uint8_t> dpool(pool);
    std::vector<float> k(3 * NKV * D, 0.5f), v(3 * NKV * D, 0.25f);
    k[(1 * NKV + 1) * D + 5] = NAN;  // token 1, kv-head 1
    DeviceArray<float> dk(k), dv(v);
    const std::vector<int32_t> table = {0};
    kernels::PagedKvWriteArgs w;
    w.kv.block_stride = tile * 2 * NKV;
    w.kv.tile_bytes = tile;
    w.kv.block_size = bs;
    w.kv.block_table = table.data();
    w.kv.codecs = ptrs.data();
    w.kv.num_kv_heads = NKV;
    w.kv.head_dim = D;
    w.num_tokens = 3;
    w.kv.layer_base = pool.data();
    w.k = k.data();
    w.v = v.data();
    EXPECT_EQ(Cpu().PagedKvWrite({w}).code(), absl::StatusCode::kInvalidArgument);
    w.kv.layer_base = dpool.get();
    w.k = dk.get();
    w.v = dv.get();
    ASSERT_TRUE(Gpu().PagedKvWrite({w}).ok());  // CUDA reports the verdict when taken
    const absl::Status st = Gpu().TakeKvWriteError();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Gpu().TakeKvWriteError().ok()) << "the verdict is taken once";
    EXPECT_NE(st.message().find("position 1, kv-head 1 key"), absl::string_view::npos) << st;
  }
}

// A tail without the step's new keys and values (which the attention reads for positions >=
// start_pos) is refused clearly on CUDA, before any launch. The tail's numbers: PagedKvParity's
// and PagedKvBatchParity's Tail cases.
TEST(PagedKvTail, CudaNeedsTheNewKeysAndValues) {
  uint16_t ring[8] = {};
  kernels::PagedAttentionArgs a;
  a.kv.tail = ring;
  a.kv.tail_tokens = 2;
  a.num_tokens = 1;
  const absl::Status st = Gpu().PagedAttention({a});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("a tail needs"), absl::string_view::npos) << st;
}

// ---- Route -------------------------------------------------------------------------------------
struct RouteCase {
  int64_t T;
  int E, K;
  bool renormalize;
  // LFM2's routing: sigmoid scores, a random selection bias, eps 1e-6, this scaling.
  bool sigmoid = false;
  float scaling = 1.f;
};
class RouteParity : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteParity, MatchesCpu) {
  const RouteCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 13 + c.E * 3 + c.K));
  const std::vector<float> logits = Random(rng, c.T * c.E, -4.f, 4.f);
  std::vector<float> want_w(c.T * c.K);
  std::vector<int32_t> want_ids(c.T * c.K);
  kernels::RouteArgs a;
  a.num_tokens = c.T;
  a.num_experts = c.E;
  a.top_k = c.K;
  a.renormalize = c.renormalize;
  const std::vector<float> bias = Random(rng, c.E, -0.5f, 0.5f);
  if (c.sigmoid) {
    a.scoring = kernels::RouteScoring::kSigmoid;
    a.selection_bias = bias.data();
    a.renormalize_eps = 1e-6f;
    a.scaling = c.scaling;
  }
  a.logits = logits.data();
  a.weights = want_w.data();
  a.expert_ids = want_ids.data();
  Cpu().Route(a);
  DeviceArray<float> dl(logits), dbias(bias);
  if (c.sigmoid) a.selection_bias = dbias.get();
  DeviceArray<float> w = PoisonedOutput(want_w.size());
  DeviceArray<int32_t> ids(std::vector<int32_t>(want_ids.size(), -1));
  a.logits = dl.get();
  a.weights = w.get();
  a.expert_ids = ids.get();
  Gpu().Route(a);
  const std::string name = Name("T", c.T, "E", c.E, "K", c.K, c.renormalize ? "renorm" : "",
                                c.sigmoid ? "sigmoid+bias" : "", "scaling", c.scaling);
  ExpectEqualIds("Route.ids", name, ids.Read(), want_ids);
  ExpectClose("Route.w", name, w.Read(), want_w, kTolF32);
}

// A token whose router logits are not all finite: experts 0..K-1 at weight 0 on both backends,
// the fault reported naming the layer; the other tokens route as usual.
TEST(RouteFaultParity, NonFiniteLogitsAreReportedNamingTheLayer) {
  std::mt19937 rng(91);
  const int64_t T = 40;
  const int E = 128, K = 8;
  std::vector<float> logits = Random(rng, T * E, -4.f, 4.f);
  logits[3 * E + 17] = std::nanf("");
  logits[20 * E + 5] = INFINITY;
  logits[31 * E + 127] = -INFINITY;
  std::vector<float> want_w(T * K);
  std::vector<int32_t> want_ids(T * K);
  kernels::RouteArgs a;
  a.num_tokens = T;
  a.num_experts = E;
  a.top_k = K;
  a.renormalize = true;
  a.layer = 11;
  a.logits = logits.data();
  a.weights = want_w.data();
  a.expert_ids = want_ids.data();
  Cpu().Route(a);
  const absl::Status cpu_fault = Cpu().TakeRoutingError();
  DeviceArray<float> dl(logits);
  DeviceArray<float> w = PoisonedOutput(want_w.size());
  DeviceArray<int32_t> ids(std::vector<int32_t>(want_ids.size(), -1));
  a.logits = dl.get();
  a.weights = w.get();
  a.expert_ids = ids.get();
  Gpu().Route(a);
  const absl::Status gpu_fault = Gpu().TakeRoutingError();
  for (const absl::Status& st : {cpu_fault, gpu_fault}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("layer 11"), std::string::npos) << st;
  }
  EXPECT_TRUE(Gpu().TakeRoutingError().ok()) << "reported once";
  ExpectEqualIds("Route.ids", "non-finite logits", ids.Read(), want_ids);
  ExpectClose("Route.w", "non-finite logits", w.Read(), want_w, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Cases, RouteParity,
                         ::testing::Values(RouteCase{1, 128, 8, true},  // Qwen3-30B-A3B
                                           RouteCase{7, 60, 4, false},  // Qwen2-MoE
                                           RouteCase{733, 128, 8, true},
                                           RouteCase{733, 64, 8, false},  // OLMoE
                                           RouteCase{5, 8, 2, true},      // Mixtral
                                           RouteCase{33, 256, 8, true},
                                           RouteCase{3, 512, 32, false}, RouteCase{2, 7, 7, true},
                                           RouteCase{1, 32, 4, true, true, 1.f},  // LFM2-8B-A1B
                                           RouteCase{733, 64, 4, true, true, 1.5f},
                                           RouteCase{7, 8, 2, false, true, 2.5f},
                                           RouteCase{33, 256, 8, true, true, 2.5f}));

// ---- ExpertFfn (accumulates into out: out starts random, identical on both sides) --------------
struct FfnCase {
  int64_t T, H, I;
  int pool, K;
  DType dtype;
};
class ExpertFfnParity : public ::testing::TestWithParam<FfnCase> {};

// offset > 0: every expert matrix of the GPU side moved to that many bytes past an aligned
// address (the kernels' unaligned paths).
void RunExpertFfn(const FfnCase& c, int32_t group, size_t offset = 0) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 977 + c.H * 3 + c.I + c.pool + group));
  // Route every token to K distinct experts, then group the rows by expert (ascending id).
  std::vector<std::vector<std::pair<int32_t, float>>> per_expert(c.pool);
  std::vector<int> order(c.pool);
  std::uniform_real_distribution<float> weight(0.05f, 1.f);
  for (int64_t t = 0; t < c.T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < c.K; ++k) per_expert[order[k]].push_back({static_cast<int32_t>(t), weight(rng)});
  }
  std::vector<int32_t> rows;
  std::vector<float> row_weights;
  std::vector<HostWeight> gate, up, down;
  std::vector<kernels::ExpertWeights> cpu_w, gpu_w;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (row_begin, row_count)
  const int64_t scale_I = c.I, scale_H = c.H;
  for (int e = 0; e < c.pool; ++e) {
    if (per_expert[e].empty() && e % 2 == 1) continue;  // keep some zero-row experts in the list
    spans.push_back({static_cast<int64_t>(rows.size()), static_cast<int64_t>(per_expert[e].size())});
    for (auto [t, w] : per_expert[e]) {
      rows.push_back(t);
      row_weights.push_back(w);
    }
    const float gs = 1.f / std::sqrt(static_cast<float>(scale_H));
    const float ds = 1.f / std::sqrt(static_cast<float>(scale_I));
    gate.push_back(MakeAnyWeight(Random(rng, c.I * c.H, -gs, gs), c.dtype, group, {c.I, c.H}));
    up.push_back(MakeAnyWeight(Random(rng, c.I * c.H, -gs, gs), c.dtype, group, {c.I, c.H}));
    down.push_back(MakeAnyWeight(Random(rng, c.H * c.I, -ds, ds), c.dtype, group, {c.H, c.I}));
  }
  std::vector<kernels::Buffer> moved;  // offset > 0: the moved copies
  auto at_offset = [&](const TensorView& v) {
    if (offset == 0) return v;
    absl::StatusOr<kernels::Buffer> buf = Gpu().Allocate(v.bytes() + 16);
    EXPECT_TRUE(buf.ok()) << buf.status();
    TensorView w = v;
    w.data = static_cast<uint8_t*>(buf->data()) + offset;
    Gpu().CopyOnDevice(const_cast<void*>(w.data), v.data, v.bytes());
    moved.push_back(std::move(buf).value());
    return w;
  };
  for (size_t i = 0; i < spans.size(); ++i) {
    cpu_w.push_back({gate[i].cpu, up[i].cpu, down[i].cpu});
    gpu_w.push_back(
        {at_offset(gate[i].gpu.view), at_offset(up[i].gpu.view), at_offset(down[i].gpu.view)});
  }
  std::vector<kernels::ExpertWork> cpu_work, gpu_work;
  for (size_t i = 0; i < spans.size(); ++i) {
    cpu_work.push_back({&cpu_w[i], spans[i].first, spans[i].second});
    gpu_work.push_back({&gpu_w[i], spans[i].first, spans[i].second});
  }
  const std::vector<float> x = Random(rng, c.T * c.H);
  std::vector<float> want = Random(rng, c.T * c.H);
  DeviceArray<float> out(want);
  kernels::ExpertFfnArgs a;
  a.num_tokens = c.T;
  a.hidden_size = c.H;
  a.out = want.data();
  a.x = x.data();
  a.experts = cpu_work;
  a.rows = rows.data();
  a.row_weights = row_weights.data();
  Cpu().ExpertFfn(a);
  DeviceArray<float> dx(x), dw(row_weights);
  DeviceArray<int32_t> drows(rows);
  a.out = out.get();
  a.x = dx.get();
  a.experts = gpu_work;
  a.rows = drows.get();
  a.row_weights = dw.get();
  Gpu().ExpertFfn(a);
  ExpectClose("ExpertFfn",
              Name("T", c.T, "H", c.H, "I", c.I, "E", c.pool, "K", c.K, DTypeName(c.dtype),
                   GroupTag(group), offset > 0 ? absl::StrCat("at byte offset ", offset) : ""),
              out.Read(), want, TolFor(c.dtype));
}

TEST_P(ExpertFfnParity, MatchesCpu) { RunExpertFfn(GetParam(), 0); }

INSTANTIATE_TEST_SUITE_P(
    Cases, ExpertFfnParity,
    ::testing::Values(FfnCase{1, 2048, 768, 128, 8, DType::kBF16},  // Qwen3-30B-A3B decode
                      FfnCase{7, 733, 257, 16, 4, DType::kF32},
                      FfnCase{8, 2048, 768, 128, 8, DType::kBF16},  // 8 sequences: 1-3 rows
                      FfnCase{4, 256, 64, 2, 2, DType::kBF16},  // 4 rows an expert
                      FfnCase{3, 64, 32, 8, 2, DType::kF16},
                      FfnCase{733, 256, 96, 32, 8, DType::kBF16},  // prefill: tensor-core GEMM
                      FfnCase{200, 512, 129, 4, 2, DType::kF32},
                      FfnCase{64, 512, 129, 8, 2, DType::kBF16},  // ~16 rows: matvec passes
                      FfnCase{1, 7, 1, 3, 1, DType::kBF16},
                      FfnCase{2, 2051, 64, 8, 2, DType::kF32}));  // odd H, K split over warps

// ---- ExpertFfnRouted: the routing read on the device (CUDA plans the groups on the GPU) vs the
// CPU, which copies the routing out and groups it on the host. `absent`: experts 0, 3, 6, ... are
// not resident (null pointers, the tiered store's decode path): both skip their rows. `in_host`:
// the odd experts are in pinned host memory (the store's host tier read in place), which CUDA
// copies into VRAM before its expert kernels. `skew`: experts drawn with weight 1 / (e + 1) and
// the last quarter never (experts with no rows and with many). More pairs than experts (T K > E)
// take CUDA's planned path: groups of 8 rows for the tensor-core matrix-vector kernel, or of 128
// for the tensor-core GEMM once an expert averages more than 32 pairs.
struct RoutedCase {
  int64_t T, H, I;
  int pool, K;
  DType dtype;
  int32_t group;
  bool absent = false;
  bool in_host = false;
  bool skew = false;
  bool bad_ids = false;  // pairs naming expert -1 or E: skipped and reported on both backends
};
class ExpertFfnRoutedParity : public ::testing::TestWithParam<RoutedCase> {};

TEST_P(ExpertFfnRoutedParity, MatchesCpu) {
  const RoutedCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.T * 31 + c.pool * 7 + c.K));
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int> order(c.pool);
  std::uniform_real_distribution<float> weight(0.05f, 1.f);
  std::uniform_real_distribution<double> unit(1e-12, 1.0);
  std::vector<double> key(c.pool);
  for (int64_t t = 0; t < c.T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    if (c.skew) {  // weighted sampling without replacement: the K largest u^(1 / w)
      for (int e = 0; e < c.pool; ++e) {
        key[e] = 4 * e < 3 * c.pool ? std::pow(unit(rng), e + 1.0) : -1.0;
      }
      std::sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
    } else {
      std::shuffle(order.begin(), order.end(), rng);
    }
    for (int k = 0; k < c.K; ++k) {
      ids.push_back(order[k]);
      weights.push_back(weight(rng));
    }
  }
  for (size_t i = 3; c.bad_ids && i < ids.size(); i += 7) ids[i] = i % 2 == 0 ? -1 : c.pool;
  std::vector<HostWeight> gate, up, down;
  std::vector<kernels::ExpertWeights> cpu_w, gpu_w;
  const float gs = 1.f / std::sqrt(static_cast<float>(c.H)), ds = 1.f / std::sqrt(static_cast<float>(c.I));
  for (int e = 0; e < c.pool; ++e) {
    gate.push_back(MakeAnyWeight(Random(rng, c.I * c.H, -gs, gs), c.dtype, c.group, {c.I, c.H}));
    up.push_back(MakeAnyWeight(Random(rng, c.I * c.H, -gs, gs), c.dtype, c.group, {c.I, c.H}));
    down.push_back(MakeAnyWeight(Random(rng, c.H * c.I, -ds, ds), c.dtype, c.group, {c.H, c.I}));
  }
  std::vector<const void*> cpu_ptrs(3 * c.pool), gpu_ptrs(3 * c.pool);
  for (int e = 0; e < c.pool; ++e) {
    cpu_w.push_back({gate[e].cpu, up[e].cpu, down[e].cpu});
    gpu_w.push_back({gate[e].gpu.view, up[e].gpu.view, down[e].gpu.view});
    for (int m = 0; m < 3; ++m) {
      const kernels::ExpertWeights& cw = cpu_w.back();
      const kernels::ExpertWeights& gw = gpu_w.back();
      cpu_ptrs[m * c.pool + e] = (m == 0 ? cw.gate : m == 1 ? cw.up : cw.down).data;
      gpu_ptrs[m * c.pool + e] = (m == 0 ? gw.gate : m == 1 ? gw.up : gw.down).data;
    }
  }
  for (int e = 0; c.absent && e < c.pool; e += 3) {
    cpu_w[e] = gpu_w[e] = kernels::ExpertWeights{};
    for (int m = 0; m < 3; ++m) cpu_ptrs[m * c.pool + e] = gpu_ptrs[m * c.pool + e] = nullptr;
  }
  std::vector<uint8_t> in_host(c.pool, 0);
  std::vector<kernels::Buffer> pinned;
  for (int e = 1; c.in_host && e < c.pool; e += 2) {
    in_host[e] = 1;  // also where absent: CUDA must still skip those (null pointers)
    if (cpu_w[e].gate.data == nullptr) continue;
    kernels::TensorView* views[3] = {&gpu_w[e].gate, &gpu_w[e].up, &gpu_w[e].down};
    const kernels::TensorView* from[3] = {&cpu_w[e].gate, &cpu_w[e].up, &cpu_w[e].down};
    for (int m = 0; m < 3; ++m) {
      auto buffer = Gpu().AllocateHost(from[m]->bytes());
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      std::memcpy(buffer->data(), from[m]->data, from[m]->bytes());
      views[m]->data = buffer->data();
      gpu_ptrs[m * c.pool + e] = buffer->data();
      pinned.push_back(std::move(*buffer));
    }
  }
  DeviceArray<const void*> dptrs(gpu_ptrs);
  DeviceArray<uint8_t> dhost(in_host);
  const kernels::ResidentExperts cpu_table{cpu_w.data(), cpu_ptrs.data(), cpu_ptrs.data() + c.pool,
                                           cpu_ptrs.data() + 2 * c.pool, c.pool};
  const kernels::ResidentExperts gpu_table{gpu_w.data(), dptrs.get(), dptrs.get() + c.pool,
                                           dptrs.get() + 2 * c.pool, c.pool,
                                           c.in_host ? dhost.get() : nullptr};
  const std::vector<float> x = Random(rng, c.T * c.H);
  // One row past the output: a canary that neither backend may write.
  std::vector<float> want = Random(rng, (c.T + 1) * c.H);
  const std::vector<float> canary(want.end() - c.H, want.end());
  DeviceArray<float> out(want), dx(x), dweights(weights);
  DeviceArray<int32_t> dids(ids);
  kernels::ExpertFfnRoutedArgs a;
  a.num_tokens = c.T;
  a.hidden_size = c.H;
  a.top_k = c.K;
  a.out = want.data();
  a.x = x.data();
  a.experts = &cpu_table;
  a.expert_ids = ids.data();
  a.weights = weights.data();
  a.layer = 5;
  Cpu().ExpertFfnRouted(a);
  const absl::Status cpu_fault = Cpu().TakeRoutingError();
  a.out = out.get();
  a.x = dx.get();
  a.experts = &gpu_table;
  a.expert_ids = dids.get();
  a.weights = dweights.get();
  Gpu().ExpertFfnRouted(a);
  const absl::Status gpu_fault = Gpu().TakeRoutingError();
  EXPECT_EQ(cpu_fault.ok(), !c.bad_ids) << cpu_fault;
  EXPECT_EQ(gpu_fault.ok(), !c.bad_ids) << gpu_fault;
  if (c.bad_ids) {
    EXPECT_NE(cpu_fault.message().find("layer 5"), std::string::npos) << cpu_fault;
    EXPECT_NE(gpu_fault.message().find("layer 5"), std::string::npos) << gpu_fault;
  }
  const std::vector<float> got = out.Read();
  EXPECT_EQ(std::vector<float>(got.end() - c.H, got.end()), canary) << "written out of bounds";
  ExpectClose("ExpertFfnRouted",
              Name("T", c.T, "H", c.H, "I", c.I, "E", c.pool, "K", c.K, DTypeName(c.dtype),
                   GroupTag(c.group), c.absent ? "some absent" : "",
                   c.in_host ? "odd in host" : "", c.skew ? "skewed" : "",
                   c.bad_ids ? "bad ids" : ""),
              got, want, TolFor(c.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExpertFfnRoutedParity,
    ::testing::Values(RoutedCase{1, 2048, 768, 32, 8, DType::kQ4, 64},   // Qwen3-30B-A3B decode shape
                      RoutedCase{4, 2048, 768, 32, 8, DType::kQ4, 128},  // shared experts
                      RoutedCase{3, 256, 96, 8, 2, DType::kBF16, 0},
                      RoutedCase{2, 64, 32, 4, 4, DType::kF32, 0},      // every expert
                      RoutedCase{1, 2048, 768, 32, 8, DType::kQ4, 64, true},
                      RoutedCase{4, 256, 96, 8, 4, DType::kBF16, 0, true},
                      RoutedCase{1, 2048, 768, 32, 8, DType::kQ4, 64, false, true},
                      RoutedCase{5, 255, 97, 8, 4, DType::kBF16, 0, true, true},  // odd sizes
                      RoutedCase{6, 64, 32, 4, 4, DType::kF32, 0, false, true},  // repeats
                      // planned on the GPU (T K > E): a decode batch of 256 at the Qwen3-30B-A3B
                      // shape, skewed batches, odd expert counts, absent and host-tier experts
                      RoutedCase{256, 2048, 768, 128, 8, DType::kQ4, 64},
                      RoutedCase{64, 2048, 768, 128, 8, DType::kQ4, 32, false, false, true},
                      RoutedCase{96, 512, 256, 17, 4, DType::kQ4, 128, true, true, true},
                      RoutedCase{40, 256, 96, 9, 3, DType::kQ8, 64, false, false, true},
                      RoutedCase{33, 255, 97, 7, 4, DType::kBF16, 0, true, true},
                      RoutedCase{40, 64, 32, 4, 2, DType::kF32, 0, true, true, true},
                      // prefill chunks: experts averaging > 32 pairs take the GEMM's groups
                      RoutedCase{1024, 2048, 768, 64, 8, DType::kQ4, 64, false, false, true},
                      RoutedCase{600, 512, 256, 17, 4, DType::kQ4, 128, true, true, true},
                      RoutedCase{300, 255, 97, 9, 3, DType::kBF16, 0, false, true, true},
                      // ids outside [0, E): per pair, planned in groups of 8 and of 128
                      RoutedCase{3, 256, 96, 8, 2, DType::kBF16, 0, false, true, false, true},
                      RoutedCase{64, 512, 256, 16, 4, DType::kQ4, 64, true, false, false, true},
                      RoutedCase{600, 512, 256, 9, 4, DType::kQ4, 64, false, true, true, true}));

// ---- Quantized weights (kQ8/kQ4/kQ2/kF8, kernels/quant.h): MatMul and ExpertFfn -----------------
// Realistic Qwen3-30B-A3B expert shapes (2048x768, 768x2048) for every format and group size 64
// and 128 (int2 also 32, where a 16-byte load spans two groups), odd sizes (7, 733: the scalar
// path), K split over 4 warps, several rows per expert, and the tiled prefill kernel. int4 with
// K a multiple of 64, groups of 64 or more and up to 8 rows takes the tensor-core kernel: a last
// m-tile of fewer than 16 rows, 5 and 8 rows, groups of 256, K split over warps.
struct QuantMatMulCase {
  MatMulCase mm;
  int32_t group;
};
class QuantMatMulParity : public ::testing::TestWithParam<QuantMatMulCase> {};
TEST_P(QuantMatMulParity, MatchesCpu) { RunMatMul(GetParam().mm, GetParam().group); }

INSTANTIATE_TEST_SUITE_P(
    Cases, QuantMatMulParity,
    ::testing::Values(QuantMatMulCase{{256, 128, 2048, DType::kQ4, true}, 64},    // K split 8
                      QuantMatMulCase{{100, 512, 2048, DType::kQ8, false}, 128},  // K split 8
                      QuantMatMulCase{{1, 2048, 768, DType::kQ4, false}, 64},     // expert down
                      QuantMatMulCase{{1, 2048, 768, DType::kQ4, false}, 128},
                      QuantMatMulCase{{1, 768, 2048, DType::kQ4, false}, 64},  // expert gate/up
                      QuantMatMulCase{{1, 768, 2048, DType::kQ4, false}, 128},
                      QuantMatMulCase{{1, 2048, 768, DType::kQ8, false}, 64},
                      QuantMatMulCase{{1, 768, 2048, DType::kQ8, false}, 128},
                      QuantMatMulCase{{1, 2048, 768, DType::kQ2, false}, 64},
                      QuantMatMulCase{{1, 768, 2048, DType::kQ2, false}, 128},
                      QuantMatMulCase{{1, 768, 2048, DType::kQ2, false}, 32},  // 2 groups a load
                      QuantMatMulCase{{1, 8192, 2048, DType::kQ4, false}, 64},
                      QuantMatMulCase{{1, 512, 2048, DType::kQ4, true}, 64},  // K split, 4 warps
                      QuantMatMulCase{{1, 733, 7, DType::kQ4, false}, 32},    // odd: scalar path
                      QuantMatMulCase{{1, 7, 733, DType::kQ8, true}, 64},
                      QuantMatMulCase{{1, 733, 733, DType::kQ2, false}, 128},
                      QuantMatMulCase{{3, 733, 4099, DType::kQ4, false}, 64},  // odd K, split
                      QuantMatMulCase{{5, 100, 4096, DType::kQ2, true}, 32},   // split, 5 rows
                      QuantMatMulCase{{8, 64, 2048, DType::kQ8, false}, 64},
                      QuantMatMulCase{{2, 2048, 768, DType::kQ4, false}, 128},
                      QuantMatMulCase{{9, 733, 129, DType::kQ4, false}, 64},    // two passes of 8
                      QuantMatMulCase{{12, 768, 2048, DType::kQ4, false}, 64},  // two n-tiles
                      // K sliced over clusters: a short last slice; two n-tiles, 8 slices
                      QuantMatMulCase{{6, 200, 4288, DType::kQ4, true}, 64},
                      QuantMatMulCase{{16, 300, 4096, DType::kQ4, false}, 128},
                      QuantMatMulCase{{16, 2048, 768, DType::kQ4, false}, 128},
                      QuantMatMulCase{{13, 733, 2048, DType::kQ4, true}, 64},    // partial tiles
                      QuantMatMulCase{{100, 300, 2048, DType::kQ4, false}, 32},  // GEMM, k-tile 32
                      QuantMatMulCase{{33, 257, 67, DType::kQ2, true}, 32},
                      QuantMatMulCase{{64, 768, 2048, DType::kQ4, false}, 64},  // last matvec size
                      QuantMatMulCase{{65, 733, 129, DType::kQ4, false}, 64},   // first tiled size
                      QuantMatMulCase{{130, 300, 2048, DType::kQ8, false}, 128},
                      QuantMatMulCase{{512, 2048, 768, DType::kQ4, false}, 64},  // prefill
                      QuantMatMulCase{{100, 200, 96, DType::kQ4, false}, 64},    // group past K
                      QuantMatMulCase{{257, 130, 2048, DType::kQ2, true}, 32},
                      QuantMatMulCase{{65, 1000, 256, DType::kQ8, false}, 256},
                      QuantMatMulCase{{1, 733, 2048, DType::kQ4, false}, 64},  // tensor cores
                      QuantMatMulCase{{5, 1000, 1024, DType::kQ4, true}, 128},
                      QuantMatMulCase{{8, 2048, 768, DType::kQ4, false}, 256},
                      QuantMatMulCase{{2, 40, 8192, DType::kQ4, false}, 64},
                      QuantMatMulCase{{2, 100003, 2048, DType::kQ4, false}, 64},  // vocab-like
                      // fp8 e4m3 (kF8): the int8 matrix-vector kernel's fp8 form (vector and
                      // scalar paths, K split), the tensor-core GEMM's F8Weights, the tiled GEMM;
                      // K not a multiple of 128 (a partial last group), odd N.
                      QuantMatMulCase{{1, 2048, 768, DType::kF8, false}, 128},
                      QuantMatMulCase{{1, 768, 2048, DType::kF8, false}, 128},  // K split
                      QuantMatMulCase{{3, 733, 300, DType::kF8, true}, 128},    // scalar path
                      QuantMatMulCase{{5, 200, 160, DType::kF8, false}, 128},
                      QuantMatMulCase{{8, 64, 2048, DType::kF8, false}, 64},
                      QuantMatMulCase{{100, 300, 2048, DType::kF8, false}, 128},  // GEMM, k-tile 64
                      QuantMatMulCase{{130, 257, 160, DType::kF8, true}, 128},    // GEMM, k-tile 32
                      QuantMatMulCase{{65, 733, 300, DType::kF8, false}, 128},    // tiled SIMT
                      QuantMatMulCase{{512, 2048, 768, DType::kF8, false}, 128}));  // prefill

// Weights at an address that is not 8-byte aligned (a view into a larger buffer): the int4
// tensor-core kernels (matrix-vector, GEMM) read codes and scales byte by byte there, the SIMT
// kernel (int8 matrix-vector) element by element.
TEST(QuantMatMulUnaligned, MatchesCpu) {
  const int64_t N = 733, K = 2048;
  for (const DType dtype : {DType::kQ4, DType::kQ8, DType::kF8}) {
    for (const int64_t T : {1, 3, 100}) {  // 100: the tensor-core GEMM
      for (const size_t offset : {1, 4}) {
        std::mt19937 rng(static_cast<uint32_t>(T * 31 + offset));
        const std::vector<float> x = Random(rng, T * K);
        const HostWeight w = MakeAnyWeight(Random(rng, N * K), dtype, 64, {N, K});
        std::vector<float> want(T * N);
        Cpu().MatMul(want.data(), x.data(), T, w.cpu, nullptr);
        const size_t bytes = w.gpu.view.bytes();
        absl::StatusOr<kernels::Buffer> buf = Gpu().Allocate(bytes + 8);
        ASSERT_TRUE(buf.ok()) << buf.status();
        Gpu().CopyOnDevice(static_cast<uint8_t*>(buf->data()) + offset, w.gpu.view.data, bytes);
        TensorView moved = w.gpu.view;
        moved.data = static_cast<const uint8_t*>(buf->data()) + offset;
        DeviceArray<float> dx(x);
        DeviceArray<float> out = PoisonedOutput(want.size());
        Gpu().MatMul(out.get(), dx.get(), T, moved, nullptr);
        ExpectClose("MatMul",
                    Name("T", T, "N", N, "K", K, DTypeName(dtype), "g64 at byte offset", offset),
                    out.Read(), want, TolFor(dtype));
      }
    }
  }
}

// Codes near the format's offset: int8 codes q - z + 16 with m = -16 s, as asymmetric int4
// checkpoints load (expertstore/published_quant.cc), and int4 codes near 8 with m = -8 s, as
// symmetric GPTQ. Each output is then small against s sum |x q|, so whatever precision a kernel
// cancels away shows. Both backends against a double-precision sum of the same weights, bound
// 2e-5 (the CPU's own fp32 error here: up to 1.2e-5). The matrix-vector kernels that multiplied x
// by 1 + q / 256 (int8, SIMT) or 128 + q (int4, tensor cores) and took the offset off after the
// sum were 2.6-4e-5 and 4-7e-5 from it (their arithmetic emulated on these inputs; NOTES.md,
// "Exact codes"). The int4 SIMT kernel (17-64 rows, or groups of 32) keeps 1 + q / 16 and is
// not held to this bound.
TEST(QuantMatMulExactCodes, MatchesDoubleSum) {
  constexpr int64_t N = 256, K = 2048;
  struct Case {
    DType dtype;
    int32_t group;
    int64_t T;
  };
  for (const Case c :
       {Case{DType::kQ8, 64, 1}, Case{DType::kQ8, 128, 1}, Case{DType::kQ8, 128, 12},
        Case{DType::kQ8, 64, 24}, Case{DType::kQ8, 128, 64}, Case{DType::kQ4, 128, 1},
        Case{DType::kQ4, 64, 5}, Case{DType::kQ4, 128, 12}}) {
    std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.group));
    const std::vector<float> x = Random(rng, c.T * K);
    const int bits = kernels::QuantBits(c.dtype), offset = c.dtype == DType::kQ8 ? 16 : 8;
    const int64_t groups = kernels::QuantGroups(K, c.group);
    const int64_t row_bytes = kernels::QuantRowBytes(c.dtype, K);
    std::vector<uint8_t> bytes(kernels::QuantizedBytes(c.dtype, N, K, c.group), 0);
    auto* params =
        reinterpret_cast<uint16_t*>(bytes.data() + kernels::QuantParamsOffset(c.dtype, N, K));
    std::vector<double> w(N * K);  // the dequantized weights, exact
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = std::ldexp(static_cast<float>(64 + rng() % 64), -14);  // exact in fp16
        params[(n * groups + g) * 2] = kernels::F32ToF16(scale);
        params[(n * groups + g) * 2 + 1] = kernels::F32ToF16(-offset * scale);
        for (int64_t k = g * c.group; k < (g + 1) * c.group; ++k) {
          const int code = offset + static_cast<int>(rng() % 5) - 2;
          bytes[n * row_bytes + k * bits / 8] |= static_cast<uint8_t>(code << (k * bits % 8));
          w[n * K + k] = static_cast<double>(code - offset) * scale;
        }
      }
    }
    TensorView view = kernels::View(bytes.data(), c.dtype, {N, K});
    view.group_size = c.group;
    auto up = Gpu().Upload(view);
    ASSERT_TRUE(up.ok()) << up.status();
    std::vector<float> exact(c.T * N), cpu(c.T * N);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += static_cast<double>(x[t * K + k]) * w[n * K + k];
        exact[t * N + n] = static_cast<float>(sum);
      }
    }
    Cpu().MatMul(cpu.data(), x.data(), c.T, view, nullptr);
    DeviceArray<float> dx(x);
    DeviceArray<float> out = PoisonedOutput(exact.size());
    Gpu().MatMul(out.get(), dx.get(), c.T, up->view, nullptr);
    const std::string name =
        Name("T", c.T, "N", N, "K", K, DTypeName(c.dtype), GroupTag(c.group), "codes near", offset);
    ExpectClose("MatMul", name, out.Read(), exact, 2e-5);
    ExpectClose("MatMul", name + " CPU", cpu, exact, 2e-5);
  }
}

struct QuantFfnCase {
  FfnCase ffn;
  int32_t group;
  size_t offset = 0;  // the GPU's expert matrices at this many bytes past an aligned address
};
class QuantExpertFfnParity : public ::testing::TestWithParam<QuantFfnCase> {};
TEST_P(QuantExpertFfnParity, MatchesCpu) {
  RunExpertFfn(GetParam().ffn, GetParam().group, GetParam().offset);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, QuantExpertFfnParity,
    ::testing::Values(QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ4}, 64},  // Qwen3-30B-A3B
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ4}, 128},
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ8}, 64},
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ8}, 128},
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ2}, 64},
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kQ2}, 32},
                      QuantFfnCase{{4, 2048, 768, 16, 8, DType::kQ4}, 64},  // several rows/expert
                      QuantFfnCase{{7, 733, 257, 16, 4, DType::kQ4}, 32},   // odd: scalar path
                      QuantFfnCase{{3, 64, 32, 8, 2, DType::kQ8}, 32},
                      QuantFfnCase{{1, 7, 1, 3, 1, DType::kQ2}, 32},
                      QuantFfnCase{{64, 2048, 768, 16, 8, DType::kQ4}, 128},  // ~32 rows: passes
                      QuantFfnCase{{512, 2048, 768, 16, 8, DType::kQ4}, 64},  // prefill: GEMM
                      // the int4 GEMM on A split once: partial m- and n-tiles, then experts at
                      // odd addresses (codes and scales read by plain loads)
                      QuantFfnCase{{300, 512, 192, 5, 2, DType::kQ4}, 64},
                      QuantFfnCase{{300, 512, 192, 5, 2, DType::kQ4}, 64, 4},
                      QuantFfnCase{{200, 256, 128, 4, 2, DType::kQ4}, 128, 1},
                      QuantFfnCase{{733, 256, 96, 32, 8, DType::kQ2}, 64},
                      QuantFfnCase{{200, 512, 129, 4, 2, DType::kQ8}, 128},
                      QuantFfnCase{{8, 2048, 768, 64, 8, DType::kQ4}, 128},  // tensor cores
                      // 9-16 rows an expert (every token to every expert): the two-n-tile
                      // kernel (the cp.async ring), K split over warps at 4 experts, not at 32;
                      // g32 takes the SIMT kernel; at byte offset 4 the ring kernel's byte loads
                      QuantFfnCase{{9, 2048, 768, 4, 4, DType::kQ4}, 64},
                      QuantFfnCase{{13, 2048, 768, 4, 4, DType::kQ4}, 128},
                      QuantFfnCase{{16, 2048, 768, 4, 4, DType::kQ4}, 32},
                      QuantFfnCase{{16, 2048, 768, 32, 32, DType::kQ4}, 128},
                      QuantFfnCase{{13, 1024, 320, 8, 8, DType::kQ4}, 64},
                      QuantFfnCase{{16, 512, 192, 4, 4, DType::kQ4}, 64, 4},
                      QuantFfnCase{{3, 1024, 320, 8, 4, DType::kQ4}, 64},
                      QuantFfnCase{{1, 2048, 768, 128, 8, DType::kF8}, 128},  // fp8 (kF8)
                      QuantFfnCase{{4, 2048, 768, 16, 8, DType::kF8}, 128},
                      QuantFfnCase{{7, 733, 257, 16, 4, DType::kF8}, 128},   // odd: scalar path
                      QuantFfnCase{{200, 512, 160, 4, 2, DType::kF8}, 128},  // GEMM, partial group
                      QuantFfnCase{{512, 2048, 768, 16, 8, DType::kF8}, 128}));  // prefill

// ---- Embed, Add, Sigmoid -----------------------------------------------------------------------
struct EmbedCase {
  int64_t V, H, T;
  DType dtype;
};
class EmbedParity : public ::testing::TestWithParam<EmbedCase> {};

TEST_P(EmbedParity, MatchesCpu) {
  const EmbedCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.V + c.H * 7 + c.T * 3));
  const HostWeight table = MakeWeight(Random(rng, c.V * c.H), c.dtype, {c.V, c.H});
  std::vector<int32_t> ids(c.T);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.V - 1));
  for (int32_t& i : ids) i = id(rng);
  std::vector<float> want(c.T * c.H);
  Cpu().Embed(want.data(), table.cpu, ids.data(), c.T);
  DeviceArray<float> out = PoisonedOutput(want.size());
  Gpu().Embed(out.get(), table.gpu.view, ids.data(), c.T);
  ExpectClose("Embed", Name("V", c.V, "H", c.H, "T", c.T, DTypeName(c.dtype)), out.Read(), want,
              0.0);
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbedParity,
                         ::testing::Values(EmbedCase{1000, 2048, 1, DType::kBF16},
                                           EmbedCase{1000, 7, 733, DType::kF32},
                                           EmbedCase{50, 733, 7, DType::kF16}));

class ElementwiseParity : public ::testing::TestWithParam<int64_t> {};

TEST_P(ElementwiseParity, AddAndSigmoidMatchCpu) {
  const int64_t n = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<float> out = Random(rng, n, -10.f, 10.f);
  const std::vector<float> x = Random(rng, n, -10.f, 10.f);
  DeviceArray<float> dout(out), dx(x);
  Cpu().Add(out.data(), x.data(), n);
  Gpu().Add(dout.get(), dx.get(), n);
  ExpectClose("Add", Name("n", n), dout.Read(), out, 0.0);
  Cpu().Sigmoid(out.data(), n);
  Gpu().Sigmoid(dout.get(), n);
  ExpectClose("Sigmoid", Name("n", n), dout.Read(), out, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, ElementwiseParity,
                         ::testing::Values(int64_t{1}, int64_t{7}, int64_t{733},
                                           int64_t{1} << 20));

// SplitColumns: rows of [q | k | v] (the stacked projection at T > 1) into poisoned parts.
struct SplitColumnsCase {
  int64_t rows;
  std::vector<int64_t> widths;
};
class SplitColumnsParity : public ::testing::TestWithParam<SplitColumnsCase> {};

TEST_P(SplitColumnsParity, MatchesCpu) {
  const SplitColumnsCase c = GetParam();
  int64_t cols = 0;
  for (const int64_t w : c.widths) cols += w;
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 31 + cols));
  const std::vector<float> src = Random(rng, c.rows * cols);
  DeviceArray<float> dsrc(src);
  std::vector<std::vector<float>> want;
  std::vector<DeviceArray<float>> got;
  std::vector<float*> cpu_parts, gpu_parts;
  for (const int64_t w : c.widths) {
    want.emplace_back(c.rows * w, -1.f);
    got.push_back(PoisonedOutput(c.rows * w));
  }
  for (size_t i = 0; i < c.widths.size(); ++i) {
    cpu_parts.push_back(want[i].data());
    gpu_parts.push_back(got[i].get());
  }
  Cpu().SplitColumns(src.data(), c.rows, cpu_parts, c.widths);
  Gpu().SplitColumns(dsrc.get(), c.rows, gpu_parts, c.widths);
  for (size_t i = 0; i < c.widths.size(); ++i) {
    ExpectClose("SplitColumns", Name("rows", c.rows, "part", static_cast<int64_t>(i)),
                got[i].Read(), want[i], 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SplitColumnsParity,
                         ::testing::Values(SplitColumnsCase{1, {7, 3, 5}},
                                           SplitColumnsCase{33, {4096, 512, 512}},
                                           SplitColumnsCase{256, {1, 2}},
                                           SplitColumnsCase{5, {128, 64, 64, 9}},
                                           SplitColumnsCase{70000, {4, 8}}));

// ---- GatedDeltaNet: MulSigmoid, GatedRmsNorm, CausalConv, GatedDeltaRule ----------------------
// Several sequences per call with their own non-zero states; the states after the call are
// compared as well as the outputs.
class MulSigmoidParity : public ::testing::TestWithParam<int64_t> {};

TEST_P(MulSigmoidParity, MatchesCpu) {
  const int64_t n = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 5 + 1));
  std::vector<float> x = Random(rng, n, -10.f, 10.f);
  const std::vector<float> gate = Random(rng, n, -10.f, 10.f);
  DeviceArray<float> dx(x), dgate(gate);
  Cpu().MulSigmoid(x.data(), gate.data(), n);
  Gpu().MulSigmoid(dx.get(), dgate.get(), n);
  ExpectClose("MulSigmoid", Name("n", n), dx.Read(), x, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, MulSigmoidParity,
                         ::testing::Values(int64_t{1}, int64_t{733}, int64_t{1} << 20));

// out = a * b (LFM2's short-conv gates), into a poisoned output and in place (out == b).
class MulParity : public ::testing::TestWithParam<int64_t> {};

TEST_P(MulParity, MatchesCpu) {
  const int64_t n = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 3 + 2));
  const std::vector<float> a = Random(rng, n, -10.f, 10.f);
  const std::vector<float> b = Random(rng, n, -10.f, 10.f);
  std::vector<float> want(n);
  Cpu().Mul(want.data(), a.data(), b.data(), n);
  DeviceArray<float> da(a), db(b);
  DeviceArray<float> out = PoisonedOutput(n);
  Gpu().Mul(out.get(), da.get(), db.get(), n);
  ExpectClose("Mul", Name("n", n), out.Read(), want, 0.0);
  Gpu().Mul(db.get(), da.get(), db.get(), n);
  ExpectClose("Mul", Name("n", n, "in place"), db.Read(), want, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Cases, MulParity,
                         ::testing::Values(int64_t{1}, int64_t{733}, int64_t{1} << 20));

// out = RmsNorm(x) * weight * silu(z), into a poisoned output and in place (out == x).
class GatedRmsNormParity : public ::testing::TestWithParam<NormCase> {};

TEST_P(GatedRmsNormParity, MatchesCpu) {
  const NormCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 17 + c.H));
  const std::vector<float> x = Random(rng, c.rows * c.H, -3.f, 3.f);
  const std::vector<float> z = Random(rng, c.rows * c.H, -4.f, 4.f);
  const HostWeight w = MakeWeight(Random(rng, c.H, 0.5f, 1.5f), c.dtype, {c.H});
  const float eps = 1e-6f;
  std::vector<float> want(x.size());
  Cpu().GatedRmsNorm(want.data(), x.data(), z.data(), c.rows, w.cpu, eps);
  DeviceArray<float> dx(x), dz(z);
  DeviceArray<float> out = PoisonedOutput(want.size());
  Gpu().GatedRmsNorm(out.get(), dx.get(), dz.get(), c.rows, w.gpu.view, eps);
  const std::string name = Name("rows", c.rows, "n", c.H, DTypeName(c.dtype));
  ExpectClose("GatedRmsNorm", name, out.Read(), want, kTolF32);
  Gpu().GatedRmsNorm(dx.get(), dx.get(), dz.get(), c.rows, w.gpu.view, eps);
  ExpectClose("GatedRmsNorm", name + " in place", dx.Read(), want, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Cases, GatedRmsNormParity,
                         ::testing::Values(NormCase{1, 128, DType::kBF16},
                                           NormCase{7 * 6, 12, DType::kF32},
                                           NormCase{333, 128, DType::kF16},
                                           NormCase{5, 733, DType::kF32}));

// The sequences of one call: states for both backends (host for the CPU, one device array for
// the GPU, `per_seq` floats a sequence, random and non-zero as after earlier steps).
struct LinearSeqs {
  std::vector<float> cpu_state;
  DeviceArray<float> gpu_state;
  std::vector<kernels::LinearAttnSeq> cpu, gpu;
  int64_t T = 0;

  LinearSeqs(const std::vector<int64_t>& tokens, int64_t per_seq, std::mt19937& rng, bool conv)
      : cpu_state(Random(rng, tokens.size() * per_seq, -0.5f, 0.5f)), gpu_state(cpu_state) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      kernels::LinearAttnSeq c{tokens[i], nullptr, nullptr}, g = c;
      float* cs = cpu_state.data() + i * per_seq;
      float* gs = gpu_state.get() + i * per_seq;
      (conv ? c.conv_state : c.state) = cs;
      (conv ? g.conv_state : g.state) = gs;
      cpu.push_back(c);
      gpu.push_back(g);
      T += tokens[i];
    }
  }
};

std::string TokensName(const std::vector<int64_t>& tokens) {
  std::ostringstream s;
  s << "tokens";
  for (size_t i = 0; i < tokens.size(); ++i) s << (i == 0 ? " " : ",") << tokens[i];
  return s.str();
}

struct ConvCase {
  std::vector<int64_t> tokens;
  int64_t C;
  int KW;
  DType dtype;
  bool silu = true;   // false: LFM2's short conv
  bool bias = false;  // a [C] bias of `dtype` (LFM2 with conv_bias)
};
class CausalConvParity : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CausalConvParity, MatchesCpuWithState) {
  const ConvCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.C * 7 + c.KW + c.tokens.size()));
  LinearSeqs seqs(c.tokens, c.C * (c.KW - 1), rng, /*conv=*/true);
  const std::vector<float> x = Random(rng, seqs.T * c.C, -2.f, 2.f);
  const HostWeight w = MakeWeight(Random(rng, c.C * c.KW), c.dtype, {c.C, 1, c.KW});
  std::vector<float> want(x.size());
  kernels::CausalConvArgs a;
  a.out = want.data();
  a.x = x.data();
  a.weight = w.cpu;
  a.channels = c.C;
  a.kernel_size = c.KW;
  a.seqs = seqs.cpu;
  a.silu = c.silu;
  const HostWeight bias = MakeWeight(Random(rng, c.C), c.dtype, {c.C});
  if (c.bias) a.bias = bias.cpu;
  Cpu().CausalConv(a);
  DeviceArray<float> dx(x);
  DeviceArray<float> out = PoisonedOutput(want.size());
  a.out = out.get();
  a.x = dx.get();
  a.weight = w.gpu.view;
  if (c.bias) a.bias = bias.gpu.view;
  a.seqs = seqs.gpu;
  Gpu().CausalConv(a);
  const std::string name = Name(TokensName(c.tokens), "C", c.C, "KW", c.KW, DTypeName(c.dtype),
                                c.silu ? "silu" : "no activation", c.bias ? "bias" : "");
  ExpectClose("CausalConv", name, out.Read(), want, kTolF32);
  // The state is the last KW-1 raw inputs: copied, so exact.
  ExpectClose("CausalConv state", name, seqs.gpu_state.Read(), seqs.cpu_state, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CausalConvParity,
    ::testing::Values(ConvCase{{1, 7, 64, 70, 130}, 333, 4, DType::kBF16},
                      ConvCase{{130, 1, 70, 7, 1, 64}, 37, 3, DType::kF32},
                      ConvCase{{1, 1, 1}, 8193, 4, DType::kF16},  // decode
                      ConvCase{{2, 5}, 3, 8, DType::kF32},        // fewer tokens than the window
                      ConvCase{{3}, 5, 2, DType::kF32},
                      // LFM2's short conv: no activation, with and without a bias
                      ConvCase{{1, 7, 64, 70, 130}, 333, 3, DType::kBF16, false, true},
                      ConvCase{{24, 1, 1}, 2048, 3, DType::kF32, false, false},
                      ConvCase{{2, 5}, 37, 4, DType::kF16, true, true}));

struct DeltaCase {
  std::vector<int64_t> tokens;
  int NK, NV, DK, DV;
  DType dtype;  // of a_log and dt_bias
  // a_log's range: g = -exp(a_log) softplus(a + dt_bias) is about -exp(a_log) at most, so
  // [2, 3] decays S to nothing within a few tokens (exp(cumsum g) underflows inside a chunk)
  // and [-9, -8] barely at all.
  float a_log_lo = -2.f, a_log_hi = 0.f;
};
class GatedDeltaRuleParity : public ::testing::TestWithParam<DeltaCase> {};

TEST_P(GatedDeltaRuleParity, MatchesCpuWithState) {
  const DeltaCase c = GetParam();
  std::mt19937 rng(
      static_cast<uint32_t>(c.NK * 1000 + c.NV * 100 + c.DK + c.DV * 7 + c.tokens.size()));
  LinearSeqs seqs(c.tokens, int64_t{c.NV} * c.DK * c.DV, rng, /*conv=*/false);
  const int64_t C = 2 * int64_t{c.NK} * c.DK + int64_t{c.NV} * c.DV;
  const std::vector<float> qkv = Random(rng, seqs.T * C, -1.f, 1.f);
  const std::vector<float> b = Random(rng, seqs.T * c.NV, -3.f, 3.f);
  // By default g = -exp(a_log) softplus(a + dt_bias) in about [-1, 0): the decays of real
  // checkpoints, and no underflow of exp(cumsum g) over a chunk of 64.
  const std::vector<float> av = Random(rng, seqs.T * c.NV, -3.f, 0.f);
  const HostWeight a_log = MakeWeight(Random(rng, c.NV, c.a_log_lo, c.a_log_hi), c.dtype, {c.NV});
  const HostWeight dt_bias = MakeWeight(Random(rng, c.NV, -1.f, 0.5f), c.dtype, {c.NV});
  std::vector<float> want(seqs.T * c.NV * c.DV);
  kernels::GatedDeltaRuleArgs a;
  a.out = want.data();
  a.qkv = qkv.data();
  a.b = b.data();
  a.a = av.data();
  a.a_log = a_log.cpu;
  a.dt_bias = dt_bias.cpu;
  a.num_k_heads = c.NK;
  a.num_v_heads = c.NV;
  a.k_head_dim = c.DK;
  a.v_head_dim = c.DV;
  a.seqs = seqs.cpu;
  Cpu().GatedDeltaRule(a);
  DeviceArray<float> dqkv(qkv), db(b), da(av);
  DeviceArray<float> out = PoisonedOutput(want.size());
  a.out = out.get();
  a.qkv = dqkv.get();
  a.b = db.get();
  a.a = da.get();
  a.a_log = a_log.gpu.view;
  a.dt_bias = dt_bias.gpu.view;
  a.seqs = seqs.gpu;
  Gpu().GatedDeltaRule(a);
  const std::string name = Name(TokensName(c.tokens), "NK", c.NK, "NV", c.NV, "DK", c.DK, "DV",
                                c.DV, DTypeName(c.dtype), "a_log", c.a_log_lo);
  // Both run the recurrent step for one-token sequences and the chunked form for longer ones;
  // the GPU forms V' as (I + A)^-1 (beta (v - exp(gamma) k S)) rather than U - W S and splits
  // its sums differently: the same function, different fp32 rounding.
  ExpectClose("GatedDeltaRule", name, out.Read(), want, kTolF32);
  ExpectClose("GatedDeltaRule state", name, seqs.gpu_state.Read(), seqs.cpu_state, kTolF32);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GatedDeltaRuleParity,
    ::testing::Values(DeltaCase{{1, 7, 64, 70, 130}, 3, 6, 20, 12, DType::kF32},
                      DeltaCase{{130, 1, 7, 1}, 3, 6, 20, 12, DType::kBF16},
                      DeltaCase{{1, 1, 1, 1, 1}, 16, 32, 128, 128, DType::kBF16},  // decode
                      DeltaCase{{70, 1}, 4, 8, 128, 128, DType::kF32},
                      DeltaCase{{1, 65}, 1, 3, 256, 72, DType::kF16},
                      DeltaCase{{3, 1}, 2, 2, 33, 256, DType::kF32},
                      // the chunked kernel: three chunks, the last partial
                      DeltaCase{{130}, 2, 4, 64, 64, DType::kF32},
                      DeltaCase{{200}, 2, 4, 128, 128, DType::kBF16},
                      DeltaCase{{129, 2}, 1, 2, 256, 72, DType::kF32},  // the largest smem
                      // one-token (recurrent) and long (chunked) sequences in one call
                      DeltaCase{{1, 200, 1, 65, 1, 2}, 2, 4, 128, 128, DType::kF32},
                      DeltaCase{{300, 64, 1, 129}, 4, 16, 128, 128, DType::kBF16},  // 2 blocks/SM
                      DeltaCase{{1, 150, 64}, 2, 4, 128, 128, DType::kF32, 2.f, 3.f},      // strong
                      DeltaCase{{1, 150, 64}, 2, 4, 128, 128, DType::kF32, -9.f, -8.f}));  // weak

// ---- Sample -----------------------------------------------------------------------------------
struct SampleCase {
  int64_t V;
  int rows;
  bool ties;  // logits rounded to halves: many equal logits, ties broken by id
};
class SampleParity : public ::testing::TestWithParam<SampleCase> {};

// Row r's parameters cycle through these: greedy, the usual cuts alone and together, penalties,
// log-probabilities, no cut at all (a draw over the whole vocabulary).
kernels::SampleParams SampleMode(int mode, std::mt19937& rng) {
  kernels::SampleParams p;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  p.uniform = u(rng);
  switch (mode % 9) {
    case 0: p.temperature = 0.f; break;
    case 1: p.temperature = 0.f; p.top_logprobs = 20; p.repetition_penalty = 1.3f; break;
    case 2: p.temperature = 0.7f; p.top_k = 50; break;
    case 3: p.top_p = 0.9f; break;
    case 4: p.temperature = 1.3f; p.min_p = 0.05f; p.logprobs = true; break;
    case 5: p.temperature = 0.8f; p.top_k = 200; p.top_p = 0.95f; p.min_p = 0.02f;
            p.repetition_penalty = 1.1f; p.presence_penalty = 0.5f; p.frequency_penalty = 0.3f;
            p.top_logprobs = 5; break;
    case 6: break;  // temperature 1, no cut
    case 7: p.temperature = 2.f; p.top_p = 0.999f; p.top_k = 1 << 30; break;
    case 8: p.temperature = 0.5f; p.top_p = 1e-4f; break;
  }
  return p;
}

TEST_P(SampleParity, MatchesCpu) {
  const SampleCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.V * 7 + c.rows));
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(c.rows * c.V);
  for (float& l : logits) l = c.ties ? std::round(normal(rng) * 2.f) / 2.f : normal(rng);
  std::vector<kernels::SampleParams> params;
  std::vector<kernels::PenaltyToken> penalties;
  for (int r = 0; r < c.rows; ++r) {
    kernels::SampleParams p = SampleMode(r, rng);
    p.row = c.rows - 1 - r;  // params in another order than the rows
    p.penalty_begin = static_cast<int32_t>(penalties.size());
    if (p.repetition_penalty != 1.f || p.presence_penalty != 0.f) {
      std::vector<bool> used(c.V, false);
      for (int j = 0; j < 300; ++j) {
        const int32_t id = static_cast<int32_t>(rng() % c.V);
        if (used[id]) continue;
        used[id] = true;
        penalties.push_back({id, static_cast<int32_t>(rng() % 3)});
      }
    }
    p.penalty_count = static_cast<int32_t>(penalties.size()) - p.penalty_begin;
    params.push_back(p);
  }
  DeviceArray<float> dlogits(logits);
  std::vector<kernels::SampledToken> want(params.size()), got(params.size());
  kernels::SampleArgs a;
  a.vocab_size = c.V;
  a.params = params;
  a.penalties = penalties;
  a.logits = logits.data();
  a.out = want.data();
  Cpu().Sample(a);
  for (kernels::SampledToken& t : got) t.id = -1;
  a.logits = dlogits.get();
  a.out = got.data();
  Gpu().Sample(a);

  const std::string name = Name("V", c.V, "rows", c.rows, c.ties ? "ties" : "");
  // The penalised, tempered logits: the same IEEE operations on both sides.
  ExpectClose("Sample.logits", name, dlogits.Read(), logits, 0.0);
  std::vector<int32_t> got_ids, want_ids;
  std::vector<float> got_lp, want_lp;
  for (size_t r = 0; r < params.size(); ++r) {
    got_ids.push_back(got[r].id);
    want_ids.push_back(want[r].id);
    for (int k = 0; k < params[r].top_logprobs; ++k) {
      got_ids.push_back(got[r].top_ids[k]);
      want_ids.push_back(want[r].top_ids[k]);
      got_lp.push_back(got[r].top_logprobs[k]);
      want_lp.push_back(want[r].top_logprobs[k]);
    }
    if (params[r].logprobs || params[r].top_logprobs > 0) {
      got_lp.push_back(got[r].logprob);
      want_lp.push_back(want[r].logprob);
    }
  }
  ExpectEqualIds("Sample.ids", name, got_ids, want_ids);
  ExpectClose("Sample.logprobs", name, got_lp, want_lp, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, SampleParity,
                         ::testing::Values(SampleCase{151936, 18, false},  // Qwen3
                                           SampleCase{151936, 9, true},
                                           SampleCase{50257, 27, false},
                                           SampleCase{1000, 9, true},
                                           SampleCase{7, 9, false},
                                           SampleCase{1, 3, false}));

// ---- Errors ------------------------------------------------------------------------------------
TEST(CudaBackendErrors, AllocationFailureIsResourceExhaustedNamingTheBytes) {
  auto buf = Gpu().Allocate(size_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kResourceExhausted) << buf.status();
  EXPECT_NE(std::string(buf.status().message()).find("1125899906842624 bytes"), std::string::npos)
      << buf.status();
  // The failure is not sticky: the backend still works.
  auto ok = Gpu().Allocate(1024);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

}  // namespace
}  // namespace moe::parity
