"""Benchmark outputs, reusable by any script that produces records in the `run_bench` schema.

A results dict has `meta` (device, versions, commit, command), `settings`, optional `cost` (step-cost ratio),
`hf_best`, `memory_metric`, and `records`: one dict per timed generation with at least method, method_name,
options, dataset, category, temperature, new_tokens, seconds; optionally the other keys of the one metrics record
(`decoding.metrics.Metrics.stats()`: target_calls, draft_calls, rounds, num_spec_steps, num_draft_tokens,
num_accepted_draft_tokens, accepted_per_position, prefill_s, draft_s, verify_s, cache_s, ...) and peak_mem_mb,
same_as_ar, lossless. Records written before that schema (accepted, drafted_depth, num_drafts, accepted_per_pos) are
read under the new names (`upgrade_record`).

`write_outputs(out, results)` writes results.json, results.md, speedup.png and, when some method was run at several
values of one numeric option (threshold, k, num_assistant_tokens, ...), pareto.png. `render(results, out)` writes all
but the JSON (for benchmarks/make_figures.py).
"""
from __future__ import annotations

import json
import shlex
import textwrap
from collections import defaultdict
from pathlib import Path

SUMMARY_KEYS = ("method", "dataset", "temperature", "category", "prompts", "generations", "new_tokens", "seconds",
                "tokens_per_s", "speedup", "tau", "acceptance_rate", "accepted_per_call", "prefill_frac",
                "draft_frac", "verify_frac", "cache_frac", "peak_mem_mb", "greedy_identical", "lossless",
                "mean_acceptance_length", "accepted_per_position")


def write_outputs(out: str | Path, results: dict) -> dict:
    """Add `summary` to results and write results.json, results.md and the plots into `out`. Returns results."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results["summary"] = summarize(results["records"])
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    render(results, out)
    return results


def render(results: dict, out: str | Path) -> list[Path]:
    """Write results.md, speedup.png and (if a knob was swept) pareto.png from a results dict; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results["records"])  # recomputed: other scripts store summaries of their own shape
    written = [out / "results.md"]
    written[0].write_text(markdown(results, summary))
    label = shadow_label_of(results)
    written.append(plot_speedup(summary, out / "speedup.png", label))
    pareto = plot_pareto(results["records"], summary, out / "pareto.png", label)
    if pareto is not None:
        written.append(pareto)
    return written


def shadow_label_of(results: dict) -> str | None:
    """The --shadow-target label of a run ('SHADOW TARGET 12x768: ...'), or None for a plain run."""
    shadow = (results.get("settings") or {}).get("shadow_target")
    return shadow.get("label") if shadow else None


_OLD_KEYS = {"accepted": "num_accepted_draft_tokens", "drafted_depth": "num_draft_tokens", "num_drafts": "num_spec_steps",
             "accepted_per_pos": "accepted_per_position"}


def upgrade_record(r: dict) -> dict:
    """A record in the current schema: keys of records written before the one metrics record renamed."""
    return {_OLD_KEYS.get(k, k): v for k, v in r.items()} if any(k in r for k in _OLD_KEYS) else r


