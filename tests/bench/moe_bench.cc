// Long file (~1,000 lines) on purpose: one tool and its flags; synthetic model, runs and report.
// moe-bench: the whole forward pass (engine::Model::Forward) on a synthetic model with the shape of
// Qwen3-30B-A3B: 48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts, top-8, expert
// width 768, vocabulary 151936 (--shape=qwen3.5-35b-a3b: the hybrid, 40 layers of which every
// fourth is gated full attention (16 / 2 heads of 256) and the others GatedDeltaNet (16 key / 32
// value heads of 128), 256 experts top-8 of width 512 and a shared expert, vocabulary 248320;
// --shape=qwen3.5-397b-a17b: its layer shape, hidden 4096, 512 experts top-10 of 1024, reported
// per layer, with --layers small enough to fit; --shape=lfm2-8b-a1b: 24 layers, 18 short-conv
// and 6 attention (32 / 8 heads of 64), the first 2 dense, 32 experts top-4 of 1792 with
// expert-bias routing, vocabulary 65536, tied). Dense weights bf16 (random) or, with
// --dense_format / --lm_head_format int8|int4|fp8, quantized by moe-import's dense writer (routers
// and the embedding stay bf16); experts --expert_format (int4 default, int8, or fp8) group --group
// 64 (random codes, scales and offsets; fp8: e4m3 codes, fp32 scales, --group=128 as published).
//
// The generator (WriteSyntheticModel) writes config.json + model.safetensors with the dense
// weights only; the experts never touch the disk: ResidentInt4Provider (an ExpertProvider) puts
// every expert in backend memory as one quantized blob (gate | up | down, kernels/quant.h
// layout), its bytes copied from a few distinct random templates (the contents only need to be
// non-zero and finite for timing). 6144 experts x 2.65 MB = 16.3 GB of VRAM.
//
// Prints, with the given backend (cuda on the GPU machine; cpu with small --layers/--experts/
// --vocab for a smoke test): decode tokens/s at batch 1 and context --context, the bytes a token
// must read (derived below), the measured device-to-device copy bandwidth and the achieved
// fraction of it, the roofline tokens/s; time to first token for each --prompt length against
// the FLOP roofline (--peak_tflops); throughput at --batches concurrent sequences (one Forward
// with one ForwardItem per sequence) against the step's byte roofline (DecodeStepBytes);
// every step samples its tokens greedily on the backend (Model::ForwardSample), as the engine
// does. Also Backend::Sample alone (greedy, top-k, top-p, a draw over the whole vocabulary; batch
// 1 and 64) next to what copying the logits to the host for host-side sampling cost.
// Every run uses the engine's paged KV cache (--kv_cache_dtype, block 16, each sequence its own
// blocks); the batched runs start from random keys/values at positions [0, context) (FillRandom).
// --kv_formats adds the KV sweep: decode tokens/s per cache format at --kv_contexts x
// --kv_batches, the bytes moved per step against the measured copy bandwidth, points whose cache
// exceeds --kv_budget_gb reported as not fitting, and the context tokens each format fits in it;
// --kv_repeats runs every point that many times, in interleaved rounds, and reports the median.
// --timings adds engine::PhaseTimes per layer and per token (host clock: on CUDA the phases
// that do not synchronize measure launch time, not GPU time; expert wait is where the step
// synchronizes).
//
// Last, the offload runs: the same experts written as a real expert store (--store_dir:
// blobs/000001.blob in the blob format of expertstore/blob_format.h, indexed by BlobIndex, the
// store's own on-disk contract), opened by ExpertStore with the device budget at each of
// --store_vram_percents of the experts under each of --store_policies, and every expert in the
// host tier (pinned memory from Backend::AllocateHost). A 512-token prefill loads most experts
// from disk into the host tier and one Acquire of every expert the rest; then decode steps of
// each of --store_batches sequences (1: after that prefill; more: random KV at --context, as the
// batched runs) are timed and compared with their PCIe bound: the bytes that crossed PCIe
// (experts the steps read in place from the host tier, StoreStats::host_reads, plus what the
// store copied up into the device tier, its bytes in) / 52 GB/s + the all-resident step time
// of the same batch.
//
// --serve_dir=DIR runs nothing: it writes a model store moe-worker and moe-generate serve (the
// experts as --store_dir has them, config.json, dense.safetensors and manifest.json by
// moe-import's writer, the default model's tokenizer) and exits; tests/bench/
// service_store_bench.sh serves it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/default_model.h"
#include "engine/kv_storage.h"
#include "engine/model.h"
#include "engine/store_import.h"
#include "expertstore/blob_format.h"
#include "expertstore/blob_index.h"
#include "expertstore/dense_writer.h"
#include "expertstore/expert_provider.h"
#include "expertstore/expert_store.h"
#include "expertstore/policy.h"
#include "expertstore/safetensors.h"
#include "kernels/backend.h"
#include "kernels/base/flags.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, "/tmp/moe_bench_model", "Where the synthetic dense model goes");
ABSL_FLAG(std::string, backend, "cuda", "cuda or cpu");
ABSL_FLAG(std::string, shape, "qwen3-30b-a3b",
          "Model shape: qwen3-30b-a3b, qwen3.5-35b-a3b (hybrid: GatedDeltaNet + gated "
          "attention), qwen3.5-397b-a17b (its layer shape; take few --layers to fit) or "
          "lfm2-8b-a1b (short conv + attention)");
ABSL_FLAG(int64_t, layers, 0, "Layers (0: the shape's; Qwen3-30B-A3B 48, Qwen3.5-35B-A3B 40)");
ABSL_FLAG(int64_t, experts, 0, "Experts per layer (0: the shape's)");
ABSL_FLAG(int64_t, vocab, 0, "Vocabulary (0: the shape's)");
ABSL_FLAG(int32_t, group, 64, "Group size of the quantized weights (experts and dense)");
ABSL_FLAG(std::string, expert_format, "int4", "Format of the experts: int4, int8 or fp8");
ABSL_FLAG(std::string, dense_format, "bf16",
          "Format of the dense matrices (attention, shared expert, dense MLP; as moe-import "
          "--dense_format: routers and the embedding stay bf16): bf16, int8, int4 or fp8 (e4m3, "
          "an fp32 scale per --group)");
ABSL_FLAG(std::string, lm_head_format, "", "Format of the lm head. Default: --dense_format");
ABSL_FLAG(int64_t, context, 512, "Context of the batch-1 decode and the batched runs");
ABSL_FLAG(std::string, decode_contexts, "",
          "Contexts of the batch-1 decode, e.g. 512,4096 (one model for all). Default: --context");
ABSL_FLAG(std::string, prompt, "512,2048", "Prompt lengths of the time-to-first-token runs");
ABSL_FLAG(double, peak_tflops, 989,
          "Dense bf16 tensor-core peak for the prefill FLOP roofline (H100/H200 SXM datasheet)");
ABSL_FLAG(int64_t, steps, 32, "Timed decode steps at batch 1");
ABSL_FLAG(std::string, batches, "8,32,64,128,256", "Concurrent sequences of the throughput runs");
ABSL_FLAG(int64_t, batch_steps, 8, "Timed decode steps per throughput run");
ABSL_FLAG(bool, timings, false, "Print engine::PhaseTimes per layer and per token");
ABSL_FLAG(std::string, store_dir, "/tmp/moe_bench_store",
          "Where the expert store of the offload runs is written (empty: skip them)");
ABSL_FLAG(std::string, serve_dir, "",
          "Write a model store of the shape that moe-worker --model=DIR serves (the experts as "
          "--store_dir has them, config.json, dense.safetensors, manifest.json, and a tokenizer "
          "of ~1,000 tokens: ids past it decode to no text), then exit without running anything");
ABSL_FLAG(int64_t, store_steps, 32, "Timed decode steps of each offload run");
ABSL_FLAG(std::string, store_vram_percents, "25",
          "Offload runs: shares of the experts in VRAM, in %, comma-separated");
ABSL_FLAG(std::string, store_policies, "next_use",
          "Offload runs: the device tier's eviction policies to compare, comma-separated");
ABSL_FLAG(std::string, store_batches, "1",
          "Offload runs: concurrent sequences at context --context (each also in --batches, "
          "whose all-resident step is the bound's compute part; 1 is always measured)");
ABSL_FLAG(bool, store_prefetch, false,
          "Offload runs: prefetch each next layer's likely experts (the worker's --prefetch)");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16", "KV cache format of the runs above (paged, block 16)");
ABSL_FLAG(int32_t, kv_tail_tokens, 0,
          "16-bit KV tail of every run's cache (engine/paged_kv.h): each "
          "sequence's newest this many keys/values also in bf16; 0: none");
ABSL_FLAG(std::string, kv_formats, "",
          "KV sweep: formats to time at --kv_contexts x --kv_batches, e.g. "
          "bf16,fp8_e4m3,tq4,tq3,tq2 (empty: no sweep)");
ABSL_FLAG(std::string, kv_contexts, "1024,8192,32768", "Contexts of the KV sweep");
ABSL_FLAG(std::string, kv_batches, "1,64", "Concurrent sequences of the KV sweep");
ABSL_FLAG(int64_t, kv_steps, 4, "Timed decode steps per KV sweep point");
ABSL_FLAG(double, kv_budget_gb, 100,
          "KV cache budget of the sweep (GB): a point whose cache does not fit is reported so");
ABSL_FLAG(int64_t, kv_repeats, 1,
          "KV sweep rounds: every point runs once a round, rounds in turn; rows report the "
          "median round");
ABSL_FLAG(bool, kv_only, false, "Run only the KV sweep");

