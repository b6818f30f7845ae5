"""What `auto` learned of acceptance, kept across generations and processes (beside the cost calibration).

Per pair (target and draft or head, by identity: name, size, dtype and a few weights), proposer and temperature
range, the decayed statistics a generation ends with — draft and lookup acceptance by (depth, rank or n-gram
length), a draft chain's acceptance by confidence bucket, the suffix calibration — are stored after each generation,
moved halfway from what was stored towards what was seen (as the cost calibration is), in memory (every Decoder
and server worker of the process) and on disk ($MULTISPEC_CACHE_DIR/acceptance-v1.json). A generation starts from
them instead of the priors, so a 64-token request is planned from what earlier requests learned; a pair seen for
the first time starts from the conservative priors (drafting/auto/acceptance.py). Acceptance does not depend on
the machine, so unlike the costs the key names no device or thread count.

The statistics only shape the plans; every plan is verified losslessly, so a stale or wrong file costs speed,
never exactness. A file or entry that is not what `save` writes is ignored with one warning and rebuilt.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from multispec.paths import DeferredWrites, cache_root, load_cache_json, save_cache_json, warn_once

FILE = "acceptance-v1.json"
BLEND = 0.5  # a generation moves the stored statistics this far towards what it saw
TEMPERATURE_EDGES = (0.0, 0.5, 0.9)  # ranges: T = 0, (0, 0.5], (0.5, 0.9], > 0.9
MAX_ENTRIES = 256  # pairs x proposers x temperature ranges kept on disk
# Sections that are a state, not statistics: the latest generation's wins. The probes' back-off level and streak
# were blended like counts, so levels 3 and 4 stored 3.5, read back as 3, and the streak settled near its mean: the
# embedded pair at T = 1 probed the draft in the first round of nearly every request, through the whole prompt.
REPLACED = ("probe",)
_MEMORY: dict[str, dict] = {}


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


def load(key: str) -> dict | None:
    """The stored statistics for key (sections as AutoPolicy.finish saves them: Planner.state's, "confidence",
    "realised"), or None."""
    with _WRITES.lock:
        if key in _MEMORY:
            return _MEMORY[key]
        entry = _disk().get(key)
        if entry is not None and not valid_entry(entry):
            warn_once(f"ignoring auto's acceptance statistics for this pair in {_file()}: not what multispec "
                       "writes; they are rebuilt from this generation")
            entry = None
        if entry is not None:
            _MEMORY[key] = entry
        return entry


def save(key: str, seen: dict) -> dict:
    """Move the stored statistics for key halfway towards `seen` (same layout) and return them. Every Decoder of
    the process reads them at once; the file is written at most every 5 s (a 64-token request takes less than
    that) and when the process exits (paths.DeferredWrites)."""
    with _WRITES.lock:
        old = _MEMORY.get(key)
        entry = seen if old is None else {**_blend(old, seen), **{k: seen[k] for k in REPLACED if k in seen}}
        _MEMORY[key] = entry
        _WRITES.changed(key)
        return entry


def _merge(keys: set[str]) -> None:
    """Merge these keys' entries into the file (the most recent last: past MAX_ENTRIES the longest unused go)."""
    data = _disk()
    for key in [k for k in keys if k in _MEMORY]:
        data.pop(key, None)
        data[key] = _MEMORY[key]
    save_cache_json(_file(), dict(list(data.items())[-MAX_ENTRIES:]))


_WRITES = DeferredWrites(_merge)
flush = _WRITES.flush  # write what has not been written yet (at exit; tests call it to read the file)


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


def _file() -> Path:
    return cache_root() / FILE


def _disk() -> dict:
    return load_cache_json(_file(), "auto's acceptance statistics", "they are rebuilt")
