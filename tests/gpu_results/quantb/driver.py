# Device driver (quantb): transformers' own FP8 loading of the qwen3_moe_fp8 fixture, every way
# 5.17 offers, each failure's text kept. Writes into $OUT.
import glob, inspect, json, os, shutil, sys, traceback
import torch, transformers
from safetensors.torch import load_file, save_file
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf

OUT = os.environ["OUT"]
d = sys.argv[1]
print("transformers", transformers.__version__, "torch", torch.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")
for mod in ("accelerate", "triton", "kernels"):
    try:
        m = __import__(mod); print(mod, getattr(m, "__version__", "?"))
    except Exception as e:
        print(mod, "missing:", e)
print("FineGrainedFP8Config", inspect.signature(transformers.FineGrainedFP8Config.__init__))
with open(os.path.join(OUT, "src.txt"), "w") as f:
    for name in ("transformers.quantizers.quantizer_finegrained_fp8",
                 "transformers.integrations.finegrained_fp8",
                 "transformers.utils.quantization_config"):
        try:
            m = __import__(name, fromlist=["x"])
            f.write(f"##### {name} {m.__file__}\n")
            f.write(inspect.getsource(m) if "quantization_config" not in name else
                    inspect.getsource(transformers.FineGrainedFP8Config))
        except Exception:
            f.write(traceback.format_exc())
expected = json.load(open(os.path.join(d, "expected.json")))
tokens = torch.tensor([expected["prompt_ids"] + expected["greedy_ids"]])
ref = load_file(os.path.join(d, "expected_logits.safetensors"))["logits"]

print("=== A: FineGrainedFP8Config(dequantize=True) passed to from_pretrained, CPU fp32")
ok = False
try:
    mf.write_fp8_loader_reference(d)
    ok = True
except Exception:
    traceback.print_exc()
if not ok:
    print("=== A2: dequantize true in config.json's quantization_config, no config argument")
    d2 = d + "_deq"
    shutil.copytree(d, d2)
    cfg = json.load(open(os.path.join(d2, "config.json")))
    cfg["quantization_config"]["dequantize"] = True
    json.dump(cfg, open(os.path.join(d2, "config.json"), "w"), indent=2)
    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(
            d2, torch_dtype=torch.float32, attn_implementation="eager")
        print({n: str(p.dtype) for n, p in list(m.state_dict().items())[:6]})
        mf.write_fp8_loader_reference(d2)
        shutil.copy(os.path.join(d2, mf.FP8_LOADER_LOGITS), d)
        ok = True
    except Exception:
        traceback.print_exc()
for f in glob.glob(os.path.join(d, mf.FP8_LOADER_LOGITS)):
    shutil.copy(f, OUT)

for dtype in (torch.float32, torch.bfloat16):
    print(f"=== B: native FP8 modules on CUDA, dtype {dtype}")
    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(
            d, torch_dtype=dtype, attn_implementation="eager", device_map="cuda")
        m.eval()
        kinds = sorted({type(x).__name__ for x in m.modules()})
        print("modules:", kinds)
        print({n: str(p.dtype) for n, p in m.state_dict().items() if "layers.0." in n})
        with torch.no_grad():
            logits = m(tokens.cuda()).logits[0].float().cpu()
        diff = (logits - ref).abs().max().item() / ref.abs().max().item()
        agree = (logits.argmax(-1) == ref.argmax(-1))[len(expected["prompt_ids"]) - 1:]
        print(f"native {dtype}: max relative difference to expected_logits {diff:.3g}, "
              f"argmax agreement {agree.float().mean().item():.3f}")
        lf = os.path.join(d, mf.FP8_LOADER_LOGITS)
        if os.path.exists(lf):
            a = load_file(lf)["logits"]
            print(f"native {dtype}: against the dequantize reference "
                  f"{(logits - a).abs().max().item() / a.abs().max().item():.3g}")
        tag = "f32" if dtype == torch.float32 else "bf16"
        save_file({"logits": logits.contiguous()},
                  os.path.join(OUT, f"expected_logits_fp8_native_{tag}.safetensors"))
    except Exception:
        traceback.print_exc()
