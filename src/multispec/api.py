"""The Python API: `load_pair` and `generate`."""
from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from multispec.errors import MultispecError, check
from multispec.methods import DEFAULT_METHOD, NEEDS_DRAFT, build_method
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
    compile: bool = False  # generate's default backend: "compiled" when True, else "hf"

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device


def load_pair(target: str | None = None, draft: str | None = None, device: str | None = None,
              dtype: str | torch.dtype | None = None, compile: bool = False) -> Pair:
    """Load a target/draft pair from local Hugging Face directories (or hub names where a hub is reachable).

    target=None and draft=None load the embedded default pair. The draft must share the target's vocabulary.
    device: default "cuda" when available, else "cpu". dtype: default float32 on CPU, bfloat16 on CUDA.
    compile=True: `generate` runs on the compiled fast backend unless told otherwise (backend="compiled": the
    static-cache backend with its steps torch.compile'd; Llama-family models only, checked here). Every step size
    is compiled here, at load, with a line on stderr each (minutes the first time on a CPU; torch caches the
    compiled code on disk, so later loads take seconds). On this project's CPU it is not faster overall (README).
    """
    check(isinstance(compile, bool), f"compile must be True or False, got {compile!r}")
    if target is None:
        check(draft is None, "a draft was given without a target; give both, or neither for the default pair")
        target, draft = DEFAULT_PAIR_DIR / "target", DEFAULT_PAIR_DIR / "draft"
        check(target.is_dir() and draft.is_dir(),
              f"the embedded default pair is not installed (expected {DEFAULT_PAIR_DIR}); pass --target/--draft")
    device = resolve_device(device)
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
    if compile:
        from multispec.models import make_backend

        models = [m for m in (t_model, d_model) if m is not None]
        for m in models:
            make_backend(m, "fast", max_len=1)  # refuses, in one line, a model the fast backend cannot run
        for m in models:
            make_backend(m, "compiled", max_len=128).warm_up()  # every step size now, not mid-generation
    return Pair(target=t_model, draft=d_model, tokenizer=tokenizer, target_path=str(target),
                draft_path=None if draft is None else str(draft), compile=compile)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to load on: `device`, checked (cpu, cuda[:N] when CUDA is available, mps when available), or
    CUDA when available, else the CPU. Raises MultispecError for anything else."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check(isinstance(device, (str, torch.device)), f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise MultispecError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    check(d.type in ("cpu", "cuda", "mps"), f"device {str(device)!r} cannot run a model here; use cpu, cuda or cuda:N")
    if d.type == "cuda":
        check(torch.cuda.is_available(), f"device {str(device)!r} asked for, but CUDA is not available on this machine "
                                         "(torch.cuda.is_available() is False); use cpu")
        check(d.index is None or d.index < torch.cuda.device_count(),
              f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if d.type == "mps":
        check(torch.backends.mps.is_available(), f"device {str(device)!r} asked for, but MPS is not available")
    return d


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
    from safetensors import SafetensorError

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # no "Loading weights" bars on every run
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise MultispecError(f"{path} is not a causal language model (config type {type(config).__name__} "
                                 "has no AutoModelForCausalLM class)") from None
        raise MultispecError(f"cannot load {path}: {_first_line(e)}") from None
    except (OSError, SafetensorError, RuntimeError) as e:  # missing, truncated or corrupt weight files
        raise MultispecError(f"cannot load {path}: {_first_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    model = model.to(device).eval()
    _check_supported(model, path)
    return model


def _check_supported(model: torch.nn.Module, path: str) -> None:
    """Refuse, in one line, what the backends cannot decode exactly: recurrent / linear-attention caches, and any
    model whose cached, tree-masked forwards disagree with its own full forward (see models/probe.py)."""
    from multispec.models.probe import probe_model

    probe_model(model, path)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


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
    """token_ids: the new tokens only. text: their decoding, cut before the first stop string. stats: see README.
    finish_reason: "stop" (an EOS token or a stop string ended it), "length" (max_new_tokens, or the model's
    context, reached) or "abort" (a partial result carried by an exception, see `generate`).

    When a stop string ends the output, `token_ids` are the tokens wholly before it: a token whose text straddles
    the stop string's start is dropped from `token_ids`, while `text` keeps its part before the stop. So
    decode(token_ids) == text, or a prefix of it short of that one token's head."""

    token_ids: list[int]
    text: str
    stats: dict
    finish_reason: str = "length"


SEED_LIMIT = 2**63  # seeds are integers in [0, 2**63)


def generate(pair: Pair, prompt: str | list[int], method: str = DEFAULT_METHOD, max_new_tokens: int = 128,
             temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, stop: str | list[str] | None = None,
             stream: Callable[[str], None] | None = None, backend: str | None = None,
             **method_options) -> GenerationResult:
    """Generate with `method` (auto, ar, sd, mcsd, ti-mcsd, dynamic, specdecpp, lookup). Method options: k,
    heuristic, confidence, entropy, tree, verifier, width, depth, decision_model, beta, head, threshold, k_min,
    k_max, ngram, proposers, max_nodes. stream(text_delta) is called as text is committed; the deltas add up to
    `result.text` exactly (text that could begin a stop string is held back until it is known not to).
    backend: "hf" (any transformers causal LM), "fast" (static cache, Llama family) or "compiled" (the fast backend,
    compiled); default "compiled" for a pair loaded with compile=True, else "hf".

    The default, `auto`, picks every round between no speculation, prompt lookup and a draft chain or tree from
    acceptance and forward costs measured on this machine, so that it is not slower than plain decoding.

    prompt: a str (BOS-prefixed when the tokenizer has one) or a 1-D sequence of integer token ids (a list, or a
    [L] / [1, L] integer tensor or array). stop: a str or a list of non-empty strs.
    temperature=None takes the sampling defaults of the target's generation_config.json, as transformers'
    `generate` does: its temperature, top_k and top_p when it sets do_sample, otherwise greedy (temperature 0).
    Explicit top_k / top_p override the file's. seed=None draws a fresh seed (as transformers and vLLM sample
    afresh unless seeded); the seed used is `stats["seed"]`.

    Context: a prompt with as many tokens as the model has positions (config max_position_embeddings or
    n_positions, the smaller of target and draft) is refused; when prompt + max_new_tokens would pass that
    limit, max_new_tokens is capped to fit and `stats["warnings"]` says so (vLLM's behaviour; finish_reason
    "length"). Every input is checked before any model runs. If generation fails part-way (an error or Ctrl-C),
    the exception carries `.partial`: a GenerationResult of the tokens committed so far (finish_reason "abort").
    """
    from multispec.engine import generate_ids
    from multispec.policy_factory import make_policy

    check(isinstance(pair, Pair), f"pair must be a multispec Pair from load_pair(), got {type(pair).__name__}")
    temperature, top_k, top_p = _real(temperature, "temperature"), _integer(top_k, "top_k"), _real(top_p, "top_p")
    sampling = _sampling(pair, temperature, top_k, top_p)
    check(isinstance(method, str), f"method must be a string, got {method!r}")
    config = build_method(method, **method_options)
    max_new_tokens = _integer(max_new_tokens, "max_new_tokens")
    check(max_new_tokens is not None and max_new_tokens >= 1,
          f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    seed = _seed(seed)
    stops = _stops(stop)
    check(stream is None or callable(stream), f"stream must be a callable taking a text delta, got {stream!r}")
    backend = _backend_name(pair, backend)
    ids = _encode(pair, prompt)
    if config.name in NEEDS_DRAFT:
        check(pair.draft is not None, f"method {config.name!r} needs a draft model; load the pair with a draft")
    warnings: list[str] = []
    max_new_tokens = _fit_context(pair, config, len(ids), max_new_tokens, warnings)

    uses_draft = config.name in NEEDS_DRAFT or (config.name == "auto" and "draft" in config.proposers)
    _refuse_trees_where_inexact(pair, config, uses_draft)
    target = _backend(pair.target, backend, len(ids) + max_new_tokens, config)
    draft = _backend(pair.draft, backend, len(ids) + max_new_tokens, config) \
        if (pair.draft is not None and uses_draft) else None
    policy = make_policy(config, pair)
    eos = _eos_ids(pair)
    tok = pair.tokenizer
    stop_fn = _stop_fn(tok, stops) if stops else None
    streamer = _Streamer(tok, stops, stream)
    try:
        new, c, seconds = generate_ids(target, draft, ids, config, sampling, max_new_tokens, seed, eos, stop_fn,
                                       streamer.on_tokens, policy)
    except BaseException as e:  # keep what was committed: the caller gets it as e.partial, then the error
        new = list(streamer.latest)
        e.partial = GenerationResult(token_ids=new, text=tok.decode(new, skip_special_tokens=True),
                                     stats={"seed": seed, "new_tokens": len(new), "warnings": warnings},
                                     finish_reason="abort")
        raise
    text, token_ids = _cut_at_stop(tok, new, stops)
    streamer.flush(text)
    stats = _stats(config, sampling, c, seconds, backend)
    stats.update(seed=seed, prompt_tokens=len(ids), max_new_tokens=max_new_tokens, warnings=warnings)
    extra = policy.report()
    if extra is not None:
        stats[config.name] = extra
    return GenerationResult(token_ids=token_ids, text=text, stats=stats, finish_reason=c.finish_reason)


def _refuse_trees_where_inexact(pair: Pair, config, uses_draft: bool) -> None:
    """Models whose attention depends on cache-row order or uses ALiBi by row (MPT, GPT-Neo local layers, Bloom,
    Falcon-ALiBi) verify chains exactly but not token trees: refuse tree methods here, before any model runs
    (`auto` keeps to chains for them, see policy_factory)."""
    from multispec.models import tree_refusal

    if not any(w > 1 for w in config.tree):
        return
    reason = tree_refusal(pair.target) or (tree_refusal(pair.draft) if uses_draft and pair.draft is not None
                                           else None)
    check(reason is None, f"method {config.name!r} drafts token trees, and tree methods are not supported on this "
                          f"model ({reason}); use auto, sd, specdecpp, lookup or ar")


def _integer(v, name: str) -> int | None:
    """None, or an int from an int-like value (numpy integers too); bool and floats are refused."""
    if v is None:
        return None
    check(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)),
          f"{name} must be an integer, got {v!r}")
    return int(v)


def _real(v, name: str) -> float | None:
    """None, or a float from a real number (numpy scalars too); bool and strings are refused."""
    if v is None:
        return None
    check(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)), f"{name} must be a number, got {v!r}")
    return float(v)


