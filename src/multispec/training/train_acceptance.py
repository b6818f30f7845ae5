"""Train the SpecDec++ acceptance head (design §7.4-7.5): data -> head -> AdamW loop -> test metrics -> save.

Prompts are split by prompt into train / validation / test. The head trains on cached draft features with the
weighted soft-label BCE (w_rej on the rejection class); the epoch with the lowest validation loss is kept; test
metrics are the same loss, the unweighted BCE and the mean binary KL(y || P̂). Output directory:
config.json (architecture, settings, data counts, metrics), head.safetensors, reliability.png.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from multispec.errors import check
from multispec.heads.acceptance import AcceptanceHead, save_head, weighted_bce
from multispec.training.acceptance_data import AcceptanceData, DataConfig
from multispec.training.common import binary_kl, progress, reliability_diagram


@dataclass(frozen=True)
class TrainConfig:
    out: str
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_size: int = 256
    warmup_ratio: float = 0.03
    w_rej: float = 6.0
    depth: int = 3
    share_blocks: bool = False
    val_frac: float = 0.1
    test_frac: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}")
        check(self.lr > 0 and math.isfinite(self.lr), f"--lr must be > 0, got {self.lr}")
        check(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        check(self.w_rej > 0, f"--w-rej must be > 0, got {self.w_rej}")
        check(self.depth >= 0, f"--depth must be >= 0, got {self.depth}")
        check(0 < self.val_frac and 0 < self.test_frac and self.val_frac + self.test_frac < 1,
              f"validation and test fractions must be > 0 with sum < 1, got {self.val_frac}, {self.test_frac}")
        check(0 <= self.warmup_ratio < 1, f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


def lr_at(step: int, total: int, base: float, warmup_ratio: float) -> float:
    """Linear warm-up over warmup_ratio * total steps, then cosine decay to 0 (the HF trainer's schedule)."""
    warm = max(1, int(warmup_ratio * total))
    if step < warm:
        return base * (step + 1) / warm
    return base * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def split_by_prompt(data: AcceptanceData, val_frac: float, test_frac: float, seed: int) -> dict[str, torch.Tensor]:
    """Row indices (long [n]) of train / val / test; each prompt's rows go to one split."""
    prompts = data.prompt.unique()
    order = prompts[torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))]
    n_val, n_test = max(1, round(val_frac * len(order))), max(1, round(test_frac * len(order)))
    check(len(order) - n_val - n_test >= 1, f"too few prompts ({len(order)}) for a train/validation/test split")
    groups = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
    return {k: torch.isin(data.prompt, v).nonzero()[:, 0] for k, v in groups.items()}


@torch.no_grad()
def evaluate(head: AcceptanceHead, x: torch.Tensor, y: torch.Tensor, w_rej: float) -> dict:
    """Weighted BCE (the training loss), unweighted BCE and mean binary KL on (x float [n, H], y float [n])."""
    logits = head(x)
    pred = torch.softmax(logits, -1)[:, 1]
    return {"loss": float(weighted_bce(logits, y, w_rej)), "bce": float(weighted_bce(logits, y, 1.0)),
            "kl": binary_kl(y, pred), "mean_pred": float(pred.mean()), "mean_label": float(y.mean()),
            "positions": int(y.numel())}


