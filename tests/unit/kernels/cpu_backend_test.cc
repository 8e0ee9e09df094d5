// CPU reference ops: known answers, thread-count independence, and the contracts in backend.h.
#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/bytes.h"
#include "kernels/tensor.h"

namespace moe::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(CpuBackendTest, MatMulMatchesNaiveAndIgnoresThreadCount) {
  const int64_t T = 3, N = 37, K = 53;
  auto x = Random(T * K, 1), w = Random(N * K, 2), b = Random(N, 3);
  std::vector<float> ref(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = b[n];
      for (int64_t k = 0; k < K; ++k) acc += double(x[t * K + k]) * w[n * K + k];
      ref[t * N + n] = static_cast<float>(acc);
    }
  const TensorView wv = View(w.data(), DType::kF32, {N, K}), bv = View(b.data(), DType::kF32, {N});
  std::vector<float> out1(T * N), out4(T * N);
  CpuBackend(1).MatMul(out1.data(), x.data(), T, wv, &bv);
  CpuBackend(4).MatMul(out4.data(), x.data(), T, wv, &bv);
  EXPECT_EQ(out1, out4);  // bitwise: the split is over output rows only
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(out1[i], ref[i], 1e-5);
  // bf16 weights read as the bf16-rounded floats.
  std::vector<uint16_t> w16(N * K);
  std::vector<float> w16f(N * K);
  for (size_t i = 0; i < w.size(); ++i) w16f[i] = Bf16ToF32(w16[i] = F32ToBf16(w[i]));
  std::vector<float> a(T * N), c(T * N);
  CpuBackend(2).MatMul(a.data(), x.data(), T, View(w16.data(), DType::kBF16, {N, K}), nullptr);
  CpuBackend(2).MatMul(c.data(), x.data(), T, View(w16f.data(), DType::kF32, {N, K}), nullptr);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], c[i], 1e-5);
}

TEST(CpuBackendTest, RouteTopKRenormalisesAndBreaksTiesToLowerId) {
  CpuBackend cpu(1);
  const std::vector<float> logits = {0.f, 2.f, 2.f, 1.f};  // experts 1 and 2 tie
  std::vector<float> weights(2);
  std::vector<int32_t> ids(2);
  RouteArgs a{logits.data(), 1, 4, 2, true, weights.data(), ids.data()};
  cpu.Route(a);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  a.renormalize = false;
  cpu.Route(a);
  const float denom = 1 + 2 * std::exp(2.f) + std::exp(1.f);
  EXPECT_NEAR(weights[0], std::exp(2.f) / denom, 1e-6);
}

// LFM2's routing: the choice ranks sigmoid + bias, the weights are the unbiased sigmoids,
// w / (sum + 1e-6), times the scaling.
TEST(CpuBackendTest, RouteSigmoidChoosesByBiasedScoreAndWeighsUnbiased) {
  CpuBackend cpu(1);
  const std::vector<float> logits = {3.f, 2.f, 0.f, -1.f};
  const std::vector<float> bias = {0.f, -1.f, 0.5f, 0.f};  // expert 1 drops below 2 and 3
  std::vector<float> weights(2);
  std::vector<int32_t> ids(2);
  RouteArgs a{logits.data(), 1, 4, 2, true, weights.data(), ids.data()};
  a.scoring = RouteScoring::kSigmoid;
  a.selection_bias = bias.data();
  a.renormalize_eps = 1e-6f;
  a.scaling = 1.5f;
  cpu.Route(a);
  // keys: 0.953, -0.119, 1.0, 0.269 -> experts 2 then 0
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 0}));
  const float s0 = 1.f / (1.f + std::exp(-3.f)), s2 = 0.5f;
  EXPECT_NEAR(weights[0], s2 / (s2 + s0 + 1e-6f) * 1.5f, 1e-6);
  EXPECT_NEAR(weights[1], s0 / (s2 + s0 + 1e-6f) * 1.5f, 1e-6);
  a.renormalize = false;
  a.selection_bias = nullptr;  // plain top-k of the sigmoids: experts 0 and 1
  cpu.Route(a);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(weights[1], 1.5f / (1.f + std::exp(-2.f)), 1e-6);
}

