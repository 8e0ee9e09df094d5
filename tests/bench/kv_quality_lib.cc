// T7 / T8 measurements (kv_quality_lib.h).
#include "tests/bench/kv_quality_lib.h"

#include <algorithm>
#include <cmath>

#include "kernels/base/status.h"

namespace moe::bench {
namespace {

// Per kv-head codecs (key, value) for `format`; split formats pick outliers from the data.
absl::StatusOr<std::vector<kernels::KvCodec>> MakeCodecs(kernels::KvFormat format, const float* k,
                                                         const float* v, int64_t T, int nkv,
                                                         int d, int layer) {
  std::vector<kernels::KvCodec> codecs;
  const bool split = format == kernels::KvFormat::kTq3p5 || format == kernels::KvFormat::kTq2p5;
  std::vector<float> sample(T * d);
  for (int h = 0; h < nkv; ++h) {
    for (int role = 0; role < 2; ++role) {
      kernels::KvCodecOptions o;
      o.format = format;
      o.head_dim = d;
      o.role = role == 0 ? kernels::KvRole::kKey : kernels::KvRole::kValue;
      o.layer = layer;
      o.kv_head = h;
      if (split) {
        const float* x = role == 0 ? k : v;
        for (int64_t t = 0; t < T; ++t) std::copy_n(x + (t * nkv + h) * d, d, sample.data() + t * d);
        o.outlier_channels = kernels::SelectOutlierChannels(sample.data(), T, d, 32);
      }
      MOE_ASSIGN_OR_RETURN(kernels::KvCodec c, kernels::KvCodec::Create(o));
      codecs.push_back(std::move(c));
    }
  }
  return codecs;
}

// probs [T][NH][t + 1] and outputs [T, NH, D] of causal attention through the codecs.
absl::Status Attend(kernels::KvFormat format, const float* q, const float* k, const float* v,
                    int64_t T, int nh, int nkv, int d, int layer,
                    std::vector<std::vector<float>>* probs, std::vector<float>* out) {
  MOE_ASSIGN_OR_RETURN(std::vector<kernels::KvCodec> codecs,
                       MakeCodecs(format, k, v, T, nkv, d, layer));
  const int64_t tile_bytes = codecs[0].tile_bytes(static_cast<int>(T));
  std::vector<uint8_t> tiles(tile_bytes * 2 * nkv);
  for (int h = 0; h < nkv; ++h) {
    for (int role = 0; role < 2; ++role) {
      kernels::KvTile tile{tiles.data() + (2 * h + role) * tile_bytes, static_cast<int>(T)};
      for (int64_t t = 0; t < T; ++t) {
        const float* x = (role == 0 ? k : v) + (t * nkv + h) * d;
        MOE_RETURN_IF_ERROR(codecs[2 * h + role].Quantize(x, tile, static_cast<int>(t)));
      }
    }
  }
  const int group = nh / nkv;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  probs->assign(T * nh, {});
  out->assign(T * nh * d, 0.f);
  std::vector<float> qp, acc(d);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / group;
      const kernels::KvCodec& kc = codecs[2 * kvh];
      const kernels::KvCodec& vc = codecs[2 * kvh + 1];
      qp.resize(kc.query_floats());
      kc.PrepareQuery(q + (t * nh + h) * d, qp.data());
      std::vector<float>& p = (*probs)[t * nh + h];
      p.resize(t + 1);
      kc.Score(qp.data(), {tiles.data() + 2 * kvh * tile_bytes, static_cast<int>(T)}, 0,
               static_cast<int>(t + 1), scale, p.data());
      const float mx = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (float& x : p) sum += (x = std::exp(x - mx));
      for (float& x : p) x = static_cast<float>(x / sum);
      std::fill(acc.begin(), acc.end(), 0.f);
      vc.AccumulateValues(p.data(), {tiles.data() + (2 * kvh + 1) * tile_bytes, static_cast<int>(T)},
                          0, static_cast<int>(t + 1), acc.data());
      vc.FinishValues(acc.data(), out->data() + (t * nh + h) * d);
    }
  }
  return absl::OkStatus();
}

double Kl(const float* p, const float* q, int64_t n) {
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] > 0) kl += p[i] * (std::log(double(p[i])) - std::log(std::max(double(q[i]), 1e-30)));
  }
  return std::max(kl, 0.0);
}

std::vector<double> Softmax(const float* logits, int64_t n) {
  const float mx = *std::max_element(logits, logits + n);
  std::vector<double> p(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (p[i] = std::exp(double(logits[i]) - mx));
  for (double& x : p) x /= sum;
  return p;
}

}  // namespace

absl::StatusOr<AttentionQuality> MeasureAttention(kernels::KvFormat format, const float* q,
                                                  const float* k, const float* v, int64_t T,
                                                  int nh, int nkv, int d, int layer) {
  std::vector<std::vector<float>> p_ref, p_fmt;
  std::vector<float> o_ref, o_fmt;
  MOE_RETURN_IF_ERROR(Attend(kernels::KvFormat::kBf16, q, k, v, T, nh, nkv, d, layer, &p_ref, &o_ref));
  MOE_RETURN_IF_ERROR(Attend(format, q, k, v, T, nh, nkv, d, layer, &p_fmt, &o_fmt));
  AttentionQuality r;
  for (int64_t i = 0; i < T * nh; ++i) {
    double err = 0, ref = 0;
    for (int j = 0; j < d; ++j) {
      const double a = o_ref[i * d + j], b = o_fmt[i * d + j];
      err += (a - b) * (a - b);
      ref += a * a;
    }
    r.rel_l2 += ref > 0 ? std::sqrt(err / ref) : 0;
    r.kl += Kl(p_ref[i].data(), p_fmt[i].data(), static_cast<int64_t>(p_ref[i].size()));
    ++r.samples;
  }
  r.rel_l2 /= r.samples;
  r.kl /= r.samples;
  return r;
}