namespace moe {
namespace {

using json = nlohmann::json;
using kernels::DType;

// The model shapes: Qwen3-30B-A3B, and the hybrids of architectures.md §1.2 (every
// full_attention_interval-th layer gated full attention with partial RoPE, the others
// GatedDeltaNet; a shared expert).
struct Shape {
  const char* name;
  int64_t hidden, heads, kv_heads, head_dim, top_k, expert_width, layers, experts, vocab;
  int64_t shared_width = 0;  // the hybrids' shared expert
  int64_t linear_k_heads = 0, linear_v_heads = 0, linear_head_dim = 0;  // 0: no linear layers
  int64_t conv_width = 0, dense_layers = 0, dense_width = 0;  // LFM2: short-conv layers
  bool hybrid() const { return linear_k_heads > 0; }
  bool lfm2() const { return conv_width > 0; }
};
constexpr Shape kShapes[] = {
    {"qwen3-30b-a3b", 2048, 32, 4, 128, 8, 768, 48, 128, 151936},
    {"qwen3.5-35b-a3b", 2048, 16, 2, 256, 8, 512, 40, 256, 248320, 512, 16, 32, 128},
    {"qwen3.5-397b-a17b", 4096, 32, 2, 256, 10, 1024, 60, 512, 248320, 1024, 16, 64, 128},
    {"lfm2-8b-a1b", 2048, 32, 8, 64, 4, 1792, 24, 32, 65536, 0, 0, 0, 0, 3, 2, 7168},
};
const Shape* FindShape(const std::string& name) {
  for (const Shape& shape : kShapes) {
    if (name == shape.name) return &shape;
  }
  return nullptr;
}
// The --shape in use (checked by CheckFlags), and its sizes unless the flags override them.
const Shape& BenchShape() { return *FindShape(absl::GetFlag(FLAGS_shape)); }
int64_t Layers() {
  const int64_t n = absl::GetFlag(FLAGS_layers);
  return n > 0 ? n : BenchShape().layers;
}
int64_t Experts() {
  const int64_t n = absl::GetFlag(FLAGS_experts);
  return n > 0 ? n : BenchShape().experts;
}
int64_t Vocab() {
  const int64_t n = absl::GetFlag(FLAGS_vocab);
  return n > 0 ? n : BenchShape().vocab;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// xorshift64*: fast enough to fill 1.5 G bf16 values in seconds.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.f / 16777216.f); }  // [0, 1)
};

// The weight formats of the flags (CheckFlags has validated them).
DType ExpertFormat() { return *kernels::ParseWeightFormat(absl::GetFlag(FLAGS_expert_format)); }
DType DenseFormat() { return *kernels::ParseWeightFormat(absl::GetFlag(FLAGS_dense_format)); }
DType LmHeadFormat() {
  const std::string f = absl::GetFlag(FLAGS_lm_head_format);
  return f.empty() ? DenseFormat() : *kernels::ParseWeightFormat(f);
}
// Bytes of a dense [rows, cols] matrix in `format` (bf16 or quantized with --group).
double MatrixBytes(DType format, double rows, double cols) {
  if (!kernels::IsQuantized(format)) return 2 * rows * cols;
  return static_cast<double>(kernels::QuantizedBytes(
      format, static_cast<int64_t>(rows), static_cast<int64_t>(cols), absl::GetFlag(FLAGS_group)));
}

// The model id of a store written here (its index and manifest.json; moe-worker's model name).
std::string StoreModelId() { return absl::StrCat("moe-bench-", BenchShape().name); }

// The synthetic dense weights, bf16, uniform in [mean - half, mean + half) (std half / sqrt(3)),
// written with config.json into a model directory.
class SyntheticTensors {
 public:
  void Add(const std::string& name, std::vector<int64_t> shape, float half, float mean) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& data = storage_.emplace_back(n);
    for (auto& v : data) v = kernels::F32ToBf16(mean + half * (2.f * rng_.Uniform() - 1.f));
    tensors_.push_back({name, DType::kBF16, std::move(shape), nullptr});
  }
  // With quantized --dense_format/--lm_head_format the bf16 tensors go through moe-import's
  // dense writer (the same choice of tensors and the same bytes as an imported store); for a
  // model store (`store`: --serve_dir) always, into dense.safetensors, and manifest.json last.
  absl::Status Write(const std::string& dir, const json& config, bool store) {
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].data = storage_[i].data();
    const std::filesystem::path out = std::filesystem::path(dir) / "model.safetensors";
    std::ofstream(std::filesystem::path(dir) / "config.json") << config.dump(2);
    if (!store && DenseFormat() == DType::kBF16 && LmHeadFormat() == DType::kBF16) {
      return store::WriteSafetensors(out.string(), tensors_);
    }
    const std::filesystem::path bf16 = std::filesystem::path(dir) / "bf16";
    std::filesystem::create_directories(bf16);
    MOE_RETURN_IF_ERROR(store::WriteSafetensors((bf16 / "model.safetensors").string(), tensors_));
    std::filesystem::copy_file(std::filesystem::path(dir) / "config.json", bf16 / "config.json",
                               std::filesystem::copy_options::overwrite_existing);
    MOE_ASSIGN_OR_RETURN(const engine::ModelConfig c, engine::LoadModelConfig(bf16.string()));
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<store::Checkpoint> ckpt,
                         store::Checkpoint::Open(bf16.string()));
    MOE_ASSIGN_OR_RETURN(store::ImportOptions o, engine::ImportOptionsFor(c, *ckpt));
    o.model = store ? StoreModelId() : "moe-bench";
    o.format = ExpertFormat();  // the manifest's; the experts are written by WriteSyntheticStore
    o.dense_format = DenseFormat();
    o.lm_head_format = LmHeadFormat();
    o.group_size = absl::GetFlag(FLAGS_group);
    MOE_RETURN_IF_ERROR(store ? store::WriteDenseAndManifest(*ckpt, dir, o)
                              : store::WriteDenseSafetensors(*ckpt, out.string(), o));
    std::filesystem::remove_all(bf16);
    return absl::OkStatus();
  }

 private:
  Rng rng_{0x9e3779b97f4a7c15ull};
  std::vector<std::vector<uint16_t>> storage_;
  std::vector<store::TensorToWrite> tensors_;
};

// LFM2-8B-A1B's layout (architectures.md §3): short-conv layers but at 2, 6, 10, 14, 18, 21
// (l % 4 == 2 past 24), the first dense_layers layers dense, expert-bias routing, tied embeddings.
absl::Status WriteSyntheticLfm2(const std::string& dir, int64_t layers, int64_t experts,
                                int64_t vocab, bool store) {
  const Shape& S = BenchShape();
  const int64_t H = S.hidden, D = S.head_dim, q_dim = S.heads * D, kv_dim = S.kv_heads * D;
  json types = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    const bool full = l < 24 ? (l == 2 || l == 6 || l == 10 || l == 14 || l == 18 || l == 21)
                             : l % 4 == 2;
    types.push_back(full ? "full_attention" : "conv");
  }
  const json config = {
      {"architectures", {"Lfm2MoeForCausalLM"}},
      {"model_type", "lfm2_moe"},
      {"vocab_size", vocab},
      {"hidden_size", H},
      {"num_hidden_layers", layers},
      {"layer_types", types},
      {"num_attention_heads", S.heads},
      {"num_key_value_heads", S.kv_heads},
      {"intermediate_size", S.dense_width},
      {"moe_intermediate_size", S.expert_width},
      {"num_experts", experts},
      {"num_experts_per_tok", S.top_k},
      {"num_dense_layers", S.dense_layers},
      {"conv_L_cache", S.conv_width},
      {"conv_bias", false},
      {"use_expert_bias", true},
      {"routed_scaling_factor", 1.0},
      {"norm_topk_prob", true},
      {"norm_eps", 1e-5},
      {"max_position_embeddings", 128000},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
      {"tie_word_embeddings", true},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"torch_dtype", "bfloat16"},
  };
  SyntheticTensors t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float half, float mean) {
    t.Add(name, std::move(shape), half, mean);
  };
  add("model.embed_tokens.weight", {vocab, H}, 0.5f, 0.f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "operator_norm.weight", {H}, 0.05f, 1.f);
    add(p + "ffn_norm.weight", {H}, 0.05f, 1.f);
    if (types[l] == "conv") {
      add(p + "conv.in_proj.weight", {3 * H, H}, 0.035f, 0.f);
      add(p + "conv.conv.weight", {H, 1, S.conv_width}, 0.3f, 0.f);
      add(p + "conv.out_proj.weight", {H, H}, 0.035f, 0.f);
    } else {
      add(p + "self_attn.q_proj.weight", {q_dim, H}, 0.035f, 0.f);
      add(p + "self_attn.k_proj.weight", {kv_dim, H}, 0.035f, 0.f);
      add(p + "self_attn.v_proj.weight", {kv_dim, H}, 0.035f, 0.f);
      add(p + "self_attn.out_proj.weight", {H, q_dim}, 0.035f, 0.f);
      add(p + "self_attn.q_layernorm.weight", {D}, 0.05f, 1.f);
      add(p + "self_attn.k_layernorm.weight", {D}, 0.05f, 1.f);
    }
    if (l < S.dense_layers) {
      add(p + "feed_forward.w1.weight", {S.dense_width, H}, 0.035f, 0.f);
      add(p + "feed_forward.w3.weight", {S.dense_width, H}, 0.035f, 0.f);
      add(p + "feed_forward.w2.weight", {H, S.dense_width}, 0.035f, 0.f);
    } else {
      add(p + "feed_forward.gate.weight", {experts, H}, 0.3f, 0.f);
      add(p + "feed_forward.expert_bias", {experts}, 0.5f, 0.f);
    }
  }
  add("model.embedding_norm.weight", {H}, 0.05f, 1.f);
  return t.Write(dir, config, store);
}

