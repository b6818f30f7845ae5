"""OpenVINO GenAI on the real pair, on speed.py's prompts: plain, with the 0.5B draft, and prompt lookup, one
inference thread (a baseline, never a dependency of the package).

    python benchmarks/real_pair/openvino.py --humaneval 20 --spec-bench 2 --max-new-tokens 128 \\
        --out benchmarks/results/real_pair/openvino      # --resume goes on with a run cut short

Two processes. This one, in the project's environment, renders the prompts exactly as speed.py does (its
`raw_prompts` and `rendered`, with the target's tokenizer and chat template from the GGUF cache folder) and writes
their token ids to --out/prompts.json; then it runs this file again with the OpenVINO venv's Python (--venv) as
`--worker`, which imports nothing from multispec. Make the venv once (torch 2.13.0+cpu is the wheel the pip
configuration here finds; elsewhere add `--extra-index-url https://download.pytorch.org/whl/cpu`, which also has a
CPU torchvision). optimum-intel requires torchvision, and PyPI's torchvision 0.28.0 is built for the CUDA torch: with
the CPU torch its import fails ("operator torchvision::nms does not exist") and takes transformers' model classes
with it, so it is removed (only optimum's vision models use it):

    python -m venv ~/.cache/multispec/openvino-venv
    ~/.cache/multispec/openvino-venv/bin/pip install openvino-genai==2026.4.1 torch==2.13.0+cpu \\
        torchvision==0.28.0 'optimum-intel[openvino]'
    ~/.cache/multispec/openvino-venv/bin/pip uninstall -y torchvision

The worker exports each model it lacks with optimum-intel (`optimum-cli export openvino --weight-format int8|int4
--task text-generation-with-past`, from the float32 folders multispec dequantized the GGUF files into, one export at
a time) into --models (default ~/.cache/multispec/openvino/), then runs every configuration on every prompt, in
order, prompt by prompt, greedy, with OpenVINO's default CPU settings and INFERENCE_NUM_THREADS=1 given to every
compiled model (target and draft). Each record: new tokens, wall and process CPU seconds of `generate` (prefill
included, loading excluded), OpenVINO's own TTFT, and whether the token ids equal the plain pipeline's of the same
weight format on that prompt (else the first differing position). Written: results.json and results.md in --out;
results.md also sets the best configuration beside multispec's figures from speed.py's results (--speed).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CACHE = Path(os.environ.get("MULTISPEC_CACHE_DIR", Path.home() / ".cache" / "multispec"))
MODELS = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}
# name: (weight format of the target, draft's weight format or "lookup" or None)
CONFIGS = {"int8 plain": ("int8", None), "int4 plain": ("int4", None), "int8 + int8 draft": ("int8", "int8"),
           "int4 + int4 draft": ("int4", "int4"), "int4 lookup": ("int4", "lookup")}
DEFAULT_CONFIGS = ",".join(CONFIGS)


def say(msg: str) -> None:
    print(f"openvino: {msg}", file=sys.stderr, flush=True)


# ---- the project's side: prompts, then the worker ----------------------------------------------------------------

def prepare(args) -> int:
    from speed import interleaved, pair_files, raw_prompts, rendered
    from transformers import AutoTokenizer

    from multispec.gguf_files import open_gguf

    files = pair_files()
    folders = {}
    for role, f in zip(("target", "draft"), files):
        src = open_gguf(str(f), need_tokenizer=role == "target")
        if not src.cached:
            sys.exit(f"openvino: {src.folder} is missing; load the pair once in float32 (multispec generate "
                     f"--target {files[0]} --draft {files[1]}) so that its dequantized folder is there")
        folders[role] = str(src.folder)
    tokenizer = AutoTokenizer.from_pretrained(folders["target"])
    items = rendered(tokenizer, raw_prompts(args.humaneval, args.spec_bench, args.data_dir))
    order = [p for _, p in interleaved(items, [0.0], [])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompts.json").write_text(json.dumps({"folders": folders, "prompts": order}, indent=1))
    say(f"{len(order)} prompts rendered to {args.out / 'prompts.json'}")
    python = Path(args.venv).expanduser() / "bin" / "python"
    if not python.is_file():
        sys.exit(f"openvino: no venv at {args.venv}; make it as this file's docstring says")
    cmd = [str(python), __file__, "--worker", *sys.argv[1:]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv sees none of the project
    return subprocess.call(cmd, env={**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})


# ---- the venv's side --------------------------------------------------------------------------------------------

def export(src: str, dest: Path, fmt: str) -> None:
    """optimum-intel's export of the float32 folder `src` at `fmt` weights, written under a temporary name."""
    if (dest / "openvino_model.xml").is_file():
        return
    tmp = dest.with_name(dest.name + ".tmp")
    cli = Path(sys.executable).parent / "optimum-cli"
    cmd = [str(cli), "export", "openvino", "--model", src, "--weight-format", fmt,
           "--task", "text-generation-with-past", str(tmp)]
    say(f"exporting {dest.name}: {' '.join(cmd)}")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    tmp.rename(dest)
    say(f"exported {dest.name} in {time.perf_counter() - t0:.0f} s")


