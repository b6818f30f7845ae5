"""Train a target or a (distilled) draft model from scratch: data -> model -> optimizer -> loop -> save.

Reads top to bottom like nanoGPT's train.py, but from a validated `TrainConfig` instead of globals. The loop:
lr from the pure `get_lr`, periodic held-out eval, a checkpoint every few minutes (model config, optimizer, step,
planned steps, RNG states) so that `resume=True` continues exactly, a progress bar with loss and tokens/s. The
result is a Hugging Face directory (config.json, model.safetensors, generation_config.json, tokenizer files) plus
`training.json` with the configuration, shapes, parameters, steps, tokens, wall time, hardware and final losses.
"""
import contextlib
import json
import math
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from multispec.errors import MultispecError
from multispec.zoo.data import EOT_ID, get_batch, token_file
from multispec.zoo.presets import ModelShape, get_preset
from multispec.zoo.tokenizer import TOKENIZER_FILES, load_tokenizer

CKPT = "ckpt.pt"
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "training.json") + TOKENIZER_FILES
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; validated when built and written into ckpt.pt and training.json."""

    role: str
    preset: str
    corpus: str
    tokenizer: str
    out: str
    teacher: str | None = None       # target directory to distil from (draft only)
    steps: int | None = None         # overrides the preset; None -> preset steps, else wall clock
    max_minutes: float | None = None # wall-clock budget; the number of steps is planned from measured throughput
    seed: int = 1337
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 8
    checkpoint_minutes: float = 5.0
    device: str = "auto"             # auto, cpu or cuda
    threads: int | None = None       # torch CPU threads; None keeps torch's default (1 is faster on a loaded CPU)

    def __post_init__(self) -> None:
        recipe = get_preset(self.preset).role(self.role)  # raises on a bad preset or role
        for name in ("corpus", "tokenizer"):
            if not Path(getattr(self, name)).is_dir():
                raise MultispecError(f"train: --{name} is not a directory: {getattr(self, name)}")
        if not (Path(self.corpus) / "train.txt").is_file():
            raise MultispecError(f"train: {self.corpus} has no train.txt (run `multispec zoo corpus` first)")
        if self.teacher is not None:
            if self.role != "draft":
                raise MultispecError("train: --teacher is only for --role draft")
            if not (Path(self.teacher) / "config.json").is_file():
                raise MultispecError(f"train: --teacher is not a model directory: {self.teacher}")
        if self.steps is not None and self.steps <= 0:
            raise MultispecError(f"train: --steps must be positive, got {self.steps}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise MultispecError(f"train: --max-minutes must be positive, got {self.max_minutes}")
        if self.steps is None and self.max_minutes is None and recipe.steps is None and recipe.minutes is None:
            raise MultispecError("train: give --steps or --max-minutes")
        if self.device not in ("auto", "cpu", "cuda"):
            raise MultispecError(f"train: --device must be auto, cpu or cuda, got {self.device}")
        if self.eval_interval <= 0 or self.eval_iters <= 0 or self.checkpoint_minutes < 0:
            raise MultispecError("train: eval interval and eval iterations must be positive, checkpoint minutes >= 0")
        if self.threads is not None and self.threads <= 0:
            raise MultispecError(f"train: --threads must be positive, got {self.threads}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise MultispecError("train: --device cuda but CUDA is not available")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def get_lr(step: int, max_steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up to lr over `warmup` steps, then cosine decay to min_lr at max_steps (pure)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= max_steps:
        return min_lr
    ratio = (step - warmup) / max(1, max_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def plan_steps(done: int, seconds_per_step: float, seconds_left: float, eval_seconds: float, eval_interval: int) -> int:
    """Total steps for a wall-clock budget: done + the steps (with their periodic evals) that fit in seconds_left."""
    per_step = seconds_per_step + eval_seconds / eval_interval
    return done + max(1, int(seconds_left / per_step))


def llama_config(shape: ModelShape, vocab_size: int, block_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.n_embd, intermediate_size=shape.ffn,
        num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head, num_key_value_heads=shape.n_head,
        max_position_embeddings=block_size, tie_word_embeddings=True,  # tied: the embedding is most of a small model
        bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=EOT_ID, rope_theta=10000.0,
    )


def model_loss(model, x: torch.Tensor, y: torch.Tensor, teacher=None,
               alpha: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(training loss, cross-entropy) for x, y int64 [B, T]; with a teacher: (1-alpha)*CE + alpha*KL(teacher||model)."""
    logits = model(input_ids=x, use_cache=False).logits.float()  # [B, T, V]
    ce = F.cross_entropy(logits.flatten(0, 1), y.reshape(-1))
    if teacher is None or alpha == 0.0:
        return ce, ce
    with torch.no_grad():
        logp = F.log_softmax(teacher(input_ids=x, use_cache=False).logits.float(), dim=-1)  # [B, T, V] teacher
    logq = F.log_softmax(logits, dim=-1)  # [B, T, V] student
    kl = (logp.exp() * (logp - logq)).sum(-1).mean()
    return (1.0 - alpha) * ce + alpha * kl, ce


