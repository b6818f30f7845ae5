"""Token-level vs sequence-level verification (issue 13) from `multispec bench` results.json files; no model runs.

Pairs each token-level configuration with its sequence-level twin on the same prompts and seeds: `sd:k=K` with
`sd:k=K,verifier=block`, and `mcsd:tree=X,verifier=rrs-wor` with `mcsd:tree=X,verifier=traversal`. Several files (e.g. one
run per temperature) are read together; writes into --out `verifiers.md` (a README-ready table: mean accepted length per target call as vLLM reports it,
1 + accepted / drafting rounds, its gain with a 95% bootstrap interval over prompts, tokens/s and the tokens/s
ratio) and `accepted_length.png`.

    PYTHONPATH=src .venv/bin/python benchmarks/verifiers/verifiers_report.py benchmarks/results/verifiers/T*/results.json \
        --out benchmarks/results/verifiers
"""
from __future__ import annotations

import argparse
import gzip
import json
import shlex
from pathlib import Path

import numpy as np

PAIRS = [("sd:k=4", "sd:k=4,verifier=block"), ("sd:k=6", "sd:k=6,verifier=block"),
         ("sd:k=8", "sd:k=8,verifier=block"),
         ("mcsd:tree=4-2-2-1,verifier=rrs-wor", "mcsd:tree=4-2-2-1,verifier=traversal"),
         ("mcsd:tree=2-2-2-2-1-1,verifier=rrs-wor", "mcsd:tree=2-2-2-2-1-1,verifier=traversal")]
BOOTSTRAP = 4000


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def per_prompt(records: list[dict], method: str, temperature: float) -> dict[tuple, np.ndarray]:
    """{(dataset, prompt_id): [accepted, num_drafts, new_tokens, seconds]} for one method and temperature."""
    out = {}
    for r in records:
        if r["method"] == method and r["temperature"] == temperature:
            out[(r["dataset"], r["prompt_id"])] = np.array(
                [r["accepted"], r["num_drafts"], r["new_tokens"], r["seconds"]], dtype=float)
    return out


def mal(rows: np.ndarray) -> float:
    """Mean acceptance length 1 + Σ accepted / Σ drafting rounds. rows: [P, 4]."""
    return 1 + rows[..., 0].sum(-1) / rows[..., 1].sum(-1)


def pair_row(records: list[dict], base: str, seq: str, temperature: float, rng) -> dict | None:
    # token-level sd is `sd:k=K,verifier=sd` since block became sd's default; runs from before spell it `sd:k=K`
    explicit = per_prompt(records, base + ",verifier=sd", temperature) if base.startswith("sd:") else {}
    a, b = explicit or per_prompt(records, base, temperature), per_prompt(records, seq, temperature)
    keys = sorted(a.keys() & b.keys())
    if not keys:
        return None
    xa, xb = np.stack([a[k] for k in keys]), np.stack([b[k] for k in keys])  # [P, 4]
    idx = rng.integers(len(keys), size=(BOOTSTRAP, len(keys)))  # resample prompts, paired
    gains = mal(xb[idx]) / mal(xa[idx]) - 1
    tps = lambda x: x[:, 2].sum() / x[:, 3].sum()  # noqa: E731
    return {"base": base, "sequence": seq, "temperature": temperature, "prompts": len(keys),
            "mal_base": float(mal(xa)), "mal_sequence": float(mal(xb)), "gain": float(mal(xb) / mal(xa) - 1),
            "gain_ci95": [float(np.quantile(gains, 0.025)), float(np.quantile(gains, 0.975))],
            "tps_base": float(tps(xa)), "tps_sequence": float(tps(xb)), "tps_ratio": float(tps(xb) / tps(xa))}


def table(rows: list[dict], runs: list[dict]) -> str:
    lines = ["| configuration | T | token-level MAL | sequence-level MAL | gain (95% CI over prompts) | "
             "tok/s token | tok/s sequence | tok/s ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["gain_ci95"]
        lines.append(f"| `{r['base']}` → `{r['sequence'].rsplit('=', 1)[1]}` | {r['temperature']:g} | "
                     f"{r['mal_base']:.3f} | {r['mal_sequence']:.3f} | {r['gain']:+.1%} ({lo:+.1%}, {hi:+.1%}) | "
                     f"{r['tps_base']:.1f} | {r['tps_sequence']:.1f} | {r['tps_ratio']:.3f} |")
    head = []
    for results in runs:
        st, meta, cmd = results.get("settings", {}), results.get("meta", {}), results.get("meta", {}).get("command")
        head += [f"- T = {', '.join(f'{t:g}' for t in st.get('temperatures', []))}: "
                 f"{sum(st.get('prompts', {}).values())} prompts ({st.get('prompts')}), {st.get('max_new_tokens')} "
                 f"new tokens, same prompts and seeds for every method, {st.get('threads')} CPU thread; "
                 f"{meta.get('cpu')}, load average at end {meta.get('load_average')}, commit {meta.get('git_commit')}. "
                 "Command: `" + (shlex.join(cmd) if isinstance(cmd, list) else str(cmd)) + "`"]
    note = ("MAL: mean accepted length per target call, 1 + accepted / drafting rounds (vLLM's mean acceptance "
            "length). Gain: sequence-level MAL / token-level MAL - 1, 95% interval from a paired bootstrap over "
            "prompts.")
    return "\n".join([note, ""] + head + [""] + lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(temps), figsize=(6.5 * len(temps), 4.2), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], temps):
        sub = [r for r in rows if r["temperature"] == t]
        x = np.arange(len(sub))
        ax.bar(x - 0.2, [r["mal_base"] for r in sub], 0.4, label="token level (sd / rrs-wor walk)", color="#8da0cb")
        ax.bar(x + 0.2, [r["mal_sequence"] for r in sub], 0.4, label="sequence level (block / traversal)",
               color="#fc8d62")
        for xi, r in zip(x, sub):
            ax.text(xi + 0.2, r["mal_sequence"] + 0.03, f"{r['gain']:+.1%}", ha="center", fontsize=9)
        ax.set_xticks(x, [r["base"].replace(",verifier=rrs-wor", "").replace("mcsd:tree=", "mcsd ") for r in sub],
                      rotation=20, fontsize=9)
        ax.set_title(f"T = {t:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean accepted length per target call")
    axes[0][0].legend(fontsize=9, loc="upper left")
    fig.suptitle("pycode-v1: token-level vs sequence-level verification (same draft law, one target call per round)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = [read_json(path) for path in args.results]
    records = [r for run in runs for r in run["records"]]
    rng = np.random.default_rng(0)
    temps = sorted({r["temperature"] for r in records}, reverse=True)
    rows = [row for t in temps for base, seq in PAIRS if (row := pair_row(records, base, seq, t, rng))]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "verifiers.md").write_text(table(rows, runs))
    (out / "verifiers.json").write_text(json.dumps({"sources": [str(p) for p in args.results], "rows": rows},
                                                   indent=1) + "\n")
    plot(rows, out / "accepted_length.png")
    print((out / "verifiers.md").read_text())


if __name__ == "__main__":
    main()
