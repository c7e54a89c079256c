"""The correctness part: in fp32 with TF32 off, greedy speculative output is plain decoding's,
for every drafter, eager and compiled, chains and trees, and our plain decoding is Hugging Face's."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ...decoding.eager import CachedModel
from ..architectures import random_model
from ..machine import free_memory
from ..synthetic import SyntheticDrafter, SyntheticTreeDrafter
from .fixtures import (eagle_drafter_missing, every_drafter, greedy, hf_greedy, make_engine,
                       random_prompts, shallow_copy, tf32_off, tree_drafters)
from .part import Part, Scale


TREE_NODES = 8  # a tree round's most nodes: the 9-token verify step holds the last token and 8


def part_correctness(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """fp32, TF32 off: every drafter, eager and compiled, chains and trees, gives plain decoding's tokens."""
    from ...decoding.static import DRAFT_STEP_SIZES, StaticSteps

    with tf32_off():
        target = random_model(scale.target, torch.float32, scale.device, seed=0)
        draft = shallow_copy(target, scale.draft_layers)
        prompts = random_prompts(target.config.vocab_size, scale.prompts, scale.prompt_tokens)
        n = scale.new_tokens
        plain = [greedy(make_engine(target), p, n)[0] for p in prompts]
        hf = [hf_greedy(target, p, n) for p in prompts]
        part.check("ours-baseline == HF generate (eager, fp32)", hf == plain,
                   f"{sum(a == b for a, b in zip(hf, plain))}/{len(prompts)} prompts identical")
        compiled_steps = {}
        t0 = time.perf_counter()
        # Two target shapes (1 and 9, a verify of 1 + 4 padded up) and the draft's two keep compiling short.
        # The target's steps verify trees too, as the loader builds them (each tree size compiled at
        # its first use), and return the features the heads read (CUDA graphs replay no hooks).
        trees = tree_drafters(target)
        layers = tuple(sorted({layer for drafter in trees.values() for layer in drafter.feature_layers}))
        compiled_steps["target"] = StaticSteps(target, step_sizes=(1, 9), progress=False, name="target fp32",
                                               backend=scale.backend, trees=True, feature_layers=layers)
        compiled_steps["draft"] = StaticSteps(draft, step_sizes=DRAFT_STEP_SIZES, progress=False, name="draft fp32",
                                              backend=scale.backend)
        part.data["compile_s"] = round(time.perf_counter() - t0, 1)
        part.data["compiled"] = {role: s.decode_path + (f" ({s.fallback_reason})" if s.fallback_reason else "")
                                 for role, s in compiled_steps.items()}
        part.check("fp32 steps compiled", all(s.fallback_reason is None for s in compiled_steps.values()),
                   "; ".join(f"{r}: {p}" for r, p in part.data["compiled"].items()))
        compiled_plain = [greedy(make_engine(target, make_runner=compiled_steps["target"]), p, n)[0] for p in prompts]
        part.check("compiled ours-baseline == eager ours-baseline (fp32)", compiled_plain == plain,
                   f"{sum(a == b for a, b in zip(compiled_plain, plain))}/{len(prompts)} prompts identical")
        acceptance = {}
        for path, target_runner, draft_runner in (("eager", CachedModel, CachedModel),
                                                  ("compiled", compiled_steps["target"], compiled_steps["draft"])):
            for name, drafter in every_drafter(target, draft, draft_runner).items():
                engine = make_engine(target, drafter, make_runner=target_runner)
                same, drafted, accepted, _ = _replies_against(plain, engine, drafter, prompts, n)
                acceptance[f"{name} {path}"] = round(accepted / drafted, 3) if drafted else None
                part.check(f"{name}, {path}: greedy == ours-baseline (fp32)", same == len(prompts),
                           f"{same}/{len(prompts)} prompts identical, acceptance {acceptance[f'{name} {path}']}")
        # Random heads' trees are all rejected; the synthetic trees keep paths through later
        # branches too, so accepted keys and values move in the cache (keep_rows).
        trees["synthetic a=0.6"] = SyntheticTreeDrafter(0.6, seed=3)
        for path, target_runner in (("eager", CachedModel), ("compiled", compiled_steps["target"])):
            for name, drafter in trees.items():
                engine = make_engine(target, drafter, make_runner=target_runner)
                same, _, accepted, tree_rounds = _replies_against(plain, engine, drafter, prompts, n, TREE_NODES)
                part.check(f"{name} trees, {path}: greedy == ours-baseline (fp32)", same == len(prompts) and tree_rounds > 0,
                           f"{same}/{len(prompts)} prompts identical, {tree_rounds} rounds verified a tree, "
                           f"{accepted} draft tokens kept")
        reason = compiled_steps["target"].tree_fallback_reason
        part.check("fp32 tree steps compiled", reason is None, reason or compiled_steps["target"].decode_path)
        if eagle_drafter_missing():
            part.check("eagle: greedy == ours-baseline (fp32)", None, "EagleDrafter is not in this build")
        part.data["acceptance"] = acceptance
    del target, draft, compiled_steps
    free_memory()
    return None


def _replies_against(plain: list[list[int]], engine, drafter, prompts: list[list[int]], n: int,
                     tree_nodes: int = 0) -> tuple[int, int, int, int]:
    """The engine's greedy replies to the prompts against plain decoding's: (replies identical,
    draft tokens drafted, kept, rounds that verified a tree). A synthetic drafter is handed
    each prompt's plain reply first, as its reference."""
    same = drafted = accepted = tree_rounds = 0
    for i, (prompt, expected) in enumerate(zip(prompts, plain)):
        if isinstance(drafter, SyntheticDrafter):
            drafter.set_reference(prompt + expected, seed=i)
        tokens, stats = greedy(engine, prompt, n, tree_nodes)
        same += tokens == expected
        drafted, accepted = drafted + stats.drafted_tokens, accepted + stats.accepted_tokens
        tree_rounds += stats.tree_rounds
    return same, drafted, accepted, tree_rounds