def train_head(data: AcceptanceData, config: TrainConfig, log=print) -> tuple[AcceptanceHead, dict]:
    """Train on `data`; returns the best-validation head and a metrics dict (curves, train/val/test metrics)."""
    torch.manual_seed(config.seed)
    split = split_by_prompt(data, config.val_frac, config.test_frac, config.seed)
    x, y = data.features.float(), data.labels.float()
    xs = {k: x[v] for k, v in split.items()}
    ys = {k: y[v] for k, v in split.items()}
    head = AcceptanceHead(x.shape[1], config.depth, config.share_blocks)
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    n = len(ys["train"])
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = steps_per_epoch * config.epochs
    gen = torch.Generator().manual_seed(config.seed)
    best, best_state, curve, step = math.inf, None, [], 0
    t0 = time.perf_counter()
    bar = progress(total=total, desc="train head", unit="step")
    for epoch in range(config.epochs):
        head.train()
        perm = torch.randperm(n, generator=gen)
        running = 0.0
        for b in range(steps_per_epoch):
            idx = perm[b * config.batch_size:(b + 1) * config.batch_size]
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, config.lr, config.warmup_ratio)
            loss = weighted_bce(head(xs["train"][idx]), ys["train"][idx], config.w_rej)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += loss.item() * len(idx)
            step += 1
            bar.update(1)
        head.eval()
        val = evaluate(head, xs["val"], ys["val"], config.w_rej)
        curve.append({"epoch": epoch + 1, "train_loss": running / n, "val_loss": val["loss"], "val_kl": val["kl"]})
        bar.set_postfix(train=f"{running / n:.4f}", val=f"{val['loss']:.4f}")
        if val["loss"] < best:
            best, best_state = val["loss"], copy.deepcopy(head.state_dict())
    bar.close()
    head.load_state_dict(best_state)
    head.eval()
    best_epoch = min(curve, key=lambda r: r["val_loss"])["epoch"]
    metrics = {k: evaluate(head, xs[k], ys[k], config.w_rej) for k in ("train", "val", "test")}
    metrics.update(best_epoch=best_epoch, curve=curve, train_seconds=time.perf_counter() - t0,
                   split_prompts={k: int(data.prompt[v].unique().numel()) for k, v in split.items()})
    log(f"best epoch {best_epoch}/{config.epochs}: " + ", ".join(
        f"{k} loss {metrics[k]['loss']:.4f} (bce {metrics[k]['bce']:.4f}, kl {metrics[k]['kl']:.4f})"
        for k in ("train", "val", "test")))
    return head, metrics


def save_trained(head: AcceptanceHead, data: AcceptanceData, config: TrainConfig, metrics: dict) -> Path:
    """Write the head directory: config.json (+ settings, data counts, metrics), head.safetensors,
    reliability.png (test split)."""
    out = Path(config.out)
    split = split_by_prompt(data, config.val_frac, config.test_frac, config.seed)
    test = split["test"]
    out.mkdir(parents=True, exist_ok=True)
    pred = head.predict(data.features[test])
    m = metrics["test"]
    bins = reliability_diagram(pred, data.labels[test], out / "reliability.png",
                               title=f"acceptance head, test split ({m['positions']} positions)\n"
                                     f"weighted BCE {m['loss']:.4f} (w_rej={config.w_rej:g}), KL {m['kl']:.4f}")
    extra = {"training": {**asdict(config), "data": data.meta}, "metrics": {**metrics, "reliability_test": bins}}
    extra["training"].pop("out")
    return save_head(head, out, extra)


def train_acceptance(data_config: DataConfig, config: TrainConfig, data_dir: str | None = None,
                     cache: str | None = None, gen_batch: int = 16, log=print) -> dict:
    """The whole recipe: load the pair, build (or reuse the cached) data, train, save. Returns the metrics."""
    from multispec.api import load_pair
    from multispec.training.acceptance_data import build_data, load_cached, load_prompts, save_data

    data = load_cached(cache, data_config) if cache else None
    if data is None:
        pair = load_pair(target=data_config.target, draft=data_config.draft, device="cpu",
                         dtype=data_config.dtype)
        prompts = load_prompts(data_config.sources, data_config.n_prompts, data_dir, data_config.seed)
        log(f"{len(prompts)} prompts; sampling target responses of up to {data_config.max_new_tokens} tokens")
        eos = pair.target.generation_config.eos_token_id if pair.target.generation_config else None
        eos = pair.tokenizer.eos_token_id if eos is None else eos
        t0 = time.perf_counter()
        data = build_data(data_config, pair.target, pair.draft, pair.tokenizer, prompts,
                          eos if isinstance(eos, int) else None, gen_batch)
        data.meta["seconds"] = time.perf_counter() - t0
        if cache:
            save_data(data, cache)
    else:
        log(f"reusing cached features in {cache}")
    m = data.meta
    log(f"data: {m['prompts']} prompts, {m['positions']} response positions, {m['labelled_positions']} labelled "
        f"(mean label {m['mean_label']:.3f})")
    head, metrics = train_head(data, config, log)
    out = save_trained(head, data, config, metrics)
    log(f"saved {out}")
    return metrics
