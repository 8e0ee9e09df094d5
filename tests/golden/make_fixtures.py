#!/usr/bin/env python3
"""Makes the golden fixtures: tiny random models of every supported architecture, written by
transformers' save_pretrained (the on-disk format real checkpoints use), with the reference
logits of every position of prompt + greedy continuation and the greedy continuation itself.

Run on the GPU machine (it has torch and transformers):
    python3 tests/golden/make_fixtures.py --out tests/golden/fixtures
Everything is fp32 on the CPU so that the reference is exact and deterministic.

The FP8 block-scaled fixture without partial blocks (qwen3_moe_fp8_b128) also gets a second
reference, transformers' own FP8 loading of the checkpoint (write_fp8_loader_reference); for a
fixture already made:
    python3 tests/golden/make_fixtures.py --fp8_loader_reference tests/golden/fixtures/qwen3_moe_fp8_b128
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file

VOCAB = 384
PROMPT_LEN = 12
NEW_TOKENS = 32

COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=3, max_position_embeddings=256, rms_norm_eps=1e-6,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    initializer_range=0.08,
)

# Each entry: differences between architectures are configuration, exercised on purpose
# (q/k norm, shared expert, norm_topk_prob, decoder_sparse_step, mlp_only_layers, rope types,
# sliding window, head_dim != hidden/heads).
ARCHS = {
    "qwen3_moe": dict(
        cls="Qwen3MoeConfig", head_dim=24, intermediate_size=96, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[1],
        rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=2.0,
                             original_max_position_embeddings=32)),
    "qwen2_moe": dict(
        cls="Qwen2MoeConfig", intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "mixtral": dict(
        cls="MixtralConfig", intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "olmoe": dict(
        cls="OlmoeConfig", intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16)),
}

# The hybrids (GatedDeltaNet + gated attention), architectures.md §1.8 and §2: key heads shared
# by value heads (r = 2: division, not modulo), dk != dv, both layer types, a prompt longer than
# one 64-token chunk of the chunked delta rule, and the decode that follows runs the recurrent form.
HYBRID = dict(
    num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
    max_position_embeddings=512,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25),
    prompt_len=80)
ARCHS["qwen3_5_moe"] = dict(
    HYBRID, cls="Qwen3_5MoeTextConfig",
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
ARCHS["qwen3_next"] = dict(
    HYBRID, cls="Qwen3NextConfig", intermediate_size=96, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[1],
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])

# LFM2-MoE (architectures.md §3.5): short-conv and attention layers, a dense first layer, sigmoid
# routing with expert_bias and routed_scaling_factor != 1, tied embeddings. Its own config (no
# COMMON: the family names its fields differently, e.g. norm_eps).
LFM2 = dict(
    cls="Lfm2MoeConfig", model_type="lfm2_moe", own_config=True,
    vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, conv_bias=False,
    num_dense_layers=1, num_experts=8, num_experts_per_tok=2, use_expert_bias=True,
    routed_scaling_factor=1.5, norm_topk_prob=True, norm_eps=1e-5, max_position_embeddings=512,
    tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1e6),
    pad_token_id=0, bos_token_id=1, eos_token_id=2, prompt_len=24)
ARCHS["lfm2_moe"] = LFM2
ARCHS["lfm2_moe_conv_bias"] = dict(LFM2, conv_bias=True)
SPEC_ONLY = ("cls", "prompt_len", "model_type", "own_config")


def perturb_lfm2_(model, gen):
    """architectures.md §3.5: expert_bias (a buffer) ~ N(0, 0.5), else the choice is plain top-k;
    plain-scale norms 1 + N(0, 0.1); the short conv's weights and biases large enough to matter."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
        for name, p in model.named_parameters():
            if "norm" in name or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            elif ".conv." in name and name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def perturb_hybrid_(model, gen):
    """architectures.md §0.6: zero-centred norms ~ N(0, 0.1) (their scale is 1 + w), the gated
    norm 1 + N(0, 0.1), A_log ~ U(log 0.5, log 8), dt_bias ~ N(0, 1), the conv large enough to
    matter: a term the engine skips changes the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):
                lo, hi = torch.log(torch.tensor(0.5)), torch.log(torch.tensor(8.0))
                p.copy_(lo + (hi - lo) * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "conv1d" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))


def perturb_(model, gen):
    """Random weights everywhere, norms included, so that a weight we ignore changes the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
            if "gate.weight" in name and "proj" not in name:  # routers: decisive choices
                p.mul_(4.0)


