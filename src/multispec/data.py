"""Benchmark prompt sets: one loader, one formatting rule per data set (see docs/bench.md).

| dataset    | file                          | text used                                                          |
|------------|-------------------------------|--------------------------------------------------------------------|
| humaneval  | humaneval.jsonl.gz            | `prompt` without trailing whitespace (code completion)             |
| gsm8k      | gsm8k_test.jsonl              | "Question: {question}\\nAnswer: Let's think step by step.\\n"        |
| mt-bench   | mt_bench_question.jsonl       | first turn, verbatim                                               |
| spec-bench | spec_bench_question.jsonl     | first turn, verbatim; MT-Bench's 8 categories grouped as mt_bench  |
| alpaca     | alpaca_eval.jsonl             | "### Instruction:\\n{instruction}\\n\\n### Response:\\n"                |
| PATH.jsonl | any JSONL file                | the `prompt` field (or `prompt_field`), verbatim                   |

Files are found in `data_dir`, else in the folder named by the environment variable MULTISPEC_DATA.

Chat data sets (CHAT_DATASETS: mt-bench, spec-bench, alpaca) also give each prompt's user message
(`Prompt.message`: the first turn; Alpaca's instruction alone, without its "### Instruction" frame), which
`multispec bench` renders with the target's chat template when it has one, as the Spec-Bench paper does; code and
completion sets (humaneval, gsm8k) and JSONL files have none and stay raw text.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from multispec.errors import MultispecError, check

DATA_ENV = "MULTISPEC_DATA"

FILES = {
    "humaneval": "humaneval.jsonl.gz",
    "gsm8k": "gsm8k_test.jsonl",
    "mt-bench": "mt_bench_question.jsonl",
    "spec-bench": "spec_bench_question.jsonl",
    "alpaca": "alpaca_eval.jsonl",
}
DATASETS = tuple(FILES)
CHAT_DATASETS = ("mt-bench", "spec-bench", "alpaca")  # prompts that are a user's message (Prompt.message)

# Spec-Bench stores its MT-Bench part (question ids 81-160) under MT-Bench's own 8 categories; Spec-Bench reports
# them as one category, mt_bench.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. id: stable within its data set (e.g. 'HumanEval/0', '81', 'line 3');
    category: the data set's category, or the data set name where it has none. text: the prompt as raw text (module
    table). message: a chat data set's user message (CHAT_DATASETS), None elsewhere."""

    id: str
    category: str
    text: str
    message: str | None = None


def load_prompts(dataset: str, data_dir: str | Path | None = None, limit: int | None = None, offset: int = 0,
                 prompt_field: str = "prompt") -> list[Prompt]:
    """Prompts of `dataset` (a name in DATASETS, or a path to a .jsonl / .jsonl.gz file), formatted as in the module
    table. offset/limit select records [offset, offset + limit) in file order; for spec-bench they apply within
    each of its six categories (limit=10 gives 60 prompts)."""
    check(isinstance(offset, int) and offset >= 0, f"offset must be an integer >= 0, got {offset!r}")
    check(limit is None or (isinstance(limit, int) and limit >= 1), f"limit must be an integer >= 1, got {limit!r}")
    if dataset not in FILES:
        check(dataset.endswith((".jsonl", ".jsonl.gz")),
              f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}, or give a path to a .jsonl file")
        path = Path(dataset)
        check(path.is_file(), f"dataset file not found: {path}")
        rows = _read_jsonl(path)
        prompts = [_custom(r, i, path, prompt_field) for i, r in enumerate(rows)]
        return _window(prompts, offset, limit)
    path = data_file(dataset, data_dir)
    rows = _read_jsonl(path)
    if dataset == "spec-bench":
        prompts = _round_robin_mt_bench([(_spec_bench(r, path), str(r.get("category"))) for r in rows])
        return [p for cat in SPEC_BENCH_CATEGORIES
                for p in _window([q for q in prompts if q.category == cat], offset, limit)]
    fmt = {"humaneval": _humaneval, "gsm8k": _gsm8k, "mt-bench": _mt_bench, "alpaca": _alpaca}[dataset]
    return _window([fmt(r, i, path) for i, r in enumerate(rows)], offset, limit)