def model_dir(models: Path, role: str, fmt: str) -> Path:
    return models / f"{MODELS[role]}-{fmt}"


def needed(names: list[str]) -> list[tuple[str, str]]:
    """(role, weight format) of every model the configurations use, each once."""
    out: list[tuple[str, str]] = []
    for name in names:
        fmt, extra = CONFIGS[name]
        for m in [("target", fmt)] + ([("draft", extra)] if extra not in (None, "lookup") else []):
            out += [m] if m not in out else []
    return out


def free_gib() -> float:
    info = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())
    return int(info["MemAvailable"].split()[0]) / 2**20


def pipelines(names: list[str], models: Path, folders: dict, n_assist: int, ngram: int):
    """{config: (pipeline, its GenerationConfig)}; every compiled model on CPU with one inference thread."""
    import openvino_genai as ov_genai

    props = {"INFERENCE_NUM_THREADS": 1}
    out = {}
    for name in names:
        fmt, extra = CONFIGS[name]
        kw: dict[str, object] = dict(props)
        if extra == "lookup":
            kw["prompt_lookup"] = True
        elif extra is not None:
            kw["draft_model"] = ov_genai.draft_model(str(model_dir(models, "draft", extra)), "CPU", **props)
        t0 = time.perf_counter()
        pipe = ov_genai.LLMPipeline(str(model_dir(models, "target", fmt)), "CPU", **kw)
        cfg = pipe.get_generation_config()
        cfg.do_sample = False
        if extra == "lookup":
            cfg.num_assistant_tokens, cfg.max_ngram_size = n_assist, ngram
        elif extra is not None:
            cfg.num_assistant_tokens = n_assist
        say(f"{name}: loaded in {time.perf_counter() - t0:.1f} s")
        out[name] = (pipe, cfg)
    return out


