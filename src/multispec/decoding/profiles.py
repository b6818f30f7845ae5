"""A Decoder's machine profile (multispec/profile.py): what it measures when built, and the new profile its runs'
observations make.

    profile, measured = auto_profile(decoder)     # at construction: the cost model auto plans from
    new = updated(decoder.profile, decoder.observations)   # pure: only an explicit save keeps it

Measuring happens here, when the Decoder is built — never inside a generation: a policy reads its view of the
profile and reports what it observed, and nothing is written behind the caller's back.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

from multispec.drafting.auto import memory
from multispec.drafting.auto.policy import AutoView
from multispec.drafting.costs import cost_entry_key, cost_model_from, measure_costs, updated_entry, _valid_entry
from multispec.models.base import forward_chain
from multispec.profile import MachineProfile

if TYPE_CHECKING:
    from multispec.decoding.decoder import Decoder

CALIBRATION_CONTEXT = 32  # tokens of context before the costs are timed (a short prompt's)


def auto_view(decoder: Decoder, profile: MachineProfile) -> tuple[AutoView, dict]:
    """The view of `profile` auto plans from on this decoder's backends: its cost model (measured now when the
    profile has none for these models, backends, threads and CPU) and acceptance priors. Returns the view and the
    new "costs" entries ({} when nothing was measured)."""
    target, draft = decoder._backends(decoder.cache_rows(CALIBRATION_CONTEXT + 64))
    draft = draft if "draft" in getattr(decoder.policy, "proposers", ()) else None  # a draft model or a head
    t_model, d_model = getattr(target, "model", target), getattr(draft, "model", draft) if draft is not None else None
    key = cost_entry_key(target, t_model, draft, d_model)
    costs = cost_model_from(profile, key, draft is not None)
    measured: dict = {}
    if costs is None:
        with torch.inference_mode():
            for b in (target, draft):
                if b is not None:
                    b.reset()
                    limit = b.max_positions
                    room = CALIBRATION_CONTEXT if not limit else min(CALIBRATION_CONTEXT, limit // 2)
                    forward_chain(b, torch.arange(1, room + 1) % int(b.vocab_size), last_only=True)
            costs, entry = measure_costs(target, t_model, draft, d_model)
            for b in (target, draft):
                if b is not None:
                    b.reset()
        measured[key] = entry
    identities = (memory.model_identity(t_model), memory.model_identity(d_model))
    return AutoView(costs, profile.sections["acceptance"], identities), measured


def updated(profile: MachineProfile, observations: list[dict]) -> MachineProfile:
    """`profile` with these observations folded in, in order (each a policy's `observation()`): acceptance blended
    halfway towards each generation's (drafting/auto/memory.blended), costs moved towards their measured drift with
    the fitted overheads (drafting/costs.updated_entry). Pure."""
    acceptance = dict(profile.sections["acceptance"])
    costs = dict(profile.sections["costs"])
    for obs in observations:
        for key, seen in (obs.get("acceptance") or {}).items():
            acceptance[key] = memory.blended(acceptance.get(key), seen)
        for key, seen in (obs.get("costs") or {}).items():
            entry = costs.get(key)
            if entry is not None and _valid_entry(entry, entry.get("draft") is not None):
                costs[key] = updated_entry(entry, seen.get("drift") or {}, seen.get("overhead"))
    return profile.with_entries("acceptance", acceptance).with_entries("costs", costs)


class Observations:
    """What a decoder's runs observed, in order (each a policy's `observation()`), for `updated`. A long-lived
    decoder (a server's) folds its older half into a profile once `keep` are held, so the record stays small."""

    def __init__(self, keep: int = 256):
        self.keep, self.records, self._folded = keep, [], None
        self._lock = threading.Lock()  # a server's lanes report from its loop thread; a save reads from another

    def add(self, observation: dict | None, base: MachineProfile) -> None:
        if not observation:
            return
        with self._lock:
            self.records.append(observation)
            if len(self.records) > self.keep:
                half = len(self.records) // 2
                self._folded = updated(self._folded or base, self.records[:half])
                del self.records[:half]

    def __len__(self) -> int:
        return len(self.records)

    def profile(self, base: MachineProfile) -> MachineProfile:
        """`base` with every observation folded in."""
        with self._lock:
            return updated(self._folded or base, list(self.records))
