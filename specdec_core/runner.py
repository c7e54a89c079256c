"""A causal LM together with the KV cache it owns: forward new tokens, crop on rollback.

Position is the state: the cache holds the first `length` tokens of the sequence and nothing
else reaches into it. Rolling back after rejected drafts is a crop, never a recomputation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class CachedModel:
    """One model's incremental forward passes over a single sequence (batch size 1)."""

    def __init__(self, model) -> None:
        self.model = model
        self.device = model.device
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        """How many tokens of the sequence the cache holds."""
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Run the tokens that follow the cached ones; return float32 logits [n, V] ([1, V] if last_only).

        Positions come from the cache length (transformers 5 infers them), so the logits equal
        those of an uncached forward over the whole sequence.
        """
        input_ids = torch.tensor([token_ids], device=self.device)
        out = self.model(
            input_ids=input_ids,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()

    def crop(self, keep: int) -> None:
        """Forget every cached token after the first `keep`."""
        # transformers 5: crop() takes a negative count to remove; crop(0) is a no-op.
        surplus = self.length - keep
        if surplus > 0:
            self.cache.crop(-surplus)
