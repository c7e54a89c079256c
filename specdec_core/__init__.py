"""specdec_core: lossless speculative decoding with token provenance and live stats."""

from .drafters import Draft, Drafter, ModelDrafter, PromptLookupDrafter
from .engine import SpeculativeEngine
from .events import SOURCES, GenerationResult, Stats, TokenEvent
from .sampling import SamplingParams

__all__ = [
    "Draft",
    "Drafter",
    "GenerationResult",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SOURCES",
    "SamplingParams",
    "SpeculativeEngine",
    "Stats",
    "TokenEvent",
]