// config.json and the dense weights of the synthetic model: model.safetensors, or with `store`
// dense.safetensors and manifest.json (SyntheticTensors::Write).
absl::Status WriteSyntheticModel(const std::string& dir, int64_t layers, int64_t experts,
                                 int64_t vocab, bool store = false) {
  std::filesystem::create_directories(dir);
  const Shape& S = BenchShape();
  if (S.lfm2()) return WriteSyntheticLfm2(dir, layers, experts, vocab, store);
  const int64_t H = S.hidden, D = S.head_dim, q_dim = S.heads * D, kv_dim = S.kv_heads * D;
  json config = {
      {"architectures", {"Qwen3MoeForCausalLM"}},
      {"model_type", "qwen3_moe"},
      {"vocab_size", vocab},
      {"hidden_size", H},
      {"num_hidden_layers", layers},
      {"num_attention_heads", S.heads},
      {"num_key_value_heads", S.kv_heads},
      {"head_dim", D},
      {"intermediate_size", 6144},
      {"moe_intermediate_size", S.expert_width},
      {"num_experts", experts},
      {"num_experts_per_tok", S.top_k},
      {"norm_topk_prob", true},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", json::array()},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 40960},
      {"rope_theta", 1000000.0},
      {"tie_word_embeddings", false},
      {"attention_bias", false},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"torch_dtype", "bfloat16"},
  };
  const int64_t NK = S.linear_k_heads, NV = S.linear_v_heads, DL = S.linear_head_dim;
  const int64_t C = 2 * NK * DL + NV * DL;
  if (S.hybrid()) {
    config["architectures"] = {"Qwen3_5MoeForCausalLM"};
    config["model_type"] = "qwen3_5_moe_text";
    config["full_attention_interval"] = 4;
    config["linear_num_key_heads"] = NK;
    config["linear_num_value_heads"] = NV;
    config["linear_key_head_dim"] = DL;
    config["linear_value_head_dim"] = DL;
    config["linear_conv_kernel_dim"] = 4;
    config["shared_expert_intermediate_size"] = S.shared_width;
    config["rope_parameters"] = {
        {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
    config["max_position_embeddings"] = 262144;
  }
  SyntheticTensors t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float half, float mean) {
    t.Add(name, std::move(shape), half, mean);
  };
  // The hybrids' norms scale by 1 + w: w near 0 there.
  const float norm = S.hybrid() ? 0.f : 1.f;
  add("model.embed_tokens.weight", {vocab, H}, 0.5f, 0.f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {H}, 0.05f, norm);
    add(p + "post_attention_layernorm.weight", {H}, 0.05f, norm);
    add(p + "mlp.gate.weight", {experts, H}, 0.3f, 0.f);  // sharp enough to spread the routing
    if (S.hybrid()) {
      const int64_t SI = S.shared_width;
      add(p + "mlp.shared_expert.gate_proj.weight", {SI, H}, 0.035f, 0.f);
      add(p + "mlp.shared_expert.up_proj.weight", {SI, H}, 0.035f, 0.f);
      add(p + "mlp.shared_expert.down_proj.weight", {H, SI}, 0.035f, 0.f);
      add(p + "mlp.shared_expert_gate.weight", {1, H}, 0.035f, 0.f);
    }
    if (S.hybrid() && (l + 1) % 4 != 0) {
      const std::string a = p + "linear_attn.";
      add(a + "in_proj_qkv.weight", {C, H}, 0.035f, 0.f);
      add(a + "in_proj_z.weight", {NV * DL, H}, 0.035f, 0.f);
      add(a + "in_proj_b.weight", {NV, H}, 0.035f, 0.f);
      add(a + "in_proj_a.weight", {NV, H}, 0.035f, 0.f);
      add(a + "conv1d.weight", {C, 1, 4}, 0.3f, 0.f);
      add(a + "A_log", {NV}, 0.5f, 0.7f);
      add(a + "dt_bias", {NV}, 0.5f, 0.f);
      add(a + "norm.weight", {DL}, 0.05f, 1.f);
      add(a + "out_proj.weight", {H, NV * DL}, 0.035f, 0.f);
      continue;
    }
    // The hybrids' q_proj holds each head's query and output gate.
    add(p + "self_attn.q_proj.weight", {(S.hybrid() ? 2 : 1) * q_dim, H}, 0.035f, 0.f);
    add(p + "self_attn.k_proj.weight", {kv_dim, H}, 0.035f, 0.f);
    add(p + "self_attn.v_proj.weight", {kv_dim, H}, 0.035f, 0.f);
    add(p + "self_attn.o_proj.weight", {H, q_dim}, 0.035f, 0.f);
    add(p + "self_attn.q_norm.weight", {D}, 0.05f, norm);
    add(p + "self_attn.k_norm.weight", {D}, 0.05f, norm);
  }
  add("model.norm.weight", {H}, 0.05f, norm);
  add("lm_head.weight", {vocab, H}, 0.035f, 0.f);
  return t.Write(dir, config, store);
}

// A few distinct random experts in --expert_format, each gate | up | down packed (each part a
// multiple of 16 bytes at these shapes): codes uniform, w ~ U(-0.03, 0.03) (int4: s ~ 0.004,
// m = -7.5 s).
struct ExpertTemplates {
  size_t gate_bytes = 0, down_bytes = 0;
  std::vector<std::vector<uint8_t>> blobs;
  const std::vector<uint8_t>& For(int64_t layer, int64_t expert) const {
    return blobs[static_cast<size_t>(layer * 7 + expert) % blobs.size()];
  }
};

ExpertTemplates MakeTemplates(int32_t group) {
  const int64_t H = BenchShape().hidden, I = BenchShape().expert_width;
  const DType f = ExpertFormat();
  const float levels = static_cast<float>((1 << kernels::QuantBits(f)) - 1);  // 15 for int4
  ExpertTemplates t;
  t.gate_bytes = kernels::QuantizedBytes(f, I, H, group);
  t.down_bytes = kernels::QuantizedBytes(f, H, I, group);
  Rng rng{12345};
  auto fill = [&](uint8_t* dst, int64_t rows, int64_t cols) {
    const size_t off = static_cast<size_t>(kernels::QuantParamsOffset(f, rows, cols));
    for (size_t i = 0; i < off; ++i) dst[i] = static_cast<uint8_t>(rng.Next() >> 56);
    const int64_t pairs = rows * kernels::QuantGroups(cols, group);
    if (f == DType::kF8) {  // e4m3 codes without the NaNs, fp32 scales: |w| < 0.03 x 2
      for (size_t i = 0; i < off; ++i) dst[i] = (dst[i] & 0x7f) == 0x7f ? dst[i] ^ 1 : dst[i];
      for (int64_t i = 0; i < pairs; ++i) {
        const float s = (1.f + rng.Uniform()) * 0.03f / 448.f;
        std::memcpy(dst + off + 4 * i, &s, 4);
      }
      return;
    }
    for (int64_t i = 0; i < pairs; ++i) {
      const float s = (0.003f + 0.002f * rng.Uniform()) * 15.f / levels;
      const uint16_t sm[2] = {kernels::F32ToF16(s), kernels::F32ToF16(-levels / 2 * s)};
      std::memcpy(dst + off + 4 * i, sm, 4);
    }
  };
  t.blobs.resize(8);
  for (auto& b : t.blobs) {
    b.resize(2 * t.gate_bytes + t.down_bytes);
    fill(b.data(), I, H);
    fill(b.data() + t.gate_bytes, I, H);
    fill(b.data() + 2 * t.gate_bytes, H, I);
  }
  return t;
}

// The experts as an expert store directory: one blob file, every blob in the store's format
// (header, gate/up/down at ComputeBlobLayout's offsets, XXH3 checksum), indexed by BlobIndex.
// Returns one blob's length (the store's slot size).
absl::StatusOr<uint64_t> WriteSyntheticStore(const std::string& dir, int64_t layers,
                                             int64_t experts, int32_t group,
                                             const ExpertTemplates& t) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(std::filesystem::path(dir) / "blobs");
  const store::BlobLayout L = store::ComputeBlobLayout(ExpertFormat(), group, BenchShape().hidden,
                                                       BenchShape().expert_width);
  const std::string file = "blobs/000001.blob";
  std::ofstream out(std::filesystem::path(dir) / file, std::ios::binary);
  std::vector<uint8_t> blob(L.length);
  std::vector<store::BlobLocation> entries;
  uint64_t offset = 0;
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t e = 0; e < experts; ++e) {
      std::fill(blob.begin(), blob.end(), uint8_t{0});
      store::BlobHeader h{};
      std::memcpy(h.magic, store::kBlobMagic, sizeof(h.magic));
      h.version = store::kStoreFormatVersion;
      h.layer = static_cast<int32_t>(l);
      h.expert = static_cast<int32_t>(e);
      std::memcpy(blob.data(), &h, sizeof(h));
      const std::vector<uint8_t>& src = t.For(l, e);
      std::memcpy(blob.data() + L.gate_offset, src.data(), t.gate_bytes);
      std::memcpy(blob.data() + L.up_offset, src.data() + t.gate_bytes, t.gate_bytes);
      std::memcpy(blob.data() + L.down_offset, src.data() + 2 * t.gate_bytes, t.down_bytes);
      store::BlobLocation loc;
      loc.layer = h.layer;
      loc.expert = h.expert;
      loc.file = file;
      loc.offset = offset;
      loc.length = L.length;
      loc.checksum = store::BlobChecksum(blob.data(), L.length);
      loc.dtype = ExpertFormat();
      loc.group_size = group;
      loc.hidden_size = BenchShape().hidden;
      loc.intermediate_size = BenchShape().expert_width;
      entries.push_back(loc);
      out.write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(L.length));
      offset += L.length;
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(dir, "/", file, ": write failed"));
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<store::BlobIndex> index,
                       store::BlobIndex::Open(dir + "/index", StoreModelId(), true));
  MOE_RETURN_IF_ERROR(index->Put(entries));
  return L.length;
}

// Every expert resident in backend memory, int4: one blob per expert (gate | up | down).
class ResidentInt4Provider final : public store::ExpertProvider {
 public:
  static absl::StatusOr<std::unique_ptr<ResidentInt4Provider>> Create(kernels::Backend& backend,
                                                                      int64_t layers,
                                                                      int64_t experts,
                                                                      int32_t group) {
    auto p = std::unique_ptr<ResidentInt4Provider>(new ResidentInt4Provider());
    const int64_t H = BenchShape().hidden, I = BenchShape().expert_width;
    const ExpertTemplates templates = MakeTemplates(group);
    const size_t gate = templates.gate_bytes;
    p->expert_bytes_ = 2 * gate + templates.down_bytes;
    std::promise<absl::Status> done;
    done.set_value(absl::OkStatus());
    p->ready_ = done.get_future().share();
    p->weights_.resize(layers);
    for (int64_t l = 0; l < layers; ++l) {
      MOE_ASSIGN_OR_RETURN(kernels::Buffer buf, backend.Allocate(experts * p->expert_bytes_));
      auto* base = static_cast<uint8_t*>(buf.data());
      for (int64_t e = 0; e < experts; ++e) {
        uint8_t* x = base + e * p->expert_bytes_;
        backend.CopyToDevice(x, templates.For(l, e).data(), p->expert_bytes_);
        const DType f = ExpertFormat();
        kernels::ExpertWeights w{kernels::View(x, f, {I, H}), kernels::View(x + gate, f, {I, H}),
                                 kernels::View(x + 2 * gate, f, {H, I})};
        w.gate.group_size = w.up.group_size = w.down.group_size = group;
        p->weights_[l].push_back(std::make_shared<const kernels::ExpertWeights>(w));
      }
      p->memory_.push_back(std::move(buf));
    }
    backend.Synchronize();
    return p;
  }

