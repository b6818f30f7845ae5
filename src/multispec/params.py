"""One request's settings, validated once: `SamplingParams` (vLLM's name and meanings).

    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, stop=["\\n\\n"], seed=1)
    decoder.generate("def f(x):", params)            # or multispec.generate(pair, prompt, params=params)

Everything that does not depend on the model is checked when the object is built (types, ranges, the logprobs
bounds, min_tokens <= max_new_tokens), so the CLI and the server refuse a bad value before any model loads or any
request is queued; an error names its field (`ParamError.param`, the server's `param`). What depends on the
model (token ids against its vocabulary, the defaults of its generation config, the context) is checked by the
Decoder that takes the request (`Decoder.check_request`), still before any forward. The API, the Decoder, batches, the
server and the CLI all build or take this one object; the keyword arguments of `generate` are its fields.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from multispec.errors import MultispecError, check
from multispec.validate import integer, logit_bias as check_bias, real, seed as check_seed, stop_strings
from multispec.validate import token_ids as check_ids

LOGPROBS_MODES = ("raw", "processed")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top alternatives


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

    max_new_tokens: int = 128
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # given as {token id: bias}; ids checked against the vocabulary
    min_tokens: int = 0                              # by the Decoder
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: bool = False
    logprobs_mode: str = "raw"
    reproducible: bool | None = None
    json_schema: object = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

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


SamplingParams.__init__ = _checked_init(SamplingParams.__init__)  # type: ignore[method-assign]


def _check_ranges(p: SamplingParams) -> None:
    """The processors' ranges, by the one object that defines them (SamplingConfig), each error naming its field."""
    from multispec.sampling import SamplingConfig

    values = dict(temperature=1.0 if p.temperature is None else p.temperature, top_k=p.top_k, top_p=p.top_p,
                  min_p=p.min_p, logit_bias=p.logit_bias, min_tokens=p.min_tokens,
                  repetition_penalty=1.0 if p.repetition_penalty is None else p.repetition_penalty,
                  presence_penalty=p.presence_penalty or 0.0, frequency_penalty=p.frequency_penalty or 0.0)
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
