"""Prompt lookup: a drafter that copies what followed an earlier occurrence of the last n-gram."""

from __future__ import annotations

import numpy as np
import torch

from ..sampling import SamplingParams
from .base import Draft, Drafter


class PromptLookupDrafter(Drafter):
    """Prompt lookup decoding: find the latest n-gram earlier in the text and copy what followed.

    Tries n-gram sizes from `max_ngram` down to `min_ngram` and takes the most recent earlier
    occurrence; proposes up to `max_tokens` tokens. Deterministic, so each q is one-hot.
    """

    name = "prompt_lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_tokens: int = 10) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_tokens = max_ngram, min_ngram, max_tokens

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        return Draft(find_continuation(context, self.max_ngram, self.min_ngram, min(k, self.max_tokens)))


def find_continuation(context: list[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the context's last n-gram."""
    sequence = np.asarray(context)
    for n in range(min(max_ngram, len(sequence) - 1), min_ngram - 1, -1):
        pattern = sequence[-n:]
        # Windows that start early enough to be followed by at least one token.
        windows = np.lib.stride_tricks.sliding_window_view(sequence[:-1], n)
        starts = np.flatnonzero((windows == pattern).all(axis=1))
        if len(starts):
            follow = starts[-1] + n
            return sequence[follow : follow + k].tolist()
    return []