def data_file(dataset: str, data_dir: str | Path | None = None) -> Path:
    """The path of a named data set's file; MultispecError naming the file and both ways to point at it."""
    name = FILES[dataset]
    root = data_dir if data_dir is not None else os.environ.get(DATA_ENV)
    if root is None:
        raise MultispecError(f"{dataset}: cannot find {name}: pass --data-dir DIR (data_dir=DIR) or set "
                             f"{DATA_ENV}=DIR, where DIR holds {name}")
    path = Path(root) / name
    if not path.is_file():
        how = "--data-dir / data_dir" if data_dir is not None else f"${DATA_ENV}"
        raise MultispecError(f"{dataset}: {path} not found (folder from {how}); pass --data-dir DIR (data_dir=DIR) "
                             f"or set {DATA_ENV}=DIR, where DIR holds {name}")
    return path


def truncate_ids(ids: list[int], max_tokens: int | None, bos: int | None) -> tuple[list[int], bool]:
    """Keep the last `max_tokens` tokens of a tokenized prompt, with its BOS (when `bos` is not None and ids start
    with it) kept in front and counted. Returns (ids, truncated)."""
    if max_tokens is None or len(ids) <= max_tokens:
        return ids, False
    check(max_tokens >= 2, f"max_prompt_tokens must be >= 2, got {max_tokens}")
    if bos is not None and ids and ids[0] == bos:
        return [bos] + ids[len(ids) - (max_tokens - 1):], True
    return ids[len(ids) - max_tokens:], True


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MultispecError(f"{path}, line {n}: not JSON ({e.msg})") from None
            check(isinstance(row, dict), f"{path}, line {n}: expected a JSON object")
            rows.append(row)
    return rows


def _field(row: dict, key: str, path: Path, i: int):
    check(key in row, f"{path}: record {i} has no field {key!r} (it has {', '.join(sorted(row)) or 'none'})")
    return row[key]


def _window(items: list, offset: int, limit: int | None) -> list:
    return items[offset:] if limit is None else items[offset: offset + limit]


def _humaneval(row, i, path) -> Prompt:
    # Trailing whitespace is stripped (as bigcode-evaluation-harness does): every prompt ends in '"""\n', and a
    # byte-level BPE that merges '\n' with the next line's indent makes a bare final '\n' a token boundary never
    # seen in training; pycode-v1 then predicts <|endoftext|> first (p ~ 0.6 on HumanEval/0).
    return Prompt(id=str(row.get("task_id", i)), category="humaneval",
                  text=_field(row, "prompt", path, i).rstrip())


def _gsm8k(row, i, path) -> Prompt:
    q = _field(row, "question", path, i)
    return Prompt(id=str(i), category="gsm8k", text=f"Question: {q}\nAnswer: Let's think step by step.\n")


def _mt_bench(row, i, path) -> Prompt:
    turn = _field(row, "turns", path, i)[0]
    return Prompt(id=str(row.get("question_id", i)), category=str(row.get("category", "mt-bench")), text=turn,
                  message=turn)


def _spec_bench(row, path) -> Prompt:
    qid = row.get("question_id")
    cat = str(_field(row, "category", path, qid))
    cat = "mt_bench" if cat in MT_BENCH_CATEGORIES else cat
    check(cat in SPEC_BENCH_CATEGORIES, f"{path}: question {qid} has unknown category {cat!r}")
    turn = _field(row, "turns", path, qid)[0]
    return Prompt(id=str(qid), category=cat, text=turn, message=turn)


def _round_robin_mt_bench(pairs: list[tuple[Prompt, str]]) -> list[Prompt]:
    """Spec-Bench's mt_bench group in round-robin order over its 8 MT-Bench categories (81, 91, ..., 151, 82, 92,
    ...), so that a per-category limit samples all of them rather than 'writing' alone; other groups keep file
    order."""
    rank: dict[str, int] = {}
    keyed = []
    for i, (p, sub) in enumerate(pairs):
        if p.category == "mt_bench":
            r = rank.get(sub, 0)
            rank[sub] = r + 1
            keyed.append(((r, MT_BENCH_CATEGORIES.index(sub), i), p))
        else:
            keyed.append(((0, 0, i), p))
    mt = [p for _, p in sorted(k for k in keyed if k[1].category == "mt_bench")]
    it = iter(mt)
    return [next(it) if p.category == "mt_bench" else p for _, p in keyed]


def _alpaca(row, i, path) -> Prompt:
    inst = _field(row, "instruction", path, i)
    return Prompt(id=str(i), category="alpaca", text=f"### Instruction:\n{inst}\n\n### Response:\n", message=inst)


def _custom(row, i, path, key) -> Prompt:
    text = _field(row, key, path, i)
    check(isinstance(text, str) and text != "", f"{path}: record {i}: field {key!r} is not a non-empty string")
    return Prompt(id=str(row.get("id", row.get("question_id", row.get("task_id", i)))),
                  category=str(row.get("category", path.stem.removesuffix(".jsonl"))), text=text)
