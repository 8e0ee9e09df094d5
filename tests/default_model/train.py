#!/usr/bin/env python3
"""Trains the built-in default model: a small Qwen3-MoE (8 layers, 32 experts, top-4) on the King
James Bible, then on chat turns made from it (prepare.py), in a bounded time on one GPU. Writes
the checkpoint in the Hugging Face layout the engine loads (bf16 safetensors, one tensor per
expert projection), then checks it against transformers and writes the golden fixture.

Run on the GPU machine (torch and transformers are there), with the ids made here:
    python3 tests/default_model/train.py --data DIR --out OUT --minutes 7
DIR holds pretrain.bin, chat.bin, valid.bin, heldout.bin (uint16 ids, corpus_tool.cc), tokenizer.json,
tokenizer_config.json and prompts.json. OUT gets config.json, generation_config.json,
model.safetensors, golden.json and golden_logits.safetensors.
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=4096,
    hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, intermediate_size=256, moe_intermediate_size=48, num_experts=32,
    num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    rms_norm_eps=1e-6, max_position_embeddings=2048, rope_theta=10000.0,
    tie_word_embeddings=False, attention_bias=False, router_aux_loss_coef=0.01,
    torch_dtype="bfloat16")
SEQ = 256
BATCH = 64


def rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Model(torch.nn.Module):
    """Qwen3-MoE's forward (transformers' modeling_qwen3_moe) with the experts computed densely
    and weighted by the router (zero for experts not chosen): the same function, faster to train
    at this size than gathering tokens per expert."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        H, L, E, I, D = (c["hidden_size"], c["num_hidden_layers"], c["num_experts"],
                         c["moe_intermediate_size"], c["head_dim"])
        nh, kvh, V = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
        p = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)
        one = lambda *s: torch.nn.Parameter(torch.ones(*s))
        self.embed = p(V, H)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            m = torch.nn.Module()
            m.ln1, m.ln2, m.qn, m.kn = one(H), one(H), one(D), one(D)
            m.q, m.k, m.v = p(nh * D, H), p(kvh * D, H), p(kvh * D, H)
            m.o = torch.nn.Parameter(torch.randn(H, nh * D) * 0.02 / math.sqrt(2 * L))
            m.router = p(E, H)
            m.gate, m.up = p(E, I, H), p(E, I, H)
            m.down = torch.nn.Parameter(torch.randn(E, H, I) * 0.02 / math.sqrt(2 * L))
            self.layers.append(m)
        self.norm = one(H)
        self.lm_head = p(V, H)
        D2 = torch.arange(0, D, 2, dtype=torch.float32) / D
        self.register_buffer("inv_freq", 1.0 / (c["rope_theta"] ** D2), persistent=False)

    def forward(self, ids):
        c = self.c
        B, T = ids.shape
        nh, kvh, D, k = (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                         c["num_experts_per_tok"])
        eps = c["rms_norm_eps"]
        pos = torch.arange(T, device=ids.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed[ids]
        aux = 0.0
        for m in self.layers:
            h = rms_norm(x, m.ln1, eps)
            q = rms_norm((h @ m.q.T).view(B, T, nh, D), m.qn, eps).transpose(1, 2)
            kk = rms_norm((h @ m.k.T).view(B, T, kvh, D), m.kn, eps).transpose(1, 2)
            v = (h @ m.v.T).view(B, T, kvh, D).transpose(1, 2)
            q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
            kk = kk * cos.to(kk.dtype) + rotate_half(kk) * sin.to(kk.dtype)
            kk = kk.repeat_interleave(nh // kvh, dim=1)
            v = v.repeat_interleave(nh // kvh, dim=1)
            a = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(B, T, nh * D) @ m.o.T
            h = rms_norm(x, m.ln2, eps).reshape(B * T, -1)
            probs = torch.softmax((h @ m.router.T).float(), dim=-1)
            top_w, top_i = probs.topk(k, dim=-1)
            top_w = top_w / top_w.sum(-1, keepdim=True)
            weights = torch.zeros_like(probs).scatter(1, top_i, top_w).to(h.dtype)  # [N, E]
            g = torch.einsum("nh,eih->nei", h, m.gate)
            u = torch.einsum("nh,eih->nei", h, m.up)
            y = torch.einsum("nei,ehi->neh", F.silu(g) * u * weights[..., None], m.down)
            x = x + y.sum(1).view(B, T, -1)
            # Switch-style balance: fraction routed to each expert times its mean probability.
            frac = torch.zeros_like(probs).scatter(1, top_i, 1.0).mean(0) / k
            aux = aux + c["num_experts"] * (frac * probs.mean(0)).sum()
        return rms_norm(x, self.norm, eps) @ self.lm_head.T, aux / len(self.layers)

    def hf_state_dict(self):
        """The tensors under transformers' names, bf16."""
        out = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm,
               "lm_head.weight": self.lm_head}
        for l, m in enumerate(self.layers):
            p = f"model.layers.{l}."
            out.update({p + "input_layernorm.weight": m.ln1,
                        p + "post_attention_layernorm.weight": m.ln2,
                        p + "self_attn.q_proj.weight": m.q, p + "self_attn.k_proj.weight": m.k,
                        p + "self_attn.v_proj.weight": m.v, p + "self_attn.o_proj.weight": m.o,
                        p + "self_attn.q_norm.weight": m.qn, p + "self_attn.k_norm.weight": m.kn,
                        p + "mlp.gate.weight": m.router})
            for e in range(self.c["num_experts"]):
                x = f"{p}mlp.experts.{e}."
                out.update({x + "gate_proj.weight": m.gate[e], x + "up_proj.weight": m.up[e],
                            x + "down_proj.weight": m.down[e]})
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def load_ids(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def eval_loss(model, ids, device):
    """Mean next-token loss over windows of SEQ tokens, each scored from its start."""
    model.eval()
    n = (len(ids) - 1) // SEQ * SEQ
    xs = ids[:n].view(-1, SEQ).to(device)
    nll, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, xs.size(0), 64):
            w = xs[i:i + 64]
            logits, _ = model(w)
            nll += F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                   w[:, 1:].reshape(-1), reduction="sum").item()
            count += w[:, 1:].numel()
    model.train()
    return nll / count


def batches(ids, gen, device):
    starts = torch.randint(0, len(ids) - SEQ - 1, (BATCH,), generator=gen)
    x = torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()]).to(device)
    return x[:, :-1], x[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=7.0, help="time budget of both phases")
    ap.add_argument("--pretrain_steps", type=int, default=2000,
                    help="most steps on the Bible text (stops early on validation)")
    ap.add_argument("--chat_steps", type=int, default=600,
                    help="steps on half chat, half Bible text batches")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(20261127)
    gen = torch.Generator().manual_seed(20261127)
    dev = "cuda"
    pre, chat, valid, held = (load_ids(os.path.join(args.data, f)) for f in
                              ("pretrain.bin", "chat.bin", "valid.bin", "heldout.bin"))
    print(f"tokens: pretrain {len(pre)}, chat {len(chat)}, validation {len(valid)}, "
          f"held-out {len(held)}", flush=True)
    model = Model(CONFIG).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {params / 1e6:.2f} M ({CONFIG['num_hidden_layers']} layers, "
          f"{CONFIG['num_experts']} experts, top-{CONFIG['num_experts_per_tok']})", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    start = time.time()
    budget = args.minutes * 60

    def train_steps(phase, steps, peak_lr, pick, stop_early):
        """Cosine-decayed steps on batches from pick(step); every 100 steps the validation loss,
        keeping the best weights when stop_early (and stopping after 3 evaluations without a
        better one). Returns the validation loss of the weights kept."""
        best, best_state, worse = float("inf"), None, 0
        for step in range(steps):
            if time.time() - start > budget:
                print(f"{phase}: time budget reached at step {step}", flush=True)
                break
            lr = peak_lr * min(1.0, (step + 1) / 100) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = batches(pick(step), gen, dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, aux = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            (loss + CONFIG["router_aux_loss_coef"] * aux).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 100 == 99 or step == steps - 1:
                v = eval_loss(model, valid, dev)
                print(f"{phase} step {step + 1:5d}  {time.time() - start:6.1f}s  lr {lr:.2e}  "
                      f"train {loss.item():.3f}  aux {aux.item():.3f}  valid {v:.3f}", flush=True)
                if v < best:
                    best, worse = v, 0
                    best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
                else:
                    worse += 1
                    if stop_early and worse >= 3:
                        print(f"{phase}: validation stopped improving", flush=True)
                        break
        if stop_early and best_state is not None:
            model.load_state_dict(best_state)
            return best
        return eval_loss(model, valid, dev)

    v = train_steps("pretrain", args.pretrain_steps, args.lr, lambda s: pre, stop_early=True)
    print(f"pretrain kept: validation perplexity {math.exp(v):.2f}", flush=True)
    v = train_steps("chat", args.chat_steps, args.lr / 3, lambda s: chat if s % 2 else pre,
                    stop_early=False)
    print(f"after chat: validation perplexity {math.exp(v):.2f}", flush=True)
    h = eval_loss(model, held, dev)
    print(f"held-out perplexity (training code, fp32 weights): {math.exp(h):.2f}", flush=True)

    tok_cfg = json.load(open(os.path.join(args.data, "tokenizer_config.json")))
    tok = json.load(open(os.path.join(args.data, "tokenizer.json")))
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos, eot = special["<|im_end|>"], special["<|endoftext|>"]
    config = dict(CONFIG, bos_token_id=eot, eos_token_id=eos)
    save_file(model.hf_state_dict(), os.path.join(args.out, "model.safetensors"),
              metadata={"format": "pt"})
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": eot, "eos_token_id": [eos, eot]},
              open(os.path.join(args.out, "generation_config.json"), "w"), indent=2)
    golden(args, model, tok_cfg, eos)


def golden(args, model, tok_cfg, eos):
    """transformers loads the checkpoint (fp32 on the CPU, exact): its logits on the first fixed
    prompt and 32 greedy tokens are the golden fixture; the training code must agree with it."""
    import transformers
    from tokenizers import Tokenizer
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(args.data, name)) as src, open(os.path.join(args.out, name), "w") as d:
            d.write(src.read())
    ref = transformers.AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    ref.eval()
    tokenizer = Tokenizer.from_file(os.path.join(args.data, "tokenizer.json"))
    prompts = json.load(open(os.path.join(args.data, "prompts.json")))
    answers = []
    for i, user in enumerate(prompts):
        text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids])
        with torch.no_grad():
            out = ref.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=eos,
                               pad_token_id=eos)
        new = out[0, ids.size(1):].tolist()
        answers.append({"prompt": user, "ids": new, "text": tokenizer.decode(new)})
        print(f"transformers greedy, prompt {i}: {user!r} -> {tokenizer.decode(new)!r}", flush=True)
        if i == 0:
            with torch.no_grad():
                full = ref.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                    eos_token_id=None, pad_token_id=eos)[0]
                logits = ref(full.unsqueeze(0)).logits[0].float()
                model.float()
                for t in model.parameters():  # the checkpoint's bf16 values, as transformers has
                    t.copy_(t.to(torch.bfloat16).float())
                mine, _ = model(full.unsqueeze(0).cuda())
            diff = (mine[0].cpu() - logits).abs().max().item() / logits.abs().max().item()
            print(f"training code vs transformers: max relative logit error {diff:.3g}", flush=True)
            top2 = logits.topk(2, dim=-1).values
            gap = (top2[:, 0] - top2[:, 1])[ids.size(1) - 1:].min().item()
            save_file({"logits": logits.contiguous()},
                      os.path.join(args.out, "golden_logits.safetensors"))
            golden_json = {"prompt_ids": ids[0].tolist(), "greedy_ids": full[ids.size(1):].tolist(),
                           "min_greedy_logit_gap": gap, "transformers": transformers.__version__,
                           "torch": torch.__version__}
    golden_json["answers"] = answers
    json.dump(golden_json, open(os.path.join(args.out, "golden.json"), "w"), indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