@torch.no_grad()
def estimate_loss(model, data: np.ndarray, batch_size: int, block_size: int, iters: int, seed: int,
                  device, autocast) -> float:
    """Mean CE (nats/token) over `iters` fixed random batches (same windows every call)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(iters):
        x, y = get_batch(data, batch_size, block_size, gen)
        with autocast:
            losses.append(model_loss(model, x.to(device), y.to(device))[1].item())
    model.train()
    return float(np.mean(losses))


@torch.no_grad()
def full_loss(model, data: np.ndarray, batch_size: int, block_size: int, device, autocast) -> float:
    """CE (nats/token) over all of `data`, in non-overlapping windows of block_size."""
    from multispec.zoo.evaluate import heldout_loss

    model.eval()
    loss = heldout_loss(model, data, block_size, batch_size, device, autocast)["loss"]
    model.train()
    return loss


def load_teacher(path: str, vocab_size: int, device):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    if teacher.config.vocab_size != vocab_size:
        raise MultispecError(f"train: teacher vocabulary {teacher.config.vocab_size} "
                             f"!= tokenizer vocabulary {vocab_size}")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def hardware(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return f"{cpu} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def train(cfg: TrainConfig, resume: bool = False) -> dict:
    """Run the recipe; returns the training.json record. With resume, cfg comes from out/ckpt.pt."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(cfg.out)
    ckpt = None
    if resume:
        if not (out / CKPT).is_file():
            raise MultispecError(f"train: --resume but no checkpoint at {out / CKPT}")
        ckpt = torch.load(out / CKPT, map_location="cpu", weights_only=False)
        cfg = TrainConfig.from_dict(ckpt["config"])  # the checkpoint's own config is the truth
    recipe = get_preset(cfg.preset).role(cfg.role)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    # bf16 autocast on GPU; fp32 on CPU (CPU bf16 matmuls are slower than fp32 here)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    B, T = recipe.batch_size, recipe.block_size
    out.mkdir(parents=True, exist_ok=True)

    # ---- data: tokenize once, cached as uint16 memmaps in the corpus directory
    vocab_size = load_tokenizer(cfg.tokenizer).get_vocab_size()
    train_data = token_file(cfg.corpus, "train", cfg.tokenizer)
    val_data = token_file(cfg.corpus, "heldout", cfg.tokenizer)

    # ---- model: from the preset, or rebuilt from the checkpoint's own config
    torch.manual_seed(cfg.seed)
    if ckpt is None:
        mconf = llama_config(recipe.shape, vocab_size, T)
    else:
        mconf = LlamaConfig.from_dict(ckpt["model_config"])
    model = LlamaForCausalLM(mconf)
    if ckpt is not None:
        state = ckpt["model"]
        for name, p in model.state_dict().items():
            assert state[name].shape == p.shape, f"checkpoint {name}: {tuple(state[name].shape)} != {tuple(p.shape)}"
        model.load_state_dict(state)
    model.to(device).train()
    n_params = model.num_parameters()
    teacher = load_teacher(cfg.teacher, vocab_size, device) if cfg.teacher else None
    alpha = recipe.distill_alpha if teacher is not None else 0.0

    # ---- optimizer: AdamW, weight decay on matrices only (not on norms)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda",
    )
    gen = torch.Generator().manual_seed(cfg.seed)  # batch sampling
    step, elapsed, history = 0, 0.0, []
    fixed_steps = cfg.steps or (recipe.steps if cfg.max_minutes is None else None)
    budget_s = None if fixed_steps else 60.0 * (cfg.max_minutes or recipe.minutes)
    max_steps = fixed_steps
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        step, elapsed, history, max_steps = ckpt["step"], ckpt["elapsed"], ckpt["history"], ckpt["max_steps"]
        gen.set_state(ckpt["rng"]["batch"])
        torch.set_rng_state(ckpt["rng"]["torch"])

    def save_checkpoint() -> None:
        tmp = out / (CKPT + ".tmp")
        torch.save({
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_config": mconf.to_dict(),
            "config": asdict(cfg), "step": step, "max_steps": max_steps, "elapsed": elapsed, "history": history,
            "rng": {"batch": gen.get_state(), "torch": torch.get_rng_state()},
        }, tmp)
        os.replace(tmp, out / CKPT)

    def evaluate() -> float:
        return estimate_loss(model, val_data, B, T, cfg.eval_iters, cfg.seed + 1, device, autocast)

    # ---- loop
    t0 = time.perf_counter() - elapsed
    last_ckpt = time.perf_counter()
    eval_seconds = 0.0
    # step-time measurement window (starts after the slow first steps; on a wall-clock resume, here)
    warm_t, warm_step = (time.perf_counter(), step) if max_steps is not None else (None, None)

    def replan() -> int:
        """Total steps that fit the rest of the wall-clock budget at the throughput measured since warm_step."""
        sps = (time.perf_counter() - warm_t) / (step - warm_step)
        final_eval_s = eval_seconds / (cfg.eval_iters * B * T) * len(val_data) + 10.0  # full held-out pass
        left = budget_s - (time.perf_counter() - t0) - final_eval_s
        bar.write(f"step {step}: {B * T / sps:.0f} tokens/s ({sps * 1e3:.0f} ms/step)")
        return max(step + 1, plan_steps(step, sps, left, eval_seconds, cfg.eval_interval))

    bar = tqdm(total=max_steps, initial=step, desc=f"{cfg.role} {cfg.preset}", unit="step", dynamic_ncols=True)
    train_losses: list[float] = []
    while max_steps is None or step < max_steps:
        if max_steps is None and step == 2:
            warm_t, warm_step = time.perf_counter(), step
        # plan once warm-up is timed (warm-up lr does not depend on max_steps), re-plan at each eval: on a shared
        # machine the throughput moves with the load, the budget does not
        first_plan = max_steps is None and step >= max(recipe.warmup_steps, 5)
        replan_now = first_plan or (max_steps is not None and step % cfg.eval_interval == 0)
        if budget_s is not None and warm_step is not None and step > warm_step and replan_now:
            max_steps = replan()
            bar.total = max_steps
            bar.write(f"step {step}: planning {max_steps} steps")
            warm_t, warm_step = time.perf_counter(), step
        lr = get_lr(step, max_steps or 10**9, recipe.lr, recipe.min_lr, recipe.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if step % cfg.eval_interval == 0:
            te = time.perf_counter()
            val = evaluate()
            eval_seconds = time.perf_counter() - te
            train_loss = float(np.mean(train_losses[-50:])) if train_losses else None
            history.append({"step": step, "val_loss": val, "train_loss": train_loss, "planned_steps": max_steps,
                            "elapsed": round(time.perf_counter() - t0, 1)})
            bar.write(f"step {step}: held-out loss {val:.4f} (planned steps {max_steps})")
            if warm_t is not None:
                warm_t += eval_seconds  # keep eval time out of the step-time measurement
        if time.perf_counter() - last_ckpt > 60 * cfg.checkpoint_minutes:
            elapsed = time.perf_counter() - t0
            save_checkpoint()
            last_ckpt = time.perf_counter()
        x, y = get_batch(train_data, B, T, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss, ce = model_loss(model, x, y, teacher, alpha)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        train_losses.append(ce.item())
        elapsed = time.perf_counter() - t0
        bar.update(1)
        tok_s = B * T * bar.n / max(elapsed, 1e-9)
        bar.set_postfix(loss=f"{train_losses[-1]:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}")
        if budget_s is not None and max_steps is not None and elapsed > 1.15 * budget_s:
            bar.write(f"wall-clock budget exceeded by 15% at step {step}/{max_steps}; stopping early")
            break
    bar.close()

    # ---- final eval and save
    val_full = full_loss(model, val_data, B, T, device, autocast)
    train_final = float(np.mean(train_losses[-50:])) if train_losses else history[-1]["train_loss"]
    history.append({"step": step, "val_loss": val_full, "train_loss": train_final})
    elapsed = time.perf_counter() - t0
    save_checkpoint()
    save_dtype = DTYPES[recipe.save_dtype]
    model.to("cpu", dtype=save_dtype).save_pretrained(out)
    GenerationConfig(bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=EOT_ID).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(cfg.tokenizer) / name).is_file():
            shutil.copy(Path(cfg.tokenizer) / name, out / name)
    record = {
        "config": asdict(cfg), "preset": cfg.preset, "role": cfg.role, "recipe": asdict(recipe),
        "shape": str(recipe.shape), "params": n_params, "vocab_size": vocab_size,
        "steps": step, "planned_steps": max_steps, "tokens": step * B * T,
        "corpus_tokens": {"train": len(train_data), "heldout": len(val_data)},
        "wall_seconds": round(elapsed, 1), "tokens_per_second": round(step * B * T / elapsed, 1),
        "hardware": hardware(device), "torch": torch.__version__, "stored_dtype": recipe.save_dtype,
        "distilled_from": cfg.teacher, "distill_alpha": alpha,
        "final_train_loss": train_final, "final_heldout_loss": val_full, "history": history,
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
