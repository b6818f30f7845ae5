"""The Python API: `load_pair` and `generate`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from multispec.errors import MultispecError, check
from multispec.methods import build_method
from multispec.sampling import SamplingConfig

DEFAULT_PAIR_DIR = Path(__file__).parent / "default_pair"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


@dataclass
class Pair:
    """A target model, an optional draft model sharing its vocabulary, and their tokenizer."""

    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object
    target_path: str
    draft_path: str | None

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device


def load_pair(target: str | None = None, draft: str | None = None, device: str | None = None,
              dtype: str | torch.dtype | None = None) -> Pair:
    """Load a target/draft pair from local Hugging Face directories (or hub names where a hub is reachable).

    target=None and draft=None load the embedded default pair. The draft must share the target's vocabulary.
    device: default "cuda" when available, else "cpu". dtype: default float32 on CPU, bfloat16 on CUDA.
    """
    if target is None:
        check(draft is None, "a draft was given without a target; give both, or neither for the default pair")
        target, draft = DEFAULT_PAIR_DIR / "target", DEFAULT_PAIR_DIR / "draft"
        check(target.is_dir() and draft.is_dir(),
              f"the embedded default pair is not installed (expected {DEFAULT_PAIR_DIR}); pass --target/--draft")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if isinstance(dtype, str):
        check(dtype in _DTYPES, f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
        dtype = _DTYPES[dtype]
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    t_model = _load_model(str(target), device, dtype)
    tokenizer = _load_tokenizer(str(target))
    d_model = None
    if draft is not None:
        d_model = _load_model(str(draft), device, dtype)
        tv, dv = _vocab_rows(t_model), _vocab_rows(d_model)
        check(tv == dv, f"draft and target vocabularies differ: the target has {tv} output tokens, the draft {dv}; "
                        "speculative decoding needs one shared vocabulary")
        d_tok = _load_tokenizer(str(draft), required=False)
        if d_tok is not None:
            check(d_tok.get_vocab() == tokenizer.get_vocab(),
                  "draft and target tokenizers differ (same size, different tokens); use a draft trained with the "
                  "target's tokenizer")
    return Pair(target=t_model, draft=d_model, tokenizer=tokenizer, target_path=str(target),
                draft_path=None if draft is None else str(draft))


def _load_model(path: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    p = Path(path)
    if not p.exists() and (p.is_absolute() or path.startswith(".") or path.count("/") > 1):
        raise MultispecError(f"model path not found: {path}")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise MultispecError(f"cannot load a model config from {path}: {str(e).splitlines()[0]}") from None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise MultispecError(f"{path} is not a causal language model (config type {type(config).__name__} "
                                 "has no AutoModelForCausalLM class)") from None
        raise MultispecError(f"cannot load {path}: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise MultispecError(f"cannot load {path}: {str(e).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    model = model.to(device).eval()
    _check_supported(model, path)
    return model


def _check_supported(model: torch.nn.Module, path: str) -> None:
    """Refuse, in one line, what the backends cannot decode exactly: recurrent / linear-attention caches, and any
    model whose cached, tree-masked forwards disagree with its own full forward (see models/probe.py)."""
    from multispec.models.probe import probe_model

    probe_model(model, path)


def _vocab_rows(model: torch.nn.Module) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _load_tokenizer(path: str, required: bool = True):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        if not required:
            return None
        raise MultispecError(f"cannot load a tokenizer from {path}: {str(e).splitlines()[0]}") from None


@dataclass
class GenerationResult:
    """token_ids: the new tokens only. text: their decoding (cut before a stop string). stats: see README.
    finish_reason: "stop" (an EOS token or a stop string ended it) or "length" (max_new_tokens reached)."""

    token_ids: list[int]
    text: str
    stats: dict
    finish_reason: str = "length"


def generate(pair: Pair, prompt: str | list[int], method: str = "mcsd", max_new_tokens: int = 128,
             temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None,
             stop: list[str] | None = None, stream: Callable[[str], None] | None = None, backend: str = "hf",
             **method_options) -> GenerationResult:
    """Generate with `method` (ar, sd, mcsd, ti-mcsd, dynamic, specdecpp). Method options: k, heuristic, tree,
    verifier, width, depth, decision_model, beta, head, threshold, k_min, k_max. stream(text_delta) is called as
    text is committed.

    temperature=None takes the sampling defaults of the target's generation_config.json, as transformers'
    `generate` does: its temperature, top_k and top_p when it sets do_sample, otherwise greedy (temperature 0).
    Explicit top_k / top_p override the file's."""
    from multispec.engine import generate_ids
    from multispec.models import make_backend
    from multispec.policy_factory import make_policy

    sampling = _sampling(pair, temperature, top_k, top_p)
    config = build_method(method, **method_options)
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1,
          f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    ids = _encode(pair, prompt)
    if config.name != "ar":
        check(pair.draft is not None, f"method {config.name!r} needs a draft model; load the pair with a draft")
    target = make_backend(pair.target, backend)
    draft = make_backend(pair.draft, backend) if (pair.draft is not None and config.name != "ar") else None
    policy = make_policy(config, pair)
    eos = _eos_ids(pair)
    tok = pair.tokenizer
    stop_fn = _stop_fn(tok, stop) if stop else None
    on_tokens = _streamer(tok, stream) if stream else None
    new, c, seconds = generate_ids(target, draft, ids, config, sampling, max_new_tokens, seed, eos, stop_fn,
                                   on_tokens, policy)
    text = tok.decode(new, skip_special_tokens=True)
    if stop:
        cuts = [text.find(s) for s in stop if s in text]
        text = text[: min(cuts)] if cuts else text
    stats = _stats(config, sampling, c, seconds, backend)
    return GenerationResult(token_ids=new, text=text, stats=stats, finish_reason=c.finish_reason)


