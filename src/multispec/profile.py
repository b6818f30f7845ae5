"""The machine profile: what multispec measured or learned about this machine and these models, as a frozen value.

    profile = MachineProfile.load("profile.json")        # or MachineProfile.default(): the cache folder's file
    decoder = Decoder(pair, "auto", profile=profile)      # measures what the profile lacks, now (never mid-run)
    result = decoder.generate(prompt)                     # plans from decoder.profile; stats["profile"] names it
    decoder.updated_profile().save("profile.json")        # only an explicit call writes what the runs observed

Sections, each {key: entry} of plain JSON values (the keys name what an entry depends on: models, backend,
device, threads, CPU):
- "costs": a forward's seconds by size for the target and the draft, and auto's per-round overheads
  (drafting/costs.py);
- "batch_costs": the batched forward's cost table (drafting/batch_costs.py);
- "cheap_draft": the cheapest form of a draft model here (models/cheap.py);
- "acceptance": auto's acceptance priors per pair, proposer and temperature range (drafting/auto/memory.py);
- "rows": which row counts take the few-row product (models/rows.py).

A profile never changes: `with_entries` returns a new one. The Decoder reads it; runs report observations;
`updated` (decoding/profiles.py) folds them into a new profile. So what a run does depends on what it is given —
the pair, the method, the request and this value — not on what an earlier run left in a file. `digest` names the
content (a run's stats carry it)."""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multispec.errors import MultispecError, check

SECTIONS = ("costs", "batch_costs", "cheap_draft", "acceptance", "rows")
FILE = "profile-v1.json"
VERSION = 1


@dataclass(frozen=True)
class MachineProfile:
    """sections: {section: {key: entry}} (see the module docstring). source: where it came from (a file path,
    "measured" or "empty"), for messages only: it is not part of the digest."""

    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "empty"

    def __post_init__(self) -> None:
        clean = {}
        for name in SECTIONS:
            entries = self.sections.get(name, {})
            check(isinstance(entries, Mapping), f"profile section {name!r} must be an object of entries")
            clean[name] = {str(k): copy.deepcopy(v) for k, v in entries.items()}
        unknown = set(self.sections) - set(SECTIONS)
        check(not unknown, f"profile: unknown section(s) {', '.join(sorted(unknown))}; expected {', '.join(SECTIONS)}")
        object.__setattr__(self, "sections", clean)

    # ------------------------------------------------------------------ reading
    def get(self, section: str, key: str) -> Any:
        """A copy of the entry for key in section, or None."""
        entry = self.sections[section].get(key)
        return copy.deepcopy(entry)

    def __contains__(self, item: tuple[str, str]) -> bool:
        section, key = item
        return key in self.sections[section]

    @functools.cached_property
    def digest(self) -> str:
        """12 hex digits of the SHA-256 of the content (canonical JSON): equal profiles, equal digests."""
        text = json.dumps(self.sections, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def summary(self) -> dict:
        """What `multispec profile show` prints: the digest, the source and each section's entry count."""
        return {"digest": self.digest, "source": self.source,
                **{name: len(entries) for name, entries in self.sections.items()}}

    # ------------------------------------------------------------------ new values
    def with_entries(self, section: str, entries: Mapping[str, Any], source: str | None = None) -> MachineProfile:
        """A new profile with `entries` set in section (others kept)."""
        check(section in SECTIONS, f"profile: unknown section {section!r}")
        if not entries:
            return self
        sections = {name: dict(v) for name, v in self.sections.items()}
        sections[section].update(entries)
        return MachineProfile(sections, self.source if source is None else source)

    def merged(self, other: MachineProfile) -> MachineProfile:
        """This profile with every entry of `other` set over it."""
        out = self
        for name in SECTIONS:
            out = out.with_entries(name, other.sections[name])
        return out

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict:
        return {"multispec_profile": VERSION, **self.sections}

    def save(self, path: str | Path) -> Path:
        """Write the profile whole or not at all (a temporary file renamed over it). Returns the path."""
        from multispec.paths import save_cache_json, writable_file

        p = writable_file(path, "profile")
        if not save_cache_json(p, self.to_json()):
            raise MultispecError(f"profile {p}: could not be written")
        return p

    @classmethod
    def from_json(cls, data: Any, source: str) -> MachineProfile:
        """Parse what `to_json` wrote; refuses anything else in one line."""
        check(isinstance(data, dict) and data.get("multispec_profile") == VERSION,
              f"{source}: not a multispec machine profile (version {VERSION})")
        try:
            return cls({k: v for k, v in data.items() if k != "multispec_profile"}, source)
        except MultispecError as e:
            raise MultispecError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> MachineProfile:
        """A profile file given by the user: a missing or malformed file is refused in one line."""
        p = Path(path)
        check(p.is_file(), f"profile {p}: no such file (write one with `multispec profile measure --out {p}`)")
        try:
            data = json.loads(p.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise MultispecError(f"profile {p}: cannot be read ({type(e).__name__})") from None
        return cls.from_json(data, str(p))

    @classmethod
    def default_path(cls) -> Path:
        from multispec.paths import cache_root

        return cache_root() / FILE

    @classmethod
    def default(cls) -> MachineProfile:
        """The cache folder's profile ($MULTISPEC_CACHE_DIR/profile-v1.json), or an empty one. A damaged file is
        ignored with one warning (what it held is measured again)."""
        from multispec.paths import load_cache_json, warn_once

        p = cls.default_path()
        data = load_cache_json(p, "the machine profile", "measuring again")
        if not data:
            return cls(source="empty")
        try:
            return cls.from_json(data, str(p))
        except MultispecError as e:
            warn_once(f"ignoring {e}; measuring again")
            return cls(source="empty")


def resolve(profile: MachineProfile | str | Path | None) -> tuple[MachineProfile, bool]:
    """What a Decoder was given -> (the profile, whether it is the cache folder's default). None: the default."""
    if profile is None:
        return MachineProfile.default(), True
    if isinstance(profile, MachineProfile):
        return profile, False
    check(isinstance(profile, (str, Path)), f"profile must be a MachineProfile, a file path or None, "
                                            f"got {type(profile).__name__}")
    return MachineProfile.load(profile), False


def add_to_default(section: str, entries: Mapping[str, Any]) -> None:
    """Measurements a Decoder made because the default profile lacked them are added to the default file (a first
    run on a machine measures once, as `multispec profile measure` would): never what a run observed, never a
    given profile's file."""
    if not entries:
        return
    from multispec.paths import save_cache_json

    current = MachineProfile.default()
    save_cache_json(MachineProfile.default_path(), current.with_entries(section, entries).to_json())
