"""A drafter whose acceptance is set by construction, for measuring the engine's ceiling.

Not a user-facing drafter (it is no entry of the drafter menu): it needs to know the answer.
Given the target's own greedy continuation of a prompt (from a plain run first), it proposes
each next token correctly with probability `acceptance`, independently per position, and
otherwise a token that is certainly wrong. Under greedy decoding the target then accepts each
drafted token with exactly that probability, which is the assumption of Leviathan et al.'s
formula, so the measured speedup against the predicted one is the engine's own efficiency:
round overhead, verify cost, rollback and (on a GPU) CUDA graphs included.

Its cost per drafted token is configurable: zero (a free drafter, like prompt lookup), or a
wait of `cost_s` per token, either sleeping (the device idles, as when a draft model's kernels
run while the host waits) or spinning the host (a CPU-bound drafter).
"""

from __future__ import annotations

import random
import time

import torch

from ..drafters import Draft, Drafter
from ..sampling import SamplingParams

COST_MODES = ("sleep", "spin")


class SyntheticDrafter(Drafter):
    """Right with probability `acceptance` per drafted token, against a known greedy reply."""

    name = "synthetic"

    def __init__(self, acceptance: float, cost_s: float = 0.0, cost_mode: str = "sleep", seed: int = 0) -> None:
        """acceptance: probability in [0, 1] that each drafted token is the reference token.
        cost_s: seconds one drafted token costs (0: free). cost_mode: sleep | spin."""
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        if cost_s < 0:
            raise ValueError(f"cost_s must be >= 0, got {cost_s}")
        if cost_mode not in COST_MODES:
            raise ValueError(f"cost_mode must be one of {', '.join(COST_MODES)}, got {cost_mode!r}")
        self.acceptance, self.cost_s, self.cost_mode = acceptance, cost_s, cost_mode
        self._seed = seed
        self._rng = random.Random(seed)
        self._reference: list[int] = []
        self._vocab = 2

    def bind(self, target_model, tokenizer) -> None:
        self._vocab = int(target_model.config.get_text_config().vocab_size)

    def set_reference(self, sequence: list[int], seed: int | None = None) -> None:
        """The sequence the target will produce: the prompt followed by its greedy reply. A seed
        makes the right/wrong draws of this sequence repeatable."""
        self._reference = [int(t) for t in sequence]
        if seed is not None:
            self._rng = random.Random(f"{self._seed}:{seed}")

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Up to k tokens after the context (fewer where the reference ends)."""
        start = len(context)
        tokens = []
        for position in range(start, min(start + k, len(self._reference))):
            right = self._reference[position]
            tokens.append(right if self._rng.random() < self.acceptance else (right + 1) % self._vocab)
        self._pay(len(tokens))
        return Draft(tokens)

    def _pay(self, tokens: int) -> None:
        seconds = self.cost_s * tokens
        if seconds <= 0:
            return
        if self.cost_mode == "sleep":
            time.sleep(seconds)
        else:
            until = time.perf_counter() + seconds
            while time.perf_counter() < until:
                pass


class SyntheticTreeDrafter(SyntheticDrafter):
    """SyntheticDrafter's chain, and with a node budget trees: beside each chain token, while the
    budget lasts, a sibling holding the other choice (the reference token where the chain's is
    wrong, a wrong one where it is right). The target then keeps paths that leave the first
    branch, whose keys and values must move in its cache: what the GPU check verifies trees with."""

    name = "synthetic-tree"

    def propose_tree(
        self, context: list[int], k: int, nodes: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        chain = self.propose(context, k, params, generator).tokens
        if nodes <= len(chain):
            return Draft(chain)
        tokens, parents = list(chain), list(range(-1, len(chain) - 1))
        for depth, token in enumerate(chain[: nodes - len(chain)]):
            right = self._reference[len(context) + depth]
            tokens.append(right if token != right else (right + 2) % self._vocab)
            parents.append(depth - 1)
        return Draft(tokens, parents=parents)
