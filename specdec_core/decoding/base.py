"""What a decode path is: the one interface the engine, the loader, the models panel and the
bench rely on, and the facts about a model that every path needs.

A decode path is how a model runs its decoding steps: eagerly on a growing cache (eager.py),
on a static cache with CUDA graphs (static.py), or on steps compiled for the CPU, now or in the
background (compiled.py). Calling a path with its model hands out a Runner: the KV cache of
one generation and the steps that fill it. The engine only ever sees Runners (it takes the path
as its `make_runner`); whoever chose the path asks it what it is.
"""

from __future__ import annotations

import sys
from typing import Protocol

import torch

# The longest step a path runs in one call: the last token and up to 16 drafts. The draft
# length's bound (policy.DRAFT_LENGTH_BOUNDS) and row-exact attention's rows follow from it.
MAX_STEP_TOKENS = 17
# The largest tree draft a path verifies in one step (paths that verify trees at all: see
# CachedModel.max_tree_nodes); GPU-sized trees of up to 64 nodes fit.
MAX_TREE_NODES = 64

EAGER_DYNAMIC = "eager dynamic cache"


class Runner(Protocol):
    """One generation's KV cache and the steps that fill it (batch size 1). Position is the
    state: the cache holds the first `length` tokens and nothing else reaches into it."""

    @property
    def length(self) -> int:
        """How many tokens of the sequence the cache holds."""

    @property
    def max_tree_nodes(self) -> int:
        """The most draft tokens forward_tree verifies in one step (0: chains only)."""

    def begin(self) -> None:
        """A new generation starts on this runner (a path may choose its steps here)."""

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Run the tokens that follow the cached ones; float32 logits [n, V] ([1, V] if last_only)."""

    def forward_tree(self, token_ids: list[int], parents: list[int]) -> torch.Tensor:
        """Verify a tree draft in one forward with tree attention: token_ids = [last, d1..dn],
        parents[i] the parent of draft node i (-1: the last token; tree.py). float32 logits
        [n + 1, V], row i + 1 scoring what follows node i's path. Only where max_tree_nodes > 0."""

    def crop(self, keep: int) -> None:
        """Forget every cached token after the first `keep` (a rollback is a crop)."""

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After a tree step from `start` cached tokens, keep its rows `rows` (the last token and
        the accepted path) in place, in order, and forget the rest."""

    def memory_bytes(self) -> int:
        """Bytes the cache holds."""


class DecodePath:
    """How one model decodes. Subclasses set `model` and `name` and implement `__call__` and
    `decode_path`; the rest describes an eager path and is overridden where a path differs."""

    model: torch.nn.Module
    name: str
    compiled: bool = False  # runners take compiled steps (now, or once a background compile ends)
    fallback_reason: str | None = None  # why compiling failed, if it did (the path then runs eagerly)

    def __call__(self, model=None) -> Runner:
        """A runner for one generation of `model`, which must be this path's."""
        raise NotImplementedError

    @property
    def decode_path(self) -> str:
        """How the path describes itself (the models panel, the bench's reports)."""
        raise NotImplementedError

    @property
    def compiling(self) -> bool:
        """Whether a compile is still running beside decoding."""
        return False

    def reads_features(self, layer_ids: tuple[int, ...]) -> bool:
        """Whether runners hand a drafter reading the target layers `layer_ids` their features
        (features.py): eager forwards run the model's hooks, so they do."""
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a compile running beside decoding to end; whether the steps are compiled."""
        return self.compiled

    def close(self) -> None:
        """No more use for the path: a compile still running stops."""

    def _check_model(self, model) -> None:
        if model is not None and model is not self.model:
            raise ValueError(f"these steps belong to {self.name}, not to {model_name(model)}")


def model_name(model) -> str:
    return getattr(model.config, "name_or_path", "") or type(model).__name__


def decoder_of(model) -> torch.nn.Module:
    """The model's decoder (the embeddings, the layer stack and the final norm, without the
    lm_head): Llama, Qwen2 and the other causal LMs of transformers."""
    return model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)


def context_limit(model) -> int:
    """The longest sequence the model was built for (no limit if the config doesn't say)."""
    config = model.config.get_text_config()
    return getattr(config, "max_position_embeddings", None) or sys.maxsize
