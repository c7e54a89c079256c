"""Drafters: one module per drafting method, all behind the interface in base.py."""

from ..drafter import NO_DRAFT, Draft, Drafter
from .eagle import EagleDrafter
from .eagle_head import Eagle3Head
from .hybrid import HybridDrafter
from .layer_skip import LayerSkipDrafter
from .lookup import PromptLookupDrafter, find_continuation
from .medusa import MedusaDrafter
from .medusa_heads import MedusaHeads
from .model import ModelDrafter
from .retrieval import RetrievalDrafter

__all__ = ["Draft", "Drafter", "Eagle3Head", "EagleDrafter", "HybridDrafter", "LayerSkipDrafter", "MedusaDrafter", "MedusaHeads", "ModelDrafter", "NO_DRAFT", "PromptLookupDrafter", "RetrievalDrafter", "find_continuation"]
