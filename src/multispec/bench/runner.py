"""`run_bench`: every method on the same prompts, token ids and seeds; warm-up apart; JSON + markdown + plots.

Order of work (each step fails before the slower ones start):
1. parse and validate the method specs, the sampling settings and the data sets (no model yet);
2. load the pair, tokenize every prompt once (as `generate` does, `text.encode_prompt`; a chat data set's prompts
   as one user message through the target's chat template, `text.encode_chat`, per `chat_template`), truncate long
   ones; with `shadow_target`, build the random shadow model (models/shadow.py) that runs beside every target forward;
3. measure the draft/target step-cost ratio once (shadow included);
4. warm up each method (untimed); tune `hf-assisted:best` on the first prompts of each data set and temperature;
5. timed loop over temperature -> data set -> prompt -> repeat -> method, so a change in machine load hits every
   method alike; every generation is one record;
6. `report.write_outputs` writes results.json, results.md, speedup.png (and pareto.png where a knob was swept).
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from multispec.bench.hf_assisted import hf_assisted_generate
from multispec.bench.specs import HF_ASSISTED, HF_BEST_SWEEP, MethodSpec, check_draft_given, parse_method_specs
from multispec.data import load_prompts, truncate_ids
from multispec.loading import vocab_rows
from multispec.errors import check
from multispec.decoding.methods import HEAD_DIRNAME, get_method
from multispec.paths import writable_dir
from multispec.models.shadow import parse_shadow_shape
from multispec.profile import MachineProfile
from multispec.sampling import SamplingConfig

COST_CONTEXT = 200  # tokens of context for the step-cost measurement
COST_STEPS = 15  # timed 1-token steps per model (median reported)
CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def run_bench(target: str | None = None, draft: str | None = None, datasets: list[str] | str = "humaneval",
              data_dir: str | None = None, methods: str | list = "ar;sd:k=4", temperatures=(0.0,),
              top_k: int | None = None, top_p: float | None = None, max_new_tokens: int = 128,
              limit: int | str | dict | None = None, offset: int = 0, repeats: int = 1, warmup: int = 1, seed: int = 0,
              out: str | Path | None = None, threads: int | None = None, device: str | None = None,
              dtype: str | None = None, max_prompt_tokens: int | None = 512, prompt_field: str = "prompt",
              best_probe: int = 3, pair=None, progress: bool = True, command: list[str] | None = None,
              shadow_target: str | None = None, cross_vocab: str | None = None, chat_template: str = "auto",
              profile=None) -> dict:
    """Benchmark `methods` on `datasets`; returns the results dict (see docs/bench.md) and, when `out` is given,
    writes it there. limit: an int for every data set (per category for spec-bench), or per data set as
    {name: N} or 'name=N,name=N'. `pair`: an already loaded `api.Pair` (then target/draft/device/dtype are not used).
    shadow_target: 'LAYERSxHIDDEN' (e.g. '12x768'): every target forward (engine methods and hf-assisted alike) also
    runs a random Llama of that shape, so that step costs are a larger model's while acceptance stays the pair's;
    every output says so (settings.shadow_target.label). cross_vocab: load_pair's, for a draft of another tokenizer.
    chat_template: "auto" (default) renders the prompts of chat data sets (data.CHAT_DATASETS: Spec-Bench, MT-Bench,
    Alpaca) as one user message through the target's chat template when its tokenizer has one, as the Spec-Bench
    paper does; "on" the same, refusing a target without a template; "off" raw text everywhere. Code and completion
    data sets (HumanEval, GSM8K, JSONL files) are raw text in every mode. settings.chat_template records the mode and
    settings.chat_template_applied, per data set, whether it was applied."""
    from multispec.bench.report import write_outputs
    from multispec.loading import eos_ids, load_pair

    # 1. everything that can be checked without a model
    specs = methods if isinstance(methods, list) and all(isinstance(s, MethodSpec) for s in methods) \
        else parse_method_specs(methods if isinstance(methods, str) else ";".join(methods))
    datasets = [d.strip() for d in datasets.split(",")] if isinstance(datasets, str) else list(datasets)
    temperatures = [float(t) for t in temperatures]
    check(temperatures, "no temperatures given")
    samplings = [SamplingConfig(temperature=t, top_k=top_k, top_p=top_p) for t in temperatures]
    for name, v, lo in (("max_new_tokens", max_new_tokens, 1), ("repeats", repeats, 1), ("warmup", warmup, 0),
                        ("best_probe", best_probe, 1)):
        check(isinstance(v, int) and v >= lo, f"{name} must be an integer >= {lo}, got {v!r}")
    check(max_prompt_tokens is None or max_prompt_tokens >= 2, "max_prompt_tokens must be >= 2")
    check(chat_template in CHAT_TEMPLATE_MODES,
          f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {chat_template!r}")
    if out is not None:
        writable_dir(out)
    if shadow_target is not None:
        parse_shadow_shape(shadow_target)
    if profile is not None and not isinstance(profile, MachineProfile):
        profile = MachineProfile.load(profile)  # a pinned machine profile: every method plans from it
    limits = _limits(limit, datasets)
    prompts = {d: load_prompts(d, data_dir, limit=limits[d], offset=offset, prompt_field=prompt_field)
               for d in datasets}
    for d, ps in prompts.items():
        check(ps, f"{d}: no prompts selected (offset {offset}, limit {limit})")
    if pair is None and target is None and draft is None:  # the embedded default pair, draft included
        from multispec.loading import DEFAULT_PAIR_DIR

        draft = str(DEFAULT_PAIR_DIR / "draft")
    draft_path = pair.draft_path if pair is not None else draft
    check_draft_given(specs, draft_path is not None or (pair is not None and pair.draft is not None))
    needs_draft = any(s.name == HF_ASSISTED or get_method(s.name).needs_draft for s in specs)
    for s in specs:
        if s.name == "specdecpp" and s.config.head is None:
            check(draft_path is not None and (Path(draft_path) / HEAD_DIRNAME).is_dir(),
                  f"{s.label}: no acceptance head: give head=PATH in the spec, or put one in the draft's directory "
                  f"as {HEAD_DIRNAME}/")
    if threads is not None:
        check(isinstance(threads, int) and threads >= 1, f"threads must be an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)

    # 2. models and token ids
    if pair is None:
        wants_draft = needs_draft or any(s.config is not None and get_method(s.name).drafts_with_model(s.config)
                                         for s in specs)
        if target is None:  # the embedded default pair
            pair = load_pair(device=device, dtype=dtype)
        else:
            pair = load_pair(target=target, draft=draft if wants_draft else None, device=device, dtype=dtype,
                             cross_vocab=cross_vocab if wants_draft else None)
    encoded, chat = encode_datasets(pair, prompts, chat_template, max_prompt_tokens)
    eos = eos_ids(pair)
    on_cuda = pair.device.type == "cuda"
    longest = max(len(ids) for v in encoded.values() for ids, _ in v)
    shadow = _Shadow(shadow_target, pair, longest + max_new_tokens) if shadow_target is not None else None

    # 3. cost ratio, once
    kinds = ["hf", *dict.fromkeys(s.backend for s in specs if s.backend != "hf")]
    cost = step_costs(pair, shadow=shadow, kinds=kinds) if pair.draft is not None else {
        "target_step_s": None, "draft_step_s": None, "cost_ratio": None}
    runners = {s.label: make_runner(s, pair, eos, shadow, profile) for s in specs}
    rss_base = _maxrss_mb()

    # 4. warm-up (untimed) and the hf-assisted:best sweep. The warm-up's outputs are then dropped from the methods'
    # suffix stores: kept, the timed run of the same first prompt copied them (greedy suffix on it: 12.8-14.2 tokens
    # per call, 2-17 % of a run's tokens/s)
    first = next(iter(encoded.values()))[0][0]
    for s in specs:
        for sampling in samplings:
            for _ in range(warmup):
                runners[s.label](first, sampling, max_new_tokens, seed, None)
        store = getattr(runners[s.label], "suffix_store", None)
        if store is not None:
            store.clear()
    best = {}
    for s in specs:
        if s.hf_best:
            for d in datasets:
                for sampling in samplings:
                    probe = [ids for ids, _ in encoded[d][:best_probe]]
                    best[(d, sampling.temperature)] = _sweep_hf(runners[s.label], probe, sampling, max_new_tokens,
                                                               seed, on_cuda)

    # 5. the timed loop; an error or Ctrl-C part-way still writes the records so far (marked "partial")
    records = []
    total = sum(len(v) for v in encoded.values()) * len(samplings) * repeats * len(specs)
    bar = _progress(total, progress)

    def assemble() -> dict:
        _compare_with_ar(records)
        return {
            "meta": environment(pair, command),
            "settings": {
                "target": pair.target_path, "draft": pair.draft_path, "datasets": datasets, "data_dir": data_dir
                or os.environ.get("MULTISPEC_DATA"), "methods": [s.label for s in specs],
                "temperatures": temperatures, "top_k": top_k, "top_p": top_p, "max_new_tokens": max_new_tokens,
                "limit": limits, "offset": offset, "repeats": repeats, "warmup": warmup, "seed": seed,
                "threads": torch.get_num_threads(), "max_prompt_tokens": max_prompt_tokens,
                "profile": profile.digest if profile is not None else "default",
                "prompt_field": prompt_field, "chat_template": chat_template, "chat_template_applied": chat,
                "best_probe": best_probe, "hf_best_sweep": list(HF_BEST_SWEEP),
                "shadow_target": shadow.settings() if shadow is not None else None,
                "prompts": {d: len(v) for d, v in prompts.items()},
                "truncated_prompts": {d: sum(t for _, t in v) for d, v in encoded.items()},
                "method_configs": {s.label: (_jsonable(asdict(s.config)) if s.config is not None else
                                             {"name": HF_ASSISTED, **_jsonable(s.options)}) for s in specs},
            },
            "cost": cost,
            "hf_best": [{"dataset": d, "temperature": t, **v} for (d, t), v in best.items()],
            "memory_metric": ("cuda_max_allocated_mb" if on_cuda else
                              "cpu_peak_rss_during_generation_mb" if _reset_peak_rss() else
                              "cpu_peak_rss_of_process_mb"),
            "records": records,
        }

    try:
        for sampling in samplings:
            for d in datasets:
                for i, (p, (ids, truncated)) in enumerate(zip(prompts[d], encoded[d])):
                    for r in range(repeats):
                        prompt_seed = seed + 1_000 * r + i
                        for s in specs:
                            bar.set_postfix_str(f"{s.label} T={sampling.temperature:g} {d} {p.id}", refresh=False)
                            knob = best[(d, sampling.temperature)]["best"] if s.hf_best else None
                            rec = _timed(runners[s.label], ids, sampling, max_new_tokens, prompt_seed, knob,
                                         on_cuda, rss_base)
                            lossless = s.config.lossless_at(sampling.temperature) if s.config is not None else True
                            rec.update(method=s.label, method_name=s.name, options=_jsonable(s.options),
                                       lossless=lossless, dataset=d, category=p.category, prompt_id=p.id,
                                       prompt_index=offset + i, temperature=sampling.temperature, repeat=r,
                                       seed=prompt_seed, prompt_tokens=len(ids), truncated=truncated)
                            records.append(rec)
                            bar.update(1)
    except BaseException as e:
        bar.close()
        if out is not None and records:
            write_outputs(out, {**assemble(), "partial": f"stopped after {len(records)} of {total} generations "
                                                         f"({type(e).__name__}: {e})"})
            print(f"wrote the {len(records)} generations done so far to {out}/results.json", file=sys.stderr)
        raise
    bar.close()
    results = assemble()
    if out is not None:
        write_outputs(out, results)
    return results


def encode_datasets(pair, prompts: dict, chat_template: str, max_prompt_tokens: int | None) -> tuple[dict, dict]:
    """({data set: [(ids, truncated)]}, {data set: chat template applied}): every prompt tokenized as `generate`
    does, a chat data set's as one user message through the target's chat template (per chat_template)."""
    from multispec.text import encode_chat, encode_prompt

    bos, rows = pair.tokenizer.bos_token_id, vocab_rows(pair.target)
    chat = chat_datasets(pair.tokenizer, prompts, chat_template)
    encoded = {d: [truncate_ids(encode_chat(pair.tokenizer, rows, [{"role": "user", "content": p.message}])
                                if chat[d] else encode_prompt(pair.tokenizer, rows, p.text), max_prompt_tokens, bos)
                   for p in ps] for d, ps in prompts.items()}
    return encoded, chat


def chat_datasets(tokenizer, prompts: dict, mode: str) -> dict:
    """{data set: whether its prompts go through the chat template}: the chat data sets (every prompt has a user
    message) when mode is not "off" and the tokenizer has a template; mode "on" refuses a tokenizer without one."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    check(mode != "on" or has_template, "chat template 'on', but the target's tokenizer has no chat template; "
                                        "use --chat-template auto or off")
    return {d: mode != "off" and has_template and all(p.message is not None for p in ps) for d, ps in prompts.items()}


