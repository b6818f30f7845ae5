"""Target-only decode speed of a Llama-2-7B-shaped model (random weights; bf16 on CUDA) on each backend, as a
fraction of the memory-bandwidth roofline: one decode step must read every weight once, so the fastest possible
step takes (bytes of weights read) / (nominal bandwidth). Batch 1, `--context` tokens cached, then `--steps`
greedy steps (each step's argmax is the next input, as in real decoding); tokens/s = steps / their seconds.

The weights read per step are every parameter except the input embedding table (a step reads one row of it);
the KV cache read (context x layers x 2 x kv width) is reported beside, not counted in the roofline.

    python benchmarks/steps/gpu_roofline.py --out $OUT/roofline.json                      # on the GPU machine
    python benchmarks/steps/gpu_roofline.py --layers 2 --hidden 64 --heads 4 --intermediate 128 --vocab 256 \\
        --device cpu --dtype float32 --out /tmp/roofline.json                       # a smoke test on a CPU
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# Nominal HBM bandwidth in GB/s by device-name fragment (vendor data sheets); --bandwidth overrides.
BANDWIDTH_GBS = {"H200": 4800, "H100 NVL": 3900, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
                 "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "A10G": 600}


def nominal_bandwidth(name: str) -> float | None:
    for key, gbs in BANDWIDTH_GBS.items():  # longest names first where they share a prefix (dict order above)
        if key in name:
            return gbs * 1e9
    return None


def build_model(args, device, dtype):
    """A Llama of the given shape with transformers' random initialisation, made on the device (fp32 there, then
    cast: 27 GB then 13.5 GB for the 7B shape, no CPU copy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads or args.heads, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def decode_rate(model, kind: str, context: int, steps: int, sync) -> dict:
    from multispec.models import forward_chain, make_backend

    backend = make_backend(model, kind, max_len=context + steps + 64)
    t0 = time.perf_counter()
    if kind == "compiled":
        backend.warm_up()
    warm_s = time.perf_counter() - t0
    ids = torch.randint(1, model.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    out = forward_chain(backend, ids)
    tok = out.logits[-1].argmax().view(1)
    for _ in range(3):  # untimed steps
        tok = backend.forward(tok, torch.tensor([backend.cache_len]), None).logits[-1].argmax().view(1)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = backend.forward(tok, torch.tensor([backend.cache_len]), None).logits[-1].argmax().view(1)
    sync()
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": steps / seconds, "step_s": seconds / steps, "compile_s": warm_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--backends", default="compiled,fast,hf")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--bandwidth", type=float, help="nominal memory bandwidth in GB/s (default: by device name)")
    args = ap.parse_args()
    from multispec.api import resolve_device
    from multispec.bench.runner import cpu_name, git_commit

    device, dtype = resolve_device(args.device), getattr(torch, args.dtype)
    on_cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    name = torch.cuda.get_device_name(device) if on_cuda else cpu_name()
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else nominal_bandwidth(name)
    model = build_model(args, device, dtype)
    elt = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt - model.model.embed_tokens.weight.numel() * elt
    kv_bytes = args.context * args.layers * 2 * (args.kv_heads or args.heads) * (args.hidden // args.heads) * elt
    roofline_s = weight_bytes / bandwidth if bandwidth else None
    import transformers

    result = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
              "git_commit": git_commit(), "command": sys.argv, "dtype": args.dtype,
              "shape": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate",
                                                       "vocab")},
              "context": args.context, "steps": args.steps, "weight_bytes_per_step": weight_bytes,
              "kv_bytes_per_step": kv_bytes, "nominal_bandwidth_Bps": bandwidth, "roofline_step_s": roofline_s,
              "backends": {}}
    for kind in args.backends.split(","):
        r = decode_rate(model, kind, args.context, args.steps, sync)
        if roofline_s:
            r["fraction_of_roofline"] = roofline_s / r["step_s"]
        result["backends"][kind] = r
        frac = f", {r['fraction_of_roofline']:.1%} of the roofline" if roofline_s else ""
        print(f"{kind}: {r['tokens_per_s']:.1f} tok/s, {r['step_s'] * 1e3:.2f} ms/step{frac}", file=sys.stderr,
              flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
