"""What `auto` learned of acceptance, kept across generations in the machine profile (multispec/profile.py, section
"acceptance").

Per pair (target and draft or head, by identity: name, size, dtype and a few weights), proposer and temperature
range, the decayed statistics a generation ends with — draft and lookup acceptance by (depth, rank or n-gram
length), a draft chain's acceptance by confidence bucket, the suffix calibration, the probes' state — are what a
generation observes; `blended` moves a stored entry halfway towards them when a new profile is made. A generation
starts from the profile's entry instead of the priors, so a 64-token request is planned from what earlier requests
learned; a pair seen for the first time starts from the conservative priors (drafting/auto/acceptance.py).
Acceptance does not depend on the machine, so unlike the costs the key names no device or thread count.

The statistics only shape the plans; every plan is verified losslessly, so a stale or wrong entry costs speed,
never exactness. An entry that is not what multispec writes is ignored with one warning.
"""
from __future__ import annotations

import math

import torch

from multispec.paths import warn_once

BLEND = 0.5  # a generation moves the stored statistics this far towards what it saw
TEMPERATURE_EDGES = (0.0, 0.5, 0.9)  # ranges: T = 0, (0, 0.5], (0.5, 0.9], > 0.9
# Sections that are a state, not statistics: the latest generation's wins. The probes' back-off level and streak
# were blended like counts, so levels 3 and 4 stored 3.5, read back as 3, and the streak settled near its mean: the
# embedded pair at T = 1 probed the draft in the first round of nearly every request, through the whole prompt.
REPLACED = ("probe",)


def temperature_range(t: float) -> str:
    if t <= 0:
        return "T=0"
    for edge in TEMPERATURE_EDGES[1:]:
        if t <= edge:
            return f"T<={edge}"
    return f"T>{TEMPERATURE_EDGES[-1]}"


def model_identity(model) -> str:
    """Name, parameter count, dtype and a checksum of a few weights: the same weights give the same string."""
    if model is None:
        return "-"
    cfg = getattr(model, "config", None)
    name = getattr(cfg, "_name_or_path", "") or type(model).__name__
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    n = sum(p.numel() for p in params)
    dtype = str(params[0].dtype) if params else ""
    with torch.no_grad():
        check = sum(float(p.detach().reshape(-1)[:64].double().sum()) for p in params[:1] + params[-1:])
    return f"{name}|{n}|{dtype}|{check:.6g}"


def key(target_identity: str, draft_identity: str, draft_proposer: str, temperature: float) -> str:
    """One entry: the pair (model_identity of each; "-" without a draft), who drafts, the temperature range."""
    return "||".join((target_identity, f"{draft_proposer}:{draft_identity}", temperature_range(temperature)))


def recall(policy, view, temperature: float, levels: int) -> str:
    """Start an AutoPolicy from the acceptance its profile view (AutoView) holds for this pair at this temperature
    range, if any; returns the entry's key (for the observation the generation ends with)."""
    target_id, draft_id = view.identities if policy.has_draft else (view.identities[0], "-")
    entry = key(target_id, draft_id, policy.draft_proposer, temperature)
    stored = view.acceptance.get(entry)
    if stored is not None and not valid_entry(stored):
        warn_once("ignoring auto's acceptance priors for this pair in the machine profile: not what multispec "
                  "writes; starting from the defaults")
    elif stored is not None:
        restore(policy, stored, levels)
    return entry


def restore(policy, stored: dict, levels: int) -> None:
    """Start an AutoPolicy from a stored entry: the planner's acceptance, the confidence rates, the realised
    factors (also its frozen scoring prior) and the probes' schedule (levels: how many probe periods there are)."""
    policy.planner.restore(stored)
    for name, part, kind in (("confidence", policy.confidence, list), ("realised", policy.realised_rates, dict),
                             ("realised", policy.realised_prior, dict)):
        if isinstance(stored.get(name), kind):
            part.restore(stored[name])
    probe = stored.get("probe")  # the probes' back-off and progress carry from request to request
    if isinstance(probe, list) and len(probe) == 2 and 0 <= probe[0] < levels and probe[1] >= 0:
        policy.probe_level, policy.ar_streak = int(probe[0]), int(probe[1])


def seen(policy, levels: int) -> dict:
    """The statistics an AutoPolicy's generation ends with, in `restore`'s layout."""
    return {**policy.planner.state(), "confidence": policy.confidence.state(),
            "realised": policy.realised_rates.state(), "probe": [min(policy.probe_level, levels - 1),
                                                                 policy.ar_streak]}


def blended(old: dict | None, seen: dict) -> dict:
    """The stored statistics moved halfway towards what a generation `seen` (same layout); the state sections
    (REPLACED) are the latest generation's. Pure: a new profile entry (decoding/profiles.py)."""
    return seen if old is None else {**_blend(old, seen), **{k: seen[k] for k in REPLACED if k in seen}}


def _blend(old, new):
    """Elementwise (1 - BLEND) * old + BLEND * new over nested dicts/lists of numbers; a part only one side has
    blends with zeros (a missing count is no evidence); parts of different shapes: new wins."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: _blend(old.get(k), new.get(k)) for k in old.keys() | new.keys()}
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [_blend(a, b) for a, b in zip(old, new)]
    if _number(old) and _number(new):
        return (1 - BLEND) * old + BLEND * new
    if old is None and new is not None:
        return _blend(_zeros(new), new)
    if new is None and old is not None:
        return _blend(old, _zeros(old))
    return new


def _zeros(x):
    if isinstance(x, dict):
        return {k: _zeros(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_zeros(v) for v in x]
    return 0.0


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def valid_entry(entry) -> bool:
    """What `save` writes: a dict of sections, each a dict or list, nested, of finite numbers (counts; the realised
    factors' log-ratio sums may be negative). Each section's own shape is checked where it is restored."""
    def ok(x, depth=0) -> bool:
        if depth > 4:
            return False
        if isinstance(x, dict):
            return all(isinstance(k, str) and ok(v, depth + 1) for k, v in x.items())
        if isinstance(x, list):
            return all(ok(v, depth + 1) for v in x)
        return _number(x)

    return isinstance(entry, dict) and bool(entry) and ok(entry)
