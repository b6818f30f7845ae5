"""The parts of a Decoder resolved once and shared, read-only, with the decoders it spawns and with batch engines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from multispec.decoding.methods import MethodConfig, MethodEntry
from multispec.loading import Pair

if TYPE_CHECKING:
    from multispec.models.cheap import CheapDraft


@dataclass(frozen=True)
class DecoderParts:
    """What a Decoder resolves once, read-only, and shares with the decoders it spawns and with batch engines: the
    method (config, registry entry, trained models `loaded`), the pair and backend kind, the draft as it drafts
    (`draft_model`: the cheap form's copy; `token_freq`), EOS ids, the target's vocabulary rows and the context."""

    config: MethodConfig
    entry: MethodEntry
    pair: Pair
    backend: str
    wrap_target: Callable | None
    uses_draft: bool
    cheap: CheapDraft
    draft_model: Any
    token_freq: Any
    loaded: dict
    eos_ids: set
    vocab_size: int
    context: int | None
