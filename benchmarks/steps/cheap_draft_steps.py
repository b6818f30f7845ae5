"""Issue 25, a draft that costs almost nothing: the draft's step cost and its acceptance for a reduced draft
vocabulary (models/reduced_vocab.py, the N most frequent tokens of a calibration text plus the prompt's tokens),
int8 draft weights (models/int8.py), and both, against the full float draft.

Step cost: one thread, the draft's forward of 1 token and of one 8-token tree level (8 siblings) after --context
cached tokens, fast and hf backends; variants interleaved, median of --repeats after 3 untimed calls; each as a
ratio to the full draft's, and c = draft step / the target's 1-token step on the same backend.

Acceptance (computed offline, without the engine, exact for greedy chains): the target decodes HumanEval prompts
greedily (--prompts, up to --new tokens or EOS); along that teacher-forced sequence each variant's draft argmax
(over its subset S) is compared with the target's token. Greedy `sd` with k chained drafts then accepts the run of
matches from each round's start (at most k) plus one target token; the mean accepted length is tokens per round
(vLLM's 1 + accepted / drafts). At T=1, the per-token acceptance 1 - TV(p, q) = sum(min(p, q)) with q the variant's
law (zero outside S), averaged over the same positions. Token frequencies come from the Python standard library
(token_freq.calibration_texts), disjoint from HumanEval.

    PYTHONPATH=src python benchmarks/steps/cheap_draft_steps.py --pair ../shared/models/pycode-v1 \\
        --out benchmarks/results/cheap_draft/steps.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
VOCABS = (512, 1024, 2048, 4096)
TREE_WIDTH = 8


def environment(args) -> dict:
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()  # untracked: this script's own earlier outputs
    return {"commit": commit + ("-dirty" if dirty else ""), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "load_average_1_5_15": os.getloadavg(),  # this machine is shared: step costs move with its load
            "command": " ".join(sys.argv), "config": vars(args)}


def variants(draft, freq) -> dict:
    """name -> (model, N or None)."""
    from multispec.models.int8 import quantize_draft

    q8 = quantize_draft(draft)
    out = {"full": (draft, None)}
    out.update({f"vocab{n}": (draft, n) for n in VOCABS})
    out["int8"] = (q8, None)
    out.update({f"int8+vocab{n}": (q8, n) for n in VOCABS})
    return out


def _subset(freq, n, prompt_ids):
    from multispec.token_freq import draft_vocab

    return None if n is None else draft_vocab(freq, n, prompt_ids)


def _step(backend, ids, context, n) -> float:
    """Seconds of one forward of n tokens after `context` cached rows (1: a chain step; n > 1: n siblings)."""
    backend.keep(torch.arange(context))
    mask = None
    if n > 1:
        mask = torch.zeros(n, context + n, dtype=torch.bool)
        mask[:, :context] = True
        mask[:, context:] = torch.eye(n, dtype=torch.bool)
    positions = torch.full((n,), context, dtype=torch.long)
    t0 = time.perf_counter()
    backend.forward(ids[context:context + n], positions, mask)
    return time.perf_counter() - t0


def _p10(xs: list[float]) -> float:
    """The 10th percentile: the step's cost when the shared machine left it alone (a median flips between the
    quiet and the preempted mode when other processes load both cores)."""
    return statistics.quantiles(xs, n=10)[0]


def step_costs(target, draft, freq, context_ids, repeats: int) -> dict:
    from multispec.models import forward_chain, make_backend

    context = len(context_ids) - TREE_WIDTH
    ids = torch.tensor(context_ids)
    out = {}
    for kind in ("fast", "hf"):
        runs = {"target": make_backend(target, kind)}
        for name, (model, n) in variants(draft, freq).items():
            runs[name] = make_backend(model, kind)
            runs[name].set_vocab_subset(_subset(freq, n, context_ids[:context]))
        for b in runs.values():
            forward_chain(b, ids[:context])
        times = {(name, w): [] for name in runs for w in (1, TREE_WIDTH)}
        names = list(runs)
        for r in range(repeats + 3):
            order = names if r % 2 else names[::-1]
            for name in order:
                for w in (1, TREE_WIDTH):
                    if name == "target" and w > 1:
                        continue
                    dt = _step(runs[name], ids, context, w)
                    if r >= 3:
                        times[(name, w)].append(dt)
        rows = {}
        for stat, fn in (("median", statistics.median), ("p10", _p10)):
            t = {key: fn(v) for key, v in times.items() if v}
            for name in names[1:]:
                row = rows.setdefault(name, {})
                for w in (1, TREE_WIDTH):
                    row[f"step{w}_{stat}_us"] = t[(name, w)] * 1e6
                    row[f"step{w}_{stat}_vs_full"] = t[(name, w)] / t[("full", w)]
                row[f"c_{stat}"] = t[(name, 1)] / t[("target", 1)]
        t1 = {"median": statistics.median(times[("target", 1)]), "p10": _p10(times[("target", 1)])}
        out[kind] = {"target_step1_us": {k: v * 1e6 for k, v in t1.items()}, "variants": rows,
                     "subset_sizes": {name: (None if runs[name].vocab_subset is None else
                                             runs[name].vocab_subset.size) for name in names[1:]}}
    return out


def greedy_target(target, prompt_ids, new: int, eos: int | None) -> list[int]:
    from multispec.models import forward_chain, make_backend

    backend = make_backend(target, "fast")
    logits = forward_chain(backend, torch.tensor(prompt_ids), last_only=True).logits[-1]
    out = []
    for _ in range(new):
        t = int(logits.argmax())
        out.append(t)
        if t == eos:
            break
        logits = forward_chain(backend, torch.tensor([t])).logits[-1]
    return out


def accepted_per_round(match: list[bool], k: int) -> list[int]:
    """Tokens each greedy sd round yields along a per-position match sequence: the run of matches from the round's
    start (at most k, and at most what is left) plus one target token."""
    rounds, i, n = [], 0, len(match)
    while i < n:
        a = 0
        while a < k and i + a < n - 1 and match[i + a]:
            a += 1
        rounds.append(a + 1)
        i += a + 1
    return rounds


def _metrics(logits, gen, probs, k, allowed=None) -> dict:
    """Greedy matches, tokens per sd round and T=1 acceptance of one prompt's draft logits [L, V] (rows
    predicting gen's tokens); allowed: bool [L, V] masks logits first (the subset row by row)."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    gen_t = torch.tensor(gen)
    match = (logits.argmax(-1) == gen_t).tolist()
    q = torch.softmax(logits, dim=-1)
    covered = torch.isfinite(logits.gather(1, gen_t[:, None]))[:, 0].tolist()
    return {"match": match, "rounds": accepted_per_round(match, k), "t1": torch.minimum(probs, q).sum(-1).tolist(),
            "covered": covered}


