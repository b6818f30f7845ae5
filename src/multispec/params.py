"""One request's settings, validated once: `SamplingParams` (vLLM's name and meanings).

    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, stop=["\\n\\n"], seed=1)
    decoder.generate("def f(x):", params)            # or multispec.generate(pair, prompt, params=params)

Everything that does not depend on the model is checked when the object is built (types, ranges, the logprobs
bounds, min_tokens <= max_new_tokens), so the CLI and the server refuse a bad value before any model loads or any
request is queued; an error names its field (`ParamError.param`, the server's `param`). What depends on the
model (token ids against its vocabulary, the defaults of its generation config, the context) is checked by the
Decoder that takes the request (`Decoder.prepare`, once), still before any forward. The API, the Decoder, batches,
the server and the CLI all build or take this one object, and this is the one list of its fields: `generate`'s
keywords, the server's request fields (serve/protocol.py) and the CLI's flags (each field's `_setting` metadata)
are made from it, and SamplingConfig takes the fields of its own names (sampling.config_values). A new setting is
a field here and, if it changes the law, a field of SamplingConfig.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from multispec.errors import MultispecError, check
from multispec.validate import integer, logit_bias as check_bias, real, seed as check_seed, stop_strings
from multispec.validate import token_ids as check_ids

LOGPROBS_MODES = ("raw", "processed")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top alternatives


def _setting(default, help: str, cli: bool | str = True, bounds: tuple[int, int] | None = None):
    """A SamplingParams field with what the CLI and the docs say of it. cli: True (a flag of the field's type:
    --top-k, a repeatable one for a tuple, --x/--no-x for an optional bool), "file" (a path whose text is the value)
    or False (no command-line form); bounds: an integer flag's range."""
    return field(default=default, metadata={"help": help, "cli": cli, "bounds": bounds})