  absl::StatusOr<std::vector<store::ExpertHandle>> Acquire(
      int32_t layer, absl::Span<const int32_t> experts) override {
    if (layer < 0 || layer >= static_cast<int32_t>(weights_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
    }
    std::vector<store::ExpertHandle> out;
    out.reserve(experts.size());
    for (int32_t e : experts) {
      store::ExpertHandle h;
      h.layer = layer;
      h.expert = e;
      h.ready = ready_;
      if (e < 0 || e >= static_cast<int32_t>(weights_[layer].size())) {
        std::promise<absl::Status> bad;
        bad.set_value(absl::NotFoundError(absl::StrCat("expert ", e)));
        h.ready = bad.get_future().share();
      } else {
        h.weights = weights_[layer][e];
      }
      out.push_back(std::move(h));
    }
    return out;
  }

  std::vector<kernels::ExpertWeights> ResidentLayer(int32_t layer) const override {
    std::vector<kernels::ExpertWeights> views;
    for (const auto& w : weights_[layer]) views.push_back(*w);
    return views;
  }

  size_t expert_bytes() const { return expert_bytes_; }

 private:
  ResidentInt4Provider() = default;
  size_t expert_bytes_ = 0;
  std::shared_future<absl::Status> ready_;
  std::vector<kernels::Buffer> memory_;
  std::vector<std::vector<std::shared_ptr<const kernels::ExpertWeights>>> weights_;
};

// Bytes one decode token at context `ctx` must read, the fewest the step can move:
//   per full-attention layer: q/k/v/o projections (bf16: 2 * (q_dim*H + 2*kv_dim*H + H*q_dim);
//   the hybrids' q_proj has q_dim more rows, the output gate) + q/k norms + the KV cache read
//   (ctx * the cache format's bytes per position and layer; bf16: 2 * NKV * D * 2);
//   per linear (GatedDeltaNet) layer: its projections (in_proj_qkv/z/b/a, out_proj, conv: bf16)
//   + its recurrent and conv state, read and written (fp32, StateBytes); per LFM2 short-conv
//   layer: in_proj [3H, H], out_proj [H, H] and the conv (bf16) + its conv state; a dense
//   layer's MLP in place of router and experts;
//   every layer: the two norms + the router (E*H bf16) + top-K experts (K * the int4 blob:
//   3 * (I*H/2 codes + I*H/G * 4 bytes of fp16 {s, m})) + the shared expert (bf16) if any;
//   once: the embedding row (H bf16), the final norm and the lm head (V*H bf16).
// Qwen3-30B-A3B, G 64, ctx 512, bf16 cache: 48 * (37.75 + 0.52 + 21.23 + 1.05) MB + 622.3 MB =
// 3.53 GB, so at 4.26 TB/s the roofline is ~1200 tokens/s. Activations (a few MB) are left out.
// A sequence's state in `layer` (GatedDeltaNet's or LFM2's short conv), read and written, fp32.
double StateBytes(const engine::ModelConfig& c, int64_t layer) {
  return 2.0 * 4 * static_cast<double>(c.StateFloats(layer));
}

// The weights of `layer`'s token mixer, and of its MLP but the routed experts, their matrices in
// `f` (bf16 or quantized: --dense_format; the router and vectors bf16).
double MixerWeightBytes(const engine::ModelConfig& c, int64_t layer, DType f) {
  const double H = static_cast<double>(c.hidden_size);
  if (c.IsLinearLayer(layer)) {
    const double C = static_cast<double>(c.LinearConvChannels());
    const double NV = static_cast<double>(c.linear_num_value_heads);
    const double v_dim = NV * static_cast<double>(c.linear_value_head_dim);
    return MatrixBytes(f, C, H) + MatrixBytes(f, v_dim, H) + 2 * MatrixBytes(f, NV, H) +
           MatrixBytes(f, H, v_dim) + 2 * C * static_cast<double>(c.linear_conv_kernel_dim);
  }
  if (c.IsConvLayer(layer)) {
    return MatrixBytes(f, 3 * H, H) + MatrixBytes(f, H, H) +
           2 * H * static_cast<double>(c.conv_L_cache);
  }
  const double q_dim = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv_dim = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double gate = c.arch.attention_output_gate ? q_dim : 0;
  return MatrixBytes(f, q_dim + gate, H) + 2 * MatrixBytes(f, kv_dim, H) +
         MatrixBytes(f, H, q_dim) + 2 * 2 * static_cast<double>(c.head_dim);
}
double MlpWeightBytes(const engine::ModelConfig& c, int64_t layer, DType f) {
  const double H = static_cast<double>(c.hidden_size);
  const double DI = static_cast<double>(c.intermediate_size);
  if (!c.IsSparseLayer(layer)) return 2 * MatrixBytes(f, DI, H) + MatrixBytes(f, H, DI);
  const double SI = static_cast<double>(c.shared_expert_intermediate_size);
  return 2 * static_cast<double>(c.num_experts) * H +
         (SI > 0 ? 2 * MatrixBytes(f, SI, H) + MatrixBytes(f, H, SI) + 2 * H : 0);
}

double BytesPerToken(const engine::ModelConfig& c, size_t expert_bytes, int64_t ctx,
                     double kv_bytes_per_position_layer) {
  const double H = static_cast<double>(c.hidden_size);
  // A tied lm head is the embedding, which stays bf16 (moe-import keeps the embedding's dtype).
  const DType lm_head = c.tie_word_embeddings ? DType::kBF16 : LmHeadFormat();
  double total = 2 * H * 2 + MatrixBytes(lm_head, static_cast<double>(c.vocab_size), H);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += 2 * 2 * H + MixerWeightBytes(c, l, DenseFormat()) +
             MlpWeightBytes(c, l, DenseFormat()) + StateBytes(c, l);
    if (c.KvLayerIndex(l) >= 0) total += static_cast<double>(ctx) * kv_bytes_per_position_layer;
    if (c.IsSparseLayer(l)) {
      total += static_cast<double>(c.num_experts_per_tok) * static_cast<double>(expert_bytes);
    }
  }
  return total;
}

// The bytes a decode step of B sequences at context ctx must read, by kind: the dense weights
// once (projections, norms, router, shared expert, lm head), each expert of a sparse layer's
// union once (the expected union of B tokens' top-K under uniform routing, E (1 - (1 - K/E)^B),
// which the synthetic model's random router approaches), every sequence's KV and state.
struct StepBytes {
  double dense = 0, experts = 0, kv = 0, union_per_layer = 0;
  double total() const { return dense + experts + kv; }
};
StepBytes DecodeStepBytes(const engine::ModelConfig& c, size_t expert_bytes, int64_t B,
                          int64_t ctx, double kv_bytes_per_position_layer) {
  const double E = static_cast<double>(c.num_experts), K = static_cast<double>(c.num_experts_per_tok);
  double sparse = 0, state = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    sparse += c.IsSparseLayer(l) ? 1 : 0;
    state += StateBytes(c, l);
  }
  StepBytes b;
  b.union_per_layer = E * (1 - std::pow(1 - K / E, static_cast<double>(B)));
  b.experts = sparse * b.union_per_layer * static_cast<double>(expert_bytes);
  b.kv = static_cast<double>(B) *
         (static_cast<double>(c.NumKvLayers() * ctx) * kv_bytes_per_position_layer + state);
  b.dense = BytesPerToken(c, expert_bytes, 0, 0) - sparse * K * static_cast<double>(expert_bytes) -
            state;
  return b;
}

// The matrix FLOPs of an n-token prefill: 2 per multiply-add of every projection a token runs
// (attention, GatedDeltaNet or the short conv, router and K experts or the dense MLP, the shared
// expert, lm head for the last token), causal attention's two products (2 * 2 * n^2 / 2 * NH * D
// per full layer) and the delta rule's (~ 3 DK x DV products a token and value head:
// decay-read, write, read-out).
double PrefillFlops(const engine::ModelConfig& c, int64_t expert_width, int64_t n) {
  const double H = static_cast<double>(c.hidden_size), N = static_cast<double>(n);
  const double q_dim = static_cast<double>(c.num_attention_heads * c.head_dim);
  double total = 2 * H * static_cast<double>(c.vocab_size);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    // bf16 weights: a token's FLOPs on them (2 a multiply-add) equal their bytes.
    total += N * (MixerWeightBytes(c, l, DType::kBF16) + MlpWeightBytes(c, l, DType::kBF16));
    if (c.IsSparseLayer(l)) {
      total += N * static_cast<double>(c.num_experts_per_tok) * 2 * 3 * H *
               static_cast<double>(expert_width);
    }
    if (c.IsLinearLayer(l)) {
      total += N * 2 * 3 * static_cast<double>(c.linear_key_head_dim) *
               static_cast<double>(c.linear_num_value_heads * c.linear_value_head_dim);
    } else if (c.KvLayerIndex(l) >= 0) {
      total += 2 * N * N * q_dim;
    }
  }
  return total;
}

// B sequences in one paged cache (block 16), each with its own blocks for `capacity` positions,
// as the engine's block manager would give them.
constexpr int kBlockSize = 16;
struct PagedSeqs {
  std::unique_ptr<engine::PagedKv> kv;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lengths;
  kernels::Buffer states;    // each sequence's state (a hybrid's layers, the KV tail), zeroed
  int64_t state_floats = 0;  // per sequence
  int64_t model_state_bytes = 0;
  float* state(size_t i) const {
    return state_floats > 0 ? states.f32() + i * state_floats : nullptr;
  }
  // Bytes one position takes in one layer (keys and values, all kv-heads).
  double BytesPerPositionLayer() const {
    return static_cast<double>(kv->storage().block_bytes()) / kBlockSize;
  }
};

