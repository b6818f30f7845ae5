"""The P3 report behind `multispec optimal`: optimal multi-draft acceptance rates on real target/draft pairs, and each
verifier's gap. `run_report(config)` runs the whole pipeline and writes JSON, markdown and a plot; the CLI only
parses its options and prints the table.

The target generates a continuation of each prompt (sampled at T = 1 with a seed, or greedily); teacher-forced on
that text, target and draft logits are collected at every generated position. For each temperature and number of
drafts n the command reports, averaged over positions: the optimal rate with i.i.d. drafts, without replacement
and with P3's greedy drafts, and each verifier's exact (or Monte Carlo) acceptance with its gap to the optimum of
its own draft law (P3 Table 1 layout). p is ALWAYS the target distribution and q the draft distribution.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from multispec.errors import MultispecError, check
from multispec.models.hf_compat import cache_argument, output_cache
from multispec.paths import writable_file

DATASETS = {"humaneval": ("humaneval.jsonl.gz", "prompt"), "alpaca": ("alpaca_eval.jsonl", "instruction")}
ALPACA_TEMPLATE = "# Question: {instruction}\n# Answer:\n"
MAX_PROMPT_TOKENS = 512
# verifier -> (optimum column it is compared with, n it runs with: None = the row's n)
VERIFIER_OPTIMUM = {
    "sd": ("opt_n1", 1), "mcns": (None, None), "rrs": ("opt_iid", None), "kseq": ("opt_iid", None),
    "rrs-wor": ("opt_wor", None), "spechub": ("opt_hub", 2), "greedy-md": ("opt_greedy", None),
    "ot": ("opt_iid", None),
}


def parse_list(text: str, kind: type, name: str) -> tuple:
    """'0.5,0.7' -> (0.5, 0.7); MultispecError naming the option otherwise."""
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise MultispecError(f"--{name}: expected comma-separated {kind.__name__} values, got {text!r}") from e
    check(len(values) > 0, f"--{name}: empty list")
    return values


@dataclass(frozen=True)
class OptimalRunConfig:
    """Everything a run depends on; validated when built and written into the JSON output."""

    target: str
    draft: str | None
    dataset: str
    data_dir: str | None
    limit: int = 20
    max_new_tokens: int = 64
    temperatures: tuple[float, ...] = (0.5, 0.7, 1.0)
    drafts: tuple[int, ...] = (2, 3, 4)
    sample: bool = True
    seed: int = 0
    support_eps: float = 1e-9
    mc_samples: int = 32
    out: str = "optimal_results.json"
    extra: dict = field(default_factory=dict)
    head: str | None = None  # a feature head (models/eagle_io.py) as the draft, instead of a draft model
    dtype: str | None = None  # load_pair's dtype (None: float32 on the CPU; "int8" / "int4": quantized targets)

    def __post_init__(self) -> None:
        check(self.limit >= 1, f"--limit must be >= 1, got {self.limit}")
        check(self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        check(all(t > 0 and math.isfinite(t) for t in self.temperatures),
              f"--temperatures must be finite and > 0, got {self.temperatures}")
        check(all(n >= 1 for n in self.drafts), f"--drafts must be >= 1, got {self.drafts}")
        check(0 <= self.support_eps < 1e-3, f"--support-eps must be in [0, 1e-3), got {self.support_eps}")
        check(self.mc_samples >= 2, f"--mc-samples must be >= 2, got {self.mc_samples}")
        check(self.dataset in DATASETS or self.dataset.endswith(".jsonl"),
              f"--dataset must be humaneval, alpaca or a PATH.jsonl, got {self.dataset!r}")
        check((self.draft is None) != (self.head is None), "give a draft model (--draft) or a feature head (--head)")
        if self.head is not None:
            check(str(self.target).endswith(".gguf") or Path(self.target, "config.json").is_file(),
                  f"--target: no config.json in {self.target!r} (and not a .gguf file)")
            from multispec.models.eagle_io import SHIPPED, read_config
            if self.head != SHIPPED:
                read_config(self.head)  # a head folder, before any model loads
            writable_file(self.out)
            return
        vocab = {}
        for path, name in ((self.target, "--target"), (self.draft, "--draft")):
            if str(path).lower().endswith(".gguf"):  # checked, vocabulary included, when the pair loads
                check(Path(path).is_file(), f"{name}: GGUF file not found: {path!r}")
                vocab[name] = None
                continue
            check(Path(path, "config.json").is_file(), f"{name}: no config.json in {path!r}")
            try:
                cfg = json.loads(Path(path, "config.json").read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise MultispecError(f"{name}: {path}/config.json is not valid JSON ({e})") from None
            vocab[name] = cfg.get("vocab_size") if isinstance(cfg, dict) else None
        check(None in vocab.values() or vocab["--target"] == vocab["--draft"],
              f"target and draft vocabularies differ: the target has {vocab['--target']} tokens, the draft "
              f"{vocab['--draft']}; acceptance rates need one shared vocabulary")
        writable_file(self.out)  # before any model loads, not after the whole run


# ----------------------------------------------------------------------------------- data and models
def load_prompts(dataset: str, data_dir: str | None, limit: int) -> list[str]:
    """The first `limit` prompts. humaneval: field prompt; alpaca: instruction in ALPACA_TEMPLATE; PATH.jsonl:
    field prompt, else instruction (templated)."""
    if dataset in DATASETS:
        root = data_dir or os.environ.get("MULTISPEC_DATA")
        check(root is not None, "--data-dir or MULTISPEC_DATA must name the data directory")
        path = Path(root, DATASETS[dataset][0])
    else:
        path = Path(dataset)
    check(path.is_file(), f"dataset file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if len(prompts) >= limit:
                break
            rec = json.loads(line)
            if "prompt" in rec and dataset != "alpaca":
                prompts.append(rec["prompt"])
            elif "instruction" in rec:
                prompts.append(ALPACA_TEMPLATE.format(instruction=rec["instruction"]))
            else:
                raise MultispecError(f"{path}: record has neither 'prompt' nor 'instruction'")
    check(prompts, f"{path}: no prompts")
    return prompts


def collect_logits(config: OptimalRunConfig, prompts: list[str], progress) -> list[tuple]:
    """Target continuation of each prompt, then teacher-forced logits of both models at each generated position.

    Returns [(target_logits float32 [L, V], draft_logits float32 [L, V])] per prompt.
    """
    import torch

    from multispec import load_pair

    pair = load_pair(target=config.target, draft=config.draft, device="cpu", dtype=config.dtype)
    tok, target = pair.tokenizer, pair.target.float().eval()
    draft = _head_as_model(config.head, target) if config.head is not None else pair.draft.float().eval()
    if config.head is None:
        from multispec.models.int8 import linear_shape

        tv, dv = (linear_shape(m.get_output_embeddings())[0] for m in (target, draft))
        check(tv == dv, f"target and draft vocabularies differ: {tv} vs {dv} output tokens")
    eos = target.config.eos_token_id
    gen = torch.Generator().manual_seed(config.seed)
    out = []
    cache_arg = cache_argument(target)  # read once, not per decoding step
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids[:, -MAX_PROMPT_TOKENS:]  # [1, L0]
            start = ids.shape[1]
            step = target(input_ids=ids, use_cache=True)
            cache, logits = output_cache(step), step.logits[:, -1]
            for _ in range(config.max_new_tokens):
                probs = torch.softmax(logits.float(), -1)  # [1, V], T = 1
                nxt = torch.multinomial(probs, 1, generator=gen) if config.sample else probs.argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)
                if eos is not None and int(nxt) == eos:
                    break
                step = target(input_ids=nxt, use_cache=True, **{cache_arg: cache})
                cache, logits = output_cache(step), step.logits[:, -1]
            lt = target(input_ids=ids).logits[0, start - 1 : -1].float()  # [L, V]
            ld = draft(input_ids=ids).logits[0, start - 1 : -1].float()
            check(lt.shape == ld.shape, f"target and draft vocabularies differ: {lt.shape[-1]} vs {ld.shape[-1]}")
            out.append((lt.numpy(), ld.numpy()))
            progress()
    return out


def _head_as_model(path: str, target):
    """A feature head as a teacher-forced draft: draft(input_ids=ids).logits [1, L, V] are the head's at each
    position, reading the target's features of the positions before (as `eagle` drafts one token after committed
    text), -inf outside a reduced vocabulary."""
    from types import SimpleNamespace

    import torch

    from multispec.models.eagle import TargetParts
    from multispec.models.eagle_io import load_head

    head, token_ids = load_head(path, target)
    parts = TargetParts.of(target)

    def run(input_ids):
        feats = target.model(input_ids=input_ids).last_hidden_state  # [1, L, H] (after the final norm)
        f = head.teacher_forced(parts, input_ids, feats)
        logits = parts.lm_head(f).float()
        if token_ids is not None:
            keep = torch.full_like(logits, float("-inf"))
            keep[..., token_ids] = logits[..., token_ids]
            logits = keep
        return SimpleNamespace(logits=logits)

    return run


# ----------------------------------------------------------------------------------- per-position rates
def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


def position_rates(lt: np.ndarray, ld: np.ndarray, temperature: float, drafts: tuple[int, ...],
                   support_eps: float, mc_samples: int, generator) -> dict:
    """All rates at one position. lt, ld: target/draft logits float [V]. Returns {(column, n): (value, se)}."""
    from multispec.optimal import naive_acceptance, optimal_acceptance_greedy, verifier_acceptance
    from multispec.optimal.acceptance import optimal_acceptance_all_n
    from multispec.optimal.verifiers import ot_measured_acceptance

    p, q = softmax(lt.astype(np.float64) / temperature), softmax(ld.astype(np.float64) / temperature)
    big = np.maximum(p, q)
    keep = big >= support_eps  # the union support, less tokens negligible in both
    keep[np.argsort(-big, kind="stable")[: max(drafts)]] = True  # at least n_max tokens, for n distinct drafts
    dropped = (float(p[~keep].sum()), float(q[~keep].sum()))
    p, q = p[keep] / p[keep].sum(), q[keep] / q[keep].sum()
    n_max = max(drafts)
    opt = optimal_acceptance_all_n(p, q, n_max)
    r: dict = {("opt_n1", 1): (opt[(1, True)], 0.0), ("dropped_p", 0): (dropped[0], 0.0),
               ("dropped_q", 0): (dropped[1], 0.0), ("support", 0): (float(p.size), 0.0)}
    r[("sd", 1)] = (verifier_acceptance("sd", p, q, 1).value, 0.0)
    if 2 <= q.size:
        r[("opt_hub", 2)] = (optimal_acceptance_greedy(p, q, 2), 0.0)
        r[("spechub", 2)] = (verifier_acceptance("spechub", p, q, 2).value, 0.0)
    for n in drafts:
        r[("opt_iid", n)] = (opt[(n, True)], 0.0)
        if (n, False) in opt:
            r[("opt_wor", n)] = (opt[(n, False)], 0.0)
            est = verifier_acceptance("rrs-wor", p, q, n, samples=mc_samples, generator=generator)
            r[("rrs-wor", n)] = (est.value, est.stderr or 0.0)
        r[("opt_greedy", n)] = (optimal_acceptance_greedy(p, q, n), 0.0)
        r[("naive", n)] = (naive_acceptance(p, q, n), 0.0)
        for name in ("mcns", "rrs", "kseq", "greedy-md"):
            r[(name, n)] = (verifier_acceptance(name, p, q, n).value, 0.0)
        est = ot_measured_acceptance(p, q, n, samples=mc_samples, generator=generator)  # measured, not exact
        r[("ot", n)] = (est.value, est.stderr or 0.0)
    return r


def summarize(per_position: list[dict], temperature: float, drafts: tuple[int, ...]) -> list[dict]:
    """Mean over positions for each n: optimum columns, verifier values, gaps, stderr of MC columns, and the
    fraction of positions where the P3 findings hold."""
    rows = []
    for n in drafts:
        row: dict = {"temperature": temperature, "n": n, "positions": len(per_position)}

        def mean(col: str, m: int) -> tuple[float, float] | None:
            vals = [d[(col, m)] for d in per_position if (col, m) in d]
            if not vals:
                return None
            v = np.array(vals)
            return float(v[:, 0].mean()), float(math.sqrt((v[:, 1] ** 2).sum()) / len(v))

        for col in ("opt_iid", "opt_wor", "opt_greedy", "naive"):
            row[col] = mean(col, n)[0] if mean(col, n) else None
        row["opt_hub"] = mean("opt_hub", 2)[0] if n == 2 and mean("opt_hub", 2) else None
        row["opt_n1"] = mean("opt_n1", 1)[0]
        for name, (opt_col, fixed_n) in VERIFIER_OPTIMUM.items():
            m = fixed_n or n
            if fixed_n is not None and fixed_n != n and name != "sd":
                row[name] = None
                continue
            got = mean(name, m)
            row[name] = None if got is None else got[0]
            row[f"{name}_stderr"] = None if got is None else got[1]
            if got is not None and opt_col is not None:
                opt = mean(opt_col, m)[0]
                row[f"{name}_gap"] = got[0] - opt
        both = [d for d in per_position if ("opt_wor", n) in d]
        row["frac_wor_ge_iid"] = float(np.mean([d[("opt_wor", n)][0] >= d[("opt_iid", n)][0] - 1e-12 for d in both]))
        row["frac_greedy_gt_wor"] = float(np.mean([d[("opt_greedy", n)][0] > d[("opt_wor", n)][0] + 1e-12
                                                   for d in both]))
        row["max_dropped_mass"] = max(max(d[("dropped_p", 0)][0], d[("dropped_q", 0)][0]) for d in per_position)
        row["mean_support"] = float(np.mean([d[("support", 0)][0] for d in per_position]))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------- output
COLUMNS = [("opt_iid", "α* iid"), ("opt_wor", "α* w/o"), ("opt_greedy", "α* greedy"), ("rrs", "RRS"),
           ("kseq", "K-SEQ"), ("rrs-wor", "RRS-wor (MC)"), ("spechub", "SpecHub"), ("greedy-md", "greedy-md"),
           ("sd", "SD n=1"), ("mcns", "MCNS (lossy)"), ("naive", "naive iid")]
COLUMNS.insert(6, ("ot", "OT (MC)"))  # after RRS-wor: measured acceptance of the optimal i.i.d. verifier


def cell(row: dict, key: str) -> str:
    v = row.get(key)
    if v is None:
        return "–"
    text = f"{v:.4f}"
    if row.get(f"{key}_stderr"):
        text += f"±{1.96 * row[f'{key}_stderr']:.4f}"
    gap = row.get(f"{key}_gap")
    if gap is not None:
        text += " (0)" if abs(gap) < 5e-7 else f" ({gap:+.4f})"
    return text


def markdown(rows: list[dict], config: OptimalRunConfig) -> str:
    head = "| T | n | " + " | ".join(label for _, label in COLUMNS) + " | w/o ≥ iid | greedy > w/o |"
    sep = "|" + "---|" * (len(COLUMNS) + 4)
    target = Path(config.target)
    name = target.stem if target.suffix.lower() == ".gguf" else target.parent.name  # a GGUF file names itself
    lines = [f"# multispec optimal: {name}{f' ({config.dtype})' if config.dtype else ''} on {config.dataset}", "",
             f"{config.limit} prompts, {config.max_new_tokens} new tokens, "
             f"{'sampled at T=1' if config.sample else 'greedy'} target generation, seed {config.seed}. "
             "Mean acceptance over positions; a verifier's gap to the optimum of its own draft law in parentheses; "
             f"RRS-wor is Monte Carlo ({config.mc_samples} draft tuples per position, coins exact), ± is a 95% "
             "interval. MCNS is lossy (no optimum). Last two columns: fraction of positions. The sequence "
             "verifiers have no column: at one position `block` is SD n=1 and `traversal` is RRS-wor (same laws, "
             "tests/test_verifiers_sequence.py); their gain is across positions, measured per target call by "
             "`multispec bench` (docs/verifiers.md).", "", head, sep]
    for r in rows:
        lines.append(f"| {r['temperature']:g} | {r['n']} | " + " | ".join(cell(r, k) for k, _ in COLUMNS)
                     + f" | {r['frac_wor_ge_iid']:.3f} | {r['frac_greedy_gt_wor']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 4), sharey=True, squeeze=False)
    styles = {"rrs": ("opt_iid", "C0"), "kseq": ("opt_iid", "C1"), "rrs-wor": ("opt_wor", "C2"),
              "spechub": ("opt_hub", "C3"), "greedy-md": ("opt_greedy", "C4")}
    styles["ot"] = ("opt_iid", "C5")
    for ax, n in zip(axes[0], ns):
        sub = sorted((r for r in rows if r["n"] == n), key=lambda r: r["temperature"])
        ts = [r["temperature"] for r in sub]
        for opt_col, label, color in (("opt_iid", "α* iid", "C0"), ("opt_wor", "α* w/o repl.", "C2"),
                                      ("opt_greedy", "α* greedy", "C4")):
            ax.plot(ts, [r[opt_col] for r in sub], "--", color=color, label=label)
        for name, (_, color) in styles.items():
            vals = [r.get(name) for r in sub]
            if all(v is not None for v in vals):
                ax.plot(ts, vals, "o-", color=color, label=name)
        ax.set_title(f"n = {n}")
        ax.set_xlabel("temperature")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("acceptance rate (mean over positions)")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(config: OptimalRunConfig, rows: list[dict], positions: int, started: float,
                 partial: str | None = None) -> dict:
    """config.out (.json, .md, .png) of `rows`; the JSON record."""
    out_path = Path(config.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": asdict(config), "positions": positions, "seconds": time.perf_counter() - started,
              "alpaca_template": ALPACA_TEMPLATE, "rows": rows}
    if partial is not None:
        record["partial"] = partial
    out_path.write_text(json.dumps(record, indent=2))
    out_path.with_suffix(".md").write_text(markdown(rows, config) + (f"\nPartial: {partial}\n" if partial else ""))
    plot(rows, out_path.with_suffix(".png"), f"{Path(config.target).parent.name} on {config.dataset}")
    return record


def run_report(config: OptimalRunConfig) -> dict:
    """Generate, collect logits, compute every rate at every position, write config.out (.json, .md, .png);
    returns the JSON record. Progress bars on stderr. A run stopped in the rates (an error, Ctrl-C) writes the
    temperatures done, marked partial."""
    import torch
    from tqdm import tqdm

    prompts = load_prompts(config.dataset, config.data_dir, config.limit)
    started = time.perf_counter()
    with tqdm(total=len(prompts), desc="generate + logits", unit="prompt") as bar:
        logits = collect_logits(config, prompts, lambda: bar.update(1))
    generator = torch.Generator().manual_seed(config.seed + 1)
    positions = [(lt[i], ld[i]) for lt, ld in logits for i in range(lt.shape[0])]
    rows: list[dict] = []
    try:
        with tqdm(total=len(positions) * len(config.temperatures), desc="acceptance rates", unit="pos") as bar:
            for t in config.temperatures:
                per_position = []
                for lt, ld in positions:
                    per_position.append(position_rates(lt, ld, t, config.drafts, config.support_eps,
                                                       config.mc_samples, generator))
                    bar.update(1)
                rows.extend(summarize(per_position, t, config.drafts))
    except BaseException as e:  # an error or Ctrl-C part-way: the temperatures done are written (marked "partial")
        if rows:
            done = len({r["temperature"] for r in rows})
            write_report(config, rows, len(positions), started, f"stopped after {done} of "
                         f"{len(config.temperatures)} temperatures ({type(e).__name__}: {e})")
            print(f"wrote the {done} temperatures done so far to {config.out}", file=sys.stderr)
        raise
    return write_report(config, rows, len(positions), started)