// LFM2's short conv: no activation, a bias, the state carried into the next call; Mul.
TEST(CpuBackendTest, CausalConvWithoutActivationAddsTheBiasAndKeepsTheState) {
  CpuBackend cpu(1);
  const std::vector<float> w = {1.f, 2.f, 3.f};  // [C = 1, 1, KW = 3]
  const std::vector<float> bias = {-10.f};
  std::vector<float> state = {1.f, 2.f};  // the two inputs before the first row
  const std::vector<float> x = {3.f, 4.f};
  std::vector<float> out(2);
  LinearAttnSeq seq{2, state.data(), nullptr};
  CausalConvArgs a;
  a.out = out.data();
  a.x = x.data();
  a.weight = View(w.data(), DType::kF32, {1, 1, 3});
  a.bias = View(bias.data(), DType::kF32, {1});
  a.silu = false;
  a.channels = 1;
  a.kernel_size = 3;
  a.seqs = absl::MakeConstSpan(&seq, 1);
  cpu.CausalConv(a);
  EXPECT_EQ(out, (std::vector<float>{1 + 4 + 9 - 10.f, 2 + 6 + 12 - 10.f}));
  EXPECT_EQ(state, (std::vector<float>{3.f, 4.f}));
  std::vector<float> y = {2.f, -3.f};
  cpu.Mul(y.data(), y.data(), out.data(), 2);
  EXPECT_EQ(y, (std::vector<float>{8.f, -30.f}));
}

// A token with a non-finite router logit gets experts 0..K-1 at weight 0 and the layer's fault
// is reported once; the other tokens route as usual.
TEST(CpuBackendTest, RouteReportsNonFiniteLogitsNamingTheLayer) {
  CpuBackend cpu(1);
  const std::vector<float> logits = {0.f, 2.f, 1.f, 3.f,  std::nanf(""), 1.f, 2.f, 0.f,
                                     1.f, INFINITY, 0.f, 0.f};  // [3 tokens, 4 experts]
  std::vector<float> weights(6, -1.f);
  std::vector<int32_t> ids(6, -1);
  RouteArgs a{logits.data(), 3, 4, 2, true, weights.data(), ids.data()};
  a.layer = 7;
  EXPECT_TRUE(cpu.TakeRoutingError().ok());
  cpu.Route(a);
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 1, 0, 1, 0, 1}));
  EXPECT_EQ(weights[2], 0.f);
  EXPECT_EQ(weights[5], 0.f);
  const absl::Status st = cpu.TakeRoutingError();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer 7"), std::string::npos) << st;
  EXPECT_TRUE(cpu.TakeRoutingError().ok()) << "reported once";
}

TEST(CpuBackendTest, AttentionSlidingWindowSeesOnlyTheWindow) {
  // One head, D = 1, values = position: with window 2 the last token averages positions 3 and 4.
  CpuBackend cpu(2);
  const int64_t S = 5;
  std::vector<float> k(S, 0.f), v = {0, 1, 2, 3, 4}, q(S, 0.f), out(S);
  AttentionArgs a;
  a.out = out.data();
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.num_tokens = S;
  a.num_heads = a.num_kv_heads = a.head_dim = 1;
  a.sliding_window = 2;
  cpu.Attention(a);
  EXPECT_FLOAT_EQ(out[4], 3.5f);
  EXPECT_FLOAT_EQ(out[0], 0.f);
  a.sliding_window = 0;
  cpu.Attention(a);
  EXPECT_FLOAT_EQ(out[4], 2.f);  // causal mean of 0..4
}