absl::StatusOr<PagedSeqs> MakePagedSeqs(const engine::Model& model, kernels::Backend& backend,
                                        kernels::KvFormat format, int64_t B, int64_t capacity) {
  const engine::ModelConfig& c = model.config();
  const int64_t per_seq = (capacity + kBlockSize - 1) / kBlockSize;
  PagedSeqs s;
  const int tail = absl::GetFlag(FLAGS_kv_tail_tokens);
  MOE_ASSIGN_OR_RETURN(s.kv, engine::PagedKv::Create(c, backend, format, kBlockSize,
                                                     static_cast<int32_t>(B * per_seq), tail));
  for (int64_t i = 0; i < B; ++i) {
    std::vector<int32_t>& t = s.tables.emplace_back(per_seq);
    std::iota(t.begin(), t.end(), static_cast<int32_t>(i * per_seq));
  }
  s.lengths.assign(B, 0);
  // The tail's rings after the model's state (engine/paged_kv.h); whole floats.
  const int64_t state_bytes = model.state_bytes() + engine::PagedKv::TailBytes(c, tail);
  s.state_floats = state_bytes / static_cast<int64_t>(sizeof(float));
  s.model_state_bytes = model.state_bytes();
  if (s.state_floats > 0) {
    MOE_ASSIGN_OR_RETURN(s.states, backend.Allocate(B * state_bytes));
    backend.Zero(s.states.data(), s.states.bytes());
  }
  return s;
}

// Positions [0, ctx) of every sequence in every layer hold random keys and values (uniform in
// [-2, 2), stand-ins for post-RoPE ones: decode speed does not depend on the values), written by
// the backend's batched PagedKvWrite in chunks of positions. Prefilling 64 x 32k tokens for real
// would take minutes.
absl::Status FillRandom(kernels::Backend& backend, const engine::ModelConfig& c, PagedSeqs& s,
                        int64_t ctx, Rng& rng) {
  const int64_t B = static_cast<int64_t>(s.tables.size());
  const int64_t row = c.num_key_value_heads * c.head_dim;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(ctx, (1 << 16) / B));
  std::vector<float> host_k(static_cast<size_t>(B * chunk * row)), host_v(host_k.size());
  for (float& x : host_k) x = 4.f * rng.Uniform() - 2.f;
  for (float& x : host_v) x = 4.f * rng.Uniform() - 2.f;
  MOE_ASSIGN_OR_RETURN(kernels::Buffer k, backend.Allocate(host_k.size() * sizeof(float)));
  MOE_ASSIGN_OR_RETURN(kernels::Buffer v, backend.Allocate(host_v.size() * sizeof(float)));
  backend.CopyToDevice(k.data(), host_k.data(), host_k.size() * sizeof(float));
  backend.CopyToDevice(v.data(), host_v.data(), host_v.size() * sizeof(float));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.KvLayerIndex(l) < 0) continue;  // no KV (its state stays zero: speed does not depend on it)
    // The split formats pick their outlier channels from this sample, as on a first prefill.
    MOE_RETURN_IF_ERROR(s.kv->EnsureCodecs(l, host_k.data(), host_v.data(), B * chunk));
    for (int64_t p0 = 0; p0 < ctx; p0 += chunk) {
      const int64_t n = std::min(chunk, ctx - p0);
      std::vector<kernels::PagedKvWriteArgs> writes(B);
      for (int64_t i = 0; i < B; ++i) {
        // (A tail's ring stays zero here: speed does not depend on its values.)
        writes[i].kv = s.kv->Layer(
            l, s.tables[i],
            s.kv->tail_tokens() > 0 ? reinterpret_cast<uint8_t*>(s.state(i)) + s.model_state_bytes
                                    : nullptr);
        writes[i].k = k.f32() + i * n * row;
        writes[i].v = v.f32() + i * n * row;
        writes[i].num_tokens = n;
        writes[i].start_pos = p0;
      }
      MOE_RETURN_IF_ERROR(backend.PagedKvWrite(writes));
    }
  }
  s.lengths.assign(B, ctx);
  backend.Synchronize();
  return absl::OkStatus();
}

// Greedy sampling rows for items [0, n): what the engine does for a decode step of n sequences.
std::vector<kernels::SampleParams> GreedyRows(size_t n) {
  std::vector<kernels::SampleParams> rows(n);
  for (size_t i = 0; i < n; ++i) {
    rows[i].row = static_cast<int64_t>(i);
    rows[i].temperature = 0.f;
  }
  return rows;
}

// One decode step of every sequence (one new token each, sampled greedily on the backend), then
// their lengths grow by one.
absl::Status DecodeStep(engine::Model& model, PagedSeqs& s, const std::vector<int32_t>& tokens) {
  std::vector<engine::ForwardItem> items;
  for (size_t i = 0; i < s.tables.size(); ++i) {
    engine::ForwardItem item;
    item.tokens = absl::MakeConstSpan(&tokens[i], 1);
    item.paged = s.kv.get();
    item.block_table = s.tables[i];
    item.start = s.lengths[i];
    item.state = s.state(i);
    items.push_back(item);
  }
  std::vector<kernels::SampledToken> sampled;
  MOE_RETURN_IF_ERROR(model.ForwardSample(items, GreedyRows(items.size()), {}, &sampled));
  for (int64_t& n : s.lengths) ++n;
  return absl::OkStatus();
}

// Sequence 0's prompt through Forward (a real prefill), its next token sampled greedily.
absl::Status Prefill(engine::Model& model, PagedSeqs& s, const std::vector<int32_t>& prompt) {
  engine::ForwardItem item;
  item.tokens = prompt;
  item.paged = s.kv.get();
  item.block_table = s.tables[0];
  item.start = s.lengths[0];
  item.state = s.state(0);
  std::vector<kernels::SampledToken> sampled;
  MOE_RETURN_IF_ERROR(model.ForwardSample({&item, 1}, GreedyRows(1), {}, &sampled));
  s.lengths[0] += static_cast<int64_t>(prompt.size());
  return absl::OkStatus();
}

engine::PhaseTimes Diff(const engine::PhaseTimes& a, const engine::PhaseTimes& b) {
  return {b.attention_us - a.attention_us,       b.routing_us - a.routing_us,
          b.expert_wait_us - a.expert_wait_us,   b.expert_compute_us - a.expert_compute_us,
          b.dense_us - a.dense_us,               b.logits_us - a.logits_us,
          b.sampling_us - a.sampling_us};
}

void PrintTimings(const char* what, const engine::PhaseTimes& t, int64_t tokens, int64_t layers) {
  const double per_tok = 1e-3 / static_cast<double>(tokens);
  const double per_layer = per_tok / static_cast<double>(layers);
  std::printf("  timings (%s; ms per layer / per token): attention %.4f / %.3f, routing %.4f / "
              "%.3f, expert wait %.4f / %.3f, expert compute %.4f / %.3f, dense %.4f / %.3f, "
              "logits - / %.3f, sampling - / %.3f\n",
              what, t.attention_us * per_layer, t.attention_us * per_tok,
              t.routing_us * per_layer, t.routing_us * per_tok, t.expert_wait_us * per_layer,
              t.expert_wait_us * per_tok, t.expert_compute_us * per_layer,
              t.expert_compute_us * per_tok, t.dense_us * per_layer, t.dense_us * per_tok,
              t.logits_us * per_tok, t.sampling_us * per_tok);
}

// Backend::Sample alone on random logits (uniform in [-10, 10)) of `batch` rows, median of 20
// calls (each waits for its tokens), per mode; next to it, the copy of the same logits to the
// host that host-side sampling needed before any of its own work.
absl::Status SampleTimes(kernels::Backend& backend, int64_t V, Rng& rng) {
  std::printf("\nsampling on the backend (Backend::Sample, vocabulary %lld; us per step, median "
              "of 20)\n%-8s %10s %10s %10s %12s %16s\n",
              static_cast<long long>(V), "batch", "greedy", "top-k 50", "top-p 0.9",
              "whole vocab", "logits to host");
  for (int64_t B : {int64_t{1}, int64_t{64}}) {
    std::vector<float> host(B * V);
    for (float& x : host) x = static_cast<float>(rng.Next() % 20000) / 1000.f - 10.f;
    MOE_ASSIGN_OR_RETURN(kernels::Buffer logits, backend.Allocate(host.size() * sizeof(float)));
    backend.CopyToDevice(logits.data(), host.data(), host.size() * sizeof(float));
    auto median_us = [&](auto&& op) {
      std::vector<double> us;
      for (int i = 0; i < 20; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        op();
        us.push_back(Seconds(t0, std::chrono::steady_clock::now()) * 1e6);
      }
      std::nth_element(us.begin(), us.begin() + 10, us.end());
      return us[10];
    };
    double mode_us[4];
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<kernels::SampleParams> params(B);
      for (int64_t i = 0; i < B; ++i) {
        params[i].row = i;
        params[i].uniform = static_cast<double>(rng.Next() % 1000) / 1000.0;
        if (mode == 0) params[i].temperature = 0.f;  // temperature 1 otherwise: logits unchanged
        if (mode == 1) params[i].top_k = 50;
        if (mode == 2) params[i].top_p = 0.9f;
      }
      std::vector<kernels::SampledToken> out(B);
      kernels::SampleArgs a;
      a.logits = logits.f32();
      a.vocab_size = V;
      a.params = params;
      a.out = out.data();
      mode_us[mode] = median_us([&] { backend.Sample(a); });
    }
    const double copy_us = median_us(
        [&] { backend.CopyToHost(host.data(), logits.data(), host.size() * sizeof(float)); });
    std::printf("%-8lld %10.1f %10.1f %10.1f %12.1f %16.1f\n", static_cast<long long>(B),
                mode_us[0], mode_us[1], mode_us[2], mode_us[3], copy_us);
  }
  return absl::OkStatus();
}

// A comma-separated list flag's entries, each a positive integer ("" is the empty list).
absl::StatusOr<std::vector<int64_t>> PositiveInts(const char* flag, const std::string& value) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", value, ": \"", part, "\" is not a positive integer"));
    }
    out.push_back(n);
  }
  return out;
}

