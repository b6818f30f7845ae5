"""One request, checked and defaulted once: what `Decoder.prepare` returns and `Decoder.run_prepared` runs.

    prepared = decoder.prepare("def f(x):", SamplingParams(max_new_tokens=64, json_schema=schema))
    result = decoder.run_prepared(prepared)      # no check again: the grammar was compiled once, in prepare

Everything a run decides before its first forward is here as a value: the prompt's token ids, the sampling law
(the model's generation-config defaults applied, the grammar compiled for the tokenizer), the seed (drawn when the
request gave none), whether the run is in the reproducible mode, max_new_tokens fitted to the context (with its
warning), the stop strings and the tokens that end the output. The server prepares a request at its edge, off the
event loop, and queues this object; a batch prepares every prompt before any of them decodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multispec.decoding.grammar import request_grammar
from multispec.errors import MultispecError, check
from multispec.params import ParamError, SamplingParams
from multispec.sampling import SamplingConfig, config_values
from multispec.text import encode_chat, encode_prompt
from multispec.validate import logit_bias as check_logit_bias, seed_or_fresh, token_ids


@dataclass(frozen=True)
class PreparedRequest:
    """prompt_ids: the prompt's token ids (BOS included if the tokenizer adds one); params: the request as given
    (its seed may be None: `seed` is the one used); sampling: its law, grammar compiled; reproducible: the mode
    decided (docs/reproducible.md); max_new_tokens: fitted to the context (warnings says when it was capped);
    stop: the stop strings; eos_ids: the tokens that end the output (EOS unless ignore_eos, and stop_token_ids)."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    sampling: SamplingConfig
    seed: int
    reproducible: bool
    max_new_tokens: int
    stop: tuple[str, ...]
    eos_ids: frozenset[int]
    warnings: tuple[str, ...] = ()

    @property
    def logprobs(self) -> int | None:
        """Top alternatives per new token's logprob (None: no logprobs for the output)."""
        return self.params.logprobs

    @property
    def prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs

    @property
    def logprobs_mode(self) -> str:
        return self.params.logprobs_mode


def sampling_law(decoder, params: SamplingParams) -> SamplingConfig:
    """The checks of a request that depend on the decoder's model (token ids against its vocabulary, the grammar,
    compiled here for its tokenizer), then the request's sampling law: the explicit settings (by field name:
    sampling.config_values), the rest from the target's generation config as transformers' `generate` takes them
    (its temperature, top_k and top_p when it sets do_sample, else greedy); processors are off unless given."""
    values: dict[str, Any] = config_values(params)
    try:
        values["logit_bias"] = check_logit_bias(params.logit_bias, decoder.vocab_size)
    except MultispecError as e:
        raise ParamError(str(e), "logit_bias") from None
    try:
        token_ids(params.stop_token_ids, "stop_token_ids", decoder.vocab_size)
    except MultispecError as e:
        raise ParamError(str(e), "stop_token_ids") from None
    values["grammar"] = request_grammar(params, decoder)
    if params.temperature is None:
        gc = getattr(decoder.pair.target, "generation_config", None)
        if gc is None or not getattr(gc, "do_sample", False):
            values["temperature"] = 0.0
        else:
            values["temperature"] = float(gc.temperature if gc.temperature is not None else 1.0)
            if params.top_k is None and gc.top_k:  # transformers' top_k 0 means off
                values["top_k"] = gc.top_k
            if params.top_p is None and gc.top_p is not None and gc.top_p < 1.0:
                values["top_p"] = gc.top_p
    return SamplingConfig(**values)


def prompt_ids(decoder, prompt, messages: list[dict] | None, chat_template: str | None) -> list[int]:
    """The prompt's token ids: a str or ids (text.encode_prompt), or messages rendered by the chat template."""
    if messages is None and chat_template is None:
        return encode_prompt(decoder.pair.tokenizer, decoder.vocab_size, prompt)
    check(prompt is None, "give a prompt or messages, not both")
    check(messages is not None, "chat_template applies to messages")
    return encode_chat(decoder.pair.tokenizer, decoder.vocab_size, messages, chat_template)


