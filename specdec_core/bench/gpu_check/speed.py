"""The parts that measure speed in bf16: the fast path (compiled steps, CUDA graphs, the cost
model's table), the EAGLE-3 head's cost, and the ceiling at the draft model's measured c."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import ceiling
from ..architectures import NumberTokenizer, random_model
from ..ceiling_report import markdown as ceiling_markdown
from ..cost_model import run_cost_model
from ..cost_model_report import markdown_table
from ..machine import free_memory
from ..outputs import write_text
from .fixtures import cudagraph_skips
from .part import Part, Scale


def part_fast_path(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """bf16 compiled: compile time, CUDA graphs, the cost model's table."""
    dtype = torch.bfloat16
    models = {"target": random_model(scale.target, dtype, scale.device, seed=0),
              "draft": random_model(scale.draft, dtype, scale.device, seed=1)}
    runners: dict = {}
    if scale.backend != "inductor":  # the app's steps, traced only (see Scale.backend)
        from ...decoding.static import DEFAULT_STEP_SIZES, DRAFT_STEP_SIZES, StaticSteps

        for role, sizes in (("target", DEFAULT_STEP_SIZES), ("draft", DRAFT_STEP_SIZES)):
            runners[role] = StaticSteps(models[role], step_sizes=sizes, progress=False, name=role, backend=scale.backend)
    skips = cudagraph_skips()
    result = run_cost_model(scale.target, scale.draft, device=scale.device, dtype="bfloat16", context=scale.context,
                            repeats=scale.cost_repeats, modes=("eager", "compiled"), progress=False, built=models,
                            runners=runners, bandwidth_gbs=None if scale.device.startswith("cuda") else 10.0,
                            eagle=True)
    skipped = cudagraph_skips() - skips
    compiled = result["modes"]["compiled"]
    part.data["cost_model"] = result
    part.data["cost_model_table"] = markdown_table(result)
    write_text(out / "cost_model.md", part.data["cost_model_table"])
    part.check("target and draft steps compiled", not any(compiled["fallback"].values()),
               f"compile ({scale.backend}): target {runners['target'].warmup_s:.1f} s, draft "
               f"{runners['draft'].warmup_s:.1f} s (step sizes {runners['target'].step_sizes} and "
               f"{runners['draft'].step_sizes})")
    part.data["compile_s"] = {role: round(r.warmup_s, 1) for role, r in runners.items()}
    cuda = scale.device.startswith("cuda")
    part.check("CUDA graphs in use (inductor skipped none)", skipped == 0 if cuda else None,
               f"cudagraph skips: {skipped}" if cuda else "CPU: no CUDA graphs")
    fraction, c = compiled["bandwidth_fraction"], compiled["c"]
    part.check("compiled baseline >= 60% of the bandwidth ceiling", fraction >= 0.6 if cuda else None,
               f"{fraction:.0%} ({compiled['baseline_tokens_per_s']} of {compiled['bandwidth_ceiling_tokens_per_s']} tok/s)")
    part.check("c <= 0.2 (compiled draft step / target step)", c <= 0.2 if cuda else None, f"c = {c}")
    head = result["eagle"]["modes"]["compiled"]
    part.check("EAGLE-3 head of the target's shape timed", True,
               f"{result['eagle']['step_ms']} ms a step (eager), c = {head['c']} of a compiled target step")
    shared.update(models=models, runners=runners, c=c)
    return None


def part_eagle_cost(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The cost model over the EAGLE-3 target (Llama-3.1-8B shapes), with a head of its shape."""
    shared.pop("models", None), shared.pop("runners", None), shared.pop("ceiling_subject", None)
    free_memory()
    cuda = scale.device.startswith("cuda")
    modes = ("eager", "compiled") if scale.backend == "inductor" else ("eager",)  # TINY: no codegen
    result = run_cost_model(scale.eagle_target, scale.eagle_draft, device=scale.device, dtype="bfloat16",
                            context=scale.context, repeats=scale.cost_repeats, modes=modes,
                            progress=False, bandwidth_gbs=None if cuda else 10.0, eagle=True)
    part.data["cost_model"] = result
    table = markdown_table(result)
    write_text(out / "cost_model_eagle.md", table)
    head = result["eagle"]
    mode = modes[-1]
    part.check(f"EAGLE-3 head's c over the {mode} target", True,
               f"head {head['step_ms']} ms (eager, {head['parameters']} params), c = {head['modes'][mode]['c']} "
               f"(the draft model's c = {result['modes'][mode]['c']})")
    return None


def part_ceiling(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """The ceiling on the compiled bf16 target, drafting at the draft model's measured c."""
    if "models" not in shared:
        return "needs the fast_path part (its compiled target and measured c)"
    target = shared["models"]["target"]
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, target.config.vocab_size, (scale.prompt_tokens,), generator=generator).tolist()
               for _ in range(max(scale.prompts - 1, 1))]
    subject = ceiling.Subject(target, NumberTokenizer(), prompts, shared["runners"]["target"],
                              {"architecture": scale.target, "dtype": "bfloat16", "device": scale.device,
                               "decode_path": shared["runners"]["target"].decode_path})
    results = {}
    for label, c in (("free drafter", 0.0), ("draft model's c", shared["c"])):
        result = ceiling.run_ceiling(subject, acceptances=scale.ceiling_acceptances, draft_lengths=(4,), adaptive=True,
                                     draft_cost=c, max_new_tokens=scale.ceiling_tokens, progress=False)
        results[label] = result
        write_text(out / f"ceiling_{'free' if c == 0 else 'c'}.md", ceiling_markdown(result))
    part.data["ceiling"] = results
    at = min(scale.ceiling_acceptances, key=lambda a: abs(a - 0.8))
    best = max((r for r in results["draft model's c"]["results"] if r["acceptance"] == at), key=lambda r: r["speedup"])
    cuda = scale.device.startswith("cuda")
    part.check(f"ceiling speedup >= 2.0x at a = {at:g} with the draft model's c", best["speedup"] >= 2.0 if cuda else None,
               f"{best['speedup']}x ({best['setting']}, predicted {best['predicted_speedup']}x, c = {best['c']})")
    shared["ceiling_subject"] = subject
    return None