// ---- KV sweep: decode speed per cache format, context and batch (all experts resident) ----
absl::Status KvSweep(engine::Model& model, kernels::Backend& backend, size_t expert_bytes,
                     double copy_bps, Rng& rng) {
  const engine::ModelConfig& c = model.config();
  const double budget = absl::GetFlag(FLAGS_kv_budget_gb) * 1e9;
  const int64_t steps = absl::GetFlag(FLAGS_kv_steps);
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> contexts,
                       PositiveInts("kv_contexts", absl::GetFlag(FLAGS_kv_contexts)));
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> batches,
                       PositiveInts("kv_batches", absl::GetFlag(FLAGS_kv_batches)));
  auto tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(c.vocab_size));
    return t;
  };
  const int64_t repeats = absl::GetFlag(FLAGS_kv_repeats);
  if (repeats < 1) return absl::InvalidArgumentError("--kv_repeats must be at least 1");
  // Every point, then the measurements: the points run in turn, `repeats` rounds of all of them,
  // so that a slow spell of the machine does not fall on one format only; each row reports the
  // median round (and the slowest and fastest when there are several).
  struct Point {
    kernels::KvFormat format;
    int64_t ctx, batch;
    double per_position, cache;
    std::vector<double> step_s;
  };
  std::vector<Point> points;
  std::vector<std::pair<kernels::KvFormat, double>> format_bytes;  // per position, all layers
  double bf16_position = 0;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_kv_formats), ',', absl::SkipEmpty())) {
    MOE_ASSIGN_OR_RETURN(const kernels::KvFormat format, engine::ParseCacheFormat(name));
    // Bytes per position from the cache's own layout (one block's worth, all layers).
    MOE_ASSIGN_OR_RETURN(engine::KvStorage layout,
                         engine::KvStorage::Create(format, static_cast<int>(c.NumKvLayers()),
                                                   static_cast<int>(c.num_key_value_heads),
                                                   static_cast<int>(c.head_dim), kBlockSize, 1));
    const double per_position = static_cast<double>(layout.total_bytes()) / kBlockSize;
    format_bytes.emplace_back(format, per_position);
    if (format == kernels::KvFormat::kBf16) bf16_position = per_position;
    for (int64_t ctx : contexts) {
      for (int64_t B : batches) {
        points.push_back({format, ctx, B, per_position,
                          per_position * static_cast<double>(B * (ctx + steps + 2)), {}});
      }
    }
  }
  for (int64_t round = 0; round < repeats; ++round) {
    for (Point& pt : points) {
      if (pt.cache > budget) continue;
      MOE_ASSIGN_OR_RETURN(PagedSeqs seqs,
                           MakePagedSeqs(model, backend, pt.format, pt.batch, pt.ctx + steps + 2));
      MOE_RETURN_IF_ERROR(FillRandom(backend, c, seqs, pt.ctx, rng));
      MOE_RETURN_IF_ERROR(DecodeStep(model, seqs, tokens(pt.batch)));  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) {
        MOE_RETURN_IF_ERROR(DecodeStep(model, seqs, tokens(pt.batch)));
      }
      pt.step_s.push_back(Seconds(t0, std::chrono::steady_clock::now()) / steps);
    }
    if (repeats > 1) std::fprintf(stderr, "KV sweep: round %lld of %lld done\n",
                                  static_cast<long long>(round + 1),
                                  static_cast<long long>(repeats));
  }

  std::printf("\nKV sweep: decode with every expert resident; positions [0, context) of each "
              "sequence hold random keys/values; budget %.0f GB; median of %lld round(s)\n",
              budget / 1e9, static_cast<long long>(repeats));
  std::printf("%-9s %10s %8s %6s %12s %10s %10s %12s %11s %s\n", "format", "B/position", "context",
              "batch", "decode tok/s", "step ms", "KV GB/step", "all GB/step", "of HBM BW",
              repeats > 1 ? "  tok/s slowest-fastest" : "");
  for (Point& pt : points) {
    const long long ctx = static_cast<long long>(pt.ctx), B = static_cast<long long>(pt.batch);
    if (pt.cache > budget) {
      std::printf("%-9s %10.0f %8lld %6lld %12s   (cache %.1f GB > budget: does not fit)\n",
                  kernels::KvFormatName(pt.format), pt.per_position, ctx, B, "-", pt.cache / 1e9);
      continue;
    }
    std::sort(pt.step_s.begin(), pt.step_s.end());
    const double step_s = pt.step_s[pt.step_s.size() / 2];
    const double kv_read = pt.per_position * static_cast<double>(pt.batch * pt.ctx);
    // Weights once per step (B tokens share the dense weights; experts: at most all) + KV.
    const double weights =
        BytesPerToken(c, expert_bytes, 0, 0) +
        static_cast<double>(c.num_hidden_layers) *
            static_cast<double>(std::min<int64_t>((pt.batch - 1) * c.num_experts_per_tok,
                                                  c.num_experts - c.num_experts_per_tok)) *
            static_cast<double>(expert_bytes);
    std::printf("%-9s %10.0f %8lld %6lld %12.1f %10.2f %10.3f %12.3f %10.1f%%",
                kernels::KvFormatName(pt.format), pt.per_position, ctx, B,
                static_cast<double>(pt.batch) / step_s, step_s * 1e3, kv_read / 1e9,
                (kv_read + weights) / 1e9, 100 * (kv_read + weights) / step_s / copy_bps);
    if (repeats > 1) {
      std::printf("   %.1f-%.1f", static_cast<double>(pt.batch) / pt.step_s.back(),
                  static_cast<double>(pt.batch) / pt.step_s.front());
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  if (bf16_position > 0) {
    std::printf("\ncontext tokens that fit in the %.0f GB budget (all layers):", budget / 1e9);
    const char* sep = " ";
    for (const auto& [format, per_position] : format_bytes) {
      std::printf("%s%s %.0f (x%.2f)", sep, kernels::KvFormatName(format), budget / per_position,
                  bf16_position / per_position);
      sep = ", ";
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// The flags that name formats, a backend or lists, checked before any work: a typo fails at
// once, not after the model is generated and the runs before the one that reads it.
absl::Status CheckFlags() {
  if (FindShape(absl::GetFlag(FLAGS_shape)) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape=", absl::GetFlag(FLAGS_shape),
                     ": qwen3-30b-a3b, qwen3.5-35b-a3b or qwen3.5-397b-a17b"));
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cuda" && backend != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("--backend=", backend, ": cuda or cpu"));
  }
  if (const int tail = absl::GetFlag(FLAGS_kv_tail_tokens); tail != 0) {
    if (tail < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_tail_tokens must be >= 0 (0: none), got ", tail));
    }
  }
  auto format = [](const char* flag, absl::string_view name) {
    const absl::Status s = engine::ParseCacheFormat(name).status();
    return s.ok() ? s : absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", s.message()));
  };
  MOE_RETURN_IF_ERROR(format("kv_cache_dtype", absl::GetFlag(FLAGS_kv_cache_dtype)));
  const std::pair<const char*, std::string> weights[] = {
      {"expert_format", absl::GetFlag(FLAGS_expert_format)},
      {"dense_format", absl::GetFlag(FLAGS_dense_format)},
      {"lm_head_format", absl::GetFlag(FLAGS_lm_head_format)}};
  for (const auto& [flag, name] : weights) {
    if (name.empty() && std::string(flag) == "lm_head_format") continue;
    const absl::StatusOr<DType> f = kernels::ParseWeightFormat(name);
    const bool expert = std::string(flag) == "expert_format";
    if (!f.ok() ||
        (expert ? !kernels::IsQuantized(*f) || *f == DType::kQ2
                : *f != DType::kBF16 && *f != DType::kQ8 && *f != DType::kQ4 && *f != DType::kF8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, "=", name, ": ", expert ? "int4, int8 or fp8" : "bf16, int8, int4 or fp8"));
    }
  }
  if (absl::Status s = kernels::ValidateQuantFormat(DType::kQ4, absl::GetFlag(FLAGS_group));
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--group: ", s.message()));
  }
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_kv_formats), ',', absl::SkipEmpty())) {
    MOE_RETURN_IF_ERROR(format("kv_formats", name));
  }
  const std::pair<const char*, std::string> lists[] = {
      {"batches", absl::GetFlag(FLAGS_batches)},
      {"prompt", absl::GetFlag(FLAGS_prompt)},
      {"kv_contexts", absl::GetFlag(FLAGS_kv_contexts)},
      {"kv_batches", absl::GetFlag(FLAGS_kv_batches)}};
  if (!absl::GetFlag(FLAGS_decode_contexts).empty()) {
    MOE_RETURN_IF_ERROR(
        PositiveInts("decode_contexts", absl::GetFlag(FLAGS_decode_contexts)).status());
  }
  for (const auto& [flag, value] : lists) MOE_RETURN_IF_ERROR(PositiveInts(flag, value).status());
  MOE_RETURN_IF_ERROR(
      PositiveInts("store_vram_percents", absl::GetFlag(FLAGS_store_vram_percents)).status());
  // An offload run's bound needs the all-resident step of its batch: checked before the runs.
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> batches,
                       PositiveInts("batches", absl::GetFlag(FLAGS_batches)));
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> store_batches,
                       PositiveInts("store_batches", absl::GetFlag(FLAGS_store_batches)));
  for (const int64_t B : store_batches) {
    if (B != 1 && std::find(batches.begin(), batches.end(), B) == batches.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--store_batches: ", B, " is not in --batches (its all-resident step is the bound)"));
    }
  }
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_store_policies), ',', absl::SkipEmpty())) {
    store::PolicyOptions o;
    o.name = std::string(name);
    o.num_layers = o.num_experts = 1;
    if (absl::Status st = store::MakePolicy(o).status(); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--store_policies: ", st.message()));
    }
  }
  return absl::OkStatus();
}

