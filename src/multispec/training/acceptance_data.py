"""Training data of the acceptance head (design §7.4): prompts, target responses, soft labels, mixed features.

Per prompt:
1. the target samples a response X_1..X_m (processed by `sampling`, default T = 1, top-k 50);
2. teacher-forced on prompt + X, the draft samples Z_t ~ q_t at every response position and both models score it:
   y_t = min(1, p_t(Z_t) / q_t(Z_t)) (the exact acceptance probability of Z_t), with the same processing;
3. token mixing: Z'_t = X_t with probability `mix` (no label) else Z_t (label y_t);
4. features: the frozen draft's final hidden states on prompt + Z', at the position of each labelled Z'_t.
Features are computed once and cached; the head trains on the cache.

Prompt sources (`PROMPT_SOURCES`), all disjoint from the evaluation prompts (HumanEval 100-163):
- humaneval-train: HumanEval prompts 0-99 (humaneval.jsonl.gz in the data directory);
- stdlib: snippets of the Python standard library ending at a function signature (the pycode models saw the
  standard library in training, so these are in-distribution);
- gsm8k: GSM8K test questions as Python comments followed by `def solution():`;
- a JSONL file: field `prompt` (else `text`) of each record.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from multispec.errors import MultispecError, check
from multispec.training.common import encode_prompt, last_hidden, progress, sample_responses, teacher_forced_probs
from multispec.sampling import SamplingConfig

PROMPT_SOURCES = ("humaneval-train", "stdlib", "gsm8k")
HUMANEVAL_TRAIN = range(0, 100)  # 100-163 are the evaluation prompts
FEATURES_FILE = "features.safetensors"
META_FILE = "meta.json"


@dataclass(frozen=True)
class DataConfig:
    """What the cached features depend on; a cache is reused only when this matches exactly."""

    target: str
    draft: str
    sources: tuple[str, ...]  # names from PROMPT_SOURCES and/or JSONL paths
    n_prompts: int = 200
    max_new_tokens: int = 128
    max_prompt_tokens: int = 384
    temperature: float = 1.0
    top_k: int | None = 50
    mix: float = 0.15
    seed: int = 0
    dtype: str = "float32"  # the weights both models are loaded with (labels and features depend on it)

    def __post_init__(self) -> None:
        check(len(self.sources) >= 1, "give --prompts FILE or --dataset NAME (at least one prompt source)")
        for s in self.sources:
            check(s in PROMPT_SOURCES or s.endswith(".jsonl"),
                  f"unknown prompt source {s!r}; choose {', '.join(PROMPT_SOURCES)} or a .jsonl file")
            check(s in PROMPT_SOURCES or Path(s).is_file(), f"prompt file not found: {s}")
        check(self.n_prompts >= 3, f"--n-prompts must be >= 3 (train, validation, test), got {self.n_prompts}")
        check(self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        check(self.max_prompt_tokens >= 2, f"max_prompt_tokens must be >= 2, got {self.max_prompt_tokens}")
        check(0 <= self.mix < 1, f"--mix must be in [0, 1), got {self.mix}")
        self.sampling()  # validates temperature / top_k

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k)


@dataclass
class AcceptanceData:
    """features: float32 [N, H]; labels: float32 [N] soft acceptance labels; prompt: long [N] prompt index of each
    row (splits are made by prompt); meta: counts and settings."""

    features: torch.Tensor
    labels: torch.Tensor
    prompt: torch.Tensor
    meta: dict


# ----------------------------------------------------------------------------------- prompts
def load_prompts(sources: tuple[str, ...], n: int, data_dir: str | None, seed: int) -> list[str]:
    """n prompts, split evenly over `sources` (a source with too few gives its shortfall to the next ones)."""
    texts: list[str] = []
    for i, src in enumerate(sources):
        want = (n - len(texts)) // (len(sources) - i) + ((n - len(texts)) % (len(sources) - i) > 0)
        got = _source(src, want, data_dir, seed)
        texts.extend(got[:want])
    check(len(texts) >= 3, f"only {len(texts)} prompts found in {', '.join(sources)}")
    return texts


def _source(src: str, n: int, data_dir: str | None, seed: int) -> list[str]:
    if src == "humaneval-train":
        recs = _jsonl(_data_file(data_dir, "humaneval.jsonl.gz"))
        return [recs[i]["prompt"] for i in HUMANEVAL_TRAIN if i < len(recs)][:n]
    if src == "gsm8k":
        recs = _jsonl(_data_file(data_dir, "gsm8k_test.jsonl"))
        return [_gsm8k_prompt(r["question"]) for r in recs[:n]]
    if src == "stdlib":
        return stdlib_snippets(n, seed)
    recs = _jsonl(Path(src))
    out = []
    for r in recs[:n]:
        text = r.get("prompt", r.get("text")) if isinstance(r, dict) else None
        check(isinstance(text, str) and text, f"{src}: each record needs a non-empty 'prompt' (or 'text') field")
        out.append(text)
    return out


def _data_file(data_dir: str | None, name: str) -> Path:
    root = data_dir or os.environ.get("MULTISPEC_DATA")
    check(root is not None, f"--data-dir or MULTISPEC_DATA must name the folder holding {name}")
    f = Path(root, name)
    check(f.is_file(), f"dataset file not found: {f}")
    return f


def _jsonl(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        try:
            return [json.loads(line) for line in fh if line.strip()]
        except json.JSONDecodeError as e:
            raise MultispecError(f"{path}: not JSONL ({e})") from None


def _gsm8k_prompt(question: str) -> str:
    lines = "\n".join("# " + line for line in question.strip().splitlines())
    return f"{lines}\n# Write a Python function that returns the answer.\ndef solution():\n"


def stdlib_snippets(n: int, seed: int, context_lines: int = 12) -> list[str]:
    """n snippets of the standard library: up to `context_lines` lines before a `def` line, the `def` line itself;
    the model continues with the body. Files chosen with `seed` from a sorted listing (test packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"test", "tests", "idlelib", "site-packages"} & set(p.parts))
    rng = random.Random(seed)
    rng.shuffle(files)
    out = []
    for f in files:
        if len(out) >= n:
            break
        try:
            lines = f.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and line.rstrip().endswith(":")]
        if not defs:
            continue
        i = rng.choice(defs)
        out.append("\n".join(lines[max(0, i - context_lines):i + 1]) + "\n")
    return out