// Paged attention over scattered blocks: with the bf16 cache it matches the contiguous fp32
// attention to bf16 rounding (sliding window and chunked steps included); the host-staged Backend
// defaults (what CUDA inherits) give exactly what the CPU override gives, for every format.
TEST(CpuBackendTest, PagedAttentionMatchesContiguousAndStagedDefaults) {
  CpuBackend cpu(2);
  const int NH = 4, NKV = 2, D = 32, bs = 4;
  const int64_t S = 23;
  std::mt19937 rng(9);
  std::normal_distribution<float> g;
  std::vector<float> q(S * NH * D), k(S * NKV * D), v(S * NKV * D);
  for (float& x : q) x = g(rng);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  const std::vector<int32_t> table = {5, 0, 3, 7, 1, 6};  // 24 positions, scattered
  for (KvFormat format : {KvFormat::kBf16, KvFormat::kFp8E4m3, KvFormat::kTq3}) {
    std::vector<KvCodec> codecs;
    for (int h = 0; h < NKV; ++h) {
      for (KvRole role : {KvRole::kKey, KvRole::kValue}) {
        KvCodecOptions o;
        o.format = format;
        o.head_dim = D;
        o.role = role;
        o.kv_head = h;
        codecs.push_back(*KvCodec::Create(o));
      }
    }
    std::vector<const KvCodec*> ptrs;
    for (const KvCodec& c : codecs) ptrs.push_back(&c);
    const int64_t tile = codecs[0].tile_bytes(bs);
    std::vector<uint8_t> store_cpu(8 * 2 * NKV * tile), store_staged(store_cpu.size());
    PagedKvLayer layer;
    layer.block_stride = 2 * NKV * tile;
    layer.tile_bytes = tile;
    layer.block_size = bs;
    layer.block_table = table.data();
    layer.codecs = ptrs.data();
    layer.num_kv_heads = NKV;
    layer.head_dim = D;
    for (int64_t window : {int64_t{0}, int64_t{6}}) {
      std::vector<float> out_cpu(S * NH * D), out_staged(S * NH * D), out_ref(S * NH * D);
      // Two steps: a 15-token chunk, then the remaining 8 tokens.
      for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 15}, {15, 8}}) {
        for (int which = 0; which < 2; ++which) {
          PagedKvWriteArgs w;
          w.kv = layer;
          w.kv.layer_base = (which == 0 ? store_cpu : store_staged).data();
          w.k = k.data() + start * NKV * D;
          w.v = v.data() + start * NKV * D;
          w.num_tokens = n;
          w.start_pos = start;
          ASSERT_TRUE((which == 0 ? cpu.PagedKvWrite({w}) : cpu.Backend::PagedKvWrite({w})).ok());
          PagedAttentionArgs a;
          a.kv = w.kv;
          a.out = (which == 0 ? out_cpu : out_staged).data() + start * NH * D;
          a.q = q.data() + start * NH * D;
          a.num_tokens = n;
          a.start_pos = start;
          a.num_heads = NH;
          a.scale = 1.f / std::sqrt(float(D));
          a.sliding_window = window;
          ASSERT_TRUE((which == 0 ? cpu.PagedAttention({a}) : cpu.Backend::PagedAttention({a})).ok());
        }
      }
      EXPECT_EQ(store_cpu, store_staged) << KvFormatName(format);
      EXPECT_EQ(out_cpu, out_staged) << KvFormatName(format);
      AttentionArgs c;
      c.out = out_ref.data();
      c.q = q.data();
      c.k_cache = k.data();
      c.v_cache = v.data();
      c.num_tokens = S;
      c.num_heads = NH;
      c.num_kv_heads = NKV;
      c.head_dim = D;
      c.scale = 1.f / std::sqrt(float(D));
      c.sliding_window = window;
      cpu.Attention(c);
      double err = 0, ref = 0;
      for (size_t i = 0; i < out_ref.size(); ++i) {
        err = std::max(err, double(std::abs(out_cpu[i] - out_ref[i])));
        ref = std::max(ref, double(std::abs(out_ref[i])));
      }
      const double tol = format == KvFormat::kBf16 ? 1e-2 : format == KvFormat::kFp8E4m3 ? 6e-2 : 0.5;
      EXPECT_LT(err / ref, tol) << KvFormatName(format) << " window " << window;
    }
  }
}

