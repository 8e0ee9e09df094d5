// Tests of kernels/kvcodec/kv_quant.h (and its codebooks and rotations) against turboquant.md §5,
// T1–T6, T10, T11, plus the attention-side primitives against dequantize-then-dot.
#include "kernels/kvcodec/kv_quant.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kvcodec/kv_codebook.h"
#include "kernels/kvcodec/kv_rotation.h"

namespace moe::kernels {
namespace {

constexpr int kD = 128;
constexpr int kN = 4096;
// Exact D_b for d = 128 (spec §3.4), b = 1..4.
constexpr double kMse128[] = {0.360889, 0.116000, 0.033966, 0.009315};
constexpr KvFormat kMseFormats[] = {KvFormat::kTq1, KvFormat::kTq2, KvFormat::kTq3, KvFormat::kTq4};
constexpr KvFormat kProdFormats[] = {KvFormat::kTqProd1, KvFormat::kTqProd2, KvFormat::kTqProd3,
                                     KvFormat::kTqProd4};

std::vector<float> Gaussian(std::mt19937_64& rng, int n, float sigma = 1.f) {
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(n);
  for (float& e : v) e = dist(rng);
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double{a[i]} * b[i];
  return s;
}

KvCodec MakeCodec(KvFormat format, int layer = 0, TqNorm norm = TqNorm::kDebiased,
                  RotationKind rotation = RotationKind::kRht2) {
  KvCodecOptions options;
  options.format = format;
  options.head_dim = kD;
  options.norm = norm;
  options.rotation = rotation;
  options.model_fingerprint = "kv_quant_test";
  options.layer = layer;
  if (format == KvFormat::kTq2p5 || format == KvFormat::kTq3p5) {
    for (int j = 0; j < 32; ++j) options.outlier_channels.push_back(4 * j + 1);
  }
  absl::StatusOr<KvCodec> codec = KvCodec::Create(options);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return *std::move(codec);
}

// Quantizes x into a one-token tile and returns the reconstruction.
std::vector<float> RoundTrip(const KvCodec& codec, const std::vector<float>& x,
                             std::vector<uint8_t>* bytes = nullptr) {
  std::vector<uint8_t> tile(codec.bytes_per_vector());
  absl::Status s = codec.Quantize(x.data(), KvTile{tile.data(), 1}, 0);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<float> out(x.size());
  codec.Dequantize(ConstKvTile{tile.data(), 1}, 0, out.data());
  if (bytes != nullptr) *bytes = tile;
  return out;
}

// ‖x̂/n − x/n‖², the spec's D for one vector.
double UnitError(const std::vector<float>& x, const std::vector<float>& xhat) {
  const double n2 = Dot(x, x);
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (double{xhat[i]} - x[i]) * (double{xhat[i]} - x[i]);
  return e / n2;
}

// T1: the generator reproduces the committed tables; the tables match the spec's D to all printed
// digits. (The spec's printed centroids for b >= 2 are off the Lloyd fixed point by up to 1e-3
// relative; see kv_codebook.cc. b = 1 is checked against its closed form instead.)
TEST(KvCodebookTest, T1GeneratorReproducesCommittedTables) {
  for (int d : {16, 24, 32, 64, 96, 128, 256}) {
    for (int b = 1; b <= 4; ++b) {
      SCOPED_TRACE(testing::Message() << "d " << d << " b " << b);
      const Codebook solved = SolveLloydMax(d, b);
      absl::StatusOr<Codebook> committed = CommittedCodebook(d, b);
      ASSERT_TRUE(committed.ok()) << committed.status();
      ASSERT_EQ(solved.centroids.size(), size_t{1} << b);
      ASSERT_EQ(committed->centroids.size(), size_t{1} << b);
      ASSERT_EQ(committed->boundaries.size(), (size_t{1} << b) - 1);
      for (size_t i = 0; i < solved.centroids.size(); ++i) {
        EXPECT_NEAR(committed->centroids[i], solved.centroids[i],
                    1e-6 * std::fabs(solved.centroids[i]));
        EXPECT_EQ(committed->centroids[i], -committed->centroids[solved.centroids.size() - 1 - i]);
      }
      for (size_t i = 0; i < solved.boundaries.size(); ++i) {
        EXPECT_NEAR(committed->boundaries[i], solved.boundaries[i],
                    1e-6 * std::fabs(solved.boundaries[i]) + 1e-12);
      }
      EXPECT_NEAR(committed->mse, solved.mse, 1e-9);
    }
  }
  const struct {
    int d, b;
    double mse;
  } kSpec[] = {{128, 1, 0.360889}, {128, 2, 0.116000}, {128, 3, 0.033966}, {128, 4, 0.009315},
               {256, 1, 0.362136}, {256, 2, 0.116740}, {256, 3, 0.034256}, {256, 4, 0.009408},
               {32, 3, 0.032261},  {32, 4, 0.008774},  {64, 3, 0.033391},  {64, 4, 0.009132},
               {96, 2, 0.115508},  {96, 3, 0.033773}};
  for (const auto& row : kSpec) {
    EXPECT_NEAR(SolveLloydMax(row.d, row.b).mse, row.mse, 5e-7) << "d " << row.d << " b " << row.b;
  }
  // b = 1: the centroid is E|x| = Γ(k + 3/2) / ((k + 1) √π Γ(k + 1)), k = (d − 3)/2.
  for (int d : {16, 24, 128, 256}) {
    const double k = (d - 3) / 2.0;
    const double exact =
        std::exp(std::lgamma(k + 1.5) - std::lgamma(k + 1)) / ((k + 1) * std::sqrt(M_PI));
    EXPECT_NEAR(SolveLloydMax(d, 1).centroids[1], exact, 1e-7 * exact);
  }
  // The Gaussian-limit table (× 1/√d) is close to the exact d = 128 centroids: within 1 % for the
  // inner six, as the spec says, but 1.1 % and 1.6 % off for the outer two (so: within 2 %).
  const double kGauss4[] = {0.128395, 0.388048, 0.656759, 0.942340,
                            1.256231, 1.618046, 2.069017, 2.732590};
  const Codebook cb4 = *CommittedCodebook(128, 4);
  for (int i = 0; i < 8; ++i) {
    const double tolerance = i < 6 ? 0.01 : 0.02;
    EXPECT_NEAR(cb4.centroids[8 + i], kGauss4[i] / std::sqrt(128.0),
                tolerance * cb4.centroids[8 + i]);
  }
}

// T2: D_mse through normalize → rotate → quantize → dequantize, plain norm, random norms.
TEST(KvQuantTest, T2MseThroughFullPath) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> norm_dist(0.01f, 100.f);
  for (int b = 1; b <= 4; ++b) {
    const KvCodec codec = MakeCodec(kMseFormats[b - 1], 0, TqNorm::kPlain);
    double total = 0;
    for (int i = 0; i < kN; ++i) {
      std::vector<float> x = Gaussian(rng, kD);
      const double scale = norm_dist(rng) / std::sqrt(Dot(x, x));
      for (float& e : x) e = static_cast<float>(e * scale);
      total += UnitError(x, RoundTrip(codec, x));
    }
    const double mse = total / kN;
    std::printf("T2 b %d: D = %.6f (exact %.6f)\n", b, mse, kMse128[b - 1]);
    EXPECT_NEAR(mse, kMse128[b - 1], 0.02 * kMse128[b - 1]) << "b " << b;
  }
}

// T3: worst-case inputs averaged over 200 rotation seeds.
double WorstCaseMse(int b, RotationKind rotation, int input) {
  std::mt19937_64 rng(3 + input);
  double total = 0;
  constexpr int kSeeds = 200;
  for (int seed = 0; seed < kSeeds; ++seed) {
    const KvCodec codec = MakeCodec(kMseFormats[b - 1], seed, TqNorm::kPlain, rotation);
    std::vector<float> x(kD, 0.f);
    if (input == 0) x[0] = 1.f;                                // e₁
    if (input == 1) x.assign(kD, 1.f / std::sqrt(float{kD}));  // (1, …, 1)/√d
    if (input == 2) {                                          // one massive channel + noise
      x = Gaussian(rng, kD);
      x[7] += 40.f;
    }
    total += UnitError(x, RoundTrip(codec, x));
  }
  return total / kSeeds;
}

TEST(KvQuantTest, T3WorstCaseInputsHaarAndRht2) {
  for (RotationKind rotation : {RotationKind::kHaar, RotationKind::kRht2}) {
    for (int input = 0; input < 3; ++input) {
      for (int b = 1; b <= 4; ++b) {
        const double mse = WorstCaseMse(b, rotation, input);
        std::printf("T3 %s input %d b %d: D = %.6f (exact %.6f)\n", RotationKindName(rotation),
                    input, b, mse, kMse128[b - 1]);
        // Deviation from T3's ±5 %: under R-RHT2 a one-hot input lands on the lattice
        // (Σ ±1)/d in the rotated frame, which costs +6 % at b = 3 and 4 (spec §3.3 itself
        // quotes 0.037 at b = 3, +9 %). Measured: 0.0361 and 0.00987 over these 200 seeds.
        const bool lattice_case = rotation == RotationKind::kRht2 && input == 0 && b >= 3;
        const double tolerance = lattice_case ? 0.10 : 0.05;
        EXPECT_NEAR(mse, kMse128[b - 1], tolerance * kMse128[b - 1])
            << RotationKindName(rotation) << " input " << input << " b " << b;
      }
    }
  }
}

// T3, the documented failure of a single randomized Hadamard on one-hot input.
TEST(KvQuantTest, T3Rht1FailsOnOneHot) {
  const double mse = WorstCaseMse(2, RotationKind::kRht1, 0);
  std::printf("T3 rht1 e1 b 2: D = %.6f (spec: ~0.255)\n", mse);
  EXPECT_NEAR(mse, 0.255, 0.01);
}

// T4: index histogram and entropy, read from the documented bit layout.
TEST(KvQuantTest, T4IndexHistogram) {
  const std::vector<std::vector<double>> kCells = {
      {0.3352, 0.1648},
      {0.1902, 0.1610, 0.1075, 0.0414},
      {0.1010, 0.0967, 0.0882, 0.0761, 0.0608, 0.0434, 0.0252, 0.0086}};
  const double kEntropy[] = {1.915, 2.831, 3.773};
  std::mt19937_64 rng(4);
  for (int b = 2; b <= 4; ++b) {
    const KvCodec codec = MakeCodec(kMseFormats[b - 1]);
    std::vector<double> count(1 << b, 0.0);
    for (int i = 0; i < kN; ++i) {
      std::vector<uint8_t> bytes;
      RoundTrip(codec, Gaussian(rng, kD), &bytes);
      for (int j = 0; j < kD; ++j) {
        int idx = 0;
        for (int k = 0; k < b; ++k) idx |= ((bytes[(b * j + k) / 8] >> ((b * j + k) % 8)) & 1) << k;
        count[idx] += 1;
      }
    }
    double entropy = 0;
    const int half = 1 << (b - 1);
    for (int c = 0; c < (1 << b); ++c) {
      const double p = count[c] / (double{kN} * kD);
      if (p > 0) entropy -= p * std::log2(p);
      const int from_center = c < half ? half - 1 - c : c - half;
      EXPECT_NEAR(p, kCells[b - 2][from_center], 0.005) << "b " << b << " cell " << c;
    }
    std::printf("T4 b %d: entropy %.4f bits (spec %.3f)\n", b, entropy, kEntropy[b - 2]);
    EXPECT_NEAR(entropy, kEntropy[b - 2], 0.01) << "b " << b;
  }
}

// T5: shrinkage E⟨x, x̂⟩/‖x‖² per stored-norm variant.
TEST(KvQuantTest, T5Shrinkage) {
  const double kAlpha[] = {0.6391, 0.8840, 0.9660, 0.9907};
  std::mt19937_64 rng(5);
  for (int b = 1; b <= 4; ++b) {
    for (TqNorm norm : {TqNorm::kPlain, TqNorm::kDebiased, TqNorm::kNormCorrected}) {
      const KvCodec codec = MakeCodec(kMseFormats[b - 1], 0, norm);
      double total = 0;
      for (int i = 0; i < kN; ++i) {
        const std::vector<float> x = Gaussian(rng, kD, 3.f);
        total += Dot(x, RoundTrip(codec, x)) / Dot(x, x);
      }
      const double ratio = total / kN;
      std::printf("T5 b %d norm %d: %.5f\n", b, static_cast<int>(norm), ratio);
      const double want = norm == TqNorm::kPlain      ? kAlpha[b - 1]
                          : norm == TqNorm::kDebiased ? 1.0
                                                      : std::sqrt(kAlpha[b - 1]);
      const double tolerance = norm == TqNorm::kNormCorrected ? 0.01 : 0.005;
      EXPECT_NEAR(ratio, want, tolerance * want) << "b " << b << " norm " << static_cast<int>(norm);
    }
  }
}

// T6: TurboQuant_prod is unbiased, with d·E[err²] ≈ (π/2 − 1/d)·D_mse(b − 1). Scores through the
// attention path (PrepareQuery + Score), 4 seeds of (Π, S') × 4096 pairs.
TEST(KvQuantTest, T6ProdUnbiasedInnerProducts) {
  const double kPredicted[] = {1.563, 0.564, 0.181, 0.0531};
  std::mt19937_64 rng(6);
  for (int b = 1; b <= 4; ++b) {
    double sum = 0, sum2 = 0;
    int count = 0;
    for (int seed = 0; seed < 4; ++seed) {
      const KvCodec codec = MakeCodec(kProdFormats[b - 1], 100 + seed);
      std::vector<uint8_t> tile(codec.bytes_per_vector());
      std::vector<float> q_prep(codec.query_floats());
      for (int i = 0; i < kN; ++i) {
        std::vector<float> x = Gaussian(rng, kD), y = Gaussian(rng, kD);
        const double nx = std::sqrt(Dot(x, x)), ny = std::sqrt(Dot(y, y));
        for (float& e : x) e = static_cast<float>(e / nx);
        for (float& e : y) e = static_cast<float>(e / ny);
        ASSERT_TRUE(codec.Quantize(x.data(), KvTile{tile.data(), 1}, 0).ok());
        codec.PrepareQuery(y.data(), q_prep.data());
        float logit;
        codec.Score(q_prep.data(), ConstKvTile{tile.data(), 1}, 0, 1, 1.f, &logit);
        const double err = logit - Dot(x, y);
        sum += err;
        sum2 += err * err;
        ++count;
      }
    }
    const double mean = sum / count, var = sum2 / count;
    const double se = std::sqrt((var - mean * mean) / count);
    std::printf("T6 prod b %d: mean err %.2e (SE %.2e), d*E[err^2] = %.4f (predicted %.4f)\n", b,
                mean, se, kD * var, kPredicted[b - 1]);
    EXPECT_LT(std::fabs(mean), 3 * se) << "b " << b;
    EXPECT_NEAR(kD * var, kPredicted[b - 1], 0.10 * kPredicted[b - 1]) << "b " << b;
  }
}

// T10: bytes per vector (spec §3.8) and per token for the Qwen3-30B-A3B shape.
TEST(KvQuantTest, T10StorageAccounting) {
  const struct {
    KvFormat format;
    int64_t bytes;
  } kTable[] = {{KvFormat::kBf16, 256}, {KvFormat::kFp8E4m3, 132}, {KvFormat::kTq4, 66},
                {KvFormat::kTq3, 50},   {KvFormat::kTq2, 34},      {KvFormat::kTq2p5, 40},
                {KvFormat::kTq3p5, 56}, {KvFormat::kTqProd3, 52},  {KvFormat::kTqProd4, 68}};
  for (const auto& row : kTable) {
    EXPECT_EQ(*KvBytesPerVector(row.format, kD), row.bytes) << KvFormatName(row.format);
    EXPECT_EQ(MakeCodec(row.format).bytes_per_vector(), row.bytes) << KvFormatName(row.format);
    // Per (token, layer): × 2 (K, V) × 4 kv heads; Qwen3-30B-A3B has 48 layers.
    EXPECT_EQ(*KvBytesPerToken(row.format, kD, 4, 1), row.bytes * 2 * 4);
  }
  EXPECT_EQ(*KvBytesPerToken(KvFormat::kBf16, 128, 4, 48), 98304);
  EXPECT_EQ(*KvBytesPerToken(KvFormat::kTq4, 128, 4, 48), 25344);
  EXPECT_FALSE(KvBytesPerVector(KvFormat::kTq2p5, 64).ok());
  EXPECT_FALSE(KvBytesPerVector(KvFormat::kTq3, 100).ok());
  EXPECT_EQ(*ParseKvFormat("tq3.5"), KvFormat::kTq3p5);
  EXPECT_EQ(ParseKvFormat("int4").status().code(), absl::StatusCode::kInvalidArgument);
}

// The identity a backend keys its device tables by (CudaBackend::TqTablesOnDevice): distinct for
// every Create, even of equal options; kept by copies, which hold the same tables.
TEST(KvQuantTest, IdIsUniquePerCreateAndKeptByCopies) {
  const KvCodec a = MakeCodec(KvFormat::kTq4);
  const KvCodec b = MakeCodec(KvFormat::kTq4);
  EXPECT_NE(a.id(), 0u);
  EXPECT_NE(a.id(), b.id());
  const KvCodec copy = a;
  EXPECT_EQ(copy.id(), a.id());
  KvCodec assigned = b;
  assigned = a;
  EXPECT_EQ(assigned.id(), a.id());
}

const KvFormat kAllFormats[] = {KvFormat::kBf16,    KvFormat::kFp8E4m3, KvFormat::kTq4,
                                KvFormat::kTq3,     KvFormat::kTq2,     KvFormat::kTq1,
                                KvFormat::kTq3p5,   KvFormat::kTq2p5,   KvFormat::kTqProd4,
                                KvFormat::kTqProd3, KvFormat::kTqProd2, KvFormat::kTqProd1};

// T11: zero and denormal inputs decode to (near) zero; non-finite input fails and writes nothing.
TEST(KvQuantTest, T11ZeroDenormalNonFinite) {
  for (KvFormat format : kAllFormats) {
    SCOPED_TRACE(KvFormatName(format));
    const KvCodec codec = MakeCodec(format);
    for (float v : std::vector<float>(RoundTrip(codec, std::vector<float>(kD, 0.f)))) {
      EXPECT_EQ(v, 0.f);
    }
    std::vector<float> denormal(kD, 0.f);
    for (int j = 0; j < kD; j += 3) denormal[j] = (j % 2 ? -1.f : 1.f) * 1e-40f;
    for (float v : RoundTrip(codec, denormal)) {
      EXPECT_TRUE(std::isfinite(v));
      EXPECT_LE(std::fabs(v), 1e-37f);
    }
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      std::vector<float> x(kD, 0.5f);
      x[17] = bad;
      std::vector<uint8_t> tile(codec.bytes_per_vector() * 4, 0xab);
      const absl::Status s = codec.Quantize(x.data(), KvTile{tile.data(), 4}, 2);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("element 17"), absl::string_view::npos) << s;
      for (uint8_t byte : tile) ASSERT_EQ(byte, 0xab);
    }
  }
}