def _seed(seed) -> int:
    """The seed to use: `seed` checked to lie in [0, 2**63), or a fresh random one when None."""
    if seed is None:
        return secrets.randbelow(SEED_LIMIT)
    check(isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)),
          f"seed must be an integer, got {seed!r}")
    check(0 <= int(seed) < SEED_LIMIT, f"seed must be in [0, 2**63), got {seed}")
    return int(seed)


def _stops(stop) -> list[str]:
    """`stop` as a list of non-empty strings: a str is one stop string (not its characters)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    check(isinstance(stops, (list, tuple)), f"stop must be a string or a list of strings, got {stop!r}")
    for s in stops:
        check(isinstance(s, str), f"stop strings must be strings, got {s!r}")
        check(s != "", "a stop string is empty (it would match before any text); remove it")
    return list(stops)


def max_positions(model: torch.nn.Module) -> int | None:
    """The model's number of positions from its config (max_position_embeddings, n_positions, ...), or None."""
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _fit_context(pair: Pair, config, prompt_len: int, max_new: int, warnings: list[str]) -> int:
    """max_new_tokens that fits the context: refuse a prompt that fills it; cap max_new with a warning."""
    models = [pair.target] + ([pair.draft] if pair.draft is not None and config.name != "ar" else [])
    limits = [n for n in (max_positions(m) for m in models) if n is not None]
    if not limits:
        return max_new
    limit = min(limits)
    check(prompt_len < limit, f"the prompt has {prompt_len} tokens but the model has {limit} positions; "
                              f"shorten it to at most {limit - 1} tokens (e.g. keep its last ones)")
    if prompt_len + max_new > limit:
        warnings.append(f"max_new_tokens capped from {max_new} to {limit - prompt_len}: the prompt's {prompt_len} "
                        f"tokens + {max_new} would pass the model's {limit} positions")
        return limit - prompt_len
    return max_new