// The 16-bit tail (PagedKvLayer::tail): query p reads positions s > p - W as the bf16 of their
// keys and values and older ones from the compressed blocks, so the output is the attention over
// exactly that mix (W >= the sequence: exact bf16 attention), whatever the chunking of the steps
// (the ring written after each step's attention, PagedKvTailWrite). W = 0 (no tail) is today's
// compressed attention. Checked against a reference built from Dequantize and bf16 rounding.
TEST(CpuBackendTest, PagedAttentionTailReadsEachQuerysNewestPositionsInBf16) {
  CpuBackend cpu(2);
  const int NH = 4, NKV = 2, D = 32, bs = 4, G = NH / NKV;
  const int64_t S = 23;
  std::mt19937 rng(11);
  std::normal_distribution<float> g;
  std::vector<float> q(S * NH * D), k(S * NKV * D), v(S * NKV * D);
  for (float& x : q) x = g(rng);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  const std::vector<int32_t> table = {5, 0, 3, 7, 1, 6};
  const float scale = 1.f / std::sqrt(float(D));
  for (KvFormat format : {KvFormat::kFp8E4m3, KvFormat::kTq4, KvFormat::kTq2}) {
    std::vector<KvCodec> codecs;
    for (int h = 0; h < NKV; ++h) {
      for (KvRole role : {KvRole::kKey, KvRole::kValue}) {
        KvCodecOptions o;
        o.format = format;
        o.head_dim = D;
        o.role = role;
        o.kv_head = h;
        codecs.push_back(*KvCodec::Create(o));
      }
    }
    std::vector<const KvCodec*> ptrs;
    for (const KvCodec& c : codecs) ptrs.push_back(&c);
    const int64_t tile = codecs[0].tile_bytes(bs);
    std::vector<uint8_t> store(8 * 2 * NKV * tile);
    PagedKvLayer layer;
    layer.layer_base = store.data();
    layer.block_stride = 2 * NKV * tile;
    layer.tile_bytes = tile;
    layer.block_size = bs;
    layer.block_table = table.data();
    layer.codecs = ptrs.data();
    layer.num_kv_heads = NKV;
    layer.head_dim = D;
    // The output of the steps `chunks` with a tail of W (0: none) and a fresh ring.
    auto run = [&](int W, const std::vector<int64_t>& chunks) {
      std::vector<uint16_t> ring(std::max(W, 1) * NKV * 2 * D, 0xFFFF);  // NaN until written
      std::vector<float> out(S * NH * D);
      int64_t start = 0;
      for (int64_t n : chunks) {
        PagedKvWriteArgs w;
        w.kv = layer;
        if (W > 0) {
          w.kv.tail = ring.data();
          w.kv.tail_tokens = W;
        }
        w.k = k.data() + start * NKV * D;
        w.v = v.data() + start * NKV * D;
        w.num_tokens = n;
        w.start_pos = start;
        EXPECT_TRUE(cpu.PagedKvWrite({w}).ok());
        PagedAttentionArgs a;
        a.kv = w.kv;
        a.out = out.data() + start * NH * D;
        a.q = q.data() + start * NH * D;
        a.num_tokens = n;
        a.start_pos = start;
        a.num_heads = NH;
        a.scale = scale;
        a.k_new = w.k;
        a.v_new = w.v;
        EXPECT_TRUE(cpu.PagedAttention({a}).ok());
        EXPECT_TRUE(cpu.PagedKvTailWrite({w}).ok());
        start += n;
      }
      return out;
    };
    // The attention of every query over dequantized positions s <= p - W and bf16 ones after.
    auto reference = [&](int W) {
      std::vector<float> out(S * NH * D), x(D);
      for (int64_t p = 0; p < S; ++p) {
        for (int h = 0; h < NH; ++h) {
          const int kvh = h / G;
          std::vector<double> sc(p + 1), acc(D, 0.0);
          std::vector<std::vector<float>> vals(p + 1, std::vector<float>(D));
          double mx = -1e300, den = 0;
          for (int64_t s = 0; s <= p; ++s) {
            for (int role = 0; role < 2; ++role) {
              float* y = role == 0 ? x.data() : vals[s].data();
              if (s > p - W) {
                const float* src = (role == 0 ? k : v).data() + (s * NKV + kvh) * D;
                for (int j = 0; j < D; ++j) y[j] = Bf16ToF32(F32ToBf16(src[j]));
              } else {
                ptrs[2 * kvh + role]->Dequantize(ConstKvTile{PagedTileAt(layer, s, kvh, role), bs},
                                                 int(s % bs), y);
              }
            }
            double dot = 0;
            for (int j = 0; j < D; ++j) dot += double(q[(p * NH + h) * D + j]) * x[j];
            sc[s] = scale * dot;
            mx = std::max(mx, sc[s]);
          }
          for (int64_t s = 0; s <= p; ++s) den += (sc[s] = std::exp(sc[s] - mx));
          for (int64_t s = 0; s <= p; ++s) {
            for (int j = 0; j < D; ++j) acc[j] += sc[s] / den * vals[s][j];
          }
          for (int j = 0; j < D; ++j) out[(p * NH + h) * D + j] = float(acc[j]);
        }
      }
      return out;
    };
    auto rel_err = [](const std::vector<float>& a, const std::vector<float>& b) {
      double err = 0, ref = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, double(std::abs(a[i] - b[i])));
        ref = std::max(ref, double(std::abs(b[i])));
      }
      return err / ref;
    };
    const std::vector<int64_t> one_step = {S}, two = {15, 8}, odd = {7, 7, 1, 6, 2};
    const std::vector<int64_t> decode(S, 1);
    for (int W : {0, 5, 64}) {
      const std::vector<float> out = run(W, two);
      for (const auto& chunks : {one_step, odd, decode}) {
        EXPECT_EQ(run(W, chunks), out) << KvFormatName(format) << " W " << W;
      }
      EXPECT_LT(rel_err(out, reference(W)), 2e-5) << KvFormatName(format) << " W " << W;
      if (W > 0) {
        // The tail changes the result: the compressed reading differs by its quantization.
        EXPECT_GT(rel_err(out, reference(0)), 1e-3) << KvFormatName(format) << " W " << W;
      }
    }
  }
}

