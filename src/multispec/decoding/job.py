"""One request as it decodes: what the text level reads and fills beside the token ids (its stop strings, its
stream, its logprob recorder), and its GenerationResult at the end (Decoder.run_prepared; BatchEngine.add)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from multispec.decoding.grammar import grammar_stats
from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.metrics import Metrics
from multispec.decoding.request import PreparedRequest
from multispec.decoding.result import GenerationResult
from multispec.text import StopStrings, Streamer


@dataclass
class Job:
    """prepared: the request; ids: its prompt ids; recorder: its logprob recorder (None when it asks for none);
    stops: its stop strings; streamer: its stream; profile: the digest of the machine profile it was planned from
    (its stats name it: a server that learns between requests plans each from a newer one)."""

    prepared: PreparedRequest
    ids: list[int]
    recorder: LogprobRecorder | None
    stops: StopStrings
    streamer: Streamer
    profile: str | None = None

    sampling = property(lambda self: self.prepared.sampling)
    seed = property(lambda self: self.prepared.seed)
    stop = property(lambda self: self.stops.cut_ids if self.stops else None)  # for the engine: a cut length or None

    @classmethod
    def begin(cls, tokenizer, prepared: PreparedRequest, stream: Callable | None = None,
              stream_chunks: bool = False, profile: str | None = None) -> "Job":
        params, sampling = prepared.params, prepared.sampling
        recorder = None
        if params.wants_logprobs:
            recorder = LogprobRecorder(top=0 if params.logprobs is None else params.logprobs,
                                       mode=params.logprobs_mode, prompt=params.prompt_logprobs)
        stops = StopStrings(tokenizer, list(prepared.stop), after_tokens=sampling.min_tokens)
        streamer = Streamer(stops, stream, tokens=stream_chunks,
                            recorder=recorder if params.logprobs is not None else None)
        return cls(prepared, list(prepared.prompt_ids), recorder, stops, streamer, profile)

    def partial(self) -> GenerationResult:
        """The result of a job stopped part-way: the tokens streamed so far (finish_reason "abort")."""
        new = list(self.streamer.latest)
        return GenerationResult(token_ids=new, text=self.stops.decode(new),
                                stats={"seed": self.seed, "new_tokens": len(new),
                                       "warnings": list(self.prepared.warnings)}, finish_reason="abort")

    def finish(self, stats_of: Callable, new: list[int], metrics: Metrics) -> GenerationResult:
        """The finished job's GenerationResult: its text cut at a stop string, the stream flushed, its stats
        (stats_of(metrics, sampling, reproducible): the Decoder's `stats`)."""
        prepared, sampling, recorder, params = self.prepared, self.sampling, self.recorder, self.prepared.params
        warnings = list(prepared.warnings)
        text, new_ids = self.stops.final(new)
        self.streamer.flush(text, new_ids)
        stats = stats_of(metrics, sampling, prepared.reproducible)
        if self.profile is not None:
            stats["profile"] = self.profile
        stats.update(seed=self.seed, prompt_tokens=len(self.ids), max_new_tokens=prepared.max_new_tokens,
                     warnings=warnings)
        stats.update(grammar_stats(sampling.grammar, new_ids, metrics, warnings))
        if recorder is not None:
            stats["logprobs_mode"] = recorder.mode
        return GenerationResult(
            token_ids=new_ids, text=text, stats=stats, finish_reason=metrics.finish_reason,
            logprobs=recorder.tokens[:len(new_ids)] if recorder is not None and params.logprobs is not None else None,
            prompt_logprobs=recorder.prompt_tokens if recorder is not None and params.prompt_logprobs else None)
