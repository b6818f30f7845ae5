"""Named model shapes and training budgets for the zoo (a table of frozen dataclasses).

Sizes below are for the vocabulary each preset is meant for; `ModelShape.n_params(vocab_size)` gives the exact
count for any tokenizer (tied embeddings, so the embedding matrix is counted once).

| preset    | role   | layers, hidden, heads, ffn | params (vocab)   | batch x block | budget            |
| --------- | ------ | -------------------------- | ---------------- | ------------- | ----------------- |
| tiny      | target | 2, 32, 2, 64               | ~30k (vocab 300) | 8 x 32        | 30 steps, seconds |
| tiny      | draft  | 1, 32, 2, 64               | ~20k (vocab 300) | 8 x 32        | 30 steps, seconds |
| default   | target | 4, 192, 3, 512             | 2.56M (4096)     | 16 x 256      | 95 min, 2-core CPU|
| default   | draft  | 2, 128, 2, 352             | 0.93M (4096)     | 16 x 256      | 20 min, distilled |
| bench-gpu | target | 12, 768, 12, 2304          | 98.3M (8192)     | 64 x 1024     | 6 min, one H100   |
| bench-gpu | draft  | 4, 512, 8, 1408            | 17.0M (8192)     | 64 x 1024     | 6 min, distilled  |
"""
from dataclasses import asdict, dataclass

from multispec.errors import MultispecError


@dataclass(frozen=True)
class ModelShape:
    """A Llama shape: layers, hidden size, attention heads, SwiGLU inner size."""

    n_layer: int
    n_embd: int
    n_head: int
    ffn: int

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "ffn"):
            if getattr(self, name) <= 0:
                raise MultispecError(f"model shape: {name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise MultispecError(f"model shape: hidden {self.n_embd} is not divisible by heads {self.n_head}")

    def n_params(self, vocab_size: int) -> int:
        """Parameter count with tied embeddings (matches LlamaForCausalLM.num_parameters())."""
        per_layer = 4 * self.n_embd * self.n_embd + 3 * self.n_embd * self.ffn + 2 * self.n_embd
        return vocab_size * self.n_embd + self.n_layer * per_layer + self.n_embd

    def __str__(self) -> str:
        return f"{self.n_layer},{self.n_embd},{self.n_head},{self.ffn}"


@dataclass(frozen=True)
class RoleRecipe:
    """How one role of a preset trains: shape, batch, schedule, budget, stored dtype."""

    shape: ModelShape
    batch_size: int
    block_size: int
    lr: float
    min_lr: float
    warmup_steps: int
    steps: int | None = None        # fixed step count, or None to train by wall clock
    minutes: float | None = None    # wall-clock budget used when steps is None
    distill_alpha: float = 0.0      # weight of KL(teacher || draft) when a teacher is given
    save_dtype: str = "float32"     # dtype of the stored weights: float32, bfloat16 or float16


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    vocab_size: int                 # the vocabulary the preset is sized for (the tokenizer decides the real one)
    target: RoleRecipe
    draft: RoleRecipe

    def role(self, role: str) -> RoleRecipe:
        if role not in ("target", "draft"):
            raise MultispecError(f"unknown role {role!r}; expected target or draft")
        return self.target if role == "target" else self.draft

    def describe(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny",
            description="CPU smoke test: trains in seconds, for tests",
            vocab_size=300,
            target=RoleRecipe(ModelShape(2, 32, 2, 64), batch_size=8, block_size=32, lr=1e-2, min_lr=1e-3,
                              warmup_steps=5, steps=30),
            draft=RoleRecipe(ModelShape(1, 32, 2, 64), batch_size=8, block_size=32, lr=1e-2, min_lr=1e-3,
                             warmup_steps=5, steps=30, distill_alpha=0.5),
        ),
        Preset(
            name="default",
            description="the embedded default pair, trained on a 2-core CPU",
            vocab_size=4096,
            target=RoleRecipe(ModelShape(4, 192, 3, 512), batch_size=16, block_size=256, lr=2e-3, min_lr=2e-4,
                              warmup_steps=50, minutes=95, save_dtype="bfloat16"),
            draft=RoleRecipe(ModelShape(2, 128, 2, 352), batch_size=16, block_size=256, lr=3e-3, min_lr=3e-4,
                             warmup_steps=50, minutes=20, distill_alpha=0.7, save_dtype="bfloat16"),
        ),
        Preset(
            name="bench-gpu",
            description="benchmark pair: ~100M target and a 17M draft, each <= 6 minutes on one H100 (bf16 autocast)",
            vocab_size=8192,
            target=RoleRecipe(ModelShape(12, 768, 12, 2304), batch_size=64, block_size=1024, lr=1e-3, min_lr=1e-4,
                              warmup_steps=100, minutes=5.5, save_dtype="bfloat16"),
            draft=RoleRecipe(ModelShape(4, 512, 8, 1408), batch_size=64, block_size=1024, lr=2e-3, min_lr=2e-4,
                             warmup_steps=100, minutes=5.5, distill_alpha=0.7, save_dtype="bfloat16"),
        ),
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise MultispecError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