def _backend(model: torch.nn.Module, kind: str, tokens: int, config):
    """A fresh backend; the fast backend's static cache is sized to this run: prompt + new tokens + one more
    round's largest tree (the last round may draft past the end)."""
    from multispec.models import make_backend

    if kind == "hf":
        return make_backend(model, kind)

    tree_nodes = 1 + (config.max_nodes if config.name == "auto" else
                      sum(math.prod(config.tree[:d + 1]) for d in range(len(config.tree))))
    return make_backend(model, kind, max_len=tokens + tree_nodes + 1)


def _backend_name(pair: Pair, backend) -> str:
    """The backend to run: `backend` checked, or the pair's default (compiled when loaded with compile=True)."""
    from multispec.models import BACKENDS

    if backend is None:
        return "compiled" if pair.compile else "hf"
    check(backend in BACKENDS, f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check(not (pair.compile and backend == "hf"),
          "backend 'hf' asked for on a pair loaded with compile=True; compiling applies to the fast backend")
    return backend


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
    """Token ids of `prompt`: a str (BOS-prefixed when the tokenizer has a BOS token) or 1-D integer ids."""
    if isinstance(prompt, str):
        check(prompt != "", "the prompt is empty")
        ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        bos = pair.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + ids
    check(not isinstance(prompt, (bytes, bytearray)),
          "the prompt is bytes; decode it to a str first (bytes are not token ids)")
    if isinstance(prompt, (torch.Tensor, np.ndarray)):
        check(prompt.ndim == 1 or (prompt.ndim == 2 and prompt.shape[0] == 1),
              f"token-id prompts must be 1-D (or [1, L]), got shape {tuple(prompt.shape)}")
        is_int = (not prompt.dtype.is_floating_point and not prompt.dtype.is_complex and prompt.dtype != torch.bool) \
            if isinstance(prompt, torch.Tensor) else np.issubdtype(prompt.dtype, np.integer)
        check(is_int, f"token ids must be integers, got dtype {prompt.dtype}")
        prompt = prompt.reshape(-1).tolist()
    check(isinstance(prompt, (list, tuple)),
          f"the prompt must be a str or a list of token ids, got {type(prompt).__name__}")
    for t in prompt:
        check(isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)),
              f"token ids must be integers, got {t!r}")
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
    """The engine's stop test: the shortest prefix of the new ids whose text contains a stop string, or None."""
    def stop(new: list[int]) -> int | None:
        text = tok.decode(new, skip_special_tokens=True)
        if not any(s in text for s in stops):
            return None
        for k in range(1, len(new) + 1):
            if any(s in tok.decode(new[:k], skip_special_tokens=True) for s in stops):
                return k
        return len(new)
    return stop