# ----------------------------------------------------------------------------------- data
def build_data(config: DataConfig, target: torch.nn.Module, draft: torch.nn.Module, tokenizer, prompts: list[str],
               eos_id: int | None, gen_batch: int = 16) -> AcceptanceData:
    """Steps 1-4 above for every prompt. target, draft: HF causal LMs (fp32, eval)."""
    sampling = config.sampling()
    gen = torch.Generator().manual_seed(config.seed)
    ids = [encode_prompt(tokenizer, t, config.max_prompt_tokens) for t in prompts]
    responses = sample_responses(target, ids, config.max_new_tokens, sampling, gen, eos_id, batch_size=gen_batch,
                                 desc="target responses")
    feats, labels, owner = [], [], []
    n_pos = n_mixed = 0
    for i in progress(range(len(prompts)), desc="labels + features", unit="prompt"):
        x = responses[i]
        if not x:
            continue
        seq, start = ids[i] + x, len(ids[i])
        p = teacher_forced_probs(target, seq, start, sampling)  # [m, V]
        q = teacher_forced_probs(draft, seq, start, sampling)  # [m, V]
        z = torch.multinomial(q, 1, generator=gen)[:, 0]  # [m] Z_t ~ q_t
        pz, qz = p.gather(1, z[:, None])[:, 0], q.gather(1, z[:, None])[:, 0]
        y = torch.exp(torch.clamp(pz.clamp(min=1e-30).log() - qz.log(), max=0.0))  # [m] min(1, p/q)
        keep_x = torch.rand(len(x), generator=gen) < config.mix  # [m]
        mixed = torch.where(keep_x, torch.tensor(x), z)  # [m] Z'
        h = last_hidden(draft, ids[i] + mixed.tolist())[start:]  # [m, H] hidden at each Z'_t
        feats.append(h[~keep_x])
        labels.append(y[~keep_x])
        owner.append(torch.full((int((~keep_x).sum()),), i, dtype=torch.long))
        n_pos += len(x)
        n_mixed += int(keep_x.sum())
    check(feats, "no training positions (every response was empty)")
    labels_t = torch.cat(labels)
    meta = {"config": asdict(config), "prompts": len(prompts), "positions": n_pos, "mixed_positions": n_mixed,
            "labelled_positions": int(labels_t.numel()), "mean_label": float(labels_t.mean()),
            "mean_response_tokens": n_pos / len(prompts)}
    return AcceptanceData(features=torch.cat(feats), labels=labels_t, prompt=torch.cat(owner), meta=meta)


def save_data(data: AcceptanceData, path: str | Path) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({"features": data.features.contiguous(), "labels": data.labels.contiguous(),
               "prompt": data.prompt.contiguous()}, str(path / FEATURES_FILE))
    (path / META_FILE).write_text(json.dumps(data.meta, indent=2) + "\n")


def load_cached(path: str | Path, config: DataConfig) -> AcceptanceData | None:
    """The cached data in `path` when it was built with exactly `config`, else None."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / FEATURES_FILE).is_file() or not (path / META_FILE).is_file():
        return None
    meta = json.loads((path / META_FILE).read_text())
    saved = dict(meta.get("config") or {})
    saved.setdefault("dtype", "float32")  # caches written before the dtype was recorded are float32
    if saved != json.loads(json.dumps(asdict(config))):
        return None
    t = load_file(str(path / FEATURES_FILE))
    return AcceptanceData(features=t["features"], labels=t["labels"], prompt=t["prompt"], meta=meta)
