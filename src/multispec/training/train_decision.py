"""Train a P1 decision model (design §6.3): data -> model -> Adam loop (progress bar, validation) -> save the best
epoch. Recipe as in P1's code: Adam lr 1e-3, batch 50, 10 epochs, keep the epoch with the lowest validation loss.
Type 1: BCE on soft labels. Type 2: BCE on hard labels, classes balanced by down-sampling the majority class
(in the training and the validation split, seeded).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from multispec.errors import check
from multispec.training.common import progress
from multispec.heads.decision import TYPE2_FEATURES, DecisionModel, save_decision_model, type1_sizes
from multispec.training.decision_data import DataConfig, build_data


@dataclass(frozen=True)
class TrainConfig:
    kind: int
    out: str
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.kind in (1, 2), f"--type must be 1 or 2, got {self.kind!r}")
        check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        check(self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")


def _balance(y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Indices (sorted) keeping every minority-class example and as many random majority-class ones."""
    pos, neg = (y > 0.5).nonzero()[:, 0], (y <= 0.5).nonzero()[:, 0]
    small, big = (pos, neg) if len(pos) <= len(neg) else (neg, pos)
    big = big[torch.randperm(len(big), generator=gen)[:len(small)]]
    return torch.cat([small, big]).sort().values


def split(data: dict, kind: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_val, y_val) for a model type, split by prompt (`data['val_prompts']`)."""
    x = data["hidden"] if kind == 1 else data["feats2"]
    y = data["soft"] if kind == 1 else data["hard"]
    is_val = torch.isin(data["prompt"], torch.tensor(data["val_prompts"]))
    xt, yt, xv, yv = x[~is_val], y[~is_val], x[is_val], y[is_val]
    if kind == 2:
        gen = torch.Generator().manual_seed(seed + 7)
        it, iv = _balance(yt, gen), _balance(yv, gen)
        xt, yt, xv, yv = xt[it], yt[it], xv[iv], yv[iv]
    return xt.float(), yt.float(), xv.float(), yv.float()


@torch.no_grad()
def evaluate(model: DecisionModel, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Validation metrics: BCE, MAE, accuracy at 0.5 (of labels rounded), Pearson r, and the BCE of the best
    constant predictor (the mean label), which a useful model must beat."""
    logits = model(x)
    pred = torch.sigmoid(logits)
    bce = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, y))
    m = y.mean().clamp(1e-6, 1 - 1e-6)
    const = float(-(y * m.log() + (1 - y) * (1 - m).log()).mean())
    r = float(torch.corrcoef(torch.stack([pred, y]))[0, 1]) if len(y) > 1 and float(pred.std()) > 0 else 0.0
    return {"bce": bce, "bce_constant": const, "mae": float((pred - y).abs().mean()),
            "accuracy": float(((pred > 0.5) == (y > 0.5)).float().mean()), "pearson_r": r,
            "mean_pred": float(pred.mean()), "mean_label": float(y.mean()), "n": len(y)}


def train_decision(data_config: DataConfig, train_config: TrainConfig, data_dir: str | None = None,
                   cache: str | None = None, gen_batch: int = 16, log: Callable[[str], None] = print,
                   data: dict | None = None) -> dict:
    """Build the data (or use `data`), train, save the best epoch to train_config.out. Returns the saved config."""
    t0 = time.perf_counter()
    data = data if data is not None else build_data(data_config, data_dir, cache, gen_batch, log)
    t_data = time.perf_counter() - t0
    kind = train_config.kind
    xt, yt, xv, yv = split(data, kind, train_config.seed)
    check(len(yt) >= 1 and len(yv) >= 1, "decision data: empty training or validation split")
    torch.manual_seed(train_config.seed)
    in_features = xt.shape[1]
    sizes = type1_sizes(in_features) if kind == 1 else (4 * TYPE2_FEATURES,)
    model = DecisionModel(kind, in_features, sizes)
    opt = torch.optim.Adam(model.parameters(), lr=train_config.lr)
    gen = torch.Generator().manual_seed(train_config.seed)
    history, best, best_state = [], None, None
    bar = progress(range(train_config.epochs), desc=f"decision type {kind}", unit="epoch")
    for epoch in bar:
        model.train()
        order = torch.randperm(len(yt), generator=gen)
        total = 0.0
        for b in range(0, len(order), train_config.batch_size):
            idx = order[b:b + train_config.batch_size]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        model.eval()
        val = evaluate(model, xv, yv)
        history.append({"epoch": epoch + 1, "train_bce": total / len(yt), "val_bce": val["bce"]})
        log(f"type {kind} epoch {epoch + 1}: train BCE {total / len(yt):.4f}, val BCE {val['bce']:.4f}, "
            f"val acc {val['accuracy']:.3f}")
        if best is None or val["bce"] < best["bce"]:
            best = {**val, "epoch": epoch + 1}
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    extra = {
        "label": "soft: E_x~q min(1, p(x)/q(x)) = sum min(p, q)" if kind == 1 else "hard: x ~ q equals argmax p",
        "features": "draft last hidden state at the producing position" if kind == 1
        else "entropy of q + top-10 probabilities of q",
        "data": {**data["config"], "positions": int(len(data["soft"])), "train_examples": int(len(yt)),
                 "val_examples": int(len(yv)), "val_prompts": len(data["val_prompts"])},
        "training": asdict(train_config),
        "validation": best,
        "history": history,
        "seconds": {"data": round(t_data, 1), "total": round(time.perf_counter() - t0, 1)},
    }
    save_decision_model(model, train_config.out, extra)
    log(f"saved {train_config.out}: best epoch {best['epoch']}, val BCE {best['bce']:.4f} "
        f"(constant {best['bce_constant']:.4f}), acc {best['accuracy']:.3f}, r {best['pearson_r']:.3f}")
    return {"type": kind, **extra}
