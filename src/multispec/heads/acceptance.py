"""The SpecDec++ acceptance-prediction head (design §7.3) and its loss (§7.5).

The head reads the draft's final hidden state at a draft token Y_i (after the final norm: the hidden of the draft
forward that consumes Y_i) and predicts P(Y_i accepted | Y_<i accepted, prefix):
    h <- h + SiLU(W_d h + b_d)   for d = 1..D      (D = 3; independent weights unless share_blocks)
    logits = Linear(H, 2)(h);  P̂ = softmax(logits)[1]
The released code builds its blocks as `[ResBlock(h)] * D`, i.e. one shared block applied D times;
`share_blocks=True` reproduces that (design §10.10). Blocks start as the identity (zero W, b), as in Medusa and the
released code.

A saved head is a directory: `config.json` (format, hidden size, depth, share flag, training settings and metrics)
and `head.safetensors`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from multispec.errors import MultispecError

FORMAT = "multispec-acceptance-head"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"


class ResBlock(nn.Module):
    """h + SiLU(W h + b); W, b start at zero so the block starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + nn.functional.silu(self.linear(h))


class AcceptanceHead(nn.Module):
    """D residual blocks + Linear(H, 2). forward: float [n, H] -> logits float [n, 2] (class 1 = accepted)."""

    def __init__(self, hidden_size: int, depth: int = 3, share_blocks: bool = False):
        super().__init__()
        if not (isinstance(hidden_size, int) and hidden_size >= 1):
            raise MultispecError(f"acceptance head: hidden_size must be an integer >= 1, got {hidden_size!r}")
        if not (isinstance(depth, int) and depth >= 0):
            raise MultispecError(f"acceptance head: depth must be an integer >= 0, got {depth!r}")
        self.hidden_size, self.depth, self.share_blocks = hidden_size, depth, bool(share_blocks)
        n_blocks = min(depth, 1) if share_blocks else depth
        self.blocks = nn.ModuleList([ResBlock(hidden_size) for _ in range(n_blocks)])
        self.out = nn.Linear(hidden_size, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for d in range(self.depth):
            h = self.blocks[0 if self.share_blocks else d](h)
        return self.out(h)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: float [n, H] draft hidden states (any float dtype, any device). Returns float32 [n] on the
        head's device: the predicted acceptance probability of each token."""
        if hidden.shape[-1] != self.hidden_size:
            raise MultispecError(f"acceptance head expects draft hidden size {self.hidden_size}, got "
                                 f"{hidden.shape[-1]}: it was trained for another draft model")
        w = self.out.weight
        logits = self(hidden.to(device=w.device, dtype=w.dtype).reshape(-1, self.hidden_size))  # [n, 2]
        return torch.softmax(logits.float(), dim=-1)[:, 1]

    def describe(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "hidden_size": self.hidden_size, "depth": self.depth,
                "share_blocks": self.share_blocks}


def weighted_bce(logits: torch.Tensor, y: torch.Tensor, w_rej: float) -> torch.Tensor:
    """design §7.5: -sum[w_rej (1-y) log(1-P̂) + y log P̂] / sum[w_rej (1-y) + y]. logits: float [n, 2];
    y: float [n] soft labels in [0, 1]. Returns a scalar."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, 2]
    w0, w1 = w_rej * (1 - y), y
    return -(w0 * logp[:, 0] + w1 * logp[:, 1]).sum() / (w0 + w1).sum().clamp(min=1e-12)


def save_head(head: AcceptanceHead, path: str | Path, extra: dict | None = None) -> Path:
    """Write `path/config.json` (architecture + `extra`: training settings, metrics) and `path/head.safetensors`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": FORMAT})
    (path / CONFIG_FILE).write_text(json.dumps({**head.describe(), **(extra or {})}, indent=2) + "\n")
    return path


def load_head(path: str | Path, device: str | torch.device = "cpu") -> AcceptanceHead:
    """Load a head saved by `save_head`. Raises MultispecError naming the problem when the directory, its
    config or its weights are missing or invalid."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise MultispecError(f"acceptance head not found: {path} is not a directory "
                             f"(expected {CONFIG_FILE} and {WEIGHTS_FILE}; train one with "
                             "`multispec heads train-acceptance`)")
    cfg_file, w_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    for f in (cfg_file, w_file):
        if not f.is_file():
            raise MultispecError(f"acceptance head {path}: missing {f.name}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MultispecError(f"acceptance head {path}: {CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise MultispecError(f"acceptance head {path}: {CONFIG_FILE} is not an acceptance-head config "
                             f"(format must be {FORMAT!r})")
    if cfg.get("version") != VERSION:
        raise MultispecError(f"acceptance head {path}: unsupported version {cfg.get('version')!r} (expected {VERSION})")
    missing = [k for k in ("hidden_size", "depth", "share_blocks") if k not in cfg]
    if missing:
        raise MultispecError(f"acceptance head {path}: {CONFIG_FILE} lacks {', '.join(missing)}")
    try:
        check_sizes = [cfg["hidden_size"], cfg["depth"]]
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1 << 20 for x in check_sizes):
            raise ValueError(f"hidden_size and depth must be positive integers, got {check_sizes}")
        head = AcceptanceHead(cfg["hidden_size"], cfg["depth"], cfg["share_blocks"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise MultispecError(f"acceptance head {path}: {CONFIG_FILE} holds implausible sizes ({e})") from None
    try:
        state = load_file(str(w_file))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise MultispecError(f"acceptance head {path}: cannot read {WEIGHTS_FILE} ({e})") from None
    expected = head.state_dict()
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in expected):
        raise MultispecError(f"acceptance head {path}: {WEIGHTS_FILE} does not match {CONFIG_FILE} "
                             f"(hidden_size {cfg['hidden_size']}, depth {cfg['depth']}, "
                             f"share_blocks {cfg['share_blocks']})")
    head.load_state_dict(state)
    head.config = cfg
    return head.to(device).eval()
