"""A Decoder's machine profile (multispec/profile.py): what it measures when built, and the new profile its runs'
observations make.

    view, measured = auto_view(decoder, profile)      # at construction: the costs and priors auto plans from
    new = updated(profile, observations)              # pure: only an explicit save keeps it

Measuring happens here, when the Decoder is built — never inside a generation: a policy reads its view of the
profile and reports what it observed, and nothing is written behind the caller's back.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import weakref

import torch

from multispec.drafting.auto import memory
from multispec.drafting.auto.policy import AutoView
from multispec.drafting.costs import (combined_drift, cost_entry_key, cost_model_from, measure_costs, updated_entry,
                                     valid_entry)
from multispec.models.base import forward_chain
from multispec.profile import MachineProfile

CALIBRATION_CONTEXT = 64  # tokens of the target's context before the costs are timed (a short prompt's)


def auto_view(decoder, profile: MachineProfile) -> tuple[AutoView, dict]:
    """The view of `profile` auto plans from on the backends of `decoder` (the Decoder being built): its cost model
    (measured now when the profile has none for these models, backends, threads and CPU) and acceptance priors.
    Returns the view and the new "costs" entries ({} when nothing was measured)."""
    target, draft = decoder._backends(decoder.cache_rows(CALIBRATION_CONTEXT + 2 * 64))
    draft = draft if "draft" in getattr(decoder.policy, "proposers", ()) else None  # a draft model or a head
    t_model, d_model = getattr(target, "model", target), getattr(draft, "model", draft) if draft is not None else None
    key = cost_entry_key(target, t_model, draft, d_model)
    costs = cost_model_from(profile, key, draft is not None)
    measured: dict = {}
    if costs is None:
        with torch.inference_mode():
            # as a generation's first round finds them: the target after a prompt, the draft (whose prefill auto
            # defers) empty; a feature head may then be timed over as many rows as the target holds
            for b in (target, draft):
                if b is not None:
                    b.reset()
            limit = target.max_positions
            room = CALIBRATION_CONTEXT if not limit else min(CALIBRATION_CONTEXT, limit // 2)
            forward_chain(target, torch.arange(1, room + 1) % int(target.vocab_size), last_only=True)
            costs, entry = measure_costs(target, t_model, draft, d_model)
            for b in (target, draft):
                if b is not None:
                    b.reset()
        measured[key] = entry
    identities = (memory.model_identity(t_model), memory.model_identity(d_model))
    return AutoView(costs, profile.sections["acceptance"], identities), measured


def adapt_view(decoder, profile: MachineProfile, view: AutoView) -> tuple[AutoView, dict]:
    """`view` with the seconds of one update of the head the decoder's policy adapts (drafting/adapting.py, its
    AdaptView): the profile's, timed now when it has none for this target, head, backend, update size, threads and
    CPU (models/eagle_adapt.time_update). Returns the view and the new "costs" entry ({} when nothing was timed;
    `view` itself where the policy adapts no head)."""
    from multispec.drafting.adapting import AdaptingPolicy, AdaptView, update_key, valid_update_entry
    from multispec.models.eagle_adapt import time_update

    policy = decoder.policy
    if not isinstance(policy, AdaptingPolicy):
        return view, {}
    target, head = decoder._backends(decoder.cache_rows(CALIBRATION_CONTEXT + 2 * 64))
    key = update_key(cost_entry_key(target, getattr(target, "model", target), head, getattr(head, "model", head)),
                     policy.settings)
    entry, measured = profile.get("costs", key), {}
    if not valid_update_entry(entry):
        entry = {"update_s": time_update(policy.shared, head, policy.settings)}
        measured[key] = entry
    return AdaptView(view.costs, view.acceptance, view.identities, update_s=float(entry["update_s"])), measured


def updated(profile: MachineProfile, observations: list[dict]) -> MachineProfile:
    """`profile` with runs' observations folded in (each a policy's `observation()`, every run planned from
    `profile`). Pure."""
    record = Observations()
    for obs in observations:
        record.add(obs, profile)
    return record.profile(profile)


class Observations:
    """What a decoder family's runs observed, kept as running aggregates (a server's runs for days stay small):
    - acceptance: per key, the profile's entry moved halfway towards each generation's statistics in turn
      (drafting/auto/memory.blended);
    - costs: per key and model, every run's timed ratios, combined into one drift (runs timed against the same
      profile combine: they do not compound), and the runs' fitted overheads (the last OVERHEADS; their median)."""

    OVERHEADS = 64

    def __init__(self):
        self.acceptance: dict[str, dict] = {}
        self.timed: dict[str, dict[str, list[float]]] = {}  # key -> model -> [Σ n·log(ratio), Σ n]
        self.overheads: dict[str, list[dict]] = {}
        self.runs = 0
        self._lock = threading.Lock()  # a server's batch reports from its loop thread; a save reads from another

    def add(self, observation: dict | None, base: MachineProfile) -> None:
        if not observation:
            return
        with self._lock:
            self.runs += 1
            for key, seen in (observation.get("acceptance") or {}).items():
                old = self.acceptance.get(key) or base.get("acceptance", key)
                self.acceptance[key] = memory.blended(old if memory.valid_entry(old) else None, seen)
            for key, seen in (observation.get("costs") or {}).items():
                sums = self.timed.setdefault(key, {})
                for which, (ratio, n) in (seen.get("timed") or {}).items():
                    if ratio > 0 and n > 0:
                        acc = sums.setdefault(which, [0.0, 0.0])
                        acc[0] += n * math.log(ratio)
                        acc[1] += n
                if seen.get("overhead"):
                    self.overheads.setdefault(key, []).append(seen["overhead"])
                    del self.overheads[key][:-self.OVERHEADS]

    def __len__(self) -> int:
        return self.runs

    def acceptance_entries(self) -> dict:
        """The acceptance entries so far (a copy)."""
        with self._lock:
            return dict(self.acceptance)

    def profile(self, base: MachineProfile) -> MachineProfile:
        """`base` with every observation folded in."""
        with self._lock:
            costs = {}
            for key, sums in self.timed.items():
                entry = base.get("costs", key)
                if entry is None or not valid_entry(entry, entry.get("draft") is not None):
                    continue
                drift = combined_drift([{w: [math.exp(s / n), n] for w, (s, n) in sums.items() if n}])
                overheads = self.overheads.get(key) or []
                overhead = {k: statistics.median(o[k] for o in overheads) for k in overheads[-1]} \
                    if overheads else None
                costs[key] = updated_entry(entry, drift, overhead)
            return base.with_entries("acceptance", dict(self.acceptance)).with_entries("costs", costs)


