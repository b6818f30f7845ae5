"""Train a feature head (models/eagle.py) for a target, on a CPU, within a time budget (`multispec train-head`).

Data: the target's features over training text, by batched prefill (no decoding): chunks of `seq_len` tokens,
the features f_t = the target's final-norm output, stored in float16. The target's next-token law at t is
softmax(lm_head(f_t)) exactly, so no logits are stored. The default text (never the HumanEval / Spec-Bench prompts
used for measurement) is, first, the target's own continuations of a built-in prompt set (`own`: training/onpolicy.py
and training/prompts.py; on-policy, as EAGLE-3 and speculators advise), generated in at most `own_share` of the
budget, then Python source of this interpreter (`python`: standard library and site-packages). `--data FILE` takes
a .txt (one document) or a .jsonl (field `ids`: token ids as they are; else `text`, else `prompt` +
`response`/`output`); --data repeats; `own:FILE.jsonl` is the target's own continuations of FILE's prompts. `--cache
DIR` keeps the own text and the features between runs (training/data_cache.py): a rerun goes on where the last
stopped, a `--resume` run trains for the whole budget.
Model: `new_head(target)`: fc + one decoder layer of the target's family; the target's parts frozen and shared.
Loss (models/eagle.head_loss, which online adaptation shares: models/eagle_adapt.py): distillation, the
cross-entropy of the head's law q against the target's p at every position (KL up to a constant). `unroll` > 1 adds
the steps of a simplified training-time test: step s reads the head's own features of step s-1 (shifted by one) as
every row's parent feature, weighted 0.8^(s-1).
Loop: AdamW with a warm-up and cosine learning rate over the time budget; every `eval_every` seconds the held-out
acceptance estimate E[sum_x min(p, q)] (what one drafted token is accepted with at T = 1) and the greedy agreement;
the best head so far is saved at once, so Ctrl-C or the budget's end keeps it.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from multispec.errors import MultispecError, check
from multispec.models.eagle import head_logits, head_loss


PYTHON = "python"  # --data's name for the built-in corpus
OWN = "own"  # --data's name for the target's own continuations of the built-in prompt set (training/onpolicy.py)


@dataclass(frozen=True)
class HeadTrainConfig:
    target: str
    out: str
    data: tuple[str, ...] = ()  # files, "own" and/or "python"; () = ("own", "python")
    minutes: float = 10.0
    vocab: int | None = None  # the head's reduced vocabulary: the N most frequent tokens of the training text
    seq_len: int = 256
    batch: int = 4
    lr: float = 1e-3
    unroll: int = 1
    # the data's preparation ends by a share of the budget counted from the start (the model's load included), so
    # that training has the rest: own text by own_share, features by own_share + collect_share
    own_share: float = 0.25  # at most this share of the budget generates the target's own text (--data own)
    collect_share: float = 0.2  # then this share collects features
    pick_share: float = 0.05  # the budget's last share times eagle's chain lengths with the head (head_default.py)
    max_tokens: int = 400_000
    device: str = "cpu"  # where the target and the head run ("cuda": train there, decode anywhere)
    heldout_chunks: int = 8
    eval_every: float = 60.0  # seconds
    seed: int = 0
    overwrite: bool = False
    resume: bool = False  # start from the head in `out` (its weights and reduced vocabulary) and keep improving it
    cache: str | None = None  # a folder keeping own text and features between runs (training/data_cache.py)

    def check(self) -> None:
        check(self.minutes > 0, f"--minutes must be > 0, got {self.minutes}")
        check(self.vocab is None or self.vocab >= 2, f"--vocab must be >= 2, got {self.vocab}")
        check(self.unroll >= 1, f"--unroll must be >= 1, got {self.unroll}")
        check(self.max_tokens >= 2 * self.seq_len, f"--max-tokens must be >= 2 x --seq-len ({2 * self.seq_len}), "
                                                   f"got {self.max_tokens}")
        from multispec.loading import resolve_device
        from multispec.paths import creatable_dir

        resolve_device(self.device)  # a device this machine has, before the model loads
        out = Path(self.out)
        check(not out.exists() or out.is_dir(), f"--out {out}: exists and is not a folder")
        check(self.overwrite or self.resume or not out.exists(),
              f"--out {out} exists; choose another folder, --resume its head or pass --overwrite")
        check(not self.resume or (out / "config.json").is_file(), f"--resume: no head in {out} to resume")
        creatable_dir(out)  # (a path under a regular file failed after the training, its head lost)
        for d in self.data:
            own_file = d[len(OWN) + 1:] if d.startswith(OWN + ":") else None
            check(d in (PYTHON, OWN) or Path(own_file or d).is_file(), f"--data {d}: file not found")
            check(own_file is None or own_file.endswith(".jsonl"), f"--data {d}: own:FILE takes a .jsonl prompt file")
        check(self.cache is None or not Path(self.cache).exists() or Path(self.cache).is_dir(),
              f"--cache {self.cache}: exists and is not a folder")


# ------------------------------------------------------------------------------------------------------- data
def read_texts(path: str | None, max_chars: int, seed: int) -> list[str | list[int]]:
    """The training documents: the file's, or this interpreter's Python source (a seeded sample of files). A
    .jsonl row is its `ids` (token ids as they are: the target's own continuations, benchmarks/eagle/), else its
    `text`, else `prompt` + `response` (or `output`)."""
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".jsonl"):
            docs: list[str | list[int]] = []
            for i, line in enumerate(text.splitlines()):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        raise MultispecError(f"--data {path}: line {i + 1} is not JSON") from None
                    check(isinstance(row, dict), f"--data {path}: line {i + 1} is not a JSON object")
                    ids = row.get("ids")
                    docs.append([int(t) for t in ids] if isinstance(ids, list) else row.get("text") or (
                        row.get("prompt", "") + row.get("response", row.get("output", ""))))
            return [d for d in docs if (d.strip() if isinstance(d, str) else d)]
        return [text] if text.strip() else []
    files = _python_files()
    random.Random(seed).shuffle(files)
    docs, total = [], 0
    for f in files:
        if total >= max_chars:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeError):
            continue
        if 200 <= len(text) <= 200_000:
            docs.append(text)
            total += len(text)
    return docs


def _python_files() -> list[Path]:
    """Every .py file of this interpreter's standard library and site-packages, in a sorted order (as the zoo's
    corpus lists them: zoo/corpus.py, a package beside this one)."""
    import os
    import site
    import sysconfig

    files = []
    for src in [sysconfig.get_paths()["stdlib"], *site.getsitepackages()]:
        for root, dirs, names in os.walk(src):
            dirs.sort()
            files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
    return files


def chunk_tokens(tokenizer, docs: list, seq_len: int, max_tokens: int, eos: int | None) -> torch.Tensor:
    """long [n_chunks, seq_len]: the documents' tokens (texts encoded, id lists as they are) joined by EOS (when the
    model has one), cut into chunks."""
    ids: list[int] = []
    for i in range(0, len(docs), 32):  # batched encoding, stopped once there is enough
        batch = docs[i:i + 32]
        texts = [d for d in batch if isinstance(d, str)]
        encoded = iter(tokenizer(texts)["input_ids"] if texts else [])
        for d in batch:
            row = next(encoded) if isinstance(d, str) else d
            ids += row + ([eos] if eos is not None and (not row or row[-1] != eos) else [])
        if len(ids) >= max_tokens:
            break
    n = min(len(ids), max_tokens) // seq_len
    check(n >= 2, f"the training text has {len(ids)} tokens: at least {2 * seq_len} are needed (two chunks)")
    return torch.tensor(ids[:n * seq_len], dtype=torch.long).view(n, seq_len)  # [n, L]


@torch.inference_mode()
def collect_features(target, chunks: torch.Tensor, batch: int, deadline: float,
                     done: torch.Tensor | None = None) -> torch.Tensor:
    """float16 [n, L, H]: the target's final-norm output over each chunk (batched prefill), as many chunks as fit
    before `deadline` (time.monotonic()); `done` (float16 [m, L, H], the first m chunks' features, a cache): from
    chunk m on."""
    from multispec.training.onpolicy import bf16_autocast

    out = [] if done is None else [done.to(target.device)]
    first = 0 if done is None else done.shape[0]
    if first >= chunks.shape[0]:
        return out[0]
    for b in range(first, chunks.shape[0], batch):
        if out and time.monotonic() > deadline:  # (one batch at least)
            break
        with bf16_autocast(target.device):
            ids = chunks[b:b + batch].to(target.device)
            out.append(target.model(input_ids=ids).last_hidden_state.to(torch.float16))
    return torch.cat(out)


def frequent_tokens(chunks: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """long [<= n]: the n most frequent token ids of the training chunks (sorted)."""
    counts = torch.bincount(chunks.flatten(), minlength=vocab)
    return torch.topk(counts, min(n, vocab)).indices.sort().values


# ------------------------------------------------------------------------------------------------------- model
@torch.no_grad()
def evaluate(head, parts, tokens, feats, ids, batch: int) -> dict:
    """Held-out: alpha = E[sum_x min(p, q)] (one drafted token's acceptance at T = 1, the head reading the target's
    features) and greedy agreement (argmax q = argmax p); p over the reduced vocabulary is not renormalised."""
    alpha, agree, count = 0.0, 0.0, 0
    for i in range(0, tokens.shape[0], batch):
        t, fe = tokens[i:i + batch], feats[i:i + batch].float()
        p_full = torch.softmax(head_logits(parts, fe, None), -1)
        _, _, logq = head_loss(head, parts, t, fe, ids, 1)
        q = logq.exp()
        if ids is not None:
            q = torch.zeros_like(p_full).index_copy_(-1, ids, q)
        alpha += float(torch.minimum(p_full, q).sum(-1).sum())
        agree += float((p_full.argmax(-1) == q.argmax(-1)).sum())
        count += t.numel()
    return {"alpha": alpha / count, "greedy_agree": agree / count}


def lr_at(step_frac: float, base: float, warmup: float = 0.03) -> float:
    """Warm-up then cosine to 10 % over the budget (step_frac: elapsed share of the training time)."""
    if step_frac < warmup:
        return base * step_frac / warmup
    return base * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step_frac - warmup) / (1 - warmup)))))


# ------------------------------------------------------------------------------------------------------- recipe
def train_head(cfg: HeadTrainConfig, log=None) -> dict:
    """Collect, train within cfg.minutes, keep the best held-out head in cfg.out; returns the summary."""
    from multispec import load_pair
    from multispec.loading import eos_ids
    from multispec.models.eagle import TargetParts, new_head
    from multispec.models.eagle_io import load_head, record_default, save_head
    from multispec.training.head_default import pick_default
    from multispec.training.data_cache import DataCache

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    cfg.check()
    torch.manual_seed(cfg.seed)
    start = time.monotonic()
    end = start + cfg.minutes * 60
    pair = load_pair(target=cfg.target, device=cfg.device, dtype=torch.float32)  # (a GPU's default is bfloat16)
    target = pair.target.eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    parts = TargetParts.of(target)
    cache = None if cfg.cache is None else DataCache(cfg.cache, target, cfg.seq_len, cfg.seed)
    docs = _documents(cfg, pair, target, start, log, cache)
    eos = min(eos_ids(pair)) if eos_ids(pair) else None
    chunks = chunk_tokens(pair.tokenizer, docs, cfg.seq_len, cfg.max_tokens, eos)
    chunks = chunks[torch.randperm(chunks.shape[0], generator=torch.Generator().manual_seed(cfg.seed))]
    feats = _features(cfg, target, chunks, cache, start + (cfg.own_share + cfg.collect_share) * cfg.minutes * 60)
    chunks = chunks[:feats.shape[0]].to(feats.device)
    check(feats.shape[0] >= 2, "collecting features took the whole budget before two chunks: give more --minutes")
    n_held = max(1, min(cfg.heldout_chunks, feats.shape[0] // 10))
    held, train = (chunks[:n_held], feats[:n_held]), (chunks[n_held:], feats[n_held:])
    ids = frequent_tokens(chunks, cfg.vocab, parts.lm_head.weight.shape[0]) if cfg.vocab else None
    took = time.monotonic() - start
    log(f"features: {train[0].numel()} training tokens, {held[0].numel()} held out, {took:.0f} s "
        f"({took / (cfg.minutes * 60):.0%} of the budget; training has the rest)")
    if cfg.resume:  # its weights and its vocabulary (a resumed head keeps the rows it was trained on)
        head, ids = load_head(cfg.out, target)
        head, ids = head.float().train(), None if ids is None else ids.to(feats.device)
    else:
        head = new_head(target).float().train()
    pick = cfg.pick_share * cfg.minutes * 60
    summary = _loop(cfg, head, parts, train, held, ids, end - pick, log,
                    lambda best: save_head(head, target, cfg.out, cfg.target, ids, training=best))
    try:  # (the head is saved already: a failure here loses only the recorded default)
        summary["default"] = pick_default(pair, cfg.out, held[0], max(0.0, end - time.monotonic()), log)
        record_default(cfg.out, summary["default"])
    except MultispecError as e:
        log(f"the head's default draft length was not timed ({e}); eagle drafts its fallback chain with it")
    summary.update(train_tokens=int(train[0].numel()), heldout_tokens=int(held[0].numel()),
                   minutes=(time.monotonic() - start) / 60)
    (Path(cfg.out) / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _documents(cfg, pair, target, start: float, log, cache=None) -> list:
    """The training documents of every --data source, in order (default: own text, then Python source). With a
    cache, own text already generated is read from it and new text is appended to it (none with --resume)."""
    from multispec.training.onpolicy import file_prompts, own_texts, prompt_width

    docs: list = []
    for d in cfg.data or (OWN, PYTHON):
        if d == OWN or d.startswith(OWN + ":"):
            name = "builtin" if d == OWN else Path(d[len(OWN) + 1:]).stem
            prompts = None if d == OWN else file_prompts(pair, d[len(OWN) + 1:], prompt_width(target))
            done = cache.own_rows(name) if cache is not None else []
            deadline = start if cfg.resume and done else start + cfg.own_share * cfg.minutes * 60
            if done:
                log(f"own data {name}: {len(done)} continuations from the cache")
            more = own_texts(pair, target, deadline, cfg.seed, log=log, prompts=prompts, done=done,
                             sink=None if cache is None else cache.own_sink(name))
        else:
            more = read_texts(None if d == PYTHON else d, max_chars=cfg.max_tokens * 4, seed=cfg.seed)
        check(bool(more), f"the training data {d} is empty")
        docs += more
    return docs


def _features(cfg, target, chunks: torch.Tensor, cache, deadline: float) -> torch.Tensor:
    """float16 [m, L, H]: the features of the first m chunks (collect_features), those a cache holds for these
    same chunks read from it, the cache rewritten when more were collected."""
    done = None if cache is None else cache.features(chunks)
    if done is not None and cfg.resume:  # a resumed run trains on the features there are
        deadline = 0.0
    feats = collect_features(target, chunks, cfg.batch, deadline, done=done)
    if cache is not None and (done is None or feats.shape[0] > done.shape[0]):
        cache.save_features(chunks, feats)
    return feats


def _loop(cfg, head, parts, train, held, ids, end, log, save) -> dict:
    """The training loop until `end`; saves on every held-out improvement; Ctrl-C ends it keeping the best."""
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    t0, step, seen = time.monotonic(), 0, 0
    # a resumed head is evaluated before its first step: the saved head is replaced only by a better one (the
    # warm-up's first steps at the full rate set it back: held-out alpha 0.430 -> 0.364 on SmolLM2, then saved)
    next_eval = t0 if cfg.resume else t0 + cfg.eval_every
    curve, best = [], {"alpha": -1.0}
    gen = torch.Generator().manual_seed(cfg.seed)
    try:
        while True:
            now = time.monotonic()
            if now >= next_eval or now >= end:
                head.eval()
                ev = evaluate(head, parts, held[0], held[1], ids, cfg.batch)
                head.train()
                curve.append({"minutes": (now - t0) / 60, "tokens": seen, **ev})
                if ev["alpha"] > best["alpha"]:
                    best = {**ev, "step": step, "config": {k: v for k, v in asdict(cfg).items()}}
                    save({**best, "curve": curve})
                eta = max(0.0, end - now)
                log(f"step {step}  {seen / max(1e-9, now - t0):.0f} tok/s  held-out alpha {ev['alpha']:.3f}  "
                    f"greedy agree {ev['greedy_agree']:.3f}  best {best['alpha']:.3f}  ETA {eta / 60:.1f} min")
                next_eval = now + cfg.eval_every
                if now >= end:
                    break
            idx = torch.randint(train[0].shape[0], (cfg.batch,), generator=gen).to(train[0].device)
            for g in opt.param_groups:
                g["lr"] = lr_at((now - t0) / max(1e-9, end - t0), cfg.lr)
            loss, _, _ = head_loss(head, parts, train[0][idx], train[1][idx].float(), ids, cfg.unroll)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step, seen = step + 1, seen + int(train[0][idx].numel())
    except KeyboardInterrupt:
        log("interrupted: the best head so far is kept")
    if best["alpha"] < 0:
        raise MultispecError("training ended before the first held-out evaluation: no head was saved")
    return {**best, "curve": curve, "steps": step}
