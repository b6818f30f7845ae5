"""lm-evaluation-harness against `multispec serve`: the same log-likelihoods and greedy generations as its own `hf`
model on the same checkpoint (issue 27).

Two local tasks built here from fixed Python snippets (no download): `ms_ll` (output_type loglikelihood: a code
context and its continuation) and `ms_gen` (generate_until, greedy, up to 32 tokens, until a blank line). Both run
once with lm-eval's `hf` model (transformers, fp32, CPU) and once with `local-completions` (token-id prompts,
`echo: true, logprobs: 1` for log-likelihoods, as lm-eval sends them) against a `multispec serve` subprocess on the
same target with its draft (speculative decoding on every request). Both are told add_bos_token=True (lm-eval's
API models default to no special tokens, its hf model to the tokenizer's own, which for pycode-v1 adds a BOS), so
both score the same ids. Writes the per-sample comparison as JSON.

    /path/to/env-with-lm_eval/bin/python benchmarks/serve/lm_eval_parity.py --server-python /work/venv/bin/python

lm_eval (pinned 0.4.13, `pip install lm_eval==0.4.13`) may live in its own environment: it brings a torch of its
own. Without it the script says so and exits 0 (nothing to compare).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from local_server import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PYCODE = ROOT.parent / "shared" / "models" / "pycode-v1"
LM_EVAL_VERSION = "0.4.13"
SNIPPETS = [
    ("def add(a, b):\n    return", " a + b\n"),
    ("def is_even(n):\n    return n %", " 2 == 0\n"),
    ("for i in range(10):\n    print(", "i)\n"),
    ("import os\n\npath = os.path.join(", "root, name)\n"),
    ("class Stack:\n    def __init__(self):\n        self.items =", " []\n"),
    ("def factorial(n):\n    if n == 0:\n        return", " 1\n"),
    ("with open(path) as f:\n    data =", " f.read()\n"),
    ("def mean(xs):\n    return sum(xs) /", " len(xs)\n"),
]


def write_tasks(folder: Path) -> None:
    rows = [{"context": c, "continuation": t, "prompt": c} for c, t in SNIPPETS]
    data = folder / "snippets.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n")
    (folder / "ms_ll.yaml").write_text(
        "task: ms_ll\n" + common + "output_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \"{{continuation}}\"\nmetric_list:\n  - metric: perplexity\n  - metric: acc\n")
    (folder / "ms_gen.yaml").write_text(
        "task: ms_gen\n" + common + "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\n"
        "doc_to_target: \"{{continuation}}\"\ngeneration_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 32\n"
        "  do_sample: false\n  temperature: 0.0\nmetric_list:\n  - metric: exact_match\n")


def evaluate(model: str, model_args: str, tasks: Path) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["ms_ll", "ms_gen"], batch_size=1,
                                  task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
                                  apply_chat_template=False)
    samples = out["samples"]
    return {"ll": [s["resps"][0][0] for s in sorted(samples["ms_ll"], key=lambda s: s["doc_id"])],
            "gen": [s["resps"][0][0] for s in sorted(samples["ms_gen"], key=lambda s: s["doc_id"])]}


def start_server(python: str, target: str, draft: str, port: int, method: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([python, "-m", "multispec", "serve", "--target", target, "--draft", draft, "--method",
                             method, "--threads", "1", "--port", str(port), "--served-model-name", "pycode",
                             "--max-concurrent", "1"], env=env)
    try:
        wait_healthy(port, proc)
    except SystemExit:
        proc.kill()
        raise
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(PYCODE / "target"))
    ap.add_argument("--draft", default=str(PYCODE / "draft"))
    ap.add_argument("--method", default="sd")
    ap.add_argument("--server-python", default=sys.executable, help="a Python with multispec's dependencies")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "lm_eval" / "parity.json"))
    args = ap.parse_args()
    try:
        import lm_eval
    except ImportError:
        print(f"skipped: lm_eval is not installed here (pip install lm_eval=={LM_EVAL_VERSION}); nothing to compare")
        return
    if not Path(args.target).is_dir():
        print(f"skipped: no checkpoint at {args.target}")
        return
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp)
        write_tasks(tasks)
        hf = evaluate("hf", f"pretrained={args.target},dtype=float32,device=cpu,add_bos_token=True", tasks)
        port = free_port()
        server = start_server(args.server_python, args.target, args.draft, port, args.method)
        try:
            served = evaluate("local-completions", f"model=pycode,base_url=http://127.0.0.1:{port}/v1/completions,"
                              f"tokenizer={args.target},tokenizer_backend=huggingface,tokenized_requests=True,"
                              "num_concurrent=1,max_retries=1,add_bos_token=True", tasks)
        finally:
            server.terminate()
            server.wait(30)
    ll_diff = [abs(a[0] - b[0]) for a, b in zip(hf["ll"], served["ll"])]
    greedy_same = [a[1] == b[1] for a, b in zip(hf["ll"], served["ll"])]
    gen_same = [a == b for a, b in zip(hf["gen"], served["gen"])]
    report = {"lm_eval": getattr(lm_eval, "__version__", LM_EVAL_VERSION), "target": args.target,
              "draft": args.draft, "method": args.method, "samples": len(SNIPPETS),
              "max_loglikelihood_abs_diff": max(ll_diff), "is_greedy_agree": all(greedy_same),
              "generations_equal": sum(gen_same), "hf": hf, "served": served,
              "pass": max(ll_diff) < 1e-4 and all(greedy_same) and all(gen_same)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("hf", "served")}, indent=1))
    if not report["pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
