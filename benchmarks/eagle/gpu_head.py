"""Train the SmolLM2-135M-Instruct head on a lent GPU within a wall-clock budget (the head decodes on the CPU).

The recipe of the shipped head (smollm2_data.py, then `multispec train-head`), with the data and steps a GPU
affords: the target's own continuations (greedy and T = 0.7 by turns, then T = 1) of the never-measured prompts
(smollm2_data.prompt_items) and of the built-in prompt set (training/prompts.py), generated for `--gen-share` of
the budget in batches of 256; then `train_head` on that text and Python source, on CUDA, until the budget ends.
Writes OUT/head (the head), OUT/own.jsonl's size and OUT/gpu_head.json (device, versions, commit, timings).

    python benchmarks/eagle/gpu_head.py --target SmolLM2.gguf --data-dir DATA --out OUT --seconds 480
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_data import prompt_items  # noqa: E402

from multispec import load_pair  # noqa: E402
from multispec.loading import eos_ids  # noqa: E402
from multispec.training.eagle import HeadTrainConfig, train_head  # noqa: E402
from multispec.training.onpolicy import bf16_autocast, builtin_prompts, continuations  # noqa: E402


def log(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=480)
    ap.add_argument("--gen-share", type=float, default=0.35)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4_000_000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--commit", default="")
    ap.add_argument("--own", help="where the own text is written (default: OUT/own.jsonl)")
    ap.add_argument("--chat", type=int, default=700, help="chat prompts (smollm2_data.prompt_items)")
    ap.add_argument("--width", type=int, default=384, help="prompt tokens kept (the last ones)")
    ap.add_argument("--more-chat", action="store_true", help="every GSM8K question, MT-Bench and small Alpaca sets")
    a = ap.parse_args()
    t0 = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pair = load_pair(target=a.target, device=a.device, dtype=torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = True  # after the load's exactness probe (which TF32 would fail)
    log(f"loaded in {time.monotonic() - t0:.0f} s on {pair.device}")
    code, asks = builtin_prompts(pair.tokenizer, pair.target.config.vocab_size, 3000, 256)
    prompts = [ids for ids, _ in prompt_items(pair, a.data_dir, a.chat, a.width, a.more_chat)] + code + asks
    log(f"{len(prompts)} prompts")
    model, eos = pair.target.eval(), sorted(eos_ids(pair))
    deadline = t0 + a.gen_share * a.seconds
    own, n_new = Path(a.own or out / "own.jsonl"), 0
    with open(own, "w") as f, bf16_autocast(model.device):
        for k, (temperature, alternate) in enumerate(((0.7, True), (1.0, False), (0.7, False))):  # while time remains
            for full in continuations(model, prompts, max_new=a.max_new, batch=a.batch, temperature=temperature,
                                      eos=eos, pad=eos[0], deadline=deadline, seed=int(temperature * 10) + 100 * k,
                                      alternate=alternate):
                f.write(json.dumps({"ids": full}) + "\n")
                n_new += len(full)
            log(f"own text: {n_new} tokens (prompts included), {time.monotonic() - t0:.0f} s")
            if time.monotonic() > deadline:
                break
    gen_s = time.monotonic() - t0
    del pair, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    left = a.seconds - (time.monotonic() - t0)
    cfg = HeadTrainConfig(target=a.target, out=str(out / "head"), data=(str(own), "python"), minutes=left / 60,
                          vocab=8192, unroll=a.unroll, batch=a.train_batch, max_tokens=a.max_tokens,
                          device=a.device, collect_share=0.15, eval_every=30, heldout_chunks=32, overwrite=True)
    summary = train_head(cfg, log=log)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    import transformers

    meta = {"device": dev, "torch": torch.__version__, "transformers": transformers.__version__,
            "commit": a.commit, "own_tokens": n_new, "generation_seconds": gen_s,
            "total_seconds": time.monotonic() - t0, "train_tokens": summary["train_tokens"],
            "heldout_alpha": summary["alpha"], "greedy_agree": summary["greedy_agree"], "steps": summary["steps"],
            "curve": summary["curve"], "config": {k: str(x) for k, x in vars(a).items()}}
    (out / "gpu_head.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"done: alpha {summary['alpha']:.3f}, {summary['train_tokens']} training tokens, "
        f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
