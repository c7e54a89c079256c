"""A small causal LM of the target's family as the drafter."""

from __future__ import annotations

import torch

from ..decoding.eager import CachedModel, KeptRunner
from ..sampling import SamplingParams, probabilities, sample
from ..drafter import Draft, Drafter

_READ_BY_A_ROUND = 2  # unread context tokens a ModelDrafter's proposal reads in its first step


class ModelDrafter(Drafter):
    """A small causal LM of the target's family drafts k tokens autoregressively.

    It keeps its own KV cache across rounds and crops it after each verification, so each
    round feeds it only the tokens it has not seen yet: the accepted drafts that were never
    fed back, and the token the target emitted at the end of the round. The cache is kept
    across generations too, like the target's (runner.KeptRunner).
    """

    name = "model"

    def __init__(
        self, draft_model, tokenizer=None, min_confidence: float = 0.0, make_runner=CachedModel,
        kept: KeptRunner | None = None,
    ) -> None:
        """min_confidence: stop drafting early when the draft's top probability falls below it.
        make_runner: builds the object that owns the draft's KV cache (see SpeculativeEngine).
        kept: the draft model's kept cache, to share with other drafters of the same model
        (None: one of its own)."""
        self.model = draft_model.eval()
        self.make_runner = make_runner
        if kept is not None and kept.model is not self.model:
            raise ValueError("the kept cache belongs to another model than this drafter's")
        self._kept = kept or KeptRunner(make_runner, self.model)
        self.tokenizer = tokenizer
        self.min_confidence = min_confidence
        self._runner: CachedModel | None = None
        self._target_vocab = 0
        self._target_device = None
        # (context length, draft tokens fed into the cache) of a proposal not yet verified
        self._pending: tuple[int, int] | None = None

    def bind(self, target_model, tokenizer) -> None:
        if self.tokenizer is not None and self.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"draft model {_model_name(self.model)} and target model {_model_name(target_model)} "
                "use different tokenizers; pick a draft from the target's model family"
            )
        self._target_vocab = target_model.get_output_embeddings().out_features  # an int4 head has no .weight
        self._target_device = target_model.device

    def reset(self, prompt_ids: list[int]) -> None:
        self._runner = self._kept.start(prompt_ids)  # what it lacks is read as catch-up
        self._pending = None

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
        fed = max(len(tokens) - 1, 0)
        self._pending = (len(context), fed)
        runner.crop(len(context) + fed)  # an early stop fed one token too many
        return Draft(tokens, torch.stack(dists) if dists else None)

    def accepted(self, n: int) -> None:
        # Only a pending proposal's own drafts are cropped, once: a call with none pending
        # (before the first proposal) must not throw away the kept conversation.
        if self._pending is not None:
            proposed_from, fed = self._pending
            self._runner.crop(proposed_from + min(n, fed))
            self._pending = None

    def unverified(self) -> None:
        if self._pending is not None:
            self._runner.crop(self._pending[0])
            self._pending = None

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


def _model_name(model) -> str:
    return getattr(model.config, "name_or_path", "") or type(model).__name__