class ParamError(MultispecError):
    """A bad request setting; `param` names the field (the server answers 400 with it)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """max_new_tokens: >= 1 (0 only with prompt_logprobs: the prompt's logprobs alone, OpenAI's echo with
    max_tokens 0). temperature=None: the target's generation config decides (transformers' rule: its temperature,
    top_k and top_p when it sets do_sample, else greedy); 0 is greedy. top_k (0 or -1: off), top_p, min_p,
    repetition_penalty, presence_penalty, frequency_penalty, logit_bias ({token id: bias}), min_tokens: the
    processors, with OpenAI's and vLLM's ranges and meanings (multispec.sampling.SamplingConfig). seed=None: a fresh
    seed per run (reported in stats["seed"]). stop: stop strings (a str is one); stop_token_ids: more tokens that end
    the output; ignore_eos: do not stop at EOS. logprobs=k in [0, 20]: each new token's logprob and its row's top k;
    prompt_logprobs: the prompt's; logprobs_mode "raw" or "processed". reproducible: None (the method's rule), True
    or False (docs/reproducible.md). Structured output (at most one; docs/structured.md): json_schema (a dict, its
    JSON text or a pydantic model class), regex, choice (a list of strings) or grammar (Lark or GBNF): the output
    then follows it exactly (`constraint`), and ends with EOS where it completes."""

    max_new_tokens: int = _setting(128, "The most new tokens (capped, with a warning, where prompt + new tokens "
                                   "would pass the model's positions).", cli=False)  # each command its own default
    temperature: float | None = _setting(None, "0 means greedy. Default: the target's generation_config.json (its "
                                         "temperature/top-k/top-p if it sets do_sample, else greedy).")
    top_k: int | None = _setting(None, "Keep the k most likely tokens (0 or -1: off, as in vLLM and transformers).")
    top_p: float | None = _setting(None, "Keep the smallest set of most likely tokens whose mass reaches top_p.")
    min_p: float | None = _setting(None, "Drop tokens below min_p times the most likely one's probability.")
    repetition_penalty: float | None = _setting(None, "Divide (multiply, if negative) the logits of tokens seen in "
                                                "the prompt or the output (1: off).")
    presence_penalty: float | None = _setting(None, "Lower the logits of tokens the output holds (in [-2, 2]).")
    frequency_penalty: float | None = _setting(None, "Lower the logits of tokens by how often the output holds them "
                                               "(in [-2, 2]).")
    logit_bias: tuple[tuple[int, float], ...] = _setting((), "{token id: bias}: added to the logits.", cli=False)
    min_tokens: int = _setting(0, "Stop tokens (EOS, stop_token_ids) are impossible before this many new tokens.")
    seed: int | None = _setting(None, "Sampling seed (default: a fresh one, reported).", bounds=(0, 2**63 - 1))
    stop: tuple[str, ...] = _setting((), "Stop string (repeatable); the output ends before it.")
    stop_token_ids: tuple[int, ...] = _setting((), "A token id that ends the output (repeatable), beside EOS.")
    ignore_eos: bool = _setting(False, "Do not stop at EOS.")
    logprobs: int | None = _setting(None, "Each new token's logprob and its row's top k.", cli=False)
    prompt_logprobs: bool = _setting(False, "The prompt's logprobs.", cli=False)
    logprobs_mode: str = _setting("raw", "raw or processed logprobs.", cli=False)
    reproducible: bool | None = _setting(None, "With --seed: verify with position-keyed noise so that the seed alone "
                                         "fixes the text, whatever the method or its plans (docs/reproducible.md).")
    json_schema: object = _setting(None, "Structured output: the output is JSON valid under this JSON schema file "
                                   "(docs/structured.md).", cli="file")
    regex: str | None = _setting(None, "Structured output: the output matches this regular expression.")
    choice: tuple[str, ...] | None = _setting(None, "Structured output: the output is one of these strings "
                                              "(repeatable).")
    grammar: str | None = _setting(None, "Structured output: the output follows this grammar file (Lark, or "
                                   "llama.cpp's GBNF).", cli="file")

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                value = _CHECKS[f.name](getattr(self, f.name))
            except ParamError:
                raise
            except MultispecError as e:
                raise ParamError(str(e), f.name) from None
            object.__setattr__(self, f.name, value)  # frozen: the one normalisation of a validated value
        least = 0 if self.prompt_logprobs else 1
        if self.max_new_tokens < least:
            raise ParamError(f"max_new_tokens must be an integer >= {least}, got {self.max_new_tokens!r}",
                             "max_new_tokens")
        if self.min_tokens > self.max_new_tokens:
            raise ParamError(f"min_tokens ({self.min_tokens}) must be at most max_new_tokens "
                             f"({self.max_new_tokens})", "min_tokens")
        _check_ranges(self)
        _check_constraint(self)

    @classmethod
    def of(cls, params: SamplingParams | None, settings: dict) -> SamplingParams:
        """`params`, or one built from keyword settings (generate's keywords are the fields); not both."""
        if params is None:
            return cls(**settings)
        check(not isinstance(params, str), f"params must be a SamplingParams, got the str {params!r:.40}: give a "
                                           f"method by keyword (method={params!r:.40})")
        check(isinstance(params, SamplingParams), f"params must be a SamplingParams, got {type(params).__name__}")
        check(not settings, f"give the settings in params or as keywords, not both (got {', '.join(settings)} "
                            "beside params)")
        return params

    def replace(self, **changes) -> SamplingParams:
        """A copy with `changes`, validated as a new object is."""
        return replace(self, **changes)

    @property
    def constraint(self):
        """The structured-output constraint (structured.Constraint), or None."""
        return self.__dict__.get("_constraint")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or self.prompt_logprobs


def _flag(name: str):
    def checked(v):
        check(isinstance(v, bool), f"{name} must be True or False, got {v!r}")
        return v
    return checked


def _optional_flag(v):
    check(v is None or isinstance(v, bool), f"reproducible must be True, False or None, got {v!r}")
    return v


def _logprobs(v):
    v = integer(v, "logprobs")
    check(v is None or 0 <= v <= MAX_TOP_LOGPROBS, f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                                   f"got {v!r}")
    return v


def _mode(v):
    check(v in LOGPROBS_MODES, f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {v!r}")
    return v


def _max_new(v):
    n = integer(v, "max_new_tokens")
    check(n is not None, "max_new_tokens must be an integer, got None")
    return n


def _min_tokens(v):
    n = integer(v, "min_tokens")
    return 0 if n is None else n


_CHECKS = {
    "max_new_tokens": _max_new,
    "temperature": lambda v: real(v, "temperature"),
    "top_k": lambda v: integer(v, "top_k"),
    "top_p": lambda v: real(v, "top_p"),
    "min_p": lambda v: real(v, "min_p"),
    "repetition_penalty": lambda v: real(v, "repetition_penalty"),
    "presence_penalty": lambda v: real(v, "presence_penalty"),
    "frequency_penalty": lambda v: real(v, "frequency_penalty"),
    "logit_bias": lambda v: check_bias(v, None),  # the ids' range: the Decoder's check
    "min_tokens": _min_tokens,
    "seed": check_seed,
    "stop": lambda v: tuple(stop_strings(v)),
    "stop_token_ids": lambda v: check_ids(v, "stop_token_ids", None),
    "ignore_eos": _flag("ignore_eos"),
    "logprobs": _logprobs,
    "prompt_logprobs": _flag("prompt_logprobs"),
    "logprobs_mode": _mode,
    "reproducible": _optional_flag,
    "json_schema": lambda v: v,  # checked together by _check_constraint
    "regex": lambda v: v,
    "choice": lambda v: tuple(v) if isinstance(v, list) else v,
    "grammar": lambda v: v,
}
FIELDS = frozenset(_CHECKS)
OTHER_NAMES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "stop_sequences": "stop",
               "random_seed": "seed", "n_probs": "logprobs", "top_logprobs": "logprobs"}  # other libraries' names


def _checked_init(init):
    """The dataclass's __init__, refusing an unknown keyword in one line with a did-you-mean (not a TypeError)."""
    def __init__(self, *args, **kwargs):
        for name in kwargs:
            if name not in FIELDS:
                import difflib

                close = OTHER_NAMES.get(name) or next(iter(difflib.get_close_matches(name, FIELDS, n=1)), None)
                hint = f"; did you mean {close}?" if close else f" (its fields: {', '.join(sorted(FIELDS))})"
                raise ParamError(f"SamplingParams has no setting {name!r}{hint}", name)
        init(self, *args, **kwargs)
    return __init__


FIELD_DEFAULTS = {f.name: f.default for f in fields(SamplingParams)}
SamplingParams.__init__ = _checked_init(SamplingParams.__init__)  # type: ignore[method-assign]


def _check_ranges(p: SamplingParams) -> None:
    """The processors' ranges, by the one object that defines them (SamplingConfig), each error naming its field."""
    from multispec.sampling import config_values, SamplingConfig

    values = config_values(p)
    for name in values:  # one field at a time, so the error names the right one
        try:
            SamplingConfig(**{name: values[name]})
        except MultispecError as e:
            raise ParamError(str(e), name) from None


def _check_constraint(p: SamplingParams) -> None:
    """The structured-output fields: at most one, its text valid (compiled without a tokenizer here; for the model's
    tokenizer by the Decoder), and not beside the settings that would contradict it."""
    from multispec.structured import KINDS, Constraint

    given = [k for k in KINDS if getattr(p, k) is not None]
    if not given:
        return
    try:
        constraint = Constraint.of(**{k: getattr(p, k) for k in KINDS})
    except MultispecError as e:
        raise ParamError(str(e), given[-1]) from None
    if p.ignore_eos:
        raise ParamError(f"ignore_eos cannot be combined with {given[0]}: the grammar ends the output with EOS",
                         "ignore_eos")
    if p.min_tokens:
        raise ParamError(f"min_tokens cannot be combined with {given[0]}: the grammar decides where the output "
                         "ends", "min_tokens")
    object.__setattr__(p, "_constraint", constraint)
