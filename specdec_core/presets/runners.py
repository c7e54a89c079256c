"""A loaded preset's decode runners: the compiled steps its models decode on, or None (eager).

On CUDA both models get a static cache and CUDA graphs (decoding/static.py); on CPU only the
target's steps are compiled (decoding/compiled.py), now or, for a 4-bit target with `compile:
auto`, in a background helper process. Each choice leaves a note for the models panel."""

from __future__ import annotations

from ..decoding.helper_process import HelperCommand
from .config import Preset
from .sources import cache_root


def decode_runners(preset: Preset, target, draft, setting: bool | str, notes: list[str],
                    feature_layers: tuple[int, ...] = (), helper: HelperCommand | None = None):
    """(target_runner, draft_runner): compiled steps when compiling is on, else None. `helper`
    compiles a CPU target's steps in the background (None: no background compile).

    On CUDA both models get a static cache and CUDA graphs (decoding/static.py), compiled and warmed
    up for every step shape now (with a progress bar), so the first reply is not slow. On CPU
    only the target's steps are compiled (_cpu_runners). A failure leaves that model eager: one
    log line and one note say why.
    """
    from ..policy import MAX_DRAFT_LENGTH
    from ..decoding.compiling import step_buckets, wants_compile
    from ..decoding.static import DRAFT_STEP_SIZES, StaticSteps

    if target.device.type == "cpu":
        return _cpu_runners(target, draft, setting, notes, feature_layers, helper), None
    if not wants_compile(setting, target.device):
        return None, None
    verify_sizes = step_buckets(max(MAX_DRAFT_LENGTH, preset.draft_length) + 1)  # 1 token, and k+1 padded up
    runners = []
    for role, model, sizes in (("target", target, verify_sizes), ("draft", draft, DRAFT_STEP_SIZES)):
        if model is None:
            runners.append(None)
            continue
        try:
            layers = feature_layers if role == "target" else ()  # an EAGLE head reads the target's
            # The target's steps verify tree drafts too (each tree size compiled at its first use),
            # so tree drafters keep the baseline's path on the GPU as on the CPU.
            steps = StaticSteps(model, step_sizes=sizes, name=role, feature_layers=layers, trees=role == "target")
        except ValueError as error:  # a model the static cache can't serve (sliding window)
            notes.append(f"{role}: decoding eagerly: {error}")
            runners.append(None)
            continue
        runners.append(_noted(notes, role, steps))
    return tuple(runners)


def _cpu_runners(target, draft, setting: bool | str, notes: list[str], feature_layers: tuple[int, ...],
                 helper: HelperCommand | None):
    """The target's CompiledSteps on CPU (inductor's C++ wrapper on its growing cache), or None.

    `compile: true` compiles them now. `auto` compiles a 4-bit target's steps (lean decoder
    layers, where compiling pays most: 14.6 -> 8.4 ms a SmolLM2 step) in the background, in
    `helper`'s process (stopped while replies decode): decoding starts eagerly at once and takes
    the compiled steps from the first reply after they are ready, minutes later. Either way the steps also return the inputs of the target
    layers `feature_layers` (an EAGLE head's), so its engines decode on them, and are kept in
    specdec's cache folder, where a later start loads them in seconds. A draft stays eager.
    """
    from ..decoding.compiled import CPU_TREE_SIZES, CompiledSteps
    from ..kernels.lean_layers import uses_lean_layers
    from ..decoding.compiling import wants_compile

    background = helper is not None and setting == "auto" and uses_lean_layers(target)
    if not background and not wants_compile(setting, target.device):
        return None
    if draft is not None:
        notes.append("draft: decoding eagerly (on CPU only the target's steps are compiled)")
    kept = cache_root() / "compiled"
    # Tree verify steps too (the tree-size policy's budgets), so tree drafters keep the compiled
    # path, and replies the baseline's; only on row-exact attention, compiled after the chains.
    if background:
        steps = CompiledSteps(target, name="target", feature_layers=feature_layers, background=True, cache_dir=kept,
                              tree_sizes=CPU_TREE_SIZES, helper=helper)
        trees = f" ({len(steps.tree_sizes)} tree step shapes after them)" if steps.tree_sizes else ""
        notes.append(f"target: compiling {len(steps.step_sizes)} step shapes in the background{trees}, decoding "
                     "eagerly until then")
        return steps
    return _noted(notes, "target", CompiledSteps(target, name="target", feature_layers=feature_layers, cache_dir=kept,
                                                 tree_sizes=CPU_TREE_SIZES))


def _noted(notes: list[str], role: str, steps):
    """A model's compiled steps (StaticSteps or CompiledSteps), with a note of how compiling went."""
    if steps.fallback_reason:
        notes.append(f"{role}: torch.compile failed, decoding eagerly ({steps.fallback_reason})")
    else:
        notes.append(f"{role}: compiled {len(steps.step_sizes)} step shapes in {steps.warmup_s:.0f} s")
    return steps
