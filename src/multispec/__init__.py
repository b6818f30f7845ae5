"""multispec: lossless speculative decoding with multi-candidate token trees, adaptive draft lengths and optimal
multi-draft verifiers.

`import multispec` stays light (no torch, no transformers): `load_pair` and `generate` import them on first use.
"""
from multispec.errors import MultispecError

__version__ = "0.1.0"


def load_pair(*args, **kwargs):
    """See multispec.api.load_pair."""
    from multispec.api import load_pair as _load_pair

    return _load_pair(*args, **kwargs)


def generate(*args, **kwargs):
    """See multispec.api.generate."""
    from multispec.api import generate as _generate

    return _generate(*args, **kwargs)


def __getattr__(name: str):
    """`multispec.Decoder` (multispec.decoding.decoder.Decoder) and `multispec.SamplingParams`
    (multispec.params.SamplingParams), imported on first use."""
    if name == "Decoder":
        from multispec.decoding.decoder import Decoder

        return Decoder
    if name == "SamplingParams":
        from multispec.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'multispec' has no attribute {name!r}")


__all__ = ["__version__", "load_pair", "generate", "Decoder", "MultispecError", "SamplingParams"]
