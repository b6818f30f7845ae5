"""Text work per round, early and late in a long generation: the stop-string test and the streamer (what the engine
calls after each round: StopStrings.cut_ids, then Streamer.on_tokens) over a 4,000-token output committed in
rounds of 1-4 tokens, timed round by round. Detokenized incrementally, a round's text work follows its new tokens:
the median round near token 4,000 should cost within 1.5x of one near token 100. The whole-text implementation it
replaced (tests/detok_reference.py, each round decoding the whole output) is timed alongside for comparison.

No model runs: the output is the embedded pair's tokenizer's encoding of Python source with some multi-byte text,
the stop strings never occur (so the output runs to its end), and the streamer sends token chunks (the server's
mode) to a callback that keeps them.

    python benchmarks/steps/detok_flat.py --out benchmarks/results/detok_flat/detok_flat.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STOPS = ["\n\n\n\n#END", "<|stop|>", "Observation:", "中文字字"]  # none occurs in the output


def output_ids(tok, tokens: int) -> list[int]:
    """`tokens` ids of Python source (this package's) with lines of multi-byte text among them."""
    import multispec

    text, extra = "", ["# é中文 ひらがな 😀 ∑ €\n", "s = 'ß → ✓'\n"]
    for i, path in enumerate(sorted(Path(multispec.__file__).parent.rglob("*.py"))):
        text += path.read_text() + extra[i % 2]
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) >= tokens:
            return ids[:tokens]
    raise SystemExit(f"not enough source text for {tokens} tokens")


def one_pass(stop_cls, streamer_cls, tok, ids: list[int], rounds: list[int]) -> list[tuple[int, float]]:
    """(output length, seconds of text work) per round."""
    stops = stop_cls(tok, STOPS)
    chunks: list = []
    streamer = streamer_cls(stops, chunks.append, tokens=True)
    new: list[int] = []
    out = []
    i = 0
    for r in rounds:
        new.extend(ids[i:i + r])
        i += r
        t0 = time.perf_counter()
        cut = stops.cut_ids(new)
        streamer.on_tokens(new)
        out.append((len(new), time.perf_counter() - t0))
        assert cut is None
        if i >= len(ids):
            break
    return out


def window(samples: list[tuple[int, float]], lo: int, hi: int) -> dict:
    times = [t for n, t in samples if lo <= n <= hi]
    return {"tokens": [lo, hi], "rounds": len(times), "median_round_us": statistics.median(times) * 1e6,
            "mean_round_us": statistics.fmean(times) * 1e6}


def measure(stop_cls, streamer_cls, tok, ids, rounds, repeats: int, early, late) -> dict:
    one_pass(stop_cls, streamer_cls, tok, ids, rounds)  # warm-up
    samples: list[tuple[int, float]] = []
    for _ in range(repeats):
        samples += one_pass(stop_cls, streamer_cls, tok, ids, rounds)
    a, b = window(samples, *early), window(samples, *late)
    return {"early": a, "late": b, "ratio_median": b["median_round_us"] / a["median_round_us"],
            "ratio_mean": b["mean_round_us"] / a["mean_round_us"]}


def environment() -> dict:
    import tokenizers
    import torch
    import transformers

    from multispec.bench.runner import cpu_name, git_commit

    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "torch": torch.__version__, "git_commit": git_commit(),
            "command": ["python", *sys.argv], "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the embedded pair's)")
    ap.add_argument("--no-reference", action="store_true", help="skip timing the whole-text implementation")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from multispec.loading import DEFAULT_PAIR_DIR
    from multispec.text import StopStrings, Streamer

    tok_dir = Path(args.tokenizer) if args.tokenizer else DEFAULT_PAIR_DIR / "target"
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = output_ids(tok, args.tokens)
    rng = random.Random(args.seed)
    rounds = [rng.randint(1, 4) for _ in range(args.tokens)]
    early, late = (50, 150), (args.tokens - 100, args.tokens)
    result = {
        "what": "seconds of text work per round (StopStrings.cut_ids + Streamer.on_tokens, token chunks) for an "
                f"output of {args.tokens} tokens in rounds of 1-4 tokens, {len(STOPS)} stop strings that never "
                f"occur; median over the rounds whose output length lies in each window, {args.repeats} passes",
        "tokenizer": str(tok_dir.relative_to(ROOT) if tok_dir.is_relative_to(ROOT) else tok_dir),
        "stops": STOPS, "tokens": args.tokens, "repeats": args.repeats, "seed": args.seed,
        "text_chars": len(tok.decode(ids, skip_special_tokens=True)),
        "incremental": measure(StopStrings, Streamer, tok, ids, rounds, args.repeats, early, late),
    }
    if not args.no_reference:
        sys.path.insert(0, str(ROOT / "tests"))
        from detok_reference import OldStopStrings, OldStreamer

        result["whole_text_reference"] = measure(OldStopStrings, OldStreamer, tok, ids, rounds,
                                                 max(1, args.repeats // 2), early, late)
    result["flat"] = result["incremental"]["ratio_median"] <= 1.5
    result["environment"] = environment()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