def build(spec, seed):
    """A random model of `spec` (fp32, eval mode) and the generator that draws its prompt."""
    cfg_kwargs = {} if spec.get("own_config") else dict(COMMON)
    cfg_kwargs.update({k: v for k, v in spec.items() if k not in SPEC_ONLY})
    if hasattr(transformers, spec["cls"]):
        config = getattr(transformers, spec["cls"])(**cfg_kwargs)
    else:
        config = transformers.AutoConfig.for_model(spec["model_type"], **cfg_kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    perturb_(model, gen)
    if "linear_num_key_heads" in spec:
        perturb_hybrid_(model, gen)
    if spec.get("model_type") == "lfm2_moe":
        perturb_lfm2_(model, gen)
        print("config:", {k: getattr(config, k, None) for k in (
            "layer_types", "conv_L_cache", "conv_bias", "num_dense_layers", "norm_eps",
            "routed_scaling_factor", "tie_word_embeddings", "rope_parameters")})
    return model, gen


def write_reference(model, spec, gen, d, seed):
    """Greedy continuation of a random prompt and the logits of every position, into `d`."""
    prompt_len = spec.get("prompt_len", PROMPT_LEN)
    prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=gen)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=NEW_TOKENS)
        full = out[0]
        logits = model(full.unsqueeze(0)).logits[0].float()  # [L, V]
    top2 = logits.topk(2, dim=-1).values
    min_gap = (top2[:, 0] - top2[:, 1])[prompt_len - 1:].min().item()
    save_file({"logits": logits.contiguous()}, os.path.join(d, "expected_logits.safetensors"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"prompt_ids": prompt[0].tolist(),
                   "greedy_ids": full[prompt_len:].tolist(),
                   "min_greedy_logit_gap": min_gap,
                   "seed": seed,
                   "transformers": transformers.__version__,
                   "torch": torch.__version__}, f, indent=1)
    return min_gap


# In a folder of its own: beside expected_logits it would be read as a second checkpoint shard
# (the engine loads every *.safetensors of the directory) holding "logits" again.
FP8_LOADER_LOGITS = os.path.join("fp8_loader", "expected_logits.safetensors")


