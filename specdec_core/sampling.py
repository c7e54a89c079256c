"""Sampling settings and the one place where logits become probabilities.

The warpers follow Hugging Face `generate()` exactly (temperature, then top-k, then top-p,
with the same tie and boundary rules), so the engine's baseline samples from the same
distribution transformers does, and target, draft, residual and bonus distributions are all
shaped the same way. Greedy decoding (temperature 0) is an argmax and needs no probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Below this a temperature only divides logits into overflow (1e-38 gives inf, then NaN
# probabilities) while sampling already picks the argmax in all but name: 0 is greedy.
MIN_TEMPERATURE = 0.01
# A torch generator's seed is a 64-bit integer; the non-negative int64 range is what every
# client library can hold.
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. `temperature=0` is greedy; `top_k=0` and `top_p=1.0` are off.

    seed: makes a sampled generation reproducible. The same seed, prompt and engine settings
    (drafter, draft_length, adaptive) give the same tokens on any engine and in any process, on
    the same device and dtype: a seeded generation reads its whole prompt and chooses its draft
    lengths from acceptance alone, never from timings (see SpeculativeEngine.stream). None: fresh
    randomness, and the adaptive policy may use what it measured.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    # Stop strings (OpenAI's rule): the reply ends before the first one it contains, which is
    # left out of its text.
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 means off), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 means off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, then top-p over the last dimension, as transformers applies them.

    logits: [..., V] float. Returns a new [..., V] tensor with filtered entries at -inf.
    """
    scores = logits.float() / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        kth_largest = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, sorted_indices = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative <= (1 - params.top_p)
        sorted_remove[..., -1:] = False  # always keep the most likely token
        remove = sorted_remove.scatter(-1, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities after temperature, top-k and top-p."""
    return warp_logits(logits, params).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a [V] probability vector."""
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-call generator: reproducible with a seed, fresh entropy without; never global state."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
