"""A preset's learned drafters' heads (an EAGLE-3 head, Medusa heads), read and checked against
the loaded target, each with its line for the models panel, or the one-line reason it can't be
used (a note; drafter "eagle" or "medusa" then says why). They load before the target's steps
compile: the compiled steps return the features the heads read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..kernels.int4_linear import gguf_weight_summary
from .config import Preset
from .load_errors import load_errors
from .loaded import ModelInfo
from .sources import LoadError, resolve_head


@dataclass
class LoadedHeads:
    """The heads asked for and loaded (None where not asked for or not loadable), their panel
    lines, why one could not be loaded, and the notes to show."""

    eagle: object | None = None
    eagle_info: ModelInfo | None = None
    eagle_problem: str | None = None
    medusa: object | None = None
    medusa_info: ModelInfo | None = None
    medusa_problem: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def info(self) -> list[ModelInfo]:
        return [info for info in (self.eagle_info, self.medusa_info) if info is not None]

    def feature_layers(self, target) -> tuple[int, ...]:
        """The target layers whose inputs the heads read (Medusa: the last layer's output, named
        as the layer count), so the compiled steps return every feature a loaded drafter reads."""
        layers = set(self.eagle.layer_ids) if self.eagle is not None else set()
        if self.medusa is not None:
            layers.add(target.config.get_text_config().num_hidden_layers)
        return tuple(sorted(layers))


def load_heads(preset: Preset, target, tokenizer, *, eagle: bool, medusa: bool) -> LoadedHeads:
    """The preset's EAGLE head when `eagle` and its Medusa heads when `medusa` (each only where the
    preset names one); a head that can't be loaded or doesn't fit leaves a note."""
    heads = LoadedHeads()
    if preset.eagle is not None and eagle:
        heads.eagle, heads.eagle_info, heads.eagle_problem = _attempt(_load_eagle_head, "EAGLE head", preset, target,
                                                                      tokenizer, heads.notes)
    if preset.medusa is not None and medusa:
        heads.medusa, heads.medusa_info, heads.medusa_problem = _attempt(_load_medusa_heads, "Medusa heads", preset,
                                                                         target, tokenizer, heads.notes)
    return heads


def _attempt(load, what: str, preset: Preset, target, tokenizer, notes: list[str]):
    """(heads, info, None) as `load` gives them, or (None, None, the one-line problem) and a note."""
    try:
        return (*load(preset, target, tokenizer), None)
    except LoadError as error:
        notes.append(f"{what} unavailable: {error}")
        return None, None, str(error)


def _load_eagle_head(preset: Preset, target, tokenizer):
    """(head, ModelInfo): the preset's EAGLE head, read and checked against the target (placed on
    its device, in its dtype). LoadError (one line) when it is missing, broken or doesn't fit."""
    from ..drafters import Eagle3Head, EagleDrafter

    started = time.perf_counter()
    spec = preset.eagle
    with load_errors(spec.label):
        folder = resolve_head(spec)
    head = Eagle3Head.load(folder, num_target_layers=target.config.get_text_config().num_hidden_layers)
    EagleDrafter(head, source=spec.label).bind(target, tokenizer)  # checks the fit; moves it
    parameters = head.parameter_count
    quantization = _head_on_int4(head) if gguf_weight_summary(target) else "none"
    memory = sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()])
    layers = ", ".join(str(i) for i in head.layer_ids)
    info = ModelInfo(
        role="eagle head",
        name=spec.label,
        parameters=parameters,
        memory_bytes=memory,
        device=str(head.device),
        dtype=str(head.dtype).removeprefix("torch."),
        quantization=quantization,
        load_s=time.perf_counter() - started,
        detail=f"draft vocabulary {head.draft_vocab_size:,} of {head.config.vocab_size:,} tokens, reads target layers {layers}",
    )
    return head, info


def _load_medusa_heads(preset: Preset, target, tokenizer):
    """(heads, ModelInfo): the preset's Medusa heads, read and checked against the target (placed
    on its device, in its dtype). LoadError (one line) when they are missing, broken or don't fit."""
    from ..drafters import MedusaDrafter, MedusaHeads

    started = time.perf_counter()
    spec = preset.medusa
    with load_errors(spec.label):
        folder = resolve_head(spec, "medusa")
    heads = MedusaHeads.load(folder)
    MedusaDrafter(heads, source=spec.label).bind(target, tokenizer)  # checks the fit; moves them
    memory = sum(t.numel() * t.element_size() for t in heads.parameters())
    readout = "own output layers" if heads.own_output else "read out through the target's lm_head"
    if heads.draft_token_ids is not None:
        readout += f" over a draft vocabulary of {len(heads.draft_token_ids):,} tokens"
    info = ModelInfo(
        role="medusa heads",
        name=spec.label,
        parameters=heads.parameter_count,
        memory_bytes=memory,
        device=str(heads.device),
        dtype=str(heads.dtype).removeprefix("torch."),
        quantization="none",
        load_s=time.perf_counter() - started,
        detail=f"{heads.num_heads} heads of {heads.num_layers} residual block(s), {readout}",
    )
    return heads, info


def _head_on_int4(head) -> str:
    """Run the head of a target on the 4-bit path on the same int4 kernel, from Q8_0 groups (of 32,
    with a scale) of its own weights; its quantization as the models panel shows it. For the
    offline preset's head a draft step costs a third of what it does as loaded, with the same
    acceptance on the Spec-Bench questions; Q4_1 groups were faster still but kept fewer drafts
    (docs/benchmarks-costs.md). A layer the blocks can't hold
    (a width not a multiple of 32) leaves the head as loaded."""
    from ..kernels.int4_linear import GROUP, quantise_linear_layers

    if any(isinstance(m, torch.nn.Linear) and m.in_features % GROUP for m in head.modules()):
        return "none"
    quantise_linear_layers(head, "Q8_0")
    return "q8_0 on int4 kernels"
