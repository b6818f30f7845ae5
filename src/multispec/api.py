"""The Python API: `load_pair` and `generate`. `generate` is one call of a fresh `Decoder`; to decode many prompts
with one method, build the Decoder once (`multispec.decoding.decoder.Decoder`) and call its `generate`."""
from __future__ import annotations

import difflib
import inspect
from typing import Callable

from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.decoding.methods import DEFAULT_METHOD, REGISTRY
from multispec.loading import DEFAULT_PAIR_DIR, Pair, load_pair, max_positions, resolve_device
from multispec.errors import MultispecError, check
from multispec.params import FIELD_DEFAULTS, FIELDS, SamplingParams
from multispec.validate import SEED_LIMIT

__all__ = ["DEFAULT_PAIR_DIR", "Decoder", "GenerationResult", "Pair", "SEED_LIMIT", "SamplingParams", "generate",
           "load_pair", "max_positions", "resolve_device"]


def generate(pair: Pair, prompt: str | list[int] | list[str] | list[list[int]] | None = None,
             params: SamplingParams | None = None, *, method: str = DEFAULT_METHOD,
             messages: list[dict] | None = None, chat_template: str | None = None, backend: str | None = None,
             stream: Callable[[str], None] | None = None, batch_size: int | None = None,
             on_result: Callable[[int, GenerationResult], None] | None = None, profile=None,
             tools: list[dict] | None = None, tool_choice=None, **settings) -> GenerationResult | list[GenerationResult]:
    """Generate with `method` (auto, ar, sd, mcsd, ti-mcsd, dynamic, specdecpp, lookup, or any registered method).
    Method options: k, heuristic, confidence, entropy, tree, verifier, width, depth, decision_model, beta, head,
    threshold, k_min, k_max, ngram, proposers, max_nodes. stream(text_delta) is called as text is committed; the
    deltas add up to `result.text` exactly (text that could begin a stop string is held back until it is known not
    to). backend: "hf" (any transformers causal LM), "fast" (static cache, Llama family) or "compiled" (the fast
    backend, compiled); default: "fast" where the target (and the draft, when the method drafts with it) has it,
    "compiled" for a pair loaded with compile=True, else "hf" (one rule with the CLI and the server). profile: the
    machine profile auto plans from (a multispec.profile.MachineProfile or a file path; default the cache folder's,
    docs/profile.md): the run depends on it, never on what an earlier run left behind.

    The default, `auto`, picks every round between no speculation, prompt lookup and a draft chain or tree from
    acceptance and forward costs measured on this machine, so that it is not slower than plain decoding.

    prompt: a str, encoded as `tokenizer(prompt)` encodes it (with the special tokens the tokenizer itself adds,
    e.g. its BOS: transformers' and vLLM's default), or a 1-D sequence of integer token ids taken as they are (a
    list, or a [L] / [1, L] integer tensor or array). stop: a str or a list of non-empty strs.
    messages (instead of prompt): a conversation, [{"role": "system" | "user" | "assistant", "content": str}, ...],
    rendered by the tokenizer's chat template (or chat_template, a Jinja string) with the generation prompt, as
    vLLM's `LLM.chat` and transformers' pipelines do (text.encode_chat); the reply is the result.
    tools (with messages): OpenAI tool objects, rendered by the template (one with tool support: Qwen2.5's, or
    multispec's templates/hermes_tools.jinja), and tool_choice: "auto" (default), "none", "required" or
    {"type": "function", "function": {"name": ...}}; `result.tool_calls` holds the calls the reply made (OpenAI
    tool call objects). required, a named function or a function with strict: true constrain the reply by a
    grammar (its calls' names and arguments follow the tools' schemas, exactly as structured output does).

    Sampling processors, applied to the target's law exactly (every lossless method stays lossless with respect to
    the processed law; in a drafted tree each node is processed with its own path as history), OpenAI's and vLLM's
    meanings: min_p, repetition_penalty (prompt and output tokens), presence_penalty and frequency_penalty (output
    tokens), logit_bias ({token id: bias in [-100, 100]}), min_tokens (EOS / stop_token_ids impossible, and stop
    strings unchecked, before that many new tokens). ignore_eos: do not stop at EOS; stop_token_ids: more tokens
    that end the output (kept in token_ids, like EOS).
    logprobs=k (0..20): `result.logprobs`, each new token's log-probability and its row's k most likely tokens,
    from the verification forward that committed it; prompt_logprobs=True: `result.prompt_logprobs` (raw; allows
    max_new_tokens=0). logprobs_mode: "raw" (default: log_softmax of the target's logits) or "processed" (of the
    processed law), see multispec.decoding.logprobs.
    Structured output (at most one): json_schema (a dict, its JSON text or a pydantic model class), regex, choice
    (a list of strings) or grammar (Lark, or llama.cpp's GBNF): the output follows it exactly under every method
    (the target's law masked to what the grammar allows, each drafted node along its own path; tokens the grammar
    forces are committed without a target call) and ends with EOS where it completes; stats["structured"] reports
    the forced tokens and whether the output is complete (docs/structured.md).
    temperature=None takes the sampling defaults of the target's generation_config.json, as transformers'
    `generate` does: its temperature, top_k and top_p when it sets do_sample, otherwise greedy (temperature 0).
    Explicit top_k / top_p override the file's. seed=None draws a fresh seed (as transformers and vLLM sample
    afresh unless seeded); the seed used is `stats["seed"]`. reproducible=True (T > 0): drafter-invariant
    verification with noise keyed by (seed, position), so the text depends only on the target, the prompt, the
    sampling settings and the seed, under every method but the target-initialized ones (docs/reproducible.md).

    Context: a prompt with as many tokens as the model has positions (config max_position_embeddings or
    n_positions, the smaller of target and draft) is refused; when prompt + max_new_tokens would pass that
    limit, max_new_tokens is capped to fit and `stats["warnings"]` says so (vLLM's behaviour; finish_reason
    "length"). Every input is checked before any model runs. If generation fails part-way (an error or Ctrl-C),
    the exception carries `.partial`: a GenerationResult of the tokens committed so far (finish_reason "abort").

    settings: the sampling settings as keywords, the fields of SamplingParams (multispec.params: one list of them,
    shared with the Decoder, the server and the CLI), or params=, a SamplingParams (not both); any other keyword is
    an option of the method. Validated once, before any model loads.

    Several prompts (a list of str, or a list of token-id lists) decode as one batch, batch_size sequences at a
    time (default: all), and return one GenerationResult per prompt, in order (decoding/batch.py). Each sequence's
    output is what it would be alone (its law at T > 0; its tokens greedy, up to near-ties of the batched
    arithmetic). seed: one per prompt, or an int s (prompt i uses s + i; each result's stats["seed"] says which).
    Batches run on the fast backend by default where the model has one; on "hf" the sequences run one at a time.
    on_result(i, result) is called as each prompt's sequence finishes (in the order they finish). Interrupted
    (Ctrl-C, SIGTERM, an error from on_result), a batch stops its running sequences after their current round and
    the exception carries `.partial`: one result per prompt (finished, or finish_reason "abort" with the tokens so
    far, empty for a prompt not started).
    """
    method_options = {k: v for k, v in settings.items() if k not in FIELDS}
    _check_names(method_options)
    settings = {k: v for k, v in settings.items() if k in FIELDS}
    calls = None
    if tools is not None or tool_choice is not None:
        check(messages is not None, "tools apply to messages (a conversation)")
        calls, grammar = tool_request(pair, tools, tool_choice, settings)
        if grammar is not None:
            settings["grammar"] = grammar
    if messages is not None or chat_template is not None:
        from multispec.loading import vocab_rows
        from multispec.text import encode_chat

        check(prompt is None, "give a prompt or messages, not both")
        check(messages is not None, "chat_template applies to messages")
        prompt = encode_chat(pair.tokenizer, vocab_rows(pair.target), messages, chat_template,
                             calls.template_tools() if calls is not None else None, pair.target_path)
    check(prompt is not None, "the prompt must be a str or a list of token ids (or give messages, a conversation)")
    batch = _is_batch(prompt)
    seeds = settings.pop("seed", None) if batch else None  # per prompt: s + i from an int s, or one each from a list
    if params is not None:  # keywords left at their defaults beside params are not a second set of settings
        settings = {k: v for k, v in settings.items() if v is not None and v != FIELD_DEFAULTS[k]}
    params = SamplingParams.of(params, settings)  # validated once, before any model runs
    if batch:
        from multispec.decoding.batch_offline import generate_batch

        check(stream is None, "stream takes one prompt; for several prompts read each result's text (or pass "
                              "on_result)")
        decoder = Decoder(pair, method, backend, profile=profile, **method_options)
        return generate_batch(decoder, prompt, params, batch_size, on_result, seed=seeds)
    check(batch_size is None, "batch_size applies to a list of prompts")
    check(on_result is None, "on_result applies to a list of prompts; one prompt streams with stream=")
    decoder = Decoder(pair, method, backend, profile=profile, **method_options)
    result = decoder.generate(prompt, params, stream=stream)
    if calls is not None and calls.parse:
        from multispec.tool_calls import parse_tool_calls

        result.tool_calls = parse_tool_calls(result.text, calls.forced)[1]
    return result