def _rounds_growing(logits, gen: list[int], base: torch.Tensor, k: int) -> list[int]:
    """Tokens per greedy sd round when S grows between rounds with every token produced so far: a round starting
    at i drafts with S = base ∪ gen[:i] fixed for the whole round (as an engine would update it)."""
    allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
    allowed[base] = True
    rounds, i, n = [], 0, len(gen)
    while i < n:
        allowed[gen[:i]] = True
        picks = logits[i:i + k].masked_fill(~allowed, float("-inf")).argmax(-1).tolist()
        a = 0
        while a < k and i + a < n - 1 and picks[a] == gen[i + a]:
            a += 1
        rounds.append(a + 1)
        i += a + 1
    return rounds


def acceptance(target, draft, freq, prompts: list[list[int]], new: int, eos, k: int) -> dict:
    """Per variant: mean accepted length (greedy sd, k chained drafts), greedy match rate, T=1 acceptance and the
    share of the target's tokens inside S. Variants "...+seen" grow S with every token the target has produced so
    far (S_i = S ∪ gen[:i]), computed from the model's full logits masked row by row; the others run the
    backend's restricted output layer itself."""
    from multispec.models import forward_chain, make_backend

    sequences, targets_p = [], []
    for p in prompts:
        gen = greedy_target(target, p, new, eos)
        seq = torch.tensor(p + gen)
        logits = forward_chain(make_backend(target, "fast"), seq).logits  # [L, V]
        sequences.append((p, gen))
        targets_p.append(torch.softmax(logits[len(p) - 1:len(seq) - 1], dim=-1))
    vocab = draft.config.vocab_size
    per = {}
    full_logits = {}
    for name, (model, n) in variants(draft, freq).items():
        rows = {name: []}
        if n is not None:
            rows[name + "+seen"] = []
        for j, ((p, gen), probs) in enumerate(zip(sequences, targets_p)):
            backend = make_backend(model, "fast")
            backend.set_vocab_subset(_subset(freq, n, p))
            logits = forward_chain(backend, torch.tensor(p + gen)).logits[len(p) - 1:len(p) + len(gen) - 1]
            rows[name].append(_metrics(logits, gen, probs, k))
            if n is None:
                full_logits[(id(model), j)] = logits
                continue
            allowed = torch.zeros(len(gen), vocab, dtype=torch.bool)
            allowed[:, _subset(freq, n, p)] = True
            for i in range(1, len(gen)):
                allowed[i:, gen[i - 1]] = True  # row i predicts gen[i] after gen[:i] was produced
            m = _metrics(full_logits[(id(model), j)], gen, probs, k, allowed)
            m["rounds"] = _rounds_growing(full_logits[(id(model), j)], gen, _subset(freq, n, p), k)
            rows[name + "+seen"].append(m)
        per.update(rows)
    out = {}
    for name, rs in per.items():
        cat = {key: [x for r in rs for x in r[key]] for key in ("match", "rounds", "t1", "covered")}
        out[name] = {"mean_accepted_length": statistics.fmean(cat["rounds"]),
                     "greedy_match_rate": statistics.fmean(cat["match"]), "t1_acceptance": statistics.fmean(cat["t1"]),
                     "target_tokens_in_S": statistics.fmean(cat["covered"])}
    full = out["full"]["mean_accepted_length"]
    for row in out.values():
        row["accepted_length_vs_full"] = row["mean_accepted_length"] / full
    return {"k": k, "positions": sum(len(g) for _, g in sequences), "variants": out}