// Attention primitives equal dequantize-then-dot, and a slot write touches only that slot.
TEST(KvQuantTest, ScoreAndValuesMatchDequantized) {
  constexpr int kTokens = 16;
  std::mt19937_64 rng(7);
  for (KvFormat format : kAllFormats) {
    SCOPED_TRACE(KvFormatName(format));
    const KvCodec codec = MakeCodec(format, 3);
    std::vector<uint8_t> tile(codec.tile_bytes(kTokens), 0);
    std::vector<std::vector<float>> deq(kTokens, std::vector<float>(kD));
    for (int t = 0; t < kTokens; ++t) {
      std::vector<uint8_t> before = tile;
      ASSERT_TRUE(
          codec.Quantize(Gaussian(rng, kD, 2.f).data(), KvTile{tile.data(), kTokens}, t).ok());
      for (int t2 = 0; t2 < t; ++t2) {
        std::vector<float> again(kD);
        codec.Dequantize(ConstKvTile{tile.data(), kTokens}, t2, again.data());
        ASSERT_EQ(again, deq[t2]) << "writing slot " << t << " changed slot " << t2;
      }
      codec.Dequantize(ConstKvTile{tile.data(), kTokens}, t, deq[t].data());
    }
    const std::vector<float> q = Gaussian(rng, kD);
    std::vector<float> q_prep(codec.query_floats()), logits(kTokens);
    codec.PrepareQuery(q.data(), q_prep.data());
    codec.Score(q_prep.data(), ConstKvTile{tile.data(), kTokens}, 0, kTokens, 0.125f,
                logits.data());
    std::vector<float> p(kTokens), acc(kD, 0.f), out(kD), want(kD, 0.f);
    for (int t = 0; t < kTokens; ++t) {
      const double ref = 0.125 * Dot(q, deq[t]);
      EXPECT_NEAR(logits[t], ref, 1e-4 * (1 + std::fabs(ref))) << "token " << t;
      p[t] = 1.f / (1 + t);
      for (int j = 0; j < kD; ++j) want[j] += p[t] * deq[t][j];
    }
    codec.AccumulateValues(p.data(), ConstKvTile{tile.data(), kTokens}, 0, kTokens, acc.data());
    codec.FinishValues(acc.data(), out.data());
    for (int j = 0; j < kD; ++j) EXPECT_NEAR(out[j], want[j], 1e-4 * (1 + std::fabs(want[j])));
  }
}

