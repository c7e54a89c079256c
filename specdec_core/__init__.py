"""specdec_core: lossless speculative decoding with token provenance and live stats."""

from .drafters import Draft, Drafter, EagleDrafter, HybridDrafter, ModelDrafter, PromptLookupDrafter
from .engine import SpeculativeEngine
from .events import SOURCES, GenerationResult, Stats, TokenEvent
from .sampling import SamplingParams

__all__ = [
    "Draft",
    "Drafter",
    "EagleDrafter",
    "GenerationResult",
    "HybridDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SOURCES",
    "SamplingParams",
    "SpeculativeEngine",
    "Stats",
    "TokenEvent",
]
