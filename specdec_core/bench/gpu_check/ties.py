"""The bf16 ties part: how often greedy speculative output differs from plain decoding in bf16,
and the logit gap where it does."""

from __future__ import annotations

from pathlib import Path

import torch

from ...drafters import PromptLookupDrafter
from ..synthetic import SyntheticDrafter
from .fixtures import greedy, make_engine, random_prompts
from .part import Part, Scale


def part_bf16_ties(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """bf16: how often greedy speculative output differs from plain decoding, and by how much the
    two tokens' logits differ where it does (a tie under rounding is a gap near bf16's precision)."""
    if "models" not in shared:
        return "needs the fast_path part (its bf16 models)"
    target, runner = shared["models"]["target"], shared["runners"]["target"]
    prompts = random_prompts(target.config.vocab_size, scale.prompts * 2, scale.prompt_tokens, seed=9)
    n = scale.new_tokens
    plain = [greedy(make_engine(target, make_runner=runner), p, n)[0] for p in prompts]
    rows = {}
    for name, make in (("prompt_lookup", PromptLookupDrafter), ("synthetic a=0.8", lambda: SyntheticDrafter(0.8))):
        drafter = make()
        engine = make_engine(target, drafter, make_runner=runner)
        diverged = []
        for i, (p, expected) in enumerate(zip(prompts, plain)):
            if isinstance(drafter, SyntheticDrafter):
                drafter.set_reference(p + expected, seed=i)
            tokens, _ = greedy(engine, p, n)
            if tokens != expected:
                at = next(j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b)
                diverged.append({"prompt": i, "position": at,
                                 "logit_gap": _logit_gap(target, p + expected[:at], tokens[at], expected[at])})
        rows[name] = {"runs": len(prompts), "diverged": len(diverged), "where": diverged}
        part.check(f"{name}: bf16 greedy divergence reported", True,
                   f"{len(diverged)}/{len(prompts)} replies differ"
                   + (": logit gaps " + ", ".join(f"{d['logit_gap']:.3g}" for d in diverged) if diverged else ""))
    part.data["bf16"] = rows
    return None


def _logit_gap(model, prefix: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| for the next token after `prefix`, from one uncached forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix], device=model.device)).logits[0, -1].float()
    return abs(float(logits[a] - logits[b]))