def exact_fp8_weights(d, block):
    """{name: fp32 tensor} of checkpoint `d` as our loader reads it: each F8_E4M3 weight times its
    weight_scale_inv repeated over its block (partial blocks at the edges), the rest as stored;
    experts also fused as transformers holds them ([E, 2I, H] gate rows first, [E, H, I])."""
    from safetensors.torch import load_file
    t = load_file(os.path.join(d, "model.safetensors"))
    out = {}
    for key, v in t.items():
        if key.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            n, k = v.shape
            s = t[key + "_scale_inv"]
            v = v.float() * s.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
        out[key] = v
    for key in list(out):
        if ".experts.0.gate_proj." in key:
            base = key.split(".experts.")[0] + ".experts."
            n = sum(1 for k in out if k.startswith(base) and k.endswith(".gate_proj.weight"))
            out[base + "gate_up_proj"] = torch.stack([torch.cat(
                [out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"]])
                for e in range(n)])
            out[base + "down_proj"] = torch.stack([out[f"{base}{e}.down_proj.weight"]
                                                   for e in range(n)])
    return out


def write_fp8_loader_reference(d):
    """Second reference for the `quant_method: fp8` fixture in `d`: transformers' own FP8 loading
    (FineGrainedFP8Config(dequantize=True): its Fp8Dequantize reads weight and weight_scale_inv,
    fp32 compute on the CPU), the logits of every position of the fixture's prompt + greedy
    tokens, into FP8_LOADER_LOGITS (same format as expected_logits). Prints how the weights it
    loaded and its logits differ from ours (exact_fp8_weights, expected_logits). Returns the max
    relative logit difference, max |loader - reference| / max |reference|."""
    from safetensors.torch import load_file
    with open(os.path.join(d, "expected.json")) as f:
        expected = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        block = json.load(f)["quantization_config"]["weight_block_size"][0]
    tokens = torch.tensor([expected["prompt_ids"] + expected["greedy_ids"]])
    ref = load_file(os.path.join(d, "expected_logits.safetensors"))["logits"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager",
        quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
    model.eval()
    exact = exact_fp8_weights(d, block)
    worst = (0.0, "")
    for name, p in model.state_dict().items():
        assert p.dtype == torch.float32, (name, p.dtype)  # dequantized, not fp8 modules
        if name in exact:
            err = (p - exact[name]).abs().max().item() / exact[name].abs().max().item()
            worst = max(worst, (err, name))
    print(f"fp8 loader: weights loaded against fp8 * block scale: max relative error "
          f"{worst[0]:.3g} ({worst[1]})")
    with torch.no_grad():
        logits = model(tokens).logits[0].float()
    assert logits.shape == ref.shape, (logits.shape, ref.shape)
    diff = (logits - ref).abs().max().item() / ref.abs().max().item()
    agree = (logits.argmax(-1) == ref.argmax(-1))[len(expected["prompt_ids"]) - 1:].float().mean()
    print(f"fp8 loader: logits against expected_logits: max relative difference {diff:.3g}, "
          f"argmax agreement over the continuation {agree.item():.3f}")
    os.makedirs(os.path.dirname(os.path.join(d, FP8_LOADER_LOGITS)), exist_ok=True)
    save_file({"logits": logits.contiguous()}, os.path.join(d, FP8_LOADER_LOGITS))
    return diff


def list_tensors(d):
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f, \
            open(os.path.join(d, "tensors.txt"), "w") as out:
        for key in sorted(f.keys()):  # what was written (architectures.md §7.1)
            out.write(f"{key} {list(f.get_slice(key).get_shape())}\n")


def make(arch, spec, out_dir, seed):
    model, gen = build(spec, seed)
    d = os.path.join(out_dir, arch)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    list_tensors(d)
    return write_reference(model, spec, gen, d, seed)


# Published int4 checkpoints (issue 30), each in its format's exact on-disk layout, made from a
# random qwen3_moe: every projection (attention, the dense MLP, each expert) quantized to
# symmetric int4 with groups along the input dim; the router, embedding, norms and lm head stay
# fp32 (as GPTQ / llm-compressor leave them). The reference is transformers on the same weights
# dequantized here in torch to fp32 ((q - 8) * s): no gptq/awq package is needed.
#   gptq: qweight int32 [K/8, N], code of input k = 8i + j in bits 4j..4j+3 of row i; qzeros
#     int32 [K/g, N/8] packed along N, the "gptq" (v1) checkpoint format storing z - 1 (7 for
#     symmetric); scales fp16 [K/g, N]; g_idx int32 [K] = k // g.
#   compressed-tensors pack-quantized (W4A16): weight_packed int32 [N, K/8], code of input k = 8i + j
#     (offset by 8: stored q + 8 for q in [-8, 7]) in bits 4j..4j+3 of word i; weight_scale
#     [N, K/g] in the model dtype (bf16 here); weight_shape int64 [2] = [N, K].
# Asymmetric int4 (stop 41): w = (q - z) s with a random zero point z per group and output,
# dequantized here in fp32 (z and q exact, s fp16: the product is exact in fp32).
#   gptq sym false: as above, qzeros holding z - 1 (v1).
#   awq (AutoAWQ's WQLinear_GEMM, version gemm): qweight int32 [K, N/8], word [k, i] holding
#     outputs 8i..8i+7 with output 8i + AWQ_ORDER[p] in bits 4p..4p+3; qzeros int32 [K/g, N/8]
#     packed the same way, z itself; scales fp16 [K/g, N].
# FP8 e4m3 weights (issue 30), w = fp8 * scale in fp32:
#   fp8 (transformers' FineGrainedFP8, Qwen3-FP8 and DeepSeek checkpoints): weight float8_e4m3fn
#     [N, K], weight_scale_inv fp32 [ceil(N/128), ceil(K/128)] (one per 128x128 block, partial
#     blocks at the edges; it multiplies, despite its name); scales random, so that the blocks
#     differ and a transposed or misplaced scale shows.
#   compressed-tensors float-quantized, strategy channel (FP8_DYNAMIC): weight float8_e4m3fn
#     [N, K], weight_scale bf16 [N, 1]; input activations dynamic per token (we keep ours bf16/fp32).
# Fused experts on disk ([E, 2I, H] gate rows first, [E, H, I]) become per-expert modules, as
# quantized Qwen3-MoE checkpoints name them.
QWEN3_G128 = dict(hidden_size=128, head_dim=32, intermediate_size=256, moe_intermediate_size=256)
QWEN3_G64 = dict(head_dim=32, intermediate_size=128, moe_intermediate_size=64)
# FP8 (issue 30): widths that are not multiples of the 128 block (192, 160, 320: partial blocks).
QWEN3_FP8 = dict(hidden_size=192, head_dim=32, intermediate_size=320, moe_intermediate_size=160)
# The same checkpoint format with no partial blocks (every dim <= 128 or a multiple of it, as in the
# published FP8 checkpoints), which transformers' own FP8 loading reads correctly: 5.17's
# Fp8Dequantize takes the block as dim // scale-grid dim, so qwen3_moe_fp8's [320, 192] with its
# [3, 2] scales is refused ("Weight shape (320, 192) not divisible by scale grid (3, 2).") and its
# [160, 192] with [2, 2] would be read as blocks of 80 x 96. This fixture gets the second reference
# (write_fp8_loader_reference).
QWEN3_FP8_B128 = dict(hidden_size=256, head_dim=32, intermediate_size=256, moe_intermediate_size=128)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # the nibble of output 8i + j (AutoAWQ's unpacking)
QUANT = {
    "qwen3_moe_gptq": dict(base="qwen3_moe", method="gptq", group=32),
    "qwen3_moe_gptq_g128": dict(base="qwen3_moe", method="gptq", group=128, overrides=QWEN3_G128),
    "qwen3_moe_ct": dict(base="qwen3_moe", method="compressed-tensors", group=32),
    "qwen3_moe_gptq_asym": dict(base="qwen3_moe", method="gptq_asym", group=64,
                                overrides=QWEN3_G64),
    "qwen3_moe_awq": dict(base="qwen3_moe", method="awq", group=128, overrides=QWEN3_G128),
    "qwen3_moe_fp8": dict(base="qwen3_moe", method="fp8", group=128, overrides=QWEN3_FP8),
    "qwen3_moe_ct_fp8": dict(base="qwen3_moe", method="ct_fp8", group=128, overrides=QWEN3_FP8),
    "qwen3_moe_fp8_b128": dict(base="qwen3_moe", method="fp8", group=128,
                               overrides=QWEN3_FP8_B128, fp8_loader_reference=True),
}


def quantize_sym4(w, group, scale_dtype):
    """w [N, K] fp32 -> codes q [N, K] in [0, 15] (zero point 8), scales [N, K/g] (scale_dtype,
    exactly representable in fp16), dequantized [N, K] fp32."""
    n, k = w.shape
    assert k % group == 0, (w.shape, group)
    g = w.reshape(n, k // group, group)
    s = (g.abs().amax(dim=-1) / 7.5).clamp(min=1e-6).to(scale_dtype)
    assert torch.equal(s.to(torch.float16).to(torch.float32), s.to(torch.float32))
    sf = s.to(torch.float32).unsqueeze(-1)
    q = (torch.round(g / sf) + 8).clamp(0, 15)
    deq = ((q - 8) * sf).reshape(n, k)
    return q.reshape(n, k).to(torch.int32), s, deq


def quantize_asym4(w, group, gen):
    """w [N, K] fp32 -> codes q [N, K] in [0, 15], zero points z [N, K/g] drawn in [1, 14], fp16
    scales [N, K/g] wide enough that nothing clips, dequantized (q - z) s [N, K] fp32. (z = 0 or
    15 would clip one sign of a group away: a first AWQ fixture with them was a model whose bf16
    KV cache moved its logits by 0.74 relative, against 0.007 for the GPTQ g128 fixture.)"""
    n, k = w.shape
    assert k % group == 0, (w.shape, group)
    g = w.reshape(n, k // group, group)
    z = torch.randint(1, 15, (n, k // group), generator=gen)
    hi, lo = g.amax(dim=-1).clamp(min=0), g.amin(dim=-1).clamp(max=0)
    s = torch.maximum(hi / (15 - z), -lo / z).clamp(min=1e-4).to(torch.float16)
    sf = s.to(torch.float32).unsqueeze(-1)
    zf = z.to(torch.float32).unsqueeze(-1)
    q = (torch.round(g / sf) + zf).clamp(0, 15)
    deq = ((q - zf) * sf).reshape(n, k)
    return q.reshape(n, k).to(torch.int32), z.to(torch.int32), s, deq


def quantize_fp8(w, gen, block):
    """w [N, K] fp32 -> codes float8_e4m3fn [N, K], scales [ceil(N/b), ceil(K/b)] fp32 (block) or
    [N, 1] bf16 (block None: per output channel), dequantized fp8 * scale [N, K] fp32. A scale is
    the block's max |w| / 448 times a random factor in [1, 4): codes use varied exponents."""
    n, k = w.shape
    if block is None:
        amax = w.abs().amax(dim=1, keepdim=True)
        s = (amax / 448 * (1 + 3 * torch.rand(amax.shape, generator=gen))).clamp(min=1e-6)
        s = s.to(torch.bfloat16)
        full = s.float().expand(n, k)
    else:
        nb, kb = -(-n // block), -(-k // block)
        s = torch.empty(nb, kb)
        for i in range(nb):
            for j in range(kb):
                amax = w[i * block:(i + 1) * block, j * block:(j + 1) * block].abs().max()
                s[i, j] = (amax / 448 * (1 + 3 * torch.rand((), generator=gen))).clamp(min=1e-6)
        full = s.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    q = (w / full).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s, q.float() * full


def pack8(codes):
    """codes int32 [..., 8m] in [0, 15] -> int32 [..., m]: element 8i + j in bits 4j..4j+3."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8).to(torch.int64)
    word = torch.zeros(c.shape[:-1], dtype=torch.int64)
    for j in range(8):
        word |= c[..., j] << (4 * j)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack8(words):
    """int32 [..., m] -> int64 [..., 8m]: nibble j of word i at 8i + j (pack8's inverse)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(w >> (4 * j)) & 15 for j in range(8)], dim=-1).reshape(
        *words.shape[:-1], -1)


def check_asym_packing(method, packed, mod, codes, z):
    """The packed tensors read back the way their format's readers do (GPTQ: inputs along
    qweight's rows, qzeros + 1; AWQ: AWQ_REVERSE_ORDER within each word) give codes and z."""
    if method == "gptq_asym":
        q = unpack8(packed[mod + ".qweight"].t().contiguous())
        zeros = unpack8(packed[mod + ".qzeros"]) + 1
    else:
        def unawq(t):
            u = unpack8(t)
            return u.reshape(u.shape[0], -1, 8)[:, :, AWQ_REVERSE_ORDER].reshape(u.shape[0], -1)
        q = unawq(packed[mod + ".qweight"]).t()
        zeros = unawq(packed[mod + ".qzeros"])
    assert torch.equal(q, codes.to(torch.int64)), mod
    assert torch.equal(zeros, z.t().to(torch.int64)), mod


def quantized_modules(tensors, spec):
    """{module: fp32 weight [N, K]} of every matrix to quantize, fused experts split."""
    out = {}
    for key, t in tensors.items():
        if key.endswith(".experts.gate_up_proj"):
            base = key[:-len("gate_up_proj")]
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj"] = t[e, :half]
                out[f"{base}{e}.up_proj"] = t[e, half:]
        elif key.endswith(".experts.down_proj"):
            base = key[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj"] = t[e]
        elif key.endswith("_proj.weight") and t.dim() == 2:
            out[key[:-len(".weight")]] = t
    return out


def make_quant(name, q, out_dir, seed):
    from safetensors.torch import load_file
    spec = dict(ARCHS[q["base"]], **q.get("overrides", {}))
    model, gen = build(spec, seed)
    plain = os.path.join(out_dir, "_plain_" + name)  # the fp32 model as saved, then dequantized
    model.save_pretrained(plain, safe_serialization=True)
    tensors = load_file(os.path.join(plain, "model.safetensors"))
    modules = quantized_modules(tensors, spec)
    group, method = q["group"], q["method"]
    packed, deq = {}, {}
    for mod, w in modules.items():
        w = w.contiguous().float()
        n, k = w.shape
        if method in ("gptq_asym", "awq"):
            codes, z, s, d = quantize_asym4(w, group, gen)
            zeros = z.t().contiguous()  # [K/g, N]
            if method == "gptq_asym":
                by_k = codes.t().reshape(k // 8, 8, n).permute(0, 2, 1).contiguous()
                packed[mod + ".qweight"] = pack8(by_k).reshape(k // 8, n)
                packed[mod + ".qzeros"] = pack8(zeros - 1)  # the v1 format stores z - 1
                packed[mod + ".g_idx"] = (torch.arange(k, dtype=torch.int32) // group)
            else:  # AWQ: along N, nibble p of word i holding output 8i + AWQ_ORDER[p]
                def awq_pack(t):
                    rows = t.shape[0]
                    return pack8(t.reshape(rows, n // 8, 8)[:, :, AWQ_ORDER].reshape(rows, n))
                packed[mod + ".qweight"] = awq_pack(codes.t().contiguous())
                packed[mod + ".qzeros"] = awq_pack(zeros)
            packed[mod + ".scales"] = s.t().contiguous()
            check_asym_packing(method, packed, mod, codes, z)
        elif method == "fp8":
            codes, s, d = quantize_fp8(w, gen, group)
            packed[mod + ".weight"] = codes
            packed[mod + ".weight_scale_inv"] = s
        elif method == "ct_fp8":
            codes, s, d = quantize_fp8(w, gen, None)
            packed[mod + ".weight"] = codes
            packed[mod + ".weight_scale"] = s
        elif method == "gptq":
            codes, s, d = quantize_sym4(w, group, torch.float16)
            # [K, N] -> [K/8, N, 8]: word (i, n) holds inputs 8i..8i+7 of output n.
            by_k = codes.t().reshape(k // 8, 8, n).permute(0, 2, 1).contiguous()
            packed[mod + ".qweight"] = pack8(by_k).reshape(k // 8, n)
            packed[mod + ".qzeros"] = pack8(torch.full((k // group, n), 7, dtype=torch.int32))
            packed[mod + ".scales"] = s.t().contiguous()
            packed[mod + ".g_idx"] = (torch.arange(k, dtype=torch.int32) // group)
        else:
            codes, s, d = quantize_sym4(w, group, torch.bfloat16)
            packed[mod + ".weight_packed"] = pack8(codes)
            packed[mod + ".weight_scale"] = s.contiguous()
            packed[mod + ".weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
        deq[mod] = d
    # The dequantized weights back into the saved layout, for transformers.
    ref = {}
    for key, t in tensors.items():
        if key.endswith(".experts.gate_up_proj"):
            base = key[:-len("gate_up_proj")]
            ref[key] = torch.stack([torch.cat([deq[f"{base}{e}.gate_proj"],
                                               deq[f"{base}{e}.up_proj"]]) for e in range(t.shape[0])])
        elif key.endswith(".experts.down_proj"):
            base = key[:-len("down_proj")]
            ref[key] = torch.stack([deq[f"{base}{e}.down_proj"] for e in range(t.shape[0])])
        elif key.endswith("_proj.weight") and t.dim() == 2:
            ref[key] = deq[key[:-len(".weight")]]
        else:
            ref[key] = t
        assert ref[key].shape == t.shape, key
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(plain, "model.safetensors"),
              metadata={"format": "pt"})
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        plain, torch_dtype=torch.float32, attn_implementation="eager")
    reference.eval()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    kept = {k: v.contiguous() for k, v in tensors.items()
            if not (k.endswith(".experts.gate_up_proj") or k.endswith(".experts.down_proj") or
                    (k.endswith("_proj.weight") and v.dim() == 2))}
    save_file(dict(kept, **packed), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    list_tensors(d)
    with open(os.path.join(plain, "config.json")) as f:
        config = json.load(f)
    if method in ("gptq", "gptq_asym"):
        config["quantization_config"] = dict(
            quant_method="gptq", bits=4, group_size=group, desc_act=False,
            sym=method == "gptq", checkpoint_format="gptq", damp_percent=0.01,
            true_sequential=True, static_groups=False)
    elif method == "awq":
        config["quantization_config"] = dict(
            quant_method="awq", bits=4, group_size=group, zero_point=True, version="gemm",
            modules_to_not_convert=None)
    elif method == "fp8":  # as Qwen3-30B-A3B-FP8's config.json has it
        config["quantization_config"] = dict(
            quant_method="fp8", activation_scheme="dynamic", fmt="e4m3",
            weight_block_size=[group, group], modules_to_not_convert=["lm_head"])
    elif method == "ct_fp8":  # llm-compressor's FP8_DYNAMIC scheme
        config["quantization_config"] = dict(
            quant_method="compressed-tensors", format="float-quantized",
            quantization_status="compressed", kv_cache_scheme=None,
            ignore=["lm_head", "re:.*mlp.gate$"],
            config_groups=dict(group_0=dict(
                targets=["Linear"], format="float-quantized", output_activations=None,
                input_activations=dict(num_bits=8, type="float", symmetric=True,
                                       strategy="token", dynamic=True, observer=None),
                weights=dict(num_bits=8, type="float", symmetric=True, strategy="channel",
                             group_size=None, dynamic=False, observer="minmax"))))
    else:
        config["quantization_config"] = dict(
            quant_method="compressed-tensors", format="pack-quantized",
            quantization_status="compressed", kv_cache_scheme=None,
            ignore=["lm_head", "re:.*mlp.gate$"],
            config_groups=dict(group_0=dict(
                targets=["Linear"], format="pack-quantized", input_activations=None,
                output_activations=None,
                weights=dict(num_bits=4, type="int", symmetric=True, strategy="group",
                             group_size=group, dynamic=False, actorder=None,
                             observer="minmax"))))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    gap = write_reference(reference, spec, gen, d, seed)
    if q.get("fp8_loader_reference"):
        write_fp8_loader_reference(d)
    shutil.rmtree(plain)
    return gap


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*", help="make only these architectures")
    ap.add_argument("--fp8_loader_reference", nargs="*", metavar="DIR",
                    help="only write transformers' FP8-loader reference into these fixtures")
    args = ap.parse_args()
    if args.fp8_loader_reference:
        for d in args.fp8_loader_reference:
            write_fp8_loader_reference(d)
        return
    if not args.out:
        ap.error("--out is required")
    for mod in ("fla", "causal_conv1d"):  # hub kernels would replace the torch reference
        try:
            __import__(mod)
            print(f"{mod}: importable (its kernels may replace the torch code)")
        except ImportError:
            print(f"{mod}: not installed (the torch reference runs)")
    jobs = [(arch, lambda seed, a=arch, s=spec: make(a, s, args.out, seed))
            for arch, spec in ARCHS.items()]
    jobs += [(name, lambda seed, n=name, q=q: make_quant(n, q, args.out, seed))
             for name, q in QUANT.items()]
    for arch, job in jobs:
        if args.only and arch not in args.only:
            continue
        # A greedy continuation is only a fair test if no step is a near-tie.
        for seed in range(1, 50):
            gap = job(seed)
            if gap > 1e-3:
                break
        print(f"{arch}: seed {seed} min greedy gap {gap:.4g}")
        for name in sorted(os.listdir(os.path.join(args.out, arch))):
            print("   ", name, os.path.getsize(os.path.join(args.out, arch, name)))


if __name__ == "__main__":
    main()
