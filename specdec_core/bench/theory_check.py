"""The theory check: the speedup Leviathan et al. predict from measured acceptance and costs.

Costs are measured with small timing probes through specdec_core.decoding.eager.CachedModel on one
prompt of each category: a target 1-token step, a target verify step over 1 + k tokens for
each draft length k used, a draft-model 1-token step and a prompt-lookup search. Our engine's
drafting cost is its own, timed during the runs (Stats.draft_s): that prices every drafter,
the EAGLE head and the hybrid included, as it ran. The
efficiency of a method is its measured decode-phase speedup over its own plain decoding (the
prompt reading, the same on both sides, left out: the formula prices decoding rounds) divided by
the predicted one; what is missing to 1.0 is overhead the formula does not know about.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .runs import RunTotals
from .cost_model import time_steps
from ..drafters import find_continuation
from ..decoding.eager import CachedModel
from ..theory import expected_tokens, predicted_speedup, speedup_of_rounds  # noqa: F401 - predicted_speedup: the bench's name too


def acceptance_probability(counts: RunTotals) -> float:
    """Leviathan's a, estimated from rounds: kept drafts / (kept drafts + rejections).

    Tokens after the first rejection of a round are never tried, so they don't count against
    a (accepted / drafted, the engine's acceptance_rate, does count them).
    """
    tried = counts.accepted + counts.rejections
    return counts.accepted / tried if tried else 0.0


@dataclass
class ProbedCosts:
    """Median times of single steps (seconds) at one context length, probed by the bench (the
    policy's StepCosts are running averages measured during generation)."""

    context_tokens: int
    target_step_s: float  # target forward over 1 new token
    verify_s: dict[int, float]  # k -> target forward over 1 + k new tokens
    draft_step_s: float | None  # draft model forward over 1 new token (None: no draft)
    lookup_s: float  # one prompt-lookup search over the context

    def verify_ratio(self, g: float) -> float:
        """v: verify cost over 1 + g tokens relative to a 1-token step (interpolated in g)."""
        ks = sorted(self.verify_s)
        g = min(max(g, ks[0]), ks[-1])
        low = max(k for k in ks if k <= g)
        high = min(k for k in ks if k >= g)
        t = self.verify_s[low] if low == high else (
            self.verify_s[low] + (g - low) / (high - low) * (self.verify_s[high] - self.verify_s[low])
        )
        return t / self.target_step_s

    def as_dict(self) -> dict:
        return {
            "context_tokens": self.context_tokens,
            "target_step_ms": 1e3 * self.target_step_s,
            "verify_ms": {str(k): 1e3 * t for k, t in sorted(self.verify_s.items())},
            "verify_ratio": {str(k): t / self.target_step_s for k, t in sorted(self.verify_s.items())},
            "draft_step_ms": None if self.draft_step_s is None else 1e3 * self.draft_step_s,
            "draft_cost_ratio_c": None if self.draft_step_s is None else self.draft_step_s / self.target_step_s,
            "lookup_ms": 1e3 * self.lookup_s,
        }


def measure_step_costs(
    target, draft, prompt_ids: list[int], max_k: int, repeats: int = 5,
    target_runner=None, draft_runner=None,
) -> ProbedCosts:
    """Time the steps a round is made of, after a prefill of all but the prompt's last token.

    Each probe is a forward over [last, d1..dk] (or the draft's [last]), cropped back afterwards,
    so every probe sees the same context length; the median of `repeats` timings is kept.
    target_runner / draft_runner: the make_runner the engine decodes with (compiled static-cache
    steps when they are in use; None: CachedModel), so the prediction prices the steps that ran.
    """
    context = len(prompt_ids) - 1
    filler = (prompt_ids * (max_k // max(len(prompt_ids), 1) + 1))[:max_k]  # any real tokens
    tokens = prompt_ids + filler  # tokens[context : context + k + 1] == [last, *filler[:k]]
    verify_ms = time_steps(target_runner or CachedModel, target, tokens, context, list(range(1, max_k + 2)), repeats,
                           target.device)
    draft_step = None
    if draft is not None:
        draft_step = time_steps(draft_runner or CachedModel, draft, tokens, context, [1], repeats, draft.device)[1] / 1e3
    lookup = []
    for _ in range(repeats):
        start = time.perf_counter()
        find_continuation(prompt_ids, 3, 1, 10)
        lookup.append(time.perf_counter() - start)
    verify = {size - 1: ms / 1e3 for size, ms in verify_ms.items()}
    return ProbedCosts(
        context_tokens=len(prompt_ids),
        target_step_s=verify[0],
        verify_s={k: t for k, t in verify.items() if k > 0} or {0: verify[0]},
        draft_step_s=draft_step,
        lookup_s=statistics.median(lookup),
    )


def theory_check(
    counts: RunTotals, costs: ProbedCosts, uses_draft_model: bool, measured_speedup: float | None
) -> dict:
    """Leviathan's prediction for one method on one category, and the efficiency it implies;
    for a method that verified trees, the tokens per drafting round come from the per-node
    acceptance (theory.expected_tree_tokens) instead of Leviathan's chain formula.

    c is per drafted token, over the probed target step: for our engine the drafting time it
    measured during the runs (any drafter: the EAGLE head's steps, lookup's searches, the draft
    model's steps and catch-up), for other methods the probes (the draft model's step, or the
    lookup search spread over the round's mean draft length). c_catch_up is the part of our c
    spent catching up (reading what plain rounds or a new prompt left unread): a drafter the
    policy pauses often pays it on few drafts, and c minus it is what its draft steps cost.
    """
    drafting_rounds = counts.rounds - counts.plain_rounds
    a = acceptance_probability(counts)
    g = counts.drafted / drafting_rounds if drafting_rounds else 0.0
    share = drafting_rounds / counts.rounds if counts.rounds else 0.0
    c_catch_up = 0.0
    if counts.draft_measured and counts.drafted:
        c = counts.draft_s / counts.drafted / costs.target_step_s
        c_catch_up = counts.catch_up_s / counts.drafted / costs.target_step_s
    elif uses_draft_model and costs.draft_step_s is not None:
        c = costs.draft_step_s / costs.target_step_s
    else:
        c = costs.lookup_s / costs.target_step_s / g if g else 0.0
    v = costs.verify_ratio(g) if g else 1.0
    trees = counts.nodes.tree_rounds > 0
    # A method that verified trees: the tokens its drafting rounds should yield follow from the
    # measured acceptance of each node by place (depth, sibling rank), summed over the trees it
    # drafted; a chain formula over its node count would price a 16-node tree as a 16-long chain.
    tokens = (counts.nodes.expected_tokens() if trees else expected_tokens(a, g)) if g else 1.0
    predicted = speedup_of_rounds(tokens, g, c, v, share) if g else 1.0
    efficiency = measured_speedup / predicted if measured_speedup is not None and predicted else None
    return {
        "model": TREE_MODEL if trees else CHAIN_MODEL,
        "a": a,
        "g": g,
        "c": c,
        "c_catch_up": c_catch_up,
        "v": v,
        "draft_share": share,
        "expected_tokens_per_drafting_round": tokens,
        "measured_tokens_per_drafting_round": counts.nodes.measured_tokens(),
        "acceptance_by_depth": counts.nodes.acceptance_by_depth(),
        "predicted_speedup": predicted,
        "measured_speedup": measured_speedup,
        "efficiency": efficiency,
    }


# Which expected-tokens formula a theory line used (results.json's theory "model").
CHAIN_MODEL = "chain (Leviathan: one acceptance a per draft token)"
TREE_MODEL = "tree (per-node acceptance by depth and sibling rank)"


def probe_all(
    target, draft, prompts: dict[str, list[int]], max_k: int, repeats: int = 5, target_runner=None, draft_runner=None
) -> dict[str, ProbedCosts]:
    """ProbedCosts for each category's representative prompt, through the runners in use."""
    return {
        name: measure_step_costs(target, draft, ids, max_k, repeats, target_runner, draft_runner)
        for name, ids in prompts.items()
    }