class MachineState:
    """A Decoder family's machine profile (shared by the decoders it spawns and its batch engines): the profile it
    plans from (what it lacked measured at construction), auto's view of it, and what its runs observed.

    learning (off unless the owner turns it on: `multispec serve` does): after each run, the acceptance its family
    observed so far is folded into the profile the next runs plan from (`roll`), so a server's later requests start
    from what its earlier ones learned. Each run's stats name the digest of the profile it was planned from."""

    def __init__(self, profile: MachineProfile | str | None):
        from multispec.profile import resolve

        self.profile, self.is_default = resolve(profile)
        self.observations = Observations()
        self.auto_view: AutoView | None = None
        self.learning = False
        self._policies: weakref.WeakSet = weakref.WeakSet()  # the family's policies (each plans from auto_view)

    def track(self, policy) -> None:
        """A new policy of the family: it plans from the family's view (now, and after every `roll`)."""
        self._policies.add(policy)
        if self.auto_view is not None:
            policy.use_profile(self.auto_view)

    def observe(self, observation: dict | None) -> None:
        """What a run observed (its policy's `observation()`): recorded; folded in at once when learning."""
        self.observations.add(observation, self.profile)
        if self.learning and observation:
            self.roll()

    def roll(self) -> None:
        """The profile with the acceptance observed so far folded in becomes the one the family plans from (the
        costs stay those measured: their drift is folded in only by `Decoder.updated_profile`)."""
        if self.auto_view is None:
            return
        self.profile = self.profile.with_entries("acceptance", self.observations.acceptance_entries())
        self.auto_view = dataclasses.replace(self.auto_view, acceptance=self.profile.sections["acceptance"])
        for policy in list(self._policies):
            policy.use_profile(self.auto_view)

    def measured(self, section: str, entries: dict) -> None:
        """Entries measured because the profile lacked them: part of the profile from now on, and added to the
        default file when the profile is the default (a first run on a machine measures once)."""
        if entries:
            self.profile = self.profile.with_entries(section, entries, source="measured")
            if self.is_default:
                from multispec.profile import add_to_default

                add_to_default(section, entries)

    def rows(self, decoder) -> None:
        """Set the few-row tables (models/rows.py) of the models this decoder runs products for (the fast
        backend's target and draft, a feature head and its target) from the profile, measured now where it has
        none: the Pair's sidecars then build their fast steps on them."""
        from multispec.models.rows import profile_key, table

        models = [decoder.pair.target, decoder.draft_model] if decoder.backend in ("fast", "compiled") else []
        if decoder.entry.drafts_with_own(decoder.config):
            models += [decoder.pair.target, *(m for m in decoder.loaded.values() if isinstance(m, torch.nn.Module))]
        for model in dict.fromkeys(m for m in models if m is not None):
            sidecar, key = decoder.pair.sidecar(model), profile_key(model)
            if key is not None and key not in self.profile.sections["rows"] and sidecar.has_rows_table:
                rows, measured = sidecar.rows_table, {key: sidecar.rows_table}  # measured already in this process
            else:
                rows, measured = table(model, self.profile)
            sidecar.rows_table = rows
            self.measured("rows", measured)

    def attach(self, decoder) -> None:
        """Give the decoder's policy its view of the profile: auto (a policy without fixed costs) and an adapting
        head's policy (eagle's too: its rounds and updates priced) get one, built and measured the first time."""
        if getattr(decoder.policy, "fixed_costs", False) is not None:
            return
        if self.auto_view is None:
            view, measured = auto_view(decoder, self.profile)
            self.measured("costs", measured)
            self.auto_view, measured = adapt_view(decoder, self.profile, view)  # an adapting head's update
            self.measured("costs", measured)
        self.track(decoder.policy)