def summarize(records: list[dict]) -> list[dict]:
    """One row per (method, dataset, temperature) with category None, plus one per category where a data set's
    records have several categories. Ratios are of sums (tokens/s = Σ new tokens / Σ seconds, etc.)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    cats: dict[str, set] = defaultdict(set)
    records = [upgrade_record(r) for r in records]
    for r in records:
        cats[r["dataset"]].add(r.get("category"))
    for r in records:
        groups[(r["method"], r["dataset"], r["temperature"], None)].append(r)
        if len(cats[r["dataset"]]) > 1:
            groups[(r["method"], r["dataset"], r["temperature"], r.get("category"))].append(r)
    rows = {key: _aggregate(key, rs) for key, rs in groups.items()}
    # speedup: over `ar` on the same backend; speedup_vs_hf_ar: over `ar` on the transformers backend.
    ar_by_backend = {_backend(r["method"]): r["method"] for r in records if r["method_name"] == "ar"}

    def ratio_to(row, label, d, t, c):
        base = rows.get((label, d, t, c)) if label is not None else None
        return (row["tokens_per_s"] / base["tokens_per_s"]
                if base and base["tokens_per_s"] and row["tokens_per_s"] is not None else None)

    for (m, d, t, c), row in rows.items():
        row["speedup"] = ratio_to(row, ar_by_backend.get(_backend(m)), d, t, c)
        row["speedup_vs_hf_ar"] = ratio_to(row, ar_by_backend.get("hf"), d, t, c)
    order = _method_order(records)
    return sorted(rows.values(), key=lambda r: (r["dataset"], r["temperature"], r.get("category") is not None,
                                                str(r["category"]), order[r["method"]]))


def _backend(label: str) -> str:
    """The backend of a method label ('sd:k=4,backend=fast' -> 'fast'; hf-assisted and plain labels -> 'hf')."""
    for kind in ("fast", "compiled"):
        if f"backend={kind}" in label:
            return kind
    return "hf"


def _aggregate(key: tuple, rs: list[dict]) -> dict:
    m, d, t, c = key

    def total(k):
        vals = [r.get(k) for r in rs]
        return None if any(v is None for v in vals) else sum(vals)

    def ratio(a, b):
        return a / b if a is not None and b else None

    new, secs = total("new_tokens"), total("seconds")
    same = [r["same_as_ar"] for r in rs if r.get("same_as_ar") is not None]
    peaks = [r["peak_mem_mb"] for r in rs if r.get("peak_mem_mb") is not None]
    return {
        "method": m, "dataset": d, "temperature": t, "category": c,
        "prompts": len({r.get("prompt_id", i) for i, r in enumerate(rs)}), "generations": len(rs),
        "new_tokens": new, "seconds": secs, "tokens_per_s": ratio(new, secs), "speedup": None, "speedup_vs_hf_ar": None,
        "tau": ratio(new, total("target_calls")),
        "acceptance_rate": ratio(total("num_accepted_draft_tokens"), total("num_draft_tokens")),
        "accepted_per_call": ratio(total("num_accepted_draft_tokens"), total("target_calls")),
        "prefill_frac": ratio(total("prefill_s"), secs), "draft_frac": ratio(total("draft_s"), secs),
        "verify_frac": ratio(total("verify_s"), secs), "cache_frac": ratio(total("cache_s"), secs),
        "peak_mem_mb": max(peaks) if peaks else None,
        "greedy_identical": sum(same) / len(same) if same else None,
        "lossless": all(r.get("lossless", True) for r in rs),
        **_acceptance_by_position(rs),
    }


def _acceptance_by_position(rs: list[dict]) -> dict:
    """vLLM's spec-decode metrics over records: mean acceptance length 1 + accepted / drafting rounds (the bonus
    token counted) and, per drafted depth d, the fraction of drafting rounds that accepted a token at depth d."""
    drafts = sum(r.get("num_spec_steps") or 0 for r in rs)
    if not drafts or any(r.get("accepted_per_position") is None for r in rs):
        return {"mean_acceptance_length": None, "accepted_per_position": None}
    depth = max(len(r["accepted_per_position"]) for r in rs)
    per_pos = [sum(r["accepted_per_position"][d] for r in rs if d < len(r["accepted_per_position"])) / drafts
               for d in range(depth)]
    return {"mean_acceptance_length": 1 + sum(r["num_accepted_draft_tokens"] for r in rs) / drafts,
            "accepted_per_position": per_pos}


def _method_order(records: list[dict]) -> dict:
    order: dict[str, int] = {}
    for r in records:
        order.setdefault(r["method"], len(order))
    return order


# ---------------------------------------------------------------------------------------------------------------
# markdown

_COLUMNS = [("method", "method", "{}"), ("tok/s", "tokens_per_s", "{:.1f}"), ("speedup", "speedup", "{:.2f}x"),
            ("vs hf ar", "speedup_vs_hf_ar", "{:.2f}x"),
            ("tau", "tau", "{:.2f}"), ("accept", "acceptance_rate", "{:.2f}"),
            ("acc/call", "accepted_per_call", "{:.2f}"), ("draft", "draft_frac", "{:.0%}"),
            ("verify", "verify_frac", "{:.0%}"), ("cache", "cache_frac", "{:.0%}"),
            ("peak MB", "peak_mem_mb", "{:.1f}"), ("greedy = ar", "greedy_identical", "{:.0%}"),
            ("mean acc. len", "mean_acceptance_length", "{:.3f}"),
            ("accepted per position", "accepted_per_position", lambda v: " ".join(f"{x:.2f}" for x in v[:8]))]


def markdown(results: dict, summary: list[dict]) -> str:
    meta, st = results.get("meta", {}), results.get("settings", {})
    label = shadow_label_of(results)
    lines = ["# Benchmark results" + (f" — {label}" if label else ""), ""]
    if label:
        sh = st["shadow_target"]
        lines += [f"**{label}.** Beside every target forward (every method, hf-assisted included) a random-weight "
                  f"Llama of {sh['layers']} layers x hidden {sh['hidden']} ({sh['params'] / 1e6:.0f}M parameters) "
                  "runs over the same tokens, positions and mask; outputs and acceptance are the trained pair's, "
                  "step costs are those of the larger model.", ""]
    cmd = meta.get("command")
    if cmd:
        lines += ["Command: `" + (shlex.join(cmd) if isinstance(cmd, list) else str(cmd)) + "`", ""]
    facts = [("device", meta.get("device")), ("dtype", meta.get("dtype")), ("CPU", meta.get("cpu")),
             ("torch", meta.get("torch")), ("transformers", meta.get("transformers")),
             ("commit", meta.get("git_commit")), ("date (UTC)", meta.get("time_utc")),
             ("load average at end", meta.get("load_average")), ("target", st.get("target")),
             ("draft", st.get("draft")), ("max new tokens", st.get("max_new_tokens")),
             ("top-k / top-p", f"{st.get('top_k')} / {st.get('top_p')}" if st else None),
             ("threads", st.get("threads")), ("repeats / warm-up", f"{st.get('repeats')} / {st.get('warmup')}"
                                                if st else None),
             ("prompts", st.get("prompts")), ("truncated prompts", st.get("truncated_prompts")),
             ("max prompt tokens", st.get("max_prompt_tokens"))]
    lines += [f"- {k}: {v}" for k, v in facts if v is not None]
    cost = results.get("cost") or {}
    if cost.get("cost_ratio") is not None:
        lines.append(f"- step cost at {cost.get('context')} tokens of context: target "
                     f"{cost['target_step_s'] * 1e3:.2f} ms, draft {cost['draft_step_s'] * 1e3:.2f} ms, "
                     f"ratio c = {cost['cost_ratio']:.3f}")
        for kind, c in (cost.get("backends") or {}).items():
            if kind != "hf" and c.get("cost_ratio") is not None:
                lines.append(f"- step cost on the {kind} backend: target {c['target_step_s'] * 1e3:.2f} ms, draft "
                             f"{c['draft_step_s'] * 1e3:.2f} ms, ratio c = {c['cost_ratio']:.3f}")
    for b in results.get("hf_best", []):
        rates = ", ".join(f"{k}: {v:.1f}" for k, v in b["tokens_per_s"].items())
        lines.append(f"- hf-assisted:best on {b['dataset']} at T={b['temperature']:g}: num_assistant_tokens="
                     f"{b['best']} (tok/s on the first {b['probe_prompts']} prompts: {rates})")
    mem = results.get("memory_metric")
    if mem:
        lines.append(f"- peak MB: {mem.replace('_', ' ')}")
    lines.append("")
    top = [r for r in summary if r.get("category") is None]
    for d, t in _dt_pairs(top):
        rows = [r for r in top if r["dataset"] == d and r["temperature"] == t]
        lines += [f"## {d}, T={t:g} ({rows[0]['prompts']} prompts)", ""] + _table(rows, _COLUMNS) + [""]
    cat_rows = [r for r in summary if r.get("category") is not None]
    for d, t in _dt_pairs(cat_rows):
        rows = [r for r in cat_rows if r["dataset"] == d and r["temperature"] == t]
        cols = [("method", "method", "{}"), ("category", "category", "{}")] + _COLUMNS[1:5] + [
            c for c in _COLUMNS if c[1] in ("mean_acceptance_length", "greedy_identical")]
        lines += [f"### {d}, T={t:g}, per category", ""] + _table(rows, cols) + [""]
    lossy = sorted({r["method"] for r in summary if not r["lossless"]})
    if lossy:
        lines += [f"LOSSY (output distribution differs from the target's): {', '.join(lossy)}", ""]
    return "\n".join(lines)


def _dt_pairs(rows: list[dict]) -> list[tuple]:
    seen: dict[tuple, None] = {}
    for r in rows:
        seen.setdefault((r["dataset"], r["temperature"]), None)
    return list(seen)


def _table(rows: list[dict], cols) -> list[str]:
    out = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = []
        for _, key, fmt in cols:
            v = r.get(key)
            cell = "–" if v is None else fmt(v) if callable(fmt) else fmt.format(v)
            if key == "method" and not r.get("lossless", True):
                cell += " (LOSSY)"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    return out


# ---------------------------------------------------------------------------------------------------------------
# plots

def plot_speedup(summary: list[dict], path: Path, label: str | None = None) -> Path:
    """Horizontal bars, one panel per (data set, temperature), one labelled row per method (long method names stay
    readable: they are wrapped tick labels, not a squeezed legend); speedup over ar (tokens/s when the run had no
    ar), with each bar's value written at its end."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = [r for r in summary if r.get("category") is None]
    groups = _dt_pairs(top)
    methods = list(dict.fromkeys(r["method"] for r in top))
    use_speedup = any(r["speedup"] is not None for r in top)
    key = "speedup" if use_speedup else "tokens_per_s"
    labels = [textwrap.fill(m + ("" if all(r["lossless"] for r in top if r["method"] == m) else " (LOSSY)"), 34)
              for m in methods]
    lines = sum(label.count("\n") + 1 for label in labels)
    height = 1.2 + 0.32 * lines + 0.1 * len(methods)
    fig, axes = plt.subplots(1, len(groups), figsize=(2.6 + 3.4 * len(groups), height), sharey=True, squeeze=False)
    cmap = plt.get_cmap("tab20" if len(methods) > 10 else "tab10")
    for ax, (d, t) in zip(axes[0], groups):
        values = []
        for m in methods:
            row = next((r for r in top if r["method"] == m and r["dataset"] == d and r["temperature"] == t), None)
            values.append(row[key] if row is not None and row[key] is not None else 0.0)
        ys = range(len(methods))
        ax.barh(ys, values, color=[cmap(j % cmap.N) for j in ys])
        for y, v in zip(ys, values):
            ax.text(v, y, f" {v:.2f}" if use_speedup else f" {v:.1f}", va="center", fontsize=7)
        if use_speedup:
            ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_title(f"{d}, T={t:g}", fontsize=9)
        ax.set_xlabel("speedup over ar" if use_speedup else "tokens/s", fontsize=8)
        ax.set_xlim(0, max(values + [1.0]) * 1.18)
    axes[0][0].invert_yaxis()  # the y axis is shared: invert it once, so the first method is on top
    axes[0][0].set_yticks(range(len(methods)))
    axes[0][0].set_yticklabels(labels, fontsize=7)
    title = "multispec bench" + ("\n" + textwrap.fill(label, 90) if label else "")  # e.g. the shadow-target label
    fig.suptitle(title, fontsize=10 if not label else 8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def swept_knobs(records: list[dict]) -> list[tuple[str, str, dict[str, float]]]:
    """(method_name, knob, {method label: knob value}) for every numeric option a method was run at >= 2 values of,
    with all its other options equal (sd:k=2 and sd:k=4 form a sweep of k; sd:heuristic=1 is not part of it)."""
    by_name: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in records:
        by_name[r["method_name"]][r["method"]] = r.get("options") or {}
    sweeps = []
    for name, labels in by_name.items():
        keys = sorted(set().union(*labels.values()))
        for k in keys:
            groups: dict[str, dict[str, float]] = defaultdict(dict)
            for lab, o in labels.items():
                v = o.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    rest = json.dumps({x: y for x, y in o.items() if x != k}, sort_keys=True)
                    groups[rest][lab] = v
            for vals in groups.values():
                if len(set(vals.values())) >= 2:
                    sweeps.append((name, k, vals))
    return sweeps


def plot_pareto(records: list[dict], summary: list[dict], path: Path, label: str | None = None) -> Path | None:
    """tokens/s against the swept knob, one panel per (data set, temperature), one line per method; None (and no
    file) when no knob was swept."""
    knobs = swept_knobs(records)
    if not knobs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = [r for r in summary if r.get("category") is None]
    groups = _dt_pairs(top)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    ar_labels = {r["method"] for r in records if r["method_name"] == "ar"}
    ar = {(r["dataset"], r["temperature"]): r["tokens_per_s"] for r in top if r["method"] in ar_labels}
    for ax, (d, t) in zip(axes[0], groups):
        for name, knob, vals in knobs:
            pts = sorted((v, r["tokens_per_s"]) for lab, v in vals.items() for r in top
                         if r["method"] == lab and r["dataset"] == d and r["temperature"] == t
                         and r["tokens_per_s"] is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name} ({knob})")
        if (d, t) in ar and ar[(d, t)] is not None:
            ax.axhline(ar[(d, t)], color="black", lw=0.8, ls="--", label="ar")
        ax.set_title(f"{d}, T={t:g}")
        ax.set_xlabel("knob value")
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=7)
    if label:
        fig.suptitle(textwrap.fill(label, 60), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
