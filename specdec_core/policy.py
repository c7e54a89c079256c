"""How many tokens to draft next round."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DRAFT_LENGTH = 5
MIN_DRAFT_LENGTH = 2
MAX_DRAFT_LENGTH = 8


@dataclass
class DraftLengthPolicy:
    """Adaptive k: high acceptance drafts one more next time, low acceptance one fewer.

    A round in which at least `raise_at` of the drafts were accepted raises k by one; under
    `lower_below` it lowers k by one; k stays within [lowest, highest]. Not adaptive: k is fixed.
    """

    k: int = DEFAULT_DRAFT_LENGTH
    adaptive: bool = True
    lowest: int = MIN_DRAFT_LENGTH
    highest: int = MAX_DRAFT_LENGTH
    raise_at: float = 0.8
    lower_below: float = 0.4

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"draft_length must be >= 1, got {self.k}")
        # A k the caller asks for explicitly is always reachable.
        self.lowest, self.highest = min(self.lowest, self.k), max(self.highest, self.k)

    def update(self, drafted: int, accepted: int) -> None:
        """Learn from one round."""
        if not self.adaptive or drafted == 0:
            return
        rate = accepted / drafted
        if rate >= self.raise_at:
            self.k = min(self.k + 1, self.highest)
        elif rate < self.lower_below:
            self.k = max(self.k - 1, self.lowest)
