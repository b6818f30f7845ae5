"""Training data for the P1 decision models (design §6.3), adapted to small CPU pairs.

P1 runs its target-initialized fork strategy (W = 10, depth 1, T = 1) and records, for every drafted token, the
draft's features and the verification outcome. We use the equivalent teacher-forced form, which needs one
batched target sampling pass and one forward of each model per prompt:

1. the target samples a response to each prompt at temperature T (default 1), as in P1's data runs;
2. along prompt + response, at every response position t, the draft's distribution q_t and hidden state h_t
   (at the position that *produces* token t, P1's alignment) and the target's distribution p_t are computed by
   teacher forcing;
3. labels: type 1 (soft) = the acceptance probability of the draft's token, min(1, p_t(x)/q_t(x)) with x ~ q_t,
   recorded as its exact expectation over x, sum_x min(p_t(x), q_t(x)) (BCE is linear in the label, so the
   minimiser is unchanged and the label noise of one sampled x is removed); type 2 (hard) = 1 iff a token
   x ~ q_t equals argmax p_t (greedy verification), with x actually sampled (seeded).

The context of position t is the target's own text, i.e. what an accepted chain looks like; P1's data shares
this property (depth-1 trees behind target-drawn level-1 tokens). Prompts: HumanEval 100-163 and alpaca_eval
100-299 by default, disjoint from the evaluation prompts (HumanEval 0-39, alpaca_eval 0-39).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from multispec.errors import MultispecError, check
from multispec.training.common import encode_prompt, progress, sample_responses
from multispec.heads.decision import type2_features
from multispec.sampling import SamplingConfig, process_logits

# built-in prompt sources: name -> (data set, first record, number of records)
SOURCES = {"humaneval-train": ("humaneval", 100, 64), "alpaca-train": ("alpaca", 100, 200)}


@dataclass(frozen=True)
class DataConfig:
    """What to generate. sources: names in SOURCES or paths to .jsonl files (field `prompt`)."""

    target: str
    draft: str
    sources: tuple[str, ...] = ("humaneval-train", "alpaca-train")
    n_prompts: int = 264
    max_new_tokens: int = 128
    max_prompt_tokens: int = 384
    temperature: float = 1.0
    val_frac: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        check(len(self.sources) >= 1, "give at least one prompt source (--dataset or --prompts)")
        check(self.n_prompts >= 2, f"n_prompts must be >= 2, got {self.n_prompts}")
        check(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check(self.temperature > 0, "decision-model data needs temperature > 0 (the draft's token is sampled)")
        check(0 < self.val_frac < 1, f"val_frac must be in (0, 1), got {self.val_frac}")

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def prompt_texts(config: DataConfig, data_dir: str | None) -> list[str]:
    """The prompt texts: n_prompts split evenly over the sources (a source with fewer records gives all it has,
    the rest go to the others), in source order."""
    from multispec.data import load_prompts

    pools = []
    for src in config.sources:
        if src in SOURCES:
            name, offset, count = SOURCES[src]
            pools.append([p.text for p in load_prompts(name, data_dir, limit=count, offset=offset)])
        else:
            pools.append([p.text for p in load_prompts(src, data_dir)])
    quota, left = [0] * len(pools), config.n_prompts
    while left > 0 and any(quota[i] < len(pool) for i, pool in enumerate(pools)):
        for i, pool in enumerate(pools):
            if left > 0 and quota[i] < len(pool):
                quota[i] += 1
                left -= 1
    return [t for pool, n in zip(pools, quota) for t in pool[:n]]


@torch.inference_mode()
def position_data(target: torch.nn.Module, draft: torch.nn.Module, ids: list[int], start: int,
                  sampling: SamplingConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Features and labels at response positions start..len(ids)-1 of one sequence (see module doc).

    Returns hidden float32 [L, H], feats2 float32 [L, 11], soft float32 [L], hard float32 [L]."""
    x = torch.tensor([ids])
    h = draft.base_model(input_ids=x).last_hidden_state[0, start - 1:-1].float()  # [L, H]
    q = process_logits(draft.get_output_embeddings()(h), sampling)  # [L, V]
    p = process_logits(target(input_ids=x).logits[0, start - 1:-1], sampling)  # [L, V]
    soft = torch.minimum(p, q).sum(-1).clamp(0, 1)  # E_{x~q} min(1, p(x)/q(x))
    drawn = torch.multinomial(q, 1, generator=generator)[:, 0]  # [L]
    hard = (drawn == p.argmax(-1)).float()
    return {"hidden": h, "feats2": type2_features(q), "soft": soft, "hard": hard}


def build_data(config: DataConfig, data_dir: str | None = None, cache: str | None = None, gen_batch: int = 16,
               log: Callable[[str], None] = print) -> dict:
    """Generate (or load from `cache`) the decision-model data set. Returns a dict with tensors hidden [M, H],
    feats2 [M, 11], soft [M], hard [M], prompt [M] (prompt index), the list `val_prompts`, and `config`."""
    cache_file = Path(cache) / f"decision-data-{config.key()}.pt" if cache else None
    if cache_file is not None and cache_file.is_file():
        try:
            data = torch.load(cache_file, weights_only=False)
            if isinstance(data, dict) and {"hidden", "feats2", "soft", "hard", "prompt"} <= set(data):
                log(f"decision data: reusing {cache_file}")
                return data
            log(f"warning: ignoring the decision-data cache {cache_file}: not a data set this version wrote; "
                "rebuilding it")
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file: rebuild, never crash
            log(f"warning: ignoring the decision-data cache {cache_file}: cannot be read ({type(e).__name__}); "
                "rebuilding it")
    from multispec.api import load_pair

    texts = prompt_texts(config, data_dir)
    check(len(texts) >= 2, "decision data: fewer than 2 prompts found")
    pair = load_pair(target=config.target, draft=config.draft, device="cpu", dtype="float32")
    tok = pair.tokenizer
    prompts = [encode_prompt(tok, t, config.max_prompt_tokens) for t in texts]
    sampling = SamplingConfig(temperature=config.temperature)
    gen = torch.Generator().manual_seed(config.seed)
    log(f"decision data: {len(prompts)} prompts, target responses of <= {config.max_new_tokens} tokens at "
        f"T={config.temperature}")
    responses = sample_responses(pair.target, prompts, config.max_new_tokens, sampling, gen, tok.eos_token_id,
                                 batch_size=gen_batch, pad_id=tok.pad_token_id or 0, desc="target responses")
    parts: dict[str, list[torch.Tensor]] = {"hidden": [], "feats2": [], "soft": [], "hard": [], "prompt": []}
    for i in progress(range(len(prompts)), desc="labels", unit="prompt"):
        if not responses[i]:
            continue
        d = position_data(pair.target, pair.draft, prompts[i] + responses[i], len(prompts[i]), sampling, gen)
        for k, v in d.items():
            parts[k].append(v)
        parts["prompt"].append(torch.full((len(d["soft"]),), i, dtype=torch.long))
    if not parts["soft"]:
        raise MultispecError("decision data: the target produced no response tokens")
    data = {k: torch.cat(v) for k, v in parts.items()}
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.seed + 1))
    n_val = max(1, round(config.val_frac * len(prompts)))
    data["val_prompts"] = sorted(order[:n_val].tolist())
    data["config"] = asdict(config)
    data["hidden_size"] = int(data["hidden"].shape[1])
    log(f"decision data: {len(data['soft'])} positions; mean soft label {float(data['soft'].mean()):.3f}, "
        f"hard-label positive rate {float(data['hard'].mean()):.3f}")
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, cache_file)
        log(f"decision data: cached in {cache_file}")
    return data