def generate(pipe, cfg, ids: list[int], max_new: int) -> dict:
    import numpy as np
    import openvino as ov

    cfg.max_new_tokens = max_new
    x = ov.Tensor(np.array([ids], dtype=np.int64))
    c0, t0 = time.process_time(), time.perf_counter()
    res = pipe.generate(x, cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    toks = [int(t) for t in res.tokens[0]]
    try:
        ttft = res.perf_metrics.get_ttft().mean / 1000.0
    except (AttributeError, RuntimeError):
        ttft = None
    return {"tokens": toks, "new_tokens": len(toks), "wall_s": wall, "cpu_s": cpu, "ttft_s": ttft}


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(records: list[dict], names: list[str]) -> list[dict]:
    rows = []
    for d in sorted({r["dataset"] for r in records}) + ["all"]:
        for c in names:
            rs = [r for r in records if r["config"] == c and d in ("all", r["dataset"])]
            if not rs:
                continue
            toks = sum(r["new_tokens"] for r in rs)
            same = [r["same_as_plain"] for r in rs if r["same_as_plain"] is not None]
            dec = [(r["new_tokens"] - 1, r["wall_s"] - r["ttft_s"]) for r in rs if r.get("ttft_s") is not None]
            rows.append({"dataset": d, "config": c, "prompts": len(rs), "tokens": toks,
                         "wall_tps": toks / sum(r["wall_s"] for r in rs),
                         "cpu_tps": toks / sum(r["cpu_s"] for r in rs),
                         "decode_tps": sum(n for n, _ in dec) / sum(s for _, s in dec) if len(dec) == len(rs) else None,
                         "cpu_per_wall": sum(r["cpu_s"] for r in rs) / sum(r["wall_s"] for r in rs),
                         "same_as_plain": f"{sum(same)}/{len(same)}" if same else None,
                         "first_diffs": sorted(r["first_diff"] for r in rs if r.get("first_diff") is not None)})
    return rows


def matched(records: list[dict], dataset: str, ids: set) -> list[dict]:
    """speed.py's greedy rows for `dataset` recomputed on the prompts OpenVINO ran (a run cut short has fewer)."""
    out = []
    rs = [r for r in records if r["dataset"] == dataset and r["temperature"] == 0 and r["id"] in ids]
    for c in dict.fromkeys(r["config"] for r in rs):
        mine = [r for r in rs if r["config"] == c]
        toks = sum(r["new_tokens"] for r in mine)
        same = [r["same_as_plain"] for r in mine if r.get("same_as_plain") is not None]
        out.append({"config": c, "prompts": len(mine), "e2e_tps": toks / sum(r["e2e_s"] for r in mine),
                    "decode_tps": toks / sum(r["decode_s"] for r in mine),
                    "same_as_plain": f"{sum(same)}/{len(same)}" if same else None})
    return out


def versus_multispec(rows: list[dict], speed_file: Path, ids: dict) -> tuple[str, dict]:
    """The best OpenVINO configuration of each data set (tokens per CPU-second) beside speed.py's greedy figures."""
    import gzip

    if not speed_file.is_file():
        return f"({speed_file} absent: no comparison)\n", {}
    speed = json.loads(gzip.decompress(speed_file.read_bytes()))
    parts = speed_file.resolve().parts  # named from the repository root, whichever checkout it was read in
    where = Path(*parts[parts.index("benchmarks"):]) if "benchmarks" in parts else speed_file
    lines = [f"multispec and llama.cpp: `{where}` (dtype {speed['settings'].get('dtype')}, greedy, one thread on a "
             "machine otherwise near idle, so their wall tok/s is about their tok/s per CPU-second), on the prompts "
             "OpenVINO ran. OpenVINO: its "
             "best configuration on the data set by tokens per CPU-second, here on a shared machine; its decode "
             "figure is (new tokens − 1) / (wall − TTFT) scaled by its wall/CPU ratio.\n",
             "| data set | configuration | prompts | tok/s end to end | tok/s decode | × best OpenVINO (end to end / "
             "decode) | = own plain greedy |", "|---|---|---|---|---|---|---|"]
    out: dict = {"speed_file": str(where), "rows": []}
    for d in ("humaneval", "spec-bench"):
        ovs = [r for r in rows if r["dataset"] == d]
        if not ovs:
            continue
        best = max(ovs, key=lambda r: r["cpu_tps"])
        ov_dec = best["decode_tps"] / best["cpu_per_wall"] if best["decode_tps"] else None
        picks = [(f"OpenVINO {best['config']} (per CPU-second)", best["prompts"], best["cpu_tps"], ov_dec,
                  best["same_as_plain"])]
        cell = matched(speed["records"], d, ids.get(d, set()))
        ms = [r for r in cell if r["config"].startswith("multispec")]
        if ms:
            top = max(ms, key=lambda r: r["e2e_tps"])
            ar = next((r for r in ms if r["config"].startswith("multispec ar")), None)
            picks += [(f"{r['config']} (best multispec)" if r is top else r["config"], r["prompts"], r["e2e_tps"],
                       r["decode_tps"], r["same_as_plain"]) for r in ([ar] if ar and ar is not top else []) + [top]]
        picks += [(r["config"], r["prompts"], r["e2e_tps"], r["decode_tps"], r["same_as_plain"])
                  for r in cell if r["config"] == "llama.cpp plain"]
        for name, n, e2e, dec, same in picks:
            r_e2e = e2e / best["cpu_tps"]
            r_dec = dec / ov_dec if dec and ov_dec else None
            lines.append(f"| {d} | {name} | {n} | {e2e:.1f} | {'–' if dec is None else f'{dec:.1f}'} | {r_e2e:.2f} / "
                         f"{'–' if r_dec is None else f'{r_dec:.2f}'} | {same or '–'} |")
            out["rows"].append({"dataset": d, "config": name, "prompts": n, "e2e_tps": e2e, "decode_tps": dec,
                                "vs_best_openvino_e2e": r_e2e, "vs_best_openvino_decode": r_dec,
                                "same_as_plain": same})
    return "\n".join(lines) + "\n", out


def markdown(meta: dict, rows: list[dict], versus: str) -> str:
    def f(x, p=1):
        return "–" if x is None else f"{x:.{p}f}"
    lines = ["# The real pair: OpenVINO GenAI", "", f"`{meta['command']}`", "",
             f"OpenVINO GenAI {meta['versions'].get('openvino_genai')}, optimum-intel "
             f"{meta['versions'].get('optimum_intel')}; CPU plugin defaults, INFERENCE_NUM_THREADS=1, "
             f"num_assistant_tokens {meta['num_assistant_tokens']} (lookup: max_ngram_size {meta['max_ngram_size']}); "
             f"greedy, {meta['max_new_tokens']} new tokens; wall and CPU seconds of `generate` (prefill included).",
             "", "| data set | configuration | prompts | tokens | tok/s wall | tok/s per CPU-second | "
             "tok/s decode (wall − TTFT) | CPU s / wall s | = own plain greedy | first differing positions |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['config']} | {r['prompts']} | {r['tokens']} | {f(r['wall_tps'])} | "
                     f"{f(r['cpu_tps'])} | {f(r['decode_tps'])} | {f(r['cpu_per_wall'], 2)} | "
                     f"{r['same_as_plain'] or '–'} | {', '.join(map(str, r['first_diffs'])) or '–'} |")
    return "\n".join(lines) + "\n\n## Beside multispec\n\n" + versus


def worker(args) -> int:
    if args.report:  # the tables again from the records, no run (e.g. with another --speed)
        saved = json.loads((args.out / "results.json").read_text())
        write(args, saved["settings"], saved["records"], saved["settings"]["configs"])
        return 0
    import openvino as ov
    import openvino_genai as ov_genai

    data = json.loads((args.out / "prompts.json").read_text())
    prompts = data["prompts"][: args.limit] if args.limit else data["prompts"]
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        sys.exit(f"openvino: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    args.models.mkdir(parents=True, exist_ok=True)
    for role, fmt in needed(names):  # one at a time, before any pipeline holds memory
        if not (model_dir(args.models, role, fmt) / "openvino_model.xml").is_file():
            say(f"{free_gib():.1f} GiB available before the export")
        export(data["folders"][role], model_dir(args.models, role, fmt), fmt)
    if args.export_only:
        return 0
    pipes = pipelines(names, args.models, data["folders"], args.num_assistant_tokens, args.max_ngram_size)
    for name, (pipe, cfg) in pipes.items():  # warm-up: one short untimed run each
        generate(pipe, cfg, prompts[0]["ids"], 8)
    records: list[dict] = []
    out_file = args.out / "results.json"
    if args.resume and out_file.is_file():
        records = json.loads(out_file.read_text())["records"]
        have = {(r["dataset"], r["id"]) for r in records}
        say(f"resuming: {len(have)} prompts already measured")
        prompts = [p for p in prompts if (p["dataset"], p["id"]) not in have]
    versions = {"openvino": ov.get_version(), "openvino_genai": ov_genai.__version__}
    for mod in ("optimum.intel", "nncf", "transformers", "torch"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            versions[mod.replace(".", "_")] = getattr(m, "__version__", None)
        except ImportError:
            versions[mod] = None
    try:
        from importlib.metadata import version

        versions["optimum_intel"] = version("optimum-intel")
    except Exception:  # noqa: BLE001 - a version string is not worth failing a run for
        pass
    cpu_name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), platform.machine())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    meta = {"command": " ".join(["python", os.path.relpath(__file__, HERE.parents[1]),
                                 *[a for a in sys.argv[1:] if a != "--worker"]]),
            "commit": commit, "versions": {**versions, "python": platform.python_version()},
            "machine": {"cpu": cpu_name, "cores": os.cpu_count(), "inference_threads": 1,
                        "loadavg_at_start": os.getloadavg()},
            "device_properties": {"INFERENCE_NUM_THREADS": 1}, "num_assistant_tokens": args.num_assistant_tokens,
            "max_ngram_size": args.max_ngram_size, "max_new_tokens": args.max_new_tokens,
            "models": {n: str(model_dir(args.models, r, f)) for r in MODELS for f in ("int8", "int4")
                       for n in [f"{r} {f}"]},
            "exported_from": data["folders"], "configs": names,
            "export": "optimum-cli export openvino --model FOLDER --weight-format int8|int4 "
                      "--task text-generation-with-past (optimum-intel's defaults otherwise)"}
    for i, p in enumerate(prompts, 1):
        plain: dict[str, list[int]] = {}
        row = []
        for name in names:
            fmt, extra = CONFIGS[name]
            pipe, cfg = pipes[name]
            r = generate(pipe, cfg, p["ids"], args.max_new_tokens)
            if extra is None:
                plain[fmt] = r["tokens"]
            own = plain.get(fmt)
            r["same_as_plain"] = None if own is None else r["tokens"] == own
            r["first_diff"] = None if own is None else first_diff(r["tokens"], own)
            r.update(config=name, dataset=p["dataset"], category=p["category"], id=p["id"],
                     prompt_tokens=len(p["ids"]))
            records.append(r)
            row.append(f"{name} {r['new_tokens'] / r['cpu_s']:.1f}" + ("" if r["same_as_plain"] in (None, True)
                                                                     else f" (differs at {r['first_diff']})"))
        say(f"{i}/{len(prompts)} {p['dataset']} {p['id']} (tok per CPU-s): " + ", ".join(row))
        write(args, meta, records, names)
    write(args, meta, records, names)
    return 0


def write(args, meta: dict, records: list[dict], names: list[str]) -> None:
    rows = summarize(records, names)
    ids: dict[str, set] = {}
    for r in records:
        ids.setdefault(r["dataset"], set()).add(r["id"])
    versus, vs = versus_multispec(rows, args.speed, ids)
    meta = meta if args.report else {**meta, "loadavg_at_end": os.getloadavg()}
    tmp = args.out / "results.json.tmp"
    tmp.write_text(json.dumps({"settings": meta, "summary": rows, "versus_multispec": vs, "records": records},
                              indent=1))
    tmp.replace(args.out / "results.json")  # whole or not at all: --resume reads it
    (args.out / "results.md").write_text(markdown(meta, rows, versus))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--humaneval", type=int, default=20)
    ap.add_argument("--spec-bench", type=int, default=2, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated, run in this order ({DEFAULT_CONFIGS})")
    ap.add_argument("--num-assistant-tokens", type=int, default=4, help="drafted tokens per step (draft and lookup)")
    ap.add_argument("--max-ngram-size", type=int, default=3, help="prompt lookup's n-gram")
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts of the interleaved order only")
    ap.add_argument("--resume", action="store_true", help="keep the prompts --out's results.json holds; run the rest")
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA"))
    ap.add_argument("--venv", default=str(CACHE / "openvino-venv"))
    ap.add_argument("--models", type=Path, default=CACHE / "openvino", help="the exported models' folder")
    ap.add_argument("--speed", type=Path, default=HERE.parents[1] / "benchmarks/results/real_pair/speed/results.json.gz",
                    help="speed.py's results, for the comparison table")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--export-only", action="store_true", help="export the models the configurations need; no run")
    ap.add_argument("--report", action="store_true", help="rewrite the tables from --out's results.json; no run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.report:
        return worker(args)
    if args.worker:  # this file's folder off the path, or `import openvino` would import this file
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
        return worker(args)
    return prepare(args)


if __name__ == "__main__":
    sys.exit(main())