def tool_request(pair: Pair, tools, tool_choice, settings: dict):
    """(the checked Tools or None, the grammar its calls follow or None); a grammar beside another structured-output
    setting is refused."""
    from multispec.structured import KINDS
    from multispec.tools import Tools

    calls = Tools.of(tools, tool_choice)
    grammar = calls.grammar(pair.tokenizer) if calls is not None else None
    given = [k for k in KINDS if settings.get(k) is not None]
    check(grammar is None or not given, f"{given[0] if given else ''} cannot be combined with tool_choice "
                                        f"{tool_choice!r:.60} (or a strict function): the calls' grammar constrains "
                                        "the reply")
    return calls, grammar


# names other libraries use for generate's arguments -> what multispec calls them
OTHER_NAMES = {"max_tokens": "max_new_tokens (OpenAI's max_tokens)",
               "max_length": "max_new_tokens (new tokens only; transformers' max_length counts the prompt too)",
               "stop_sequences": "stop", "stop_strings": "stop", "do_sample": "temperature (0 is greedy)",
               "random_seed": "seed", "num_beams": "none: speculative decoding samples one sequence"}
KEYED_VERIFIERS = ("gls", "gumbel")  # the reproducible mode's verifiers, chosen by reproducible=True


def _check_names(method_options: dict) -> None:
    """Before any work: a keyword that is another library's name for one of generate's arguments, or a near-miss
    of one, gets a did-you-mean line (instead of "method X does not take option Y")."""
    options = set().union(*(entry.option_names for entry in REGISTRY.values()))
    own = [n for n in inspect.signature(generate).parameters if n != "settings"] + sorted(FIELDS)
    for name in method_options:
        if name in OTHER_NAMES:
            raise MultispecError(f"generate() has no argument {name!r}; did you mean {OTHER_NAMES[name]}?")
        close = difflib.get_close_matches(name, own, n=1, cutoff=0.8)
        if close and name not in options:
            raise MultispecError(f"generate() has no argument {name!r}; did you mean {close[0]}?")


def _is_batch(prompt) -> bool:
    """A list or tuple of prompts (str or token-id sequences) rather than one prompt's token ids."""
    if not isinstance(prompt, (list, tuple)):
        return False
    return len(prompt) == 0 or any(isinstance(p, (str, list, tuple)) for p in prompt)