def _sampling(pair: Pair, temperature: float | None, top_k: int | None, top_p: float | None) -> SamplingConfig:
    """The explicit settings, with what is left out taken from the target's generation config (see `generate`)."""
    if temperature is None:
        gc = getattr(pair.target, "generation_config", None)
        if gc is None or not getattr(gc, "do_sample", False):
            return SamplingConfig(temperature=0.0, top_k=top_k, top_p=top_p)
        temperature = float(gc.temperature if gc.temperature is not None else 1.0)
        top_k = top_k if top_k is not None else (gc.top_k or None)  # transformers' top_k 0 means off
        top_p = top_p if top_p is not None else (gc.top_p if gc.top_p is not None and gc.top_p < 1.0 else None)
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)


def _encode(pair: Pair, prompt) -> list[int]:
    if isinstance(prompt, str):
        check(prompt != "", "the prompt is empty")
        ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        bos = pair.tokenizer.bos_token_id
        ids = ([bos] if bos is not None else []) + ids
    else:
        ids = [int(t) for t in prompt]
        check(len(ids) > 0, "the prompt is empty")
        v = _vocab_rows(pair.target)
        check(all(0 <= t < v for t in ids), f"prompt token ids must be in [0, {v})")
    return ids


def _eos_ids(pair: Pair) -> set[int]:
    eos = pair.target.generation_config.eos_token_id if pair.target.generation_config is not None else None
    eos = eos if eos is not None else pair.tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def _stop_fn(tok, stops: list[str]):
    def stop(new: list[int]) -> int | None:
        text = tok.decode(new, skip_special_tokens=True)
        if not any(s in text for s in stops):
            return None
        for k in range(1, len(new) + 1):  # the shortest prefix that completes a stop string
            if any(s in tok.decode(new[:k], skip_special_tokens=True) for s in stops):
                return k
        return len(new)
    return stop


def _streamer(tok, callback: Callable[[str], None]):
    shown = [""]

    def on_tokens(new: list[int]) -> None:
        text = tok.decode(new, skip_special_tokens=True)
        if text.startswith(shown[0]) and len(text) > len(shown[0]) and not text.endswith("\ufffd"):
            callback(text[len(shown[0]):])
            shown[0] = text
    return on_tokens


def _stats(config, sampling: SamplingConfig, c, seconds: float, backend: str) -> dict:
    return {
        "method": config.name,
        "lossless": config.lossless,
        "verifier": ("greedy" if sampling.greedy else config.verifier) if config.name != "ar" else None,
        "tree": list(config.tree),
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "backend": backend,
        "new_tokens": c.new_tokens,
        "target_calls": c.target_calls,
        "draft_calls": c.draft_calls,
        "rounds": c.rounds,
        "tau": c.new_tokens / max(1, c.target_calls),
        "accepted_tokens": c.accepted,
        "drafted_tokens": c.drafted_tokens,
        "acceptance_rate": c.accepted / c.drafted_depth if c.drafted_depth else None,
        "seconds": seconds,
        "tokens_per_s": c.new_tokens / seconds if seconds > 0 else None,
        "finish_reason": c.finish_reason,
        # vLLM's names (vllm/v1/spec_decode/metrics.py): mean acceptance length counts the bonus token
        "num_spec_steps": c.num_drafts,
        "num_draft_tokens": c.drafted_depth,
        "num_accepted_draft_tokens": c.accepted,
        "mean_acceptance_length": 1 + c.accepted / c.num_drafts if c.num_drafts else None,
        "draft_acceptance_rate": c.accepted / c.drafted_depth if c.drafted_depth else None,
        "accepted_per_position": list(c.accepted_per_pos),
        "prefill_s": c.t_prefill,
        "draft_s": c.t_draft,
        "verify_s": c.t_verify,
        "cache_s": c.t_cache,
    }