def kernel_choice(draft, repeats: int) -> dict:
    """The int8 kernel choice: one Linear of the draft's shapes, fp32 vs torch's dynamic int8
    (quantize_dynamic) vs weight-only int8 (aten._weight_int8pack_mm), microseconds per call (p10)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    cfg = draft.config
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    out = {}
    for o, i in ((h, h), (f, h), (h, f), (v, h)):
        lin = torch.nn.Linear(i, o, bias=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                 dtype=torch.qint8)[0]
        w = lin.weight.detach()
        scale = w.abs().amax(1) / 127
        w8 = torch.round(w / scale[:, None]).to(torch.int8)
        for n in (1, TREE_WIDTH):
            x = torch.randn(n, i)
            fns = {"fp32": lambda: F.linear(x, w), "int8_dynamic": lambda: q(x),
                   "int8_weight_only": lambda: torch.ops.aten._weight_int8pack_mm(x, w8, scale)}
            times = {name: [] for name in fns}
            with torch.inference_mode():
                for r in range(repeats + 3):
                    for name, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        if r >= 3:
                            times[name].append(time.perf_counter() - t0)
            out[f"{o}x{i} n={n}"] = {name: _p10(t) * 1e6 for name, t in times.items()}
    return out


def scatter_cost(draft, freq, repeats: int) -> dict:
    """Microseconds of the subset head alone (compact [N, K]) and of widening it to [N, V] with -inf (p10)."""
    from multispec.models.reduced_vocab import RestrictedHead

    out = {}
    for n_vocab in VOCABS:
        head = RestrictedHead(draft.get_output_embeddings(), freq.top(n_vocab), draft.config.vocab_size)
        for n in (1, TREE_WIDTH):
            x = torch.randn(n, draft.config.hidden_size)
            a, b = [], []
            with torch.inference_mode():
                for r in range(repeats + 3):
                    t0 = time.perf_counter()
                    c = head.compact(x)
                    t1 = time.perf_counter()
                    head.widen(c)
                    t2 = time.perf_counter()
                    if r >= 3:
                        a.append(t1 - t0)
                        b.append(t2 - t1)
            out[f"K={n_vocab} n={n}"] = {"head_us": _p10(a) * 1e6, "widen_us": _p10(b) * 1e6}
    return out


def markdown(res: dict) -> str:
    acc = res["acceptance"]["variants"] if "acceptance" in res else None
    env, cfg = res["env"], res["env"]["config"]
    lines = [f"# Cheap draft: step cost and acceptance ({Path(cfg['pair']).name})", "",
             f"Command: `{env['command']}` (commit {env['commit']}, torch {env['torch']}, {env['threads']} thread, "
             f"{env['cpu']}). JSON: `{Path(cfg['out']).name}`.", "",
             f"Step: {cfg['repeats']} interleaved calls per variant after a {cfg['context']}-token context; "
             f"step{TREE_WIDTH} = one tree level of {TREE_WIDTH} siblings. vs full: the variant's step over the full "
             "float draft's; c: the draft's 1-token step over the target's on the same backend. p10: the 10th "
             "percentile of the calls, the cost when the shared machine (2 cores, other jobs) left the step alone; "
             "medians move between runs with the machine's load (listed below)."]
    if acc is not None:
        a = res["acceptance"]
        lines[-1] += (f" Acceptance: greedy sd, k={a['k']} chains, HumanEval {cfg['offset']}.."
                      f"{cfg['offset'] + cfg['prompts'] - 1}, {a['positions']} target tokens; T=1: mean 1 - TV(p, q). "
                      "`+seen`: S also grows with every token the target has produced (between rounds for the "
                      "accepted length; per token for the other columns); its step is that of the same N (S grows "
                      "by the few distinct new tokens: a gather of their rows when one appears).")
    lines.append("")
    for kind in ("fast", "hf"):
        s = res["steps"][kind]
        t1 = s["target_step1_us"]
        lines += [f"## Step cost, {kind} backend (target 1-token step: p10 {t1['p10']:.0f} us, median "
                  f"{t1['median']:.0f} us)", "",
                  f"| variant | S | step1 p10 us | vs full (p10) | vs full (median) | step{TREE_WIDTH} p10 us | "
                  "vs full (p10) | vs full (median) | c (p10) |", "|---|---|---|---|---|---|---|---|---|"]
        for name, row in s["variants"].items():
            size = s["subset_sizes"][name] or "V"
            w = TREE_WIDTH
            lines.append(f"| {name} | {size} | {row['step1_p10_us']:.0f} | {row['step1_p10_vs_full']:.2f} | "
                         f"{row['step1_median_vs_full']:.2f} | {row[f'step{w}_p10_us']:.0f} | "
                         f"{row[f'step{w}_p10_vs_full']:.2f} | {row[f'step{w}_median_vs_full']:.2f} | "
                         f"{row['c_p10']:.3f} |")
        lines.append("")
    fast = res["steps"]["fast"]["variants"]
    lines += [f"Load average (1, 5, 15 min) before: {res['env']['load_average_1_5_15']}, after the step costs: "
              f"{res['load_average_after']}.", ""]
    if acc is None:
        return "\n".join(lines) + "\n"
    lines += ["## Acceptance (fast backend; the hf backend's logits agree within 1e-4)", "",
              "| variant | accepted length | vs full | greedy match | T=1 accept | target tokens in S | "
              "step1 vs full (fast, p10) | goal |", "|---|---|---|---|---|---|---|---|"]
    for name, a in acc.items():
        step = fast[name.removesuffix("+seen")]["step1_p10_vs_full"]
        goal = step <= 0.40 and a["accepted_length_vs_full"] >= 0.97
        lines.append(f"| {name} | {a['mean_accepted_length']:.3f} | {a['accepted_length_vs_full']:.3f} | "
                     f"{a['greedy_match_rate']:.3f} | {a['t1_acceptance']:.3f} | {a['target_tokens_in_S']:.3f} | "
                     f"{step:.2f} | {'yes' if goal else 'no'} |")
    lines.append("")
    lines += ["Goal: draft step <= 40% of the full draft's with mean accepted length within 3% of the full draft's.",
              "", "## Output layer on a subset: head vs widening to full width (us, p10)", "",
              "| K, rows | subset head | widen to [N, V] |", "|---|---|---|"]
    lines += [f"| {k} | {v['head_us']:.1f} | {v['widen_us']:.1f} |" for k, v in res["scatter"].items()]
    lines += ["", "## Int8 kernel choice: one Linear of the draft's shapes (us, p10)", "",
              "| shape, rows | fp32 | int8 dynamic (quantize_dynamic) | int8 weight-only (_weight_int8pack_mm) |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {v['fp32']:.1f} | {v['int8_dynamic']:.1f} | {v['int8_weight_only']:.1f} |"
              for k, v in res["kernels"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", required=True, help="folder holding target/ and draft/")
    ap.add_argument("--data", default=None, help="data folder (default: multispec's)")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--calibration-mb", type=float, default=4.0)
    ap.add_argument("--no-acceptance", action="store_true", help="step costs only (a repeat run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multispec.data import load_prompts
    from multispec.token_freq import calibration_texts, count_tokens

    pair = Path(args.pair)
    tok = AutoTokenizer.from_pretrained(pair / "target")
    target = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(pair / "draft", dtype=torch.float32).eval()
    texts, source = calibration_texts(args.calibration_mb)
    freq = count_tokens(tok, texts, source, vocab_size=draft.config.vocab_size)
    bos = tok.bos_token_id
    prompts = [([bos] if bos is not None else []) + tok(p.text, add_special_tokens=False)["input_ids"]
               for p in load_prompts("humaneval", args.data, limit=args.prompts, offset=args.offset)]
    context_ids = [t for p in prompts for t in p][:args.context + TREE_WIDTH]
    res = {"env": environment(args), "calibration": {"source": source, "tokens": sum(freq.counts)}}
    res["steps"] = step_costs(target, draft, freq, context_ids, args.repeats)
    res["scatter"] = scatter_cost(draft, freq, args.repeats)
    res["kernels"] = kernel_choice(draft, args.repeats)
    res["load_average_after"] = os.getloadavg()
    if not args.no_acceptance:
        eos = target.generation_config.eos_token_id
        res["acceptance"] = acceptance(target, draft, freq, prompts, args.new, eos if isinstance(eos, int) else None,
                                       args.k)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
