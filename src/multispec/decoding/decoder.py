"""The Decoder: one pair, one method, one backend kind, built once; then `run` token ids or `generate` text as often
as you like. Everything that does not depend on the prompt is resolved at construction: the method's validated
config, its trained models (read from disk once), its draft policy, the backends and their caches.

    decoder = Decoder(pair, "mcsd", tree=(4, 2, 2, 1))
    result = decoder.generate("def f(x):", max_new_tokens=64, temperature=0)   # text in, GenerationResult out
    ids, metrics = decoder.run(prompt_ids, sampling, max_new_tokens=64, seed=0)  # token ids in and out

A Decoder owns its caches, so it runs one generation at a time; `spawn()` gives another that shares its read-only
`parts` (the server keeps one per worker). `generate`, `bench` and `serve` all decode through this class.
What it knows of the machine is a value (`profile=`, multispec/profile.py), completed when it is built, never
inside a generation; runs report observations, and only an explicit save of `updated_profile()` keeps them.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Callable

from multispec.decoding.engine import generate_ids
from multispec.decoding.job import Job
from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.methods import MethodConfig, build_method, get_method
from multispec.decoding.metrics import Metrics
from multispec.decoding.parts import DecoderParts
from multispec.decoding.request import (PreparedRequest, fit_context, prepare_many, prepare_one, prompt_ids,
                                        reproducible_mode, sampling_law)
from multispec.decoding.result import GenerationResult
from multispec.decoding.state import choose_verifier
from multispec.decoding.pair_checks import (backend_name, cross_vocab_backend, refuse_trees_where_inexact,
                                            refuse_where_retokenizing)
from multispec.errors import attach_partial, check
from multispec.loading import Pair, eos_ids, max_positions, vocab_rows
from multispec.models.base import Backend
from multispec.params import SamplingParams
from multispec.profile import MachineProfile
from multispec.sampling import SamplingConfig


class Decoder:
    """See the module docstring. method: a registered method name (options as keywords) or a built MethodConfig.
    backend: "hf", "fast" or "compiled" (default: the fast one where the models have it, compiled for a pair loaded
    with compile=True, else "hf": pair_checks.default_backend).
    wrap_target(backend) -> backend: wraps the target backend (the bench's shadow target). loaded: the method's
    trained models, already read (spawn passes them). draft_vocab=N: the draft's output layer restricted to the
    N most frequent tokens plus the prompt's (grown with every committed token); draft_dtype="int8": int8 draft
    weights (CPU). Both only make the draft cheaper: the output law is the target's either way (models/cheap.py).
    `auto`, given neither, uses the form of the draft whose step is fastest here (draft_dtype="float32": the draft
    as loaded). profile: the machine profile (a MachineProfile, a file path, or None: the cache folder's default,
    to which a first run on a machine adds what it measured)."""

    # set from the DecoderParts by _start (the rest of the parts too: config, entry, pair, backend, ...)
    eos_ids: set
    vocab_size: int
    context: int | None

    def __init__(self, pair: Pair, method: str | MethodConfig = "auto", backend: str | None = None, *,
                 wrap_target: Callable | None = None, loaded: dict | None = None, draft_vocab: int | None = None,
                 draft_dtype: str | None = None, profile: MachineProfile | str | None = None, **method_options):
        from multispec.decoding.profiles import MachineState

        check(isinstance(pair, Pair), f"pair must be a multispec Pair from load_pair(), got {type(pair).__name__}")
        self.machine = MachineState(profile)  # the profile, checked before any model work
        if isinstance(method, MethodConfig):
            check(not method_options, "give method options to build_method, not beside a built MethodConfig")
            self.config = method
        else:
            self.config = build_method(method, **method_options)
        self.entry = get_method(self.config.name)
        if self.entry.complete is not None:  # defaults read from the pair (eagle: its head's recorded draft shape)
            self.config = self.entry.complete(self.config, pair)
        check(not self.entry.needs_draft or pair.draft is not None,
              f"method {self.config.name!r} needs a draft model; load the pair with a draft")
        self.uses_draft = pair.draft is not None and self.entry.drafts_with_model(self.config)
        self.pair, self.backend, self.wrap_target = pair, backend_name(pair, backend, self.uses_draft), wrap_target
        drafting = pair.draft if self.uses_draft else None  # the draft model, when this decoder drafts with it
        from multispec.models.cheap import CheapDraft

        self.cheap = CheapDraft(vocab=draft_vocab, dtype=draft_dtype)  # validated here, one line on bad values
        if self.entry.chooses_cheap_draft and not self.cheap.active and draft_dtype is None and drafting is not None \
                and pair.cross_vocab is None:  # auto: the fastest form of the draft on this machine (models/cheap)
            from multispec.models.cheap import choose_cheap_draft

            self.cheap, measured = choose_cheap_draft(drafting, pair.tokenizer, self.backend,
                                                      pair.sidecar(drafting), self.profile)
            self.machine.measured("cheap_draft", measured)
        check(not self.cheap.active or self.uses_draft, f"draft_vocab / draft_dtype make the draft model cheaper, and "
                                                        f"method {self.config.name!r} does not draft with one here")
        check(self.cheap.vocab is None or pair.cross_vocab is None,
              "draft_vocab restricts a draft that shares the target's vocabulary; a draft with another tokenizer "
              "already drafts from the tokens the two vocabularies share")
        self.draft_model = self.cheap.draft_model(drafting, pair.sidecar(drafting)) if drafting is not None else None
        self.token_freq = self.cheap.frequencies(pair.tokenizer, vocab_rows(drafting)) \
            if drafting is not None else None
        refuse_trees_where_inexact(pair, self.config, self.uses_draft)
        self.loaded = loaded if loaded is not None else \
            (self.entry.load(self.config, pair) if self.entry.load is not None else {})
        # a draft of another tokenizer reads a window of the text where its positions run out (models/intersection)
        models = [pair.target] + ([pair.draft] if pair.draft is not None and self.config.name != "ar"
                                  and pair.cross_vocab is None else [])
        limits = [n for n in (max_positions(m) for m in models) if n is not None]
        self.machine.rows(self)  # the few-row tables its products follow, from the profile
        self._start(DecoderParts(
            config=self.config, entry=self.entry, pair=pair, backend=self.backend, wrap_target=wrap_target,
            uses_draft=self.uses_draft, cheap=self.cheap, draft_model=self.draft_model, token_freq=self.token_freq,
            loaded=self.loaded, eos_ids=eos_ids(pair), vocab_size=vocab_rows(pair.target),
            context=min(limits) if limits else None))  # context: the model's positions (None: the configs say none)
        self.machine.attach(self)  # auto: its view of the profile (what it lacks measured now)
        if self.uses_draft and pair.cross_vocab == "uag":
            refuse_where_retokenizing(self.config, self.entry, self.policy)

    def _start(self, parts: DecoderParts, warm_up: bool = True) -> None:
        """Take the shared, read-only parts (a new Decoder's own or a spawned twin's) and make this
        decoder's own state: a fresh draft policy, no backends yet (warm_up: compile a compiled backend's steps
        now)."""
        self.parts = parts
        for f in fields(parts):
            setattr(self, f.name, getattr(parts, f.name))
        self.policy = self.new_policy()
        self._target: Backend | None = None
        self._draft: Backend | None = None
        self._rows = 0  # static-cache rows of the current fast/compiled backends
        if warm_up:
            self._warm_up()

    def new_policy(self):
        """A draft policy of this decoder's method with its own adaptive state, planning from the family's view of
        the machine profile where it has one (a BatchEngine's slots take one each)."""
        policy = self.parts.entry.make_policy(self.parts.config, self.parts.pair, self.parts.loaded)
        self.machine.track(policy)
        return policy

    def _warm_up(self) -> None:
        """A compiled backend compiles every step size now, not mid-generation (once per pair: the sidecar keeps it)."""
        if self.backend == "compiled":
            for b in self._backends(1):  # compiled backends (FastBackend) have warm_up
                if b is not None:
                    b.warm_up()

    def spawn(self) -> "Decoder":
        """Another Decoder of the same pair, method and backend, sharing what this one read or built once (its
        `parts`: the trained models, the cheap draft's copy and token frequencies; its machine profile and record
        of observations), with its own policy and caches."""
        twin = Decoder.__new__(Decoder)  # nothing to resolve again: the parts are done
        twin.machine = self.machine  # one profile and record for the family (a server saves it once)
        twin._start(self.parts)
        return twin

    # ------------------------------------------------------------------ the machine profile
    profile = property(lambda self: self.machine.profile, doc="The MachineProfile this decoder plans from.")
    observations = property(lambda self: self.machine.observations, doc="What its family's runs observed.")

    def updated_profile(self) -> MachineProfile:
        """The profile with its family's observations folded in: a new value (`.save(path)` it to keep it)."""
        return self.observations.profile(self.profile)

    # ------------------------------------------------------------------ token ids
    def fit_context(self, prompt_len: int, max_new_tokens: int, warnings: list[str]) -> int:
        """max_new_tokens that fits the context (request.fit_context)."""
        return fit_context(self.context, prompt_len, max_new_tokens, warnings)

    def run(self, prompt_ids: list[int], sampling: SamplingConfig, max_new_tokens: int, seed: int,
            stop=None, on_tokens=None, reproducible: bool = False, eos_ids: set[int] | None = None,
            logprobs: LogprobRecorder | None = None) -> tuple[list[int], Metrics]:
        """Decode up to max_new_tokens after prompt_ids (checked by the caller: see `generate`). stop(new_ids) ->
        cut length or None; on_tokens(new_ids) after each round; reproducible: see `generate`; eos_ids: the tokens
        that end the output (default: the pair's EOS); logprobs: filled as tokens are committed. Returns the new
        ids and the metrics record."""
        target, draft = self._backends(len(prompt_ids) + max_new_tokens)
        if draft is not None and self.cheap.vocab is not None:  # this prompt's draft vocabulary
            draft.set_vocab_subset(self.cheap.subset(self.token_freq, prompt_ids))
        try:
            return generate_ids(target, draft, prompt_ids, self.config, sampling, max_new_tokens, seed,
                                self.eos_ids if eos_ids is None else eos_ids, stop, on_tokens, self.policy,
                                reproducible, logprobs)
        finally:
            self.machine.observe(self.policy.observation())

    def cache_rows(self, tokens: int) -> int:
        """Static-cache rows a run of `tokens` (prompt + new tokens) needs: those, the round's root, and one more
        round's largest tree (the last round may draft past the end)."""
        return tokens + 1 + self.entry.max_tree_nodes(self.config) + 1

    def _backends(self, tokens: int):
        """The backends, built once; a static cache (fast, compiled) is rebuilt larger when a run needs more rows
        than it has: prompt + new tokens + one more round's largest tree (the last round may draft past the end)."""
        from multispec.models import make_backend

        if self.backend == "hf":
            rows = 0
        else:
            rows = self.cache_rows(tokens)
        if self._target is None or rows > self._rows:
            kw = {} if self.backend == "hf" else {"max_len": rows}
            target = make_backend(self.pair.target, self.backend, sidecar=self.pair.sidecar(self.pair.target), **kw)
            self._target = self.wrap_target(target) if self.wrap_target is not None else target
            self._draft = None
            if self.uses_draft:
                draft_model = self.draft_model  # set whenever uses_draft (__init__)
                if draft_model is None:
                    raise RuntimeError("Decoder: drafts with a draft model but has none")
                self._draft = make_backend(draft_model, self.backend, sidecar=self.pair.sidecar(draft_model), **kw) \
                    if self.pair.cross_vocab is None \
                    else cross_vocab_backend(self.pair, draft_model, self.backend, len(self.config.tree))
            if self.entry.drafts_with_own(self.config):  # a trained drafter of the method's own (a feature head)
                own = self.entry.draft_backend
                assert own is not None
                self._target, self._draft = own(self.config, self.loaded, self._target, self.pair)
            self._rows = rows
        return self._target, self._draft

    # ------------------------------------------------------------------ text
    def check_request(self, params: SamplingParams) -> SamplingConfig:
        """The checks of a request that depend on the model, then its sampling law, the grammar compiled
        (request.sampling_law). `prepare` calls it once per request."""
        return sampling_law(self, params)

    def prepare(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                chat_template: str | None = None, **settings) -> PreparedRequest:
        """Check and default one request, once, before any model runs: prompt (a str, or token ids) or messages (a
        conversation, rendered by the chat template: text.encode_chat), params (a SamplingParams, or its fields as
        keywords). Returns the PreparedRequest that `run_prepared` runs without checking it again (the grammar
        compiled, the seed drawn when None, the reproducible mode decided, max_new_tokens fitted to the context)."""
        params = SamplingParams.of(params, settings)
        sampling = self.check_request(params)
        return prepare_one(self, prompt_ids(self, prompt, messages, chat_template), params, sampling, params.seed)

    def prepare_many(self, prompts: list, params: SamplingParams, seeds: list | None = None) -> list[PreparedRequest]:
        """`prepare` for several prompts with one SamplingParams, checked once (request.prepare_many)."""
        return prepare_many(self, prompts, params, seeds)

    def generate(self, prompt=None, params: SamplingParams | None = None, *,
                 stream: Callable[[str], None] | None = None, stream_chunks: bool = False,
                 messages: list[dict] | None = None, chat_template: str | None = None,
                 **settings) -> GenerationResult:
        """Decode `prompt` (or `messages`) with `params` (a SamplingParams; or its fields as keywords:
        max_new_tokens, temperature, ..., see `multispec.generate`): `prepare`, then `run_prepared`. Every input is
        checked before any model runs; a failure part-way raises with `.partial`, the GenerationResult of the tokens
        committed so far (finish_reason "abort"). stream(text_delta) as text is committed; stream_chunks (the
        server's): `stream` gets text.StreamChunks, each delta with the tokens it covers and their logprobs,
        instead of bare deltas."""
        check(stream is None or callable(stream), f"stream must be a callable taking a text delta, got {stream!r}")
        check(isinstance(stream_chunks, bool), f"stream_chunks must be True or False, got {stream_chunks!r}")
        prepared = self.prepare(prompt, params, messages=messages, chat_template=chat_template, **settings)
        return self.run_prepared(prepared, stream=stream, stream_chunks=stream_chunks)

    def run_prepared(self, prepared: PreparedRequest, *, stream: Callable[[str], None] | None = None,
                     stream_chunks: bool = False) -> GenerationResult:
        """Decode a request `prepare` checked (nothing is checked again); see `generate` for stream, stream_chunks
        and the partial result of a failure."""
        job = Job.begin(self.pair.tokenizer, prepared, stream, stream_chunks, profile=self.profile.digest)
        try:
            new, metrics = self.run(job.ids, job.sampling, prepared.max_new_tokens, job.seed, job.stop,
                                    job.streamer.on_tokens, prepared.reproducible, set(prepared.eos_ids),
                                    job.recorder)
        except BaseException as e:  # keep what was committed: the caller gets it as e.partial, then the error
            attach_partial(e, job.partial())
            raise
        return job.finish(self.stats, new, metrics)

    def reproducible_mode(self, reproducible: bool | None, seed, sampling: SamplingConfig) -> bool:
        """Whether a run verifies with position-keyed noise (request.reproducible_mode)."""
        return reproducible_mode(self, reproducible, seed, sampling)

    def stats(self, metrics: Metrics, sampling: SamplingConfig, reproducible: bool = False) -> dict:
        """The stats schema (docs/architecture.md): what ran, then the metrics record, then the policy's own report
        (auto's plans under stats["auto"])."""
        c = self.config
        verifier = choose_verifier(c, sampling, reproducible).name  # the engine's own rule (decoding/state.py)
        stats = {
            "method": c.name,
            "lossless": c.lossless_at(sampling.temperature),
            "reproducible": reproducible,
            "verifier": verifier if c.name != "ar" or reproducible else None,
            "tree": list(c.tree),
            "temperature": sampling.temperature,
            "top_k": sampling.top_k, "top_p": sampling.top_p,
            "backend": self.backend,
            "target_dtype": self.pair.sidecar(self.pair.target).weights_dtype, "draft_vocab": self.cheap.vocab,
            "draft_dtype": self.cheap.dtype,
            "cross_vocab": self.pair.cross_vocab if self.uses_draft else None,
            "profile": self.profile.digest,
            "model": self.pair.models or None,  # what was loaded (loading.Pair.models): a GGUF file's name and hash
            **metrics.stats(),
        }
        extra = self.policy.report()
        if extra is not None:
            stats[c.name] = extra
        return stats