def _limits(limit, datasets: list[str]) -> dict:
    """limit: None, an int for every data set, or {dataset: int} / 'name=N,name=N' (data sets not named: no
    limit)."""
    if limit is None or isinstance(limit, int):
        return {d: limit for d in datasets}
    if isinstance(limit, str):
        if limit.strip().isdigit():
            return {d: int(limit) for d in datasets}
        pairs = [x.partition("=") for x in limit.split(",") if x.strip()]
        check(all(eq and n.strip().isdigit() for _, eq, n in pairs),
              f"limit {limit!r}: expected N or dataset=N[,dataset=N...]")
        limit = {k.strip(): int(n) for k, _, n in pairs}
    unknown = set(limit) - set(datasets)
    check(not unknown, f"limit names data set(s) not benchmarked: {', '.join(sorted(unknown))}")
    return {d: limit.get(d) for d in datasets}


def _compare_with_ar(records: list[dict]) -> None:
    """Greedy records get same_as_ar (token-identical to ar's output on the same prompt and repeat; the first
    ar in the run where several backends run it) and first_diff (index of the first differing token, None when
    identical); output_ids become a sha1."""
    import hashlib

    ar: dict = {}
    for r in records:
        if r["method_name"] == "ar" and r["temperature"] == 0:
            ar.setdefault((r["dataset"], r["prompt_index"], r["repeat"]), r["output_ids"])
    for r in records:
        ref = ar.get((r["dataset"], r["prompt_index"], r["repeat"])) if r["temperature"] == 0 else None
        ids = r.pop("output_ids")
        r["output_sha1"] = hashlib.sha1(repr(ids).encode()).hexdigest()[:16]
        if ref is None:
            r["same_as_ar"], r["first_diff"] = None, None
            continue
        diff = next((j for j, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
        if diff is None and len(ids) != len(ref):
            diff = min(len(ids), len(ref))
        r["same_as_ar"], r["first_diff"] = diff is None, diff


class _Shadow:
    """The --shadow-target regime: one random shadow model and one shadow backend, shared by every method (each
    generation starts with reset(), so methods never see each other's shadow cache)."""

    def __init__(self, shape: str, pair, max_len: int):
        from multispec.models.shadow import make_shadow_backend, shadow_model

        target_param = next(pair.target.parameters())
        vocab = vocab_rows(pair.target)
        self.shape = shape
        self.model = shadow_model(shape, vocab, dtype=target_param.dtype, device=target_param.device)
        self.backend = make_shadow_backend(self.model, max_len=max_len + 256)  # + room for a drafted tree

    def wrap(self, target_backend):
        """A target backend whose every forward also runs the shadow."""
        from multispec.models.shadow import ShadowBackend

        return ShadowBackend(target_backend, self.backend)

    def hook(self, model: torch.nn.Module):
        """Run the shadow beside every forward of a transformers model (hf-assisted); returns the handle."""
        from multispec.models.shadow import shadow_hook

        return shadow_hook(model, self.backend)

    def settings(self) -> dict:
        from multispec.models.shadow import intermediate_size, parse_shadow_shape, shadow_label, shadow_params

        layers, hidden = parse_shadow_shape(self.shape)
        return {"shape": self.shape, "layers": layers, "hidden": hidden, "heads": hidden // 64,
                "intermediate": intermediate_size(hidden), "params": shadow_params(self.model),
                "backend": "fast", "applies_to": "every target forward of every method, hf-assisted included",
                "label": shadow_label(self.shape)}


def make_runner(spec: MethodSpec, pair, eos: set[int], shadow: _Shadow | None = None, profile=None):
    """A function (ids, sampling, max_new, seed, knob) -> (new ids, stats dict) for one method; backends and the
    method's policy (trained heads included) are built once here. With `shadow`, the target's every forward also
    runs the shadow model."""
    if spec.name == HF_ASSISTED:
        def run_hf(ids, sampling, max_new, seed, knob):
            n = knob if knob is not None else spec.hf_tokens
            handle = shadow.hook(pair.target) if shadow is not None else None
            try:
                new, c = hf_assisted_generate(pair.target, pair.draft, ids, sampling, max_new, seed, eos, n,
                                              (pair.tokenizer, pair.draft_tokenizer) if pair.cross_vocab else None)
            finally:
                if handle is not None:
                    handle.remove()
            accepted = max(0, c.new_tokens - c.target_calls)
            return new, {"new_tokens": c.new_tokens, "target_calls": c.target_calls, "draft_calls": c.draft_calls,
                         "rounds": c.target_calls, "num_accepted_draft_tokens": accepted,
                         "num_draft_tokens": c.draft_calls, "drafted_tokens": c.draft_calls, "prefill_s": None,
                         "draft_s": None, "verify_s": None, "cache_s": None, "num_assistant_tokens": n,
                         "hf_effective": c.effective}
        return run_hf

    from multispec.decoding.decoder import Decoder

    decoder = Decoder(pair, spec.config, spec.backend, wrap_target=shadow.wrap if shadow is not None else None,
                      profile=profile, **spec.decoder_options)

    def run_engine(ids, sampling, max_new, seed, knob):
        new, metrics = decoder.run(ids, sampling, max_new, seed)
        stats = decoder.stats(metrics, sampling)
        return new, {**metrics.stats(), "engine_s": metrics.seconds, "auto": _auto_summary(stats.get("auto"))}
    run_engine.suffix_store = decoder.loaded.get("store")  # type: ignore[attr-defined]  # (cleared after warm-up)
    return run_engine


def _auto_summary(extra: dict | None) -> dict | None:
    """auto's plans (rounds per plan) and its cost model's drift, for the record; None for other methods."""
    if not extra or "plans" not in extra:
        return None
    return {"plans": {k: v["rounds"] for k, v in extra["plans"].items()},
            "cost_ratio": (extra.get("costs") or {}).get("cost_ratio"),
            "drift": (extra.get("costs") or {}).get("drift")}


def _timed(run, ids, sampling, max_new, seed, knob, on_cuda, rss_base) -> dict:
    """One timed generation. Peak memory (MB): on CUDA the max allocated during it; on the CPU the process's peak
    resident set during it (VmHWM from /proc after resetting the mark), or, where /proc cannot reset it, the
    process's lifetime peak (ru_maxrss). Both include the loaded models, as nvidia-smi or top would show; the
    growth during one warm generation is ~0 on the CPU (buffers are reused), which is why growth is not reported.
    `rss_base` is unused (kept for callers)."""
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    reset = not on_cuda and _reset_peak_rss()
    t0 = time.perf_counter()
    new, stats = run(ids, sampling, max_new, seed, knob)
    if on_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if on_cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    elif reset:
        peak = _proc_status_mb("VmHWM")
    else:
        peak = _maxrss_mb()
    return {**stats, "seconds": seconds, "peak_mem_mb": peak, "output_ids": new}


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _proc_status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0  # kB
    raise OSError(f"/proc/self/status has no {field}")


def _sweep_hf(run, probe: list[list[int]], sampling, max_new, seed, on_cuda) -> dict:
    """Time hf-assisted at each N of HF_BEST_SWEEP on the probe prompts (after one untimed call per N); the best N
    has the highest tokens/s."""
    rates = {}
    for n in HF_BEST_SWEEP:
        run(probe[0], sampling, max_new, seed, n)
        toks = secs = 0.0
        for i, ids in enumerate(probe):
            rec = _timed(run, ids, sampling, max_new, seed + i, n, on_cuda, 0.0)
            toks += rec["new_tokens"]
            secs += rec["seconds"]
        rates[n] = toks / secs if secs > 0 else 0.0
    return {"best": max(rates, key=rates.get), "tokens_per_s": {str(k): v for k, v in rates.items()},
            "probe_prompts": len(probe)}


def step_costs(pair, context: int = COST_CONTEXT, steps: int = COST_STEPS, shadow: _Shadow | None = None,
               kinds: list[str] | None = None) -> dict:
    """Median seconds of one 1-token decode step of each model at `context` tokens of cached context, on each
    backend of `kinds` (default hf and fast; a backend the model cannot run is left out); cost_ratio = draft /
    target (design §1: c_ratio). The top-level keys are the hf backend's; per-backend figures are under "backends".
    With `shadow`, the target's step includes the shadow's forward (as in every shadowed generation)."""
    from multispec.errors import MultispecError
    from multispec.models import BACKENDS, causal_mask, forward_chain, make_backend

    on_cuda = pair.device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    vocab = vocab_rows(pair.target)
    ids = torch.randint(1, vocab, (context + 1,), generator=g)
    per_backend = {}
    for kind in kinds or ["hf", "fast"]:
        assert kind in BACKENDS, kind
        out = {}
        try:
            backends = {name: make_backend(model, kind, sidecar=pair.sidecar(model))
                        for name, model in (("target", pair.target), ("draft", pair.draft))}
        except MultispecError:
            continue
        if shadow is not None:
            backends["target"] = shadow.wrap(backends["target"])
        for name, b in backends.items():
            b.reset()
            forward_chain(b, ids[:context])
            keep = torch.arange(context)
            times = []
            for i in range(steps + 2):  # two untimed steps first
                if on_cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                b.forward(ids[context:], torch.tensor([context]), causal_mask(context, 1))
                if on_cuda:
                    torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
                b.keep(keep)
            out[f"{name}_step_s"] = statistics.median(times)
        out["cost_ratio"] = out["draft_step_s"] / out["target_step_s"]
        per_backend[kind] = out
    return {**per_backend["hf"], "context": context, "steps": steps, "backends": per_backend,
            "shadow_target": shadow.shape if shadow is not None else None}


def environment(pair, command: list[str] | None) -> dict:
    """Device, CPU model, versions, git commit (with -dirty), the command line."""
    import transformers

    dev = pair.device
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        # a quantized pair keeps float32 parameters beside its int8/int4 weights: name the weights
        "dtype": pair.sidecar(pair.target).weights_dtype or str(next(pair.target.parameters()).dtype).removeprefix("torch."),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": command if command is not None else sys.argv,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """`git rev-parse HEAD` of the source tree, with '-dirty' when `git status --porcelain` lists changes."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _maxrss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kb / 1024.0


def _jsonable(d: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


class _NoBar:
    def set_postfix_str(self, *a, **k):
        pass

    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="gen", file=sys.stderr, dynamic_ncols=True)