absl::StatusOr<std::vector<LayerQkv>> CaptureQkv(engine::Model& model,
                                                const std::vector<int32_t>& tokens) {
  const engine::ModelConfig& c = model.config();
  std::vector<LayerQkv> layers(c.num_hidden_layers);
  model.set_attention_observer([&](int64_t l, const float* q, const float* k, const float* v,
                                   int64_t T) {
    LayerQkv& x = layers[l];
    x.T = T;
    x.q.assign(q, q + T * c.num_attention_heads * c.head_dim);
    x.k.assign(k, k + T * c.num_key_value_heads * c.head_dim);
    x.v.assign(v, v + T * c.num_key_value_heads * c.head_dim);
  });
  MOE_ASSIGN_OR_RETURN(auto kv, engine::SequenceKv::Create(c, model.backend(),
                                                           static_cast<int64_t>(tokens.size())));
  engine::ForwardItem item;
  item.tokens = tokens;
  item.kv = kv.get();
  std::vector<float> logits;
  const absl::Status st = model.Forward({&item, 1}, false, &logits);
  model.set_attention_observer(nullptr);
  MOE_RETURN_IF_ERROR(st);
  return layers;
}

absl::StatusOr<NextTokenQuality> MeasureNextToken(engine::Model& model, kernels::KvFormat format,
                                                  const std::vector<int32_t>& prompt, int steps,
                                                  int tail_tokens) {
  const engine::ModelConfig& c = model.config();
  const int bs = 16;
  const int64_t total = static_cast<int64_t>(prompt.size()) + steps;
  const int32_t blocks = static_cast<int32_t>((total + bs - 1) / bs);
  MOE_ASSIGN_OR_RETURN(auto ref_kv, engine::PagedKv::Create(c, model.backend(), kernels::KvFormat::kBf16,
                                                            bs, blocks));
  MOE_ASSIGN_OR_RETURN(
      auto fmt_kv, engine::PagedKv::Create(c, model.backend(), format, bs, blocks, tail_tokens));
  // Each run's state (a hybrid's layers; the format's tail rings after it), zeroed.
  const int64_t ref_bytes = model.state_bytes();
  const int64_t fmt_bytes = ref_bytes + engine::PagedKv::TailBytes(c, tail_tokens);
  MOE_ASSIGN_OR_RETURN(
      kernels::Buffer ref_state,
      model.backend().Allocate(static_cast<size_t>(std::max<int64_t>(ref_bytes, 4))));
  MOE_ASSIGN_OR_RETURN(
      kernels::Buffer fmt_state,
      model.backend().Allocate(static_cast<size_t>(std::max<int64_t>(fmt_bytes, 4))));
  model.backend().Zero(ref_state.data(), static_cast<size_t>(std::max<int64_t>(ref_bytes, 4)));
  model.backend().Zero(fmt_state.data(), static_cast<size_t>(std::max<int64_t>(fmt_bytes, 4)));
  std::vector<int32_t> table(blocks);
  for (int32_t i = 0; i < blocks; ++i) table[i] = i;
  const int64_t V = c.vocab_size;
  NextTokenQuality r;
  std::vector<int32_t> input = prompt;
  int64_t pos = 0;
  for (int step = 0; step <= steps; ++step) {
    std::vector<float> lr, lf;
    engine::ForwardItem a;
    a.tokens = input;
    a.paged = ref_kv.get();
    a.block_table = table;
    a.start = pos;
    a.state = static_cast<float*>(ref_state.data());
    engine::ForwardItem b = a;
    b.paged = fmt_kv.get();
    b.state = static_cast<float*>(fmt_state.data());
    MOE_RETURN_IF_ERROR(model.Forward({&a, 1}, false, &lr));
    MOE_RETURN_IF_ERROR(model.Forward({&b, 1}, false, &lf));
    pos += static_cast<int64_t>(input.size());
    const std::vector<double> pr = Softmax(lr.data(), V), pf = Softmax(lf.data(), V);
    double kl = 0;
    for (int64_t i = 0; i < V; ++i) kl += pr[i] * (std::log(pr[i]) - std::log(std::max(pf[i], 1e-300)));
    kl = std::max(kl, 0.0);
    const int32_t greedy = static_cast<int32_t>(std::max_element(lr.begin(), lr.end()) - lr.begin());
    const int32_t other = static_cast<int32_t>(std::max_element(lf.begin(), lf.end()) - lf.begin());
    r.mean_kl += kl;
    r.max_kl = std::max(r.max_kl, kl);
    r.agreement += greedy == other ? 1 : 0;
    ++r.positions;
    input = {greedy};
  }
  r.mean_kl /= r.positions;
  r.agreement /= r.positions;
  return r;
}

}  // namespace moe::bench
