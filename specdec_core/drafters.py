"""Drafters propose tokens for the target to verify. A new drafting method is one new class.

The engine drives a drafter through these calls per generation:
    reset(prompt_ids)                       a new sequence starts
    lag(context) / catch_up(context)        how many tokens it has yet to read before it can
                                             propose (a new prompt, rounds it sat out), and
                                             reading them; timed apart from drafting
    propose(context, k, params, generator)  -> Draft: up to k tokens + the distributions
                                             they were drawn from
    accepted(n)                             the target kept the first n drafted tokens
    release(context)                        the generation ended with this sequence (None:
                                             drop whatever the drafter kept from it)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .runner import CachedModel, KeptRunner
from .sampling import SamplingParams, probabilities, sample


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    # [len(tokens), V_target] distributions the tokens were drawn from, or None when the
    # drafter is deterministic (each q is then one-hot at its token) or decoding is greedy.
    probs: torch.Tensor | None = None


NO_DRAFT = Draft(tokens=[])
_READ_BY_A_ROUND = 2  # unread context tokens a ModelDrafter's proposal reads in its first step


class Drafter:
    """Base class: a drafter that proposes nothing. Subclasses override `propose`."""

    name = "none"

    def bind(self, target_model, tokenizer) -> None:
        """Called once by the engine: check that this drafter can serve that target."""

    def reset(self, prompt_ids: list[int]) -> None:
        """A new sequence starts with these prompt tokens."""

    def lag(self, context: list[int]) -> int:
        """Tokens of the context this drafter must read (catch up on) before proposing."""
        return 0

    def catch_up(self, context: list[int]) -> None:
        """Read those tokens now."""

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        return NO_DRAFT

    def accepted(self, n: int) -> None:
        """The target accepted the first n tokens of the last draft."""

    def release(self, context: list[int] | None) -> None:
        """The generation is over, ending with `context`. A drafter may keep what it read of it
        for the next generation; with None it must drop that."""


class ModelDrafter(Drafter):
    """A small causal LM of the target's family drafts k tokens autoregressively.

    It keeps its own KV cache across rounds and crops it after each verification, so each
    round feeds it only the tokens it has not seen yet: the accepted drafts that were never
    fed back, and the token the target emitted at the end of the round. The cache is kept
    across generations too, like the target's (runner.KeptRunner).
    """

    name = "model"

    def __init__(
        self, draft_model, tokenizer=None, min_confidence: float = 0.0, make_runner=CachedModel
    ) -> None:
        """min_confidence: stop drafting early when the draft's top probability falls below it.
        make_runner: builds the object that owns the draft's KV cache (see SpeculativeEngine)."""
        self.model = draft_model.eval()
        self.make_runner = make_runner
        self._kept = KeptRunner(make_runner, self.model)
        self.tokenizer = tokenizer
        self.min_confidence = min_confidence
        self._runner: CachedModel | None = None
        self._target_vocab = 0
        self._target_device = None
        self._proposed_from = 0  # context length at the last proposal
        self._fed_drafts = 0  # draft tokens of the last proposal that went into the cache

    def bind(self, target_model, tokenizer) -> None:
        if self.tokenizer is not None and self.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"draft model {_model_name(self.model)} and target model {_model_name(target_model)} "
                "use different tokenizers; pick a draft from the target's model family"
            )
        self._target_vocab = target_model.get_output_embeddings().weight.shape[0]
        self._target_device = target_model.device

    def reset(self, prompt_ids: list[int]) -> None:
        self._runner = self._kept.start(prompt_ids)  # what it lacks is read as catch-up
        self._proposed_from = self._fed_drafts = 0

    def lag(self, context: list[int]) -> int:
        # A round reads the context's last two tokens itself (the last accepted draft, never
        # fed, and the target's token); anything before them it missed is catch-up.
        return max(len(context) - _READ_BY_A_ROUND - self._runner.length, 0)

    def catch_up(self, context: list[int]) -> None:
        if self.lag(context):
            self._runner.forward(context[self._runner.length : -_READ_BY_A_ROUND], last_only=True)

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        runner = self._runner
        logits = runner.forward(context[runner.length :], last_only=True)[-1]
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        for i in range(k):
            token, dist, confidence = self._choose(logits, params, generator)
            if confidence < self.min_confidence:
                break
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if i + 1 < k:  # the last draft token is never fed: nothing needs its logits
                logits = runner.forward([token], last_only=True)[-1]
        self._proposed_from, self._fed_drafts = len(context), max(len(tokens) - 1, 0)
        runner.crop(len(context) + self._fed_drafts)  # an early stop fed one token too many
        return Draft(tokens, torch.stack(dists) if dists else None)

    def accepted(self, n: int) -> None:
        self._runner.crop(self._proposed_from + min(n, self._fed_drafts))

    def release(self, context: list[int] | None) -> None:
        if context is None:
            self._kept.drop()
        else:
            self._kept.finish(context)
        self._runner = None

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        """Pick one draft token: (token, its [V_target] distribution or None, top probability)."""
        logits = self._on_target_vocab(logits)
        if params.greedy:
            confidence = logits.softmax(-1).max().item() if self.min_confidence > 0 else 1.0
            return int(logits.argmax()), None, confidence
        dist = probabilities(logits, params)
        return sample(dist, generator), dist, float(dist.max())

    def _on_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary rows, on the target's device.

        Models of one family pad their embedding matrices differently. Rows the target lacks
        are dropped (the draft never proposes a token the target can't emit); rows only the
        target has get -inf (q = 0 there), which keeps the acceptance rule exact.
        """
        logits = logits.to(self._target_device)
        size = logits.shape[-1]
        if size >= self._target_vocab:
            return logits[: self._target_vocab]
        padding = logits.new_full((self._target_vocab - size,), float("-inf"))
        return torch.cat([logits, padding])


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


def _model_name(model) -> str:
    return getattr(model.config, "name_or_path", "") or type(model).__name__