def _stop_cut(text: str, stops: list[str]) -> int | None:
    """Where the first stop string starts in text, or None."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(cuts) if cuts else None


def _cut_at_stop(tok, new: list[int], stops: list[str]) -> tuple[str, list[int]]:
    """(text cut before the first stop string, the token ids wholly before it; see GenerationResult)."""
    text = tok.decode(new, skip_special_tokens=True)
    cut = _stop_cut(text, stops) if stops else None
    if cut is None:
        return text, new
    text = text[:cut]
    n = len(new)
    while n > 0 and not text.startswith(tok.decode(new[:n], skip_special_tokens=True)):
        n -= 1
    return text, new[:n]


class _Streamer:
    """Calls back with text deltas as rounds commit tokens. Never shows text at or past a stop string, nor a tail
    that could still grow into one, nor a half-decoded character; `flush(final_text)` sends the rest, so the deltas
    always add up to the final text. `latest` keeps the committed ids (for a partial result on failure)."""

    def __init__(self, tok, stops: list[str], callback: Callable[[str], None] | None):
        self.tok, self.stops, self.callback = tok, stops, callback
        self.shown = ""
        self.latest: list[int] = []

    def on_tokens(self, new: list[int]) -> None:
        self.latest = list(new)
        if self.callback is None:
            return
        text = self.tok.decode(new, skip_special_tokens=True)
        cut = _stop_cut(text, self.stops) if self.stops else None
        if cut is not None:
            text = text[:cut]
        else:
            text = text[:len(text) - self._held(text)]
        if text.endswith("\ufffd"):
            return
        self._send(text)

    def _held(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _send(self, text: str) -> None:
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self.callback(text[len(self.shown):])
            self.shown = text

    def flush(self, final_text: str) -> None:
        if self.callback is not None:
            self._send(final_text)


def _stats(config, sampling: SamplingConfig, c, seconds: float, backend: str) -> dict:
    return {
        "method": config.name,
        "lossless": config.lossless_at(sampling.temperature),
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
