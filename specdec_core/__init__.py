"""specdec_core: lossless speculative decoding with token provenance and live stats.

The public names load on first use (PEP 562), so a command that needs no model, such as
`python -m specdec_core presets` or a bad flag's one-line error, doesn't wait seconds for torch
and transformers to import.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "Draft": ".drafters",
    "Drafter": ".drafters",
    "EagleDrafter": ".drafters",
    "HybridDrafter": ".drafters",
    "MedusaDrafter": ".drafters",
    "LayerSkipDrafter": ".drafters",
    "ModelDrafter": ".drafters",
    "PromptLookupDrafter": ".drafters",
    "RetrievalDrafter": ".drafters",
    "SpeculativeEngine": ".engine",
    "SOURCES": ".events",
    "GenerationResult": ".events",
    "Stats": ".events",
    "TokenEvent": ".events",
    "SamplingParams": ".sampling",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
