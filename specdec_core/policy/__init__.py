"""The draft policy: how many tokens to draft next round, and whether drafting pays at all.

bounds.py: the draft lengths anyone may ask for. costs.py: the measured step costs.
acceptance.py: acceptance estimated by draft position. draft_length.py: the policy itself.
tree_size.py: the node budget of tree drafts.
"""

from .acceptance import AcceptanceByPosition
from .bounds import DEFAULT_DRAFT_LENGTH, DRAFT_LENGTH_BOUNDS, MAX_DRAFT_LENGTH, MIN_DRAFT_LENGTH
from .costs import LineFit, StepCosts
from .draft_length import DraftLengthPolicy
from .tree_size import TreeSizePolicy

__all__ = ["AcceptanceByPosition", "DEFAULT_DRAFT_LENGTH", "DRAFT_LENGTH_BOUNDS", "DraftLengthPolicy", "LineFit",
           "MAX_DRAFT_LENGTH", "MIN_DRAFT_LENGTH", "StepCosts", "TreeSizePolicy"]