// One offload run: `percent` of the experts in VRAM under `policy`, every expert in the pinned
// host tier, decode steps of B sequences at context --context timed after the context (batch 1:
// a prefill; more: random KV, as the batched runs) and two warm-up steps. A step reads what VRAM
// lacks in place from the host tier and the store copies up what the policy admits: both cross
// PCIe, so the bound is those bytes / 52 GB/s plus the all-resident step of B (`resident_s`).
absl::Status StoreRun(const std::string& dir, const std::string& store_dir, uint64_t slot,
                      int64_t percent, const std::string& policy, kernels::Backend& backend,
                      kernels::KvFormat kv_format, int64_t B, double resident_s, Rng& rng,
                      const std::function<std::vector<int32_t>(int64_t)>& tokens) {
  const int64_t layers = Layers(), experts = Experts();
  const int64_t ctx = absl::GetFlag(FLAGS_context);
  const int64_t total = layers * experts;
  store::StoreOptions o;
  o.store_dir = store_dir;
  o.device_budget_bytes = static_cast<uint64_t>(total * percent / 100) * slot;
  o.host_budget_bytes = static_cast<uint64_t>(total) * slot;
  o.policy.name = policy;
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<store::ExpertStore> st,
                       store::ExpertStore::Open(o, &backend));
  store::ExpertStore* store_ptr = st.get();
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model,
                       engine::Model::Load(dir, backend, std::move(st)));
  model->set_prefetch_next_layer(absl::GetFlag(FLAGS_store_prefetch));
  const engine::ModelConfig& c = model->config();
  const int64_t ssteps = absl::GetFlag(FLAGS_store_steps);
  // Positions: the prompt, two warm-up steps and the timed ones.
  MOE_ASSIGN_OR_RETURN(PagedSeqs seq,
                       MakePagedSeqs(*model, backend, kv_format, B, ctx + ssteps + 2));
  if (B == 1) {
    MOE_RETURN_IF_ERROR(Prefill(*model, seq, tokens(ctx)));  // disk -> host tier
  } else {
    MOE_RETURN_IF_ERROR(FillRandom(backend, c, seq, ctx, rng));
  }
  // Every expert into the host tier (the prefill touches most, not all: a decode step that
  // reads one from disk would be timed as disk, not as the host->device traffic bounded below).
  for (int32_t l = 0; l < static_cast<int32_t>(layers); ++l) {
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    MOE_ASSIGN_OR_RETURN(std::vector<store::ExpertHandle> handles, store_ptr->Acquire(l, all));
    for (store::ExpertHandle& h : handles) MOE_RETURN_IF_ERROR(h.ready.get());
  }
  for (int i = 0; i < 2; ++i) MOE_RETURN_IF_ERROR(DecodeStep(*model, seq, tokens(B)));
  const store::StoreStats s0 = store_ptr->Stats();
  const engine::PhaseTimes p0 = model->phase_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ssteps; ++i) MOE_RETURN_IF_ERROR(DecodeStep(*model, seq, tokens(B)));
  const double per_step_s =
      Seconds(t0, std::chrono::steady_clock::now()) / static_cast<double>(ssteps);
  const store::StoreStats s1 = store_ptr->Stats();
  const auto per_step = [&](uint64_t a, uint64_t b) {
    return static_cast<double>(b - a) / static_cast<double>(ssteps);
  };
  const double in_place = per_step(s0.host_reads, s1.host_reads) * static_cast<double>(slot);
  const double copied = per_step(s0.device.bytes_in, s1.device.bytes_in);
  const double hits = static_cast<double>(s1.device.hits - s0.device.hits);
  const double uses = hits + static_cast<double>(s1.device.misses - s0.device.misses);
  const double bound = (in_place + copied) / 52e9 + resident_s;
  std::printf("%5lld%% %-10s %5lld %10.1f %8.1f%% %12.3f %12.3f %11.2f %11.2f %9.2f\n",
              static_cast<long long>(percent), policy.c_str(), static_cast<long long>(B),
              static_cast<double>(B) / per_step_s, uses > 0 ? 100.0 * hits / uses : 0.0,
              (in_place + copied) / 1e9, in_place / 1e9, per_step_s * 1e3, bound * 1e3,
              per_step_s / bound);
  if (absl::GetFlag(FLAGS_timings)) {
    PrintTimings(absl::StrCat("decode, ", percent, "% in VRAM, ", policy, ", batch ", B).c_str(),
                 Diff(p0, model->phase_times()), B * ssteps, c.num_hidden_layers);
  }
  return absl::OkStatus();
}

// --serve_dir: the experts first (WriteSyntheticStore starts the directory afresh), the tokenizer,
// then config.json, dense.safetensors and manifest.json, last: its presence means a whole store.
absl::Status WriteServeDir(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t group = absl::GetFlag(FLAGS_group);
  MOE_ASSIGN_OR_RETURN(const uint64_t slot,
                       WriteSyntheticStore(dir, Layers(), Experts(), group, MakeTemplates(group)));
  MOE_RETURN_IF_ERROR(engine::WriteDefaultTokenizer(dir));
  MOE_RETURN_IF_ERROR(WriteSyntheticModel(dir, Layers(), Experts(), Vocab(), /*store=*/true));
  std::printf(
      "moe-bench: wrote the model store %s in %.1f s (%s: %lld layers, %lld experts of %.2f MB "
      "%s g%d, vocab %lld, dense %s); serve it with moe-worker --model=%s (model name %s)\n",
      dir.c_str(), Seconds(t0, std::chrono::steady_clock::now()), BenchShape().name,
      static_cast<long long>(Layers()), static_cast<long long>(Experts()),
      static_cast<double>(slot) / 1e6, kernels::WeightFormatName(ExpertFormat()), group,
      static_cast<long long>(Vocab()), kernels::WeightFormatName(DenseFormat()), dir.c_str(),
      StoreModelId().c_str());
  return absl::OkStatus();
}

