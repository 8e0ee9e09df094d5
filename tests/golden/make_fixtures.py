#!/usr/bin/env python3
"""Makes the golden fixtures: tiny random models of every supported architecture, written by
transformers' save_pretrained (the on-disk format real checkpoints use), with the reference
logits of every position of prompt + greedy continuation and the greedy continuation itself.

Run on the GPU machine (it has torch and transformers):
    python3 tests/golden/make_fixtures.py --out tests/golden/fixtures
Everything is fp32 on the CPU so that the reference is exact and deterministic.
"""
import argparse
import json
import os

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


def make(arch, spec, out_dir, seed):
    cfg_kwargs = dict(COMMON)
    cfg_kwargs.update({k: v for k, v in spec.items() if k != "cls"})
    config = getattr(transformers, spec["cls"])(**cfg_kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    perturb_(model, gen)
    prompt = torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=gen)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=NEW_TOKENS)
        full = out[0]
        logits = model(full.unsqueeze(0)).logits[0].float()  # [L, V]
    top2 = logits.topk(2, dim=-1).values
    min_gap = (top2[:, 0] - top2[:, 1])[PROMPT_LEN - 1:].min().item()
    d = os.path.join(out_dir, arch)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    save_file({"logits": logits.contiguous()}, os.path.join(d, "expected_logits.safetensors"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"prompt_ids": prompt[0].tolist(),
                   "greedy_ids": full[PROMPT_LEN:].tolist(),
                   "min_greedy_logit_gap": min_gap,
                   "seed": seed,
                   "transformers": transformers.__version__,
                   "torch": torch.__version__}, f, indent=1)
    return min_gap


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for arch, spec in ARCHS.items():
        # A greedy continuation is only a fair test if no step is a near-tie.
        for seed in range(1, 50):
            gap = make(arch, spec, args.out, seed)
            if gap > 1e-3:
                break
        print(f"{arch}: seed {seed} min greedy gap {gap:.4g}")
        for name in sorted(os.listdir(os.path.join(args.out, arch))):
            print("   ", name, os.path.getsize(os.path.join(args.out, arch, name)))


if __name__ == "__main__":
    main()
