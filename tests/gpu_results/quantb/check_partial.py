# transformers 5.17's Fp8Dequantize on qwen3_moe_fp8's partial-block matrices, against the exact
# fp8 * block scale (make_fixtures.exact_fp8_weights).
import os, sys
import torch
from safetensors.torch import load_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf
d = sys.argv[1]
t = load_file(os.path.join(d, "model.safetensors"))
exact = mf.exact_fp8_weights(d, 128)
deq = Fp8Dequantize(None)
for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "model.layers.0.mlp.experts.0.down_proj.weight", "model.layers.1.mlp.gate_proj.weight"):
    try:
        w = deq._dequantize_one(t[key], t[key + "_scale_inv"], output_dtype=torch.float32)
        e = exact[key]
        print(key, list(t[key].shape), "scales", list(t[key + "_scale_inv"].shape),
              "max relative error", ((w - e).abs().max() / e.abs().max()).item())
    except Exception as ex:
        print(key, list(t[key].shape), "refused:", ex)
