"""P1 decision models for early stopping of fork-tree drafting (design §6.3).

After each drafted level, the `dynamic` method asks the decision model, for every chain, how likely the chain's
newest draft token is to be accepted; when every chain is below beta, drafting stops (`AnyChainAbove`).

| type | features (per chain)                                  | network                     | training label       |
|------|-------------------------------------------------------|-----------------------------|----------------------|
| 1    | draft's last hidden state at the node that produced   | H -> h1 -> h2 -> 1, ReLU,   | soft: acceptance     |
|      | the newest token (after the final norm), float [H]    | sigmoid (P1: 768->512->256) | prob. min(1, p/q)    |
| 2    | entropy of the draft distribution q there + its top-10 | 11 -> 44 -> 1, ReLU, sigmoid | hard: x == argmax p |

Both read draft-side state only (design §10.9). A saved model is a directory: `config.json` (format, type, sizes,
training settings, validation metrics) and `model.safetensors`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from multispec.errors import MultispecError

FORMAT = "multispec-decision-model"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOP = 10  # type 2: top-10 draft probabilities
TYPE2_FEATURES = TOP + 1


def type1_sizes(hidden_size: int) -> tuple[int, int]:
    """Hidden widths of a type-1 MLP: P1's 512, 256 for H >= 512, else 2H, H (scaled down for small drafts)."""
    return (512, 256) if hidden_size >= 512 else (2 * hidden_size, hidden_size)


def type2_features(q: torch.Tensor) -> torch.Tensor:
    """q: float [n, V] draft distributions (rows sum to 1). Returns float32 [n, 11]: entropy (nats) and the 10
    largest probabilities in decreasing order (zero-padded when V < 10)."""
    q = q.float()
    entropy = -torch.special.xlogy(q, q).sum(-1, keepdim=True)  # [n, 1]
    top = q.topk(min(TOP, q.shape[-1]), dim=-1).values  # [n, <=10]
    if top.shape[-1] < TOP:
        top = torch.nn.functional.pad(top, (0, TOP - top.shape[-1]))
    return torch.cat([entropy, top], dim=-1)


class DecisionModel(nn.Module):
    """An MLP with ReLU hidden layers and one output logit. forward: features float [n, F] -> logits float [n].

    kind: 1 (features = draft hidden state, F = H) or 2 (features = `type2_features(q)`, F = 11).
    sizes: hidden layer widths.
    """

    def __init__(self, kind: int, in_features: int, sizes: tuple[int, ...]):
        super().__init__()
        if kind not in (1, 2):
            raise MultispecError(f"decision model: type must be 1 or 2, got {kind!r}")
        if not (isinstance(in_features, int) and in_features >= 1):
            raise MultispecError(f"decision model: in_features must be an integer >= 1, got {in_features!r}")
        if kind == 2 and in_features != TYPE2_FEATURES:
            raise MultispecError(f"decision model: type 2 reads {TYPE2_FEATURES} features, got {in_features}")
        self.kind, self.in_features, self.sizes = kind, in_features, tuple(int(s) for s in sizes)
        layers: list[nn.Module] = []
        width = in_features
        for s in self.sizes:
            layers += [nn.Linear(width, s), nn.ReLU()]
            width = s
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def features(self, hidden: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
        """The model's input from what the engine hands a stop policy: hidden float [n, H], q float [n, V]."""
        if self.kind == 2:
            return type2_features(q)
        if hidden is None:
            raise MultispecError("type-1 decision model needs the draft's hidden states (want_hidden)")
        if hidden.shape[-1] != self.in_features:
            raise MultispecError(f"type-1 decision model was trained on hidden size {self.in_features}, "
                                 f"but the draft's hidden size is {hidden.shape[-1]}")
        return hidden.float()

    @torch.no_grad()
    def predict(self, hidden: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
        """Predicted acceptance of each chain's newest token. hidden: float [n, H] (draft hidden states at the
        nodes that produced the newest tokens; ignored by type 2); q: float [n, V] their draft distributions.
        Returns float32 [n] in (0, 1) on the CPU."""
        device = next(self.parameters()).device
        x = self.features(hidden, q).to(device)
        return torch.sigmoid(self(x)).float().cpu()


def save_decision_model(model: DecisionModel, path: str | Path, extra: dict | None = None) -> Path:
    """Write `config.json` (format, type, sizes, plus `extra`: training settings and metrics) and
    `model.safetensors` into directory `path`. Returns the directory."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "version": VERSION, "type": model.kind, "in_features": model.in_features,
              "sizes": list(model.sizes), **(extra or {})}
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE))
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return path


def load_decision_model(path: str | Path, device: str | torch.device = "cpu") -> DecisionModel:
    """Load a decision model saved by `save_decision_model`; MultispecError naming what is wrong."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise MultispecError(f"decision model not found: {path} is not a directory (expected {CONFIG_FILE} and "
                             f"{WEIGHTS_FILE}; train one with `multispec heads train-decision`)")
    cfg_path, w_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    for f in (cfg_path, w_path):
        if not f.is_file():
            raise MultispecError(f"decision model {path}: missing {f.name}")
    try:
        config = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MultispecError(f"decision model {path}: {CONFIG_FILE} is not UTF-8 JSON ({type(e).__name__})") from None
    if not isinstance(config, dict):
        raise MultispecError(f"decision model {path}: {CONFIG_FILE} is not a JSON object")
    if config.get("format") != FORMAT:
        raise MultispecError(f"decision model {path}: {CONFIG_FILE} has format {config.get('format')!r}, "
                             f"expected {FORMAT!r} (is this an acceptance head?)")
    if config.get("version") != VERSION:
        raise MultispecError(f"decision model {path}: unsupported version {config.get('version')!r}")
    try:
        model = DecisionModel(int(config["type"]), int(config["in_features"]), tuple(config["sizes"]))
    except KeyError as e:
        raise MultispecError(f"decision model {path}: {CONFIG_FILE} lacks {e.args[0]!r}") from None
    except (TypeError, ValueError, RuntimeError) as e:
        raise MultispecError(f"decision model {path}: {CONFIG_FILE} holds implausible sizes ({e})") from None
    try:
        state = load_file(str(w_path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for corrupt files
        raise MultispecError(f"decision model {path}: cannot read {WEIGHTS_FILE} ({type(e).__name__})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise MultispecError(f"decision model {path}: weights do not match config.json: "
                             f"{str(e).splitlines()[0]}") from None
    model.config = config
    return model.to(device).eval()