TEST(KvQuantTest, SplitFormatsOutliersAndValidation) {
  std::mt19937_64 rng(8);
  std::vector<float> prefill(64 * kD);
  for (int t = 0; t < 64; ++t) {
    for (int j = 0; j < kD; ++j) prefill[t * kD + j] = Gaussian(rng, 1, j % 5 == 0 ? 6.f : 1.f)[0];
  }
  const std::vector<int> outliers = SelectOutlierChannels(prefill.data(), 64, kD, 32);
  ASSERT_EQ(outliers.size(), 32u);
  int loud = 0;  // channels 0, 5, …, 125 (26 of them) have 36× the energy: all must be chosen
  for (int c : outliers) loud += (c % 5 == 0) ? 1 : 0;
  EXPECT_EQ(loud, 26);
  KvCodecOptions options;
  options.format = KvFormat::kTq2p5;
  options.outlier_channels = outliers;
  ASSERT_TRUE(KvCodec::Create(options).ok());
  options.outlier_channels.pop_back();
  EXPECT_EQ(KvCodec::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.format = KvFormat::kTqProd3;
  options.outlier_channels.clear();
  options.role = KvRole::kValue;
  EXPECT_EQ(KvCodec::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// Pinned bytes: any change to the seed, sign stream, butterfly order, codebooks, packing or
// rounding changes these, and a CUDA port can compare against the same numbers. (Haar-rotated
// formats are left out: their matrix goes through the host's libm.)
TEST(KvQuantTest, PinnedEncodings) {
  EXPECT_EQ(RotationSeed("golden", 3, 1), 0xef30062e3a3f7f28ull);
  std::vector<float> x(kD), y(kD);
  for (int j = 0; j < kD; ++j)
    x[j] = static_cast<float>((j * 37) % 23 - 11) / 8.f + (j == 5 ? 4.f : 0.f);
  Rotation(RotationKind::kRht2, kD, RotationSeed("golden", 3, 1)).Apply(x.data(), y.data());
  EXPECT_EQ(y[0], -0x1p-6f);
  EXPECT_EQ(y[1], -0x1.d2p+0f);
  EXPECT_EQ(y[2], -0x1.03p+0f);
  EXPECT_EQ(y[3], 0x1.12p-1f);
  const struct {
    KvFormat format;
    uint64_t fnv;
  } kPins[] = {{KvFormat::kTq4, 0x9803d05350da2e36ull},
               {KvFormat::kTq3, 0x465b90cd90a9bb8bull},
               {KvFormat::kTq2, 0x9ce5eea7f22184ceull},
               {KvFormat::kFp8E4m3, 0x5810ad2ca97c7445ull}};
  for (const auto& pin : kPins) {
    KvCodecOptions options;
    options.format = pin.format;
    options.model_fingerprint = "golden";
    options.layer = 3;
    options.kv_head = 1;
    absl::StatusOr<KvCodec> codec = KvCodec::Create(options);
    ASSERT_TRUE(codec.ok()) << codec.status();
    std::vector<uint8_t> tile(codec->bytes_per_vector());
    ASSERT_TRUE(codec->Quantize(x.data(), KvTile{tile.data(), 1}, 0).ok());
    EXPECT_EQ(Fnv1a64(absl::string_view(reinterpret_cast<const char*>(tile.data()), tile.size())),
              pin.fnv)
        << KvFormatName(pin.format);
  }
}

TEST(KvQuantTest, Fp8E4m3Conversion) {
  EXPECT_EQ(F32ToE4m3(1.f), 0x38);
  EXPECT_EQ(F32ToE4m3(448.f), 0x7e);
  EXPECT_EQ(F32ToE4m3(1000.f), 0x7e);
  EXPECT_EQ(F32ToE4m3(-448.f), 0xfe);
  EXPECT_EQ(F32ToE4m3(0x1.0p-9f), 0x01);
  EXPECT_EQ(F32ToE4m3(0x1.0p-10f), 0x00);  // tie to even
  EXPECT_EQ(F32ToE4m3(1.0625f), 0x38);     // 1 + 1/16: tie to even mantissa 0
  EXPECT_EQ(F32ToE4m3(1.1875f), 0x3a);     // 1 + 3/16: tie to even mantissa 2
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(F32ToE4m3(E4m3ToF32(static_cast<uint8_t>(c))), c == 0x80 ? 0x80 : c) << c;
  }
}

// Pinned values a CUDA port must reproduce.
TEST(KvRotationTest, DeterministicAndOrthogonal) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(SplitMix64(0).Next(), 0xe220a8397b1dcdafull);
  std::mt19937_64 rng(9);
  for (RotationKind kind : {RotationKind::kRht2, RotationKind::kRht1, RotationKind::kHaar}) {
    for (int d : {32, 128}) {
      const Rotation r(kind, d, RotationSeed("m", 1, 2));
      const std::vector<float> x = Gaussian(rng, d);
      std::vector<float> y(d), back(d);
      r.Apply(x.data(), y.data());
      r.ApplyTranspose(y.data(), back.data());
      EXPECT_NEAR(Dot(y, y), Dot(x, x), 1e-4 * Dot(x, x)) << RotationKindName(kind);
      for (int j = 0; j < d; ++j) EXPECT_NEAR(back[j], x[j], 1e-5) << RotationKindName(kind);
    }
  }
  const Rotation haar96(RotationKind::kHaar, 96, 1);
  const std::vector<float>& m = haar96.matrix();
  for (int i = 0; i < 96; i += 7) {
    for (int k = 0; k < 96; k += 5) {
      double dot = 0;
      for (int j = 0; j < 96; ++j) dot += double{m[i * 96 + j]} * m[k * 96 + j];
      EXPECT_NEAR(dot, i == k ? 1.0 : 0.0, 1e-6);
    }
  }
}

}  // namespace
}  // namespace moe::kernels