// The routing read where Route left it gives bit for bit what the engine's host grouping (experts
// in ascending id, rows in token order) gives through ExpertFfn.
TEST(CpuBackendTest, ExpertFfnRoutedEqualsTheHostGrouping) {
  const int64_t T = 5, H = 24, I = 10;
  const int E = 6, K = 3;
  std::vector<std::vector<float>> mats;
  std::vector<ExpertWeights> views;
  for (int e = 0; e < E; ++e) {
    for (int m = 0; m < 3; ++m) mats.push_back(Random(I * H, 100 + 3 * e + m));
  }
  std::vector<const void*> ptrs(3 * E);
  for (int e = 0; e < E; ++e) {
    views.push_back({View(mats[3 * e].data(), DType::kF32, {I, H}),
                     View(mats[3 * e + 1].data(), DType::kF32, {I, H}),
                     View(mats[3 * e + 2].data(), DType::kF32, {H, I})});
    ptrs[e] = views[e].gate.data;
    ptrs[E + e] = views[e].up.data;
    ptrs[2 * E + e] = views[e].down.data;
  }
  const std::vector<int32_t> ids = {4, 0, 2, 0, 5, 1, 2, 4, 3, 1, 0, 5, 3, 2, 4};  // [T, K]
  const std::vector<float> weights = Random(T * K, 7);
  const std::vector<float> x = Random(T * H, 8), out0 = Random(T * H, 9);
  CpuBackend cpu(2);

  const ResidentExperts table{views.data(), ptrs.data(), ptrs.data() + E, ptrs.data() + 2 * E, E};
  ExpertFfnRoutedArgs r;
  std::vector<float> routed = out0;
  r.out = routed.data();
  r.x = x.data();
  r.num_tokens = T;
  r.hidden_size = H;
  r.top_k = K;
  r.experts = &table;
  r.expert_ids = ids.data();
  r.weights = weights.data();
  cpu.ExpertFfnRouted(r);

  std::vector<ExpertWork> work;
  std::vector<int32_t> rows;
  std::vector<float> row_weights;
  for (int e = 0; e < E; ++e) {
    const int64_t begin = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < T * K; ++i) {
      if (ids[i] != e) continue;
      rows.push_back(static_cast<int32_t>(i / K));
      row_weights.push_back(weights[i]);
    }
    work.push_back({&views[e], begin, static_cast<int64_t>(rows.size()) - begin});
  }
  std::vector<float> grouped = out0;
  ExpertFfnArgs f;
  f.out = grouped.data();
  f.x = x.data();
  f.num_tokens = T;
  f.hidden_size = H;
  f.experts = work;
  f.rows = rows.data();
  f.row_weights = row_weights.data();
  cpu.ExpertFfn(f);
  EXPECT_EQ(routed, grouped);
  EXPECT_NE(routed, out0);
  EXPECT_TRUE(cpu.TakeRoutingError().ok());

  // Pairs naming no expert (-1, E) are skipped and reported; the others give the same sums.
  std::vector<int32_t> bad_ids = ids;
  std::vector<float> bad_weights = weights;
  for (const int i : {1, 7}) {
    bad_ids[i] = i == 1 ? -1 : E;
    bad_weights[i] = 0.f;  // the reference below: those pairs add nothing
  }
  std::vector<float> skipped = out0, zero_weighted = out0;
  r.out = skipped.data();
  r.expert_ids = bad_ids.data();
  r.layer = 3;
  cpu.ExpertFfnRouted(r);
  const absl::Status st = cpu.TakeRoutingError();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer 3"), std::string::npos) << st;
  r.out = zero_weighted.data();
  r.expert_ids = ids.data();
  r.weights = bad_weights.data();
  cpu.ExpertFfnRouted(r);
  for (size_t i = 0; i < skipped.size(); ++i) EXPECT_NEAR(skipped[i], zero_weighted[i], 1e-6);
  EXPECT_TRUE(cpu.TakeRoutingError().ok());
}

TEST(TensorTest, HalfConversionsRoundTrip) {
  for (float f : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.00390625f)), 1.0f);  // ties to even
}

TEST(BytesTest, ParseAndFormat) {
  EXPECT_EQ(*base::ParseBytes("24GiB"), 24ull << 30);
  EXPECT_EQ(*base::ParseBytes("512 MB"), 512'000'000ull);
  EXPECT_EQ(*base::ParseBytes("0"), 0ull);
  EXPECT_FALSE(base::ParseBytes("12 parsecs").ok());
  EXPECT_FALSE(base::ParseBytes("-1GiB").ok());
  EXPECT_FALSE(base::ParseBytes("99999999999TiB").ok());
  EXPECT_EQ(base::FormatBytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace moe::kernels