def prepare_one(decoder, ids: list[int], params: SamplingParams, sampling: SamplingConfig,
                seed: int | None) -> PreparedRequest:
    """One prompt's request: its reproducible mode (by whether a seed was given), its seed (drawn when None), its
    length fitted to the decoder's context and the tokens that end it."""
    reproducible = reproducible_mode(decoder, params.reproducible, seed, sampling)
    warnings: list[str] = []
    max_new_tokens = fit_context(decoder.context, len(ids), params.max_new_tokens, warnings)
    ends = (set() if params.ignore_eos else set(decoder.eos_ids)) | set(params.stop_token_ids)
    return PreparedRequest(prompt_ids=tuple(ids), params=params, sampling=sampling, seed=seed_or_fresh(seed),
                           reproducible=reproducible, max_new_tokens=max_new_tokens, stop=params.stop,
                           eos_ids=frozenset(ends), warnings=tuple(warnings))


def fit_context(limit: int | None, prompt_len: int, max_new_tokens: int, warnings: list[str]) -> int:
    """max_new_tokens that fits a context of `limit` positions (None: no limit): refuse a prompt that fills it;
    cap max_new_tokens with a warning (vLLM's behaviour)."""
    if limit is None:
        return max_new_tokens
    if max_new_tokens == 0:  # the prompt's logprobs only: every position may hold a prompt token
        check(prompt_len <= limit, f"the prompt has {prompt_len} tokens but the model has {limit} positions; "
                                   f"shorten it to at most {limit} tokens")
        return 0
    check(prompt_len < limit, f"the prompt has {prompt_len} tokens but the model has {limit} positions; "
                              f"shorten it to at most {limit - 1} tokens (e.g. keep its last ones)")
    if prompt_len + max_new_tokens > limit:
        warnings.append(f"max_new_tokens capped from {max_new_tokens} to {limit - prompt_len}: the prompt's "
                        f"{prompt_len} tokens + {max_new_tokens} would pass the model's {limit} positions")
        return limit - prompt_len
    return max_new_tokens


def reproducible_mode(decoder, reproducible: bool | None, seed, sampling: SamplingConfig) -> bool:
    """Whether a run verifies with position-keyed noise (the text fixed by the seed whatever the method, plan or
    batch). None: on for a seeded run of a method whose registry entry says so (auto, whose plans follow measured
    timings: without the mode its seed would not fix its text); off otherwise, where a seed already fixes a
    method's own run and the mode costs up to 20 % of sd's speed (docs/reproducible.md)."""
    check(reproducible is None or isinstance(reproducible, bool),
          f"reproducible must be True, False or None, got {reproducible!r}")
    has_mode = not decoder.config.target_init
    if reproducible is None:
        return decoder.entry.reproducible_when_seeded and seed is not None and has_mode and not sampling.greedy
    if reproducible and not has_mode:
        raise ParamError(f"method {decoder.config.name!r} draws level 1 from the target (P1's longest chain): it "
                         "has no reproducible mode", "reproducible")
    return reproducible and not sampling.greedy


def prepare_many(decoder, prompts: list, params: SamplingParams, seeds: list | None = None) -> list[PreparedRequest]:
    """`Decoder.prepare` for several prompts (str or token ids) with one SamplingParams, checked once (one grammar
    compiled, shared: each run starts its own state). seeds: one per prompt (None: a fresh one, and the
    reproducible mode's default off, as for one prompt), or None: params.seed for every prompt. An error names its
    prompt, prompts[i]."""
    sampling = decoder.check_request(params)
    seeds = [params.seed] * len(prompts) if seeds is None else seeds
    check(len(seeds) == len(prompts), f"internal: {len(seeds)} seeds for {len(prompts)} prompts")
    out = []
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        try:
            out.append(prepare_one(decoder, prompt_ids(decoder, prompt, None, None), params, sampling, seed))
        except ParamError:  # a setting's error: not the prompt's
            raise
        except MultispecError as e:
            raise MultispecError(f"prompts[{i}]: {e}") from None
    return out