absl::Status Run() {
  MOE_RETURN_IF_ERROR(CheckFlags());
  if (const std::string serve = absl::GetFlag(FLAGS_serve_dir); !serve.empty()) {
    return WriteServeDir(serve);
  }
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  const int64_t layers = Layers(), experts = Experts();
  const int64_t vocab = Vocab(), ctx = absl::GetFlag(FLAGS_context);
  const int32_t group = absl::GetFlag(FLAGS_group);
  const bool timings = absl::GetFlag(FLAGS_timings);
  const kernels::BackendKind kind =
      absl::GetFlag(FLAGS_backend) == "cpu" ? kernels::BackendKind::kCpu : kernels::BackendKind::kCuda;
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, kernels::MakeBackend(kind, {}));

  // The ceiling of this run: a device-to-device copy, bytes read + written, median of 9.
  double copy_bps = 0;
  {
    const size_t n = kind == kernels::BackendKind::kCuda ? size_t{1} << 31 : size_t{1} << 28;
    MOE_ASSIGN_OR_RETURN(kernels::Buffer a, backend->Allocate(n));
    MOE_ASSIGN_OR_RETURN(kernels::Buffer b, backend->Allocate(n));
    backend->Zero(a.data(), n);
    std::vector<double> s;
    for (int i = 0; i < 11; ++i) {
      backend->Synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      backend->CopyOnDevice(b.data(), a.data(), n);
      backend->Synchronize();
      if (i >= 2) s.push_back(Seconds(t0, std::chrono::steady_clock::now()));
    }
    std::sort(s.begin(), s.end());
    copy_bps = 2.0 * static_cast<double>(n) / s[s.size() / 2];
  }

  auto t0 = std::chrono::steady_clock::now();
  MOE_RETURN_IF_ERROR(WriteSyntheticModel(dir, layers, experts, vocab));
  const double gen_s = Seconds(t0, std::chrono::steady_clock::now());
  t0 = std::chrono::steady_clock::now();
  MOE_ASSIGN_OR_RETURN(auto provider,
                       ResidentInt4Provider::Create(*backend, layers, experts, group));
  const size_t expert_bytes = provider->expert_bytes();
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model,
                       engine::Model::Load(dir, *backend, std::move(provider)));
  const double load_s = Seconds(t0, std::chrono::steady_clock::now());
  const engine::ModelConfig c = model->config();  // a copy: the model is replaced below
  std::printf(
      "moe-bench: backend %s, %lld layers, H %lld, %lld/%lld heads of %lld, %lld experts "
      "top-%lld width %lld (%s g%d, %.2f MB each), vocab %lld; dense %s, lm head %s\n",
      kernels::BackendKindName(kind), static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_attention_heads),
      static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_tok),
      static_cast<long long>(c.moe_intermediate_size), kernels::WeightFormatName(ExpertFormat()),
      group, expert_bytes / 1e6, static_cast<long long>(c.vocab_size),
      kernels::WeightFormatName(DenseFormat()),
      kernels::WeightFormatName(c.tie_word_embeddings ? DType::kBF16 : LmHeadFormat()));
  std::printf("generated dense model in %.1f s, loaded model + resident experts in %.1f s\n",
              gen_s, load_s);
  std::printf("measured d2d copy: %.0f GB/s (bytes read + written)\n", copy_bps / 1e9);

  Rng rng{777};
  auto tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(c.vocab_size));
    return t;
  };
  MOE_ASSIGN_OR_RETURN(const kernels::KvFormat kv_format,
                       engine::ParseCacheFormat(absl::GetFlag(FLAGS_kv_cache_dtype)));
  if (absl::GetFlag(FLAGS_kv_only)) return KvSweep(*model, *backend, expert_bytes, copy_bps, rng);

  // ---- batch 1, at each --decode_contexts (default --context) ----
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  std::vector<int64_t> decode_contexts = {ctx};
  if (!absl::GetFlag(FLAGS_decode_contexts).empty()) {
    MOE_ASSIGN_OR_RETURN(decode_contexts,
                         PositiveInts("decode_contexts", absl::GetFlag(FLAGS_decode_contexts)));
  }
  PagedSeqs one_seq;
  double ctx_tok_s = 0;  // at --context: the offload runs' all-resident step
  for (const int64_t dctx : decode_contexts) {
    MOE_ASSIGN_OR_RETURN(one_seq,
                         MakePagedSeqs(*model, *backend, kv_format, 1, dctx + 2 * steps + 4));
    MOE_RETURN_IF_ERROR(Prefill(*model, one_seq, tokens(dctx)));  // warms up
    for (int i = 0; i < 2; ++i) {                                 // warm-up decode steps
      MOE_RETURN_IF_ERROR(DecodeStep(*model, one_seq, tokens(1)));
    }
    const engine::PhaseTimes before = model->phase_times();
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      MOE_RETURN_IF_ERROR(DecodeStep(*model, one_seq, tokens(1)));
    }
    const double decode_s = Seconds(t0, std::chrono::steady_clock::now());
    const engine::PhaseTimes decode_times = Diff(before, model->phase_times());
    const double kv_bytes = one_seq.BytesPerPositionLayer();
    const double bytes = BytesPerToken(c, expert_bytes, dctx, kv_bytes);
    const double tok_s = static_cast<double>(steps) / decode_s;
    if (dctx == ctx || ctx_tok_s == 0) ctx_tok_s = tok_s;
    const double roofline = copy_bps / bytes;
    std::printf("\nbatch 1, context %lld, KV cache %s, paged (block %d)\n%-44s %12s\n",
                static_cast<long long>(dctx), kernels::KvFormatName(kv_format), kBlockSize,
                "measure", "value");
    std::printf("%-44s %12.1f\n", "decode tokens/s (batch 1, context)", tok_s);
    std::printf("%-44s %12.1f\n", "decode ms/token", 1e3 / tok_s);
    std::printf("%-44s %12.4f\n", "decode ms per layer (ms/token / layers)",
                1e3 / tok_s / static_cast<double>(c.num_hidden_layers));
    std::printf("%-44s %12.3f\n", "bytes a token must read (GB)", bytes / 1e9);
    std::printf("%-44s %12.1f\n", "achieved GB/s (bytes / step time)", bytes * tok_s / 1e9);
    std::printf("%-44s %11.1f%%\n", "fraction of measured d2d copy bandwidth",
                100 * bytes * tok_s / copy_bps);
    std::printf("%-44s %12.1f\n", "roofline tokens/s (copy BW / bytes)", roofline);
    std::printf("%-44s %11.1f%%\n", "fraction of roofline", 100 * tok_s / roofline);
    if (timings) {
      PrintTimings("decode, batch 1, host clock", decode_times, steps, c.num_hidden_layers);
      // The same steps again with the model synchronizing at every phase boundary: each phase's
      // device time (the tokens/s above are from the untouched run).
      model->set_exact_timings(true);
      const engine::PhaseTimes e0 = model->phase_times();
      const auto e_start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < steps; ++i) {
        MOE_RETURN_IF_ERROR(DecodeStep(*model, one_seq, tokens(1)));
      }
      const double exact_s = Seconds(e_start, std::chrono::steady_clock::now());
      model->set_exact_timings(false);
      PrintTimings("decode, batch 1, synchronized per phase", Diff(e0, model->phase_times()), steps,
                   c.num_hidden_layers);
      std::printf("  (synchronized run: %.2f ms/token)\n",
                  exact_s * 1e3 / static_cast<double>(steps));
    }
  }

  MOE_RETURN_IF_ERROR(SampleTimes(*backend, c.vocab_size, rng));

  // ---- time to first token, against the FLOP roofline (--peak_tflops) ----
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> prompts,
                       PositiveInts("prompt", absl::GetFlag(FLAGS_prompt)));
  const double peak_flops = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  for (const int64_t n : prompts) {
    MOE_ASSIGN_OR_RETURN(PagedSeqs seq, MakePagedSeqs(*model, *backend, kv_format, 1, n + 1));
    const std::vector<int32_t> prompt = tokens(n);
    const engine::PhaseTimes b0 = model->phase_times();
    t0 = std::chrono::steady_clock::now();
    MOE_RETURN_IF_ERROR(Prefill(*model, seq, prompt));
    const double s = Seconds(t0, std::chrono::steady_clock::now());
    const double flops = PrefillFlops(c, c.moe_intermediate_size, n);
    std::printf("%-44s %12.1f\n", absl::StrCat("time to first token, ", n, "-token prompt (ms)").c_str(),
                s * 1e3);
    std::printf("%-44s %12.0f\n", "  prefill tokens/s", static_cast<double>(n) / s);
    std::printf("%-44s %12.1f\n", "  TFLOP/s (matrix FLOPs / time)", flops / s / 1e12);
    std::printf("%-44s %12.1f\n", "  FLOP roofline time to first token (ms)", 1e3 * flops / peak_flops);
    std::printf("%-44s %11.1f%%\n", "  fraction of the FLOP roofline", 100 * flops / peak_flops / s);
    if (timings) {  // not synchronized: on CUDA the phases measure their launches, not GPU time
      PrintTimings("prefill, host clock", Diff(b0, model->phase_times()), n, c.num_hidden_layers);
    }
  }

  // ---- throughput at B concurrent sequences (each at context ctx, one token per step) ----
  const int64_t bsteps = absl::GetFlag(FLAGS_batch_steps);
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> batches,
                       PositiveInts("batches", absl::GetFlag(FLAGS_batches)));
  if (!batches.empty()) {
    std::printf(
        "\ndecode steps of B sequences at context %lld: the bytes a step must read "
        "(expert union under uniform routing, dense weights, KV) against the measured "
        "copy bandwidth; KV/st: the KV read and the hybrids' and LFM2's state read and "
        "written\n%-6s %10s %9s %8s %8s %8s %8s %11s %9s\n",
        static_cast<long long>(ctx), "B", "tokens/s", "step ms", "union", "expt GB", "dense GB",
        "KV/st GB", "roofline/s", "fraction");
  }
  std::map<int64_t, double> resident_step_s = {{1, 1.0 / ctx_tok_s}};  // the offload runs' bound
  for (const int64_t B : batches) {
    MOE_ASSIGN_OR_RETURN(PagedSeqs seqs,
                         MakePagedSeqs(*model, *backend, kv_format, B, ctx + 2 * bsteps + 4));
    MOE_RETURN_IF_ERROR(FillRandom(*backend, c, seqs, ctx, rng));
    auto step = [&]() { return DecodeStep(*model, seqs, tokens(B)); };
    MOE_RETURN_IF_ERROR(step());  // warm-up (scratch grows to B tokens)
    const engine::PhaseTimes b0 = model->phase_times();
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < bsteps; ++i) MOE_RETURN_IF_ERROR(step());
    const double s = Seconds(t0, std::chrono::steady_clock::now());
    const double batch_tok_s = static_cast<double>(B * bsteps) / s;
    resident_step_s[B] = s / static_cast<double>(bsteps);
    const StepBytes need = DecodeStepBytes(c, expert_bytes, B, ctx, seqs.BytesPerPositionLayer());
    const double roofline_tok_s = static_cast<double>(B) * copy_bps / need.total();
    std::printf("%-6lld %10.1f %9.2f %8.1f %8.2f %8.2f %8.2f %11.0f %8.1f%%\n",
                static_cast<long long>(B), batch_tok_s, 1e3 * s / static_cast<double>(bsteps),
                need.union_per_layer, need.experts / 1e9, need.dense / 1e9, need.kv / 1e9,
                roofline_tok_s, 100 * batch_tok_s / roofline_tok_s);
    if (timings) {
      PrintTimings(absl::StrCat("batch ", B).c_str(), Diff(b0, model->phase_times()), B * bsteps,
                   c.num_hidden_layers);
      // The same steps synchronizing at every phase boundary: each phase's device time.
      model->set_exact_timings(true);
      const engine::PhaseTimes e0 = model->phase_times();
      for (int64_t i = 0; i < bsteps; ++i) MOE_RETURN_IF_ERROR(step());
      model->set_exact_timings(false);
      PrintTimings(absl::StrCat("batch ", B, ", synchronized per phase").c_str(),
                   Diff(e0, model->phase_times()), B * bsteps, c.num_hidden_layers);
    }
  }

  if (!absl::GetFlag(FLAGS_kv_formats).empty()) {
    one_seq = PagedSeqs();
    MOE_RETURN_IF_ERROR(KvSweep(*model, *backend, expert_bytes, copy_bps, rng));
  }
  if (const std::string issued = backend->IssueStats(); !issued.empty()) {
    std::printf("  %s\n", issued.c_str());
  }

  // ---- a share of the experts in VRAM, the rest in the store's pinned host tier ----
  const std::string store_dir = absl::GetFlag(FLAGS_store_dir);
  if (store_dir.empty()) return absl::OkStatus();
  model.reset();  // frees the resident experts (16 GB) before the store takes its budgets
  one_seq = PagedSeqs();
  t0 = std::chrono::steady_clock::now();
  MOE_ASSIGN_OR_RETURN(const uint64_t slot,
                       WriteSyntheticStore(store_dir, layers, experts, group, MakeTemplates(group)));
  std::printf("\nexpert store: written in %.1f s (%lld blobs of %.2f MB); next-layer prefetch %s; "
              "the PCIe bound of a row: its bytes over PCIe / 52 GB/s + the all-resident step\n",
              Seconds(t0, std::chrono::steady_clock::now()),
              static_cast<long long>(layers * experts), static_cast<double>(slot) / 1e6,
              absl::GetFlag(FLAGS_store_prefetch) ? "on" : "off");
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> percents,
                       PositiveInts("store_vram_percents",
                                    absl::GetFlag(FLAGS_store_vram_percents)));
  MOE_ASSIGN_OR_RETURN(const std::vector<int64_t> store_batches,
                       PositiveInts("store_batches", absl::GetFlag(FLAGS_store_batches)));
  std::printf("%-6s %-10s %5s %10s %9s %12s %12s %11s %11s %9s\n", "VRAM", "policy", "B",
              "tokens/s", "dev hits", "PCIe GB/step", "(in place)", "ms/step", "PCIe bound",
              "ratio");
  for (const int64_t B : store_batches) {
    for (const int64_t percent : percents) {
      for (absl::string_view policy :
           absl::StrSplit(absl::GetFlag(FLAGS_store_policies), ',', absl::SkipEmpty())) {
        MOE_RETURN_IF_ERROR(StoreRun(dir, store_dir, slot, percent, std::string(policy), *backend,
                                     kv_format, B, resident_step_s.at(B), rng, tokens));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::base::ParseFlags(
      argc, argv,
      "Times the whole forward pass on a synthetic model of a real shape (--shape: Qwen3-30B-A3B, "
      "the Qwen3.5 hybrids) and prints it next to the ceiling\n(tests/bench/moe_bench.cc's "
      "opening comment says what each figure is).\n"
      "  moe-bench --timings --model_dir=/tmp/moe_bench_model   # on the GPU machine\n"
      "  moe-bench --serve_dir=/tmp/qwen3_store   # writes a store moe-worker serves, runs "
      "nothing\n"
      "  moe-bench --shape=qwen3.5-35b-a3b --batches=64 --store_dir=",
      __FILE__);
  const absl::Status s = moe::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "moe-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
