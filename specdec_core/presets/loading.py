"""Load a preset's target and draft models for this machine, or explain in one line why not.

Placement: on CUDA the draft goes on the first GPU and is loaded first, then the target with
device_map="auto", so accelerate shards it over all visible GPUs around what is already used.
On CPU everything is on "cpu". Weights are bf16 on CUDA and fp32 on CPU unless the preset
says otherwise; the draft can be quantized with bitsandbytes (nf4 or int8).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from .config import AUTO, DRAFTERS, ModelSpec, Preset, PresetFile, load_config
from ..int4_linear import gguf_weight_summary
from ..row_attention import use_row_exact_attention, uses_row_exact_attention
from ..packed_linear import has_packed_layers
from .sources import (
    GATED,
    LoadError,
    MISSING,
    UNREACHABLE,
    ResolvedSource,
    availability_problem,
    gguf_file,
    hub_problem_message,
    resolve,
    resolve_head,
)

__all__ = [
    "LoadError",
    "LoadedModels",
    "ModelInfo",
    "choose_auto_preset",
    "load_preset",
    "unload",
]

_GB = 1024**3


@dataclass(frozen=True)
class ModelInfo:
    """What one loaded model is and what it costs."""

    role: str  # "target" | "draft" | "eagle head"
    name: str  # the source as written in models.yaml
    parameters: int
    memory_bytes: int  # weights and buffers, as the model reports them
    device: str  # "cpu", "cuda:0", or "cuda:0,cuda:1" when sharded
    dtype: str  # dtype of the unquantized parts, e.g. "float32"
    quantization: str  # "nf4" | "int8" | "none"
    load_s: float
    detail: str = ""  # what else matters for this kind of model (an EAGLE head's draft vocabulary)

    def line(self) -> str:
        detail = f"  {self.detail}" if self.detail else ""
        return (
            f"{self.role}: {self.name}  {self.parameters / 1e6:,.1f}M params  "
            f"{self.memory_bytes / 1e6:,.0f} MB  {self.device}  {self.dtype}  "
            f"quantization {self.quantization}{detail}  loaded in {self.load_s:.1f} s"
        )


@dataclass
class LoadedModels:
    """A preset's models, ready to build engines from. Not frozen: `unload` clears it."""

    preset: Preset
    tokenizer: object  # the target's tokenizer (the draft's maps tokens the same way)
    target: torch.nn.Module | None
    draft: torch.nn.Module | None
    info: list[ModelInfo]
    notes: list[str] = field(default_factory=list)  # one-line remarks: auto choice, fallbacks
    draft_tokenizer: object | None = None
    # The make_runner of each model in engines (who owns its KV cache): None for the eager
    # dynamic cache (CachedModel), or compiled steps warmed up at load (StaticSteps on CUDA,
    # CompiledSteps on CPU).
    target_runner: Callable | None = None
    draft_runner: Callable | None = None
    # The preset's EAGLE-3 head (shared by every engine that drafts with it), or why there is none.
    eagle_head: torch.nn.Module | None = None
    eagle_problem: str | None = None
    _engines: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # see engine()
    # One kept conversation per model, shared by every engine made here (see make_engine):
    # KeptRunners by (role, make_runner), and "eagle": the one EagleDrafter of the head.
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def make_engine(
        self,
        drafter: str | None = None,
        draft_length: int | None = None,
        adaptive: bool | None = None,
        stop_strings: tuple[str, ...] = (),
    ):
        """A SpeculativeEngine over the target; None arguments take the preset's defaults.

        Every engine made here shares one kept KV cache of the target, and every draft-model
        drafter one of the draft model: memory holds one conversation per model however many
        settings were tried (the engines take turns; one generation at a time among them)."""
        from ..engine import SpeculativeEngine

        if self.target is None:
            raise LoadError(f"the models of preset {self.preset.name} were unloaded: load it again")
        drafter, draft_length, adaptive = self._settings(drafter, draft_length, adaptive)
        built = self._drafter(drafter)
        target_runner = self.target_runner
        if built is not None and not _reads_features(target_runner, built.feature_layers):
            target_runner = None  # the compiled steps can't hand it the target's features: eager forwards can
        return SpeculativeEngine(
            self.target,
            self.tokenizer,
            drafter=built,
            draft_length=draft_length,
            adaptive=adaptive,
            stop_strings=stop_strings,
            **_runner_argument(target_runner),
            kept=self._kept_cache("target", self.target, target_runner),
        )

    def _kept_cache(self, role: str, model, runner: Callable | None):
        """The one KeptRunner of a model's cache on a decode path (`runner`: its make_runner,
        None for the eager CachedModel; an EAGLE engine on compiled steps that can't hand it
        features reads the target eagerly)."""
        from ..runner import CachedModel, KeptRunner

        key = (role, runner)
        if key not in self._kept:
            self._kept[key] = KeptRunner(runner or CachedModel, model)
        return self._kept[key]

    def cache_bytes(self) -> dict[str, int]:
        """Bytes of the kept KV caches now, by role ("target", "draft")."""
        sizes: dict[str, int] = {}
        for key, kept in self._kept.items():
            role = key if isinstance(key, str) else key[0]
            sizes[role] = sizes.get(role, 0) + kept.memory_bytes()
        return sizes

    def cache_line(self) -> str:
        """One line for the models panel: the KV cache memory in use."""
        sizes = self.cache_bytes()
        parts = [f"{role} {sizes[role] / 1e6:,.1f} MB" for role in ("target", "draft", "eagle") if role in sizes]
        return "KV caches: " + (", ".join(parts) if parts else "none yet") + " (one conversation per model)"

    def engine(self, drafter: str | None = None, draft_length: int | None = None, adaptive: bool | None = None):
        """The engine for these settings, built on first use and then kept, so what its draft
        policy measured (step costs, acceptance) carries over from one reply to the next.
        Serves one generation at a time, like every engine."""
        key = self._settings(drafter, draft_length, adaptive)
        if key not in self._engines:
            self._engines[key] = self.make_engine(*key)
        return self._engines[key]

    def _settings(self, drafter: str | None, draft_length: int | None, adaptive: bool | None) -> tuple:
        """(drafter, draft_length, adaptive), the preset's defaults in place of None."""
        return (
            drafter or self.preset.drafter,
            draft_length if draft_length is not None else self.preset.draft_length,
            self.preset.adaptive if adaptive is None else adaptive,
        )

    @property
    def decode_path(self) -> str:
        """The decode path engines take: "compiled static cache" or "eager dynamic cache" (or
        "eager static cache"); per model when the target's and the draft's differ."""
        target = _decode_path(self.target_runner)
        draft = _decode_path(self.draft_runner) if self.draft is not None else target
        return target if draft == target else f"target {target}, draft {draft}"

    def describe(self) -> str:
        """One line per model: parameters, memory, device, dtype, quantization, load time, decode path."""
        runners = {"target": (self.target_runner, self.target), "draft": (self.draft_runner, self.draft)}
        lines = []
        for info in self.info:
            if info.role in runners:
                lines.append(f"{info.line()}  decode: {_decode_path(*runners[info.role])}")
            else:  # the EAGLE head runs eagerly; the target under it as its steps allow
                eager_target = not _reads_features(self.target_runner, self.eagle_head.layer_ids)
                target_path = "; the target decodes eagerly with it" if eager_target else ""
                lines.append(f"{info.line()}  decode: eager{target_path}")
        return "\n".join(lines)

    def _drafter(self, kind: str):
        from ..drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter

        if kind not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {kind!r}")
        if kind == "none":
            return None
        if kind == "prompt_lookup":
            return PromptLookupDrafter()
        if kind == "eagle":
            return self._eagle_drafter()
        if kind == "hybrid":
            if self.eagle_head is not None:
                return HybridDrafter(self._eagle_drafter())
            if self.draft is None:
                raise LoadError(f"preset {self.preset.name} has no EAGLE head and no draft model for hybrid "
                                f"({self._eagle_missing()}): use drafter prompt_lookup")
            return HybridDrafter(self._drafter("model"))
        if self.draft is None:
            missing = "has no draft model" if self.preset.draft is None else "was loaded without its draft model"
            raise LoadError(f"preset {self.preset.name} {missing}: use drafter prompt_lookup or none")
        return ModelDrafter(self.draft, tokenizer=self.draft_tokenizer, **_runner_argument(self.draft_runner),
                            kept=self._kept_cache("draft", self.draft, self.draft_runner))

    def _eagle_drafter(self):
        """The one EagleDrafter of this preset's head: it keeps the head's KV cache of the last
        conversation, so the eagle and hybrid engines of every setting share that one cache."""
        from ..drafters import EagleDrafter

        if "eagle" not in self._kept:
            self._kept["eagle"] = EagleDrafter(self._eagle_head(), source=self.preset.eagle.label)
        return self._kept["eagle"]

    def _eagle_head(self):
        if self.eagle_head is None:
            raise LoadError(f"{self._eagle_missing()}: use drafter prompt_lookup or model")
        return self.eagle_head

    def _eagle_missing(self) -> str:
        if self.eagle_problem:
            return self.eagle_problem
        if self.preset.eagle is None:
            return f"preset {self.preset.name} has no eagle: head source (add one in models.yaml)"
        return f"preset {self.preset.name} was loaded without its EAGLE head"


def _runner_argument(runner: Callable | None) -> dict:
    return {} if runner is None else {"make_runner": runner}


def _decode_path(runner: Callable | None, model=None) -> str:
    path = getattr(runner, "decode_path", "eager dynamic cache")
    if model is None:
        return path
    gguf = gguf_weight_summary(model)
    if gguf:
        path += f", {gguf} on int4 kernels"
    if uses_row_exact_attention(model):
        path += ", row-exact attention"
    return f"{path}, prepacked weights" if has_packed_layers(model) else path


def load_preset(
    name: str = AUTO,
    config_path=None,
    *,
    load_draft: bool | None = True,
    compile: bool | str | None = None,
    load_eagle: bool | None = True,
    cpu_weights: str | None = None,
) -> LoadedModels:
    """Load a preset by name ("auto" picks one for this machine; see models.yaml).

    load_draft=False skips the draft model (faster, for runs that won't use drafter "model");
    None loads it only when the preset's default drafter is "model". load_eagle likewise for the
    preset's EAGLE head (None: only when the default drafter is "eagle" or "hybrid"); a head that
    can't be loaded or doesn't fit the target leaves a note (and drafter "eagle" says why).
    compile: true | false | "auto" overrides the preset's `compile` key (None: the preset's);
    when on, both models' decoding steps are compiled here, before this returns.
    cpu_weights: "fp32" | "gguf" overrides the preset's `cpu_weights` key (None: the preset's);
    "gguf" runs a CPU target's linear layers on its GGUF file's own 4-bit blocks (int4_linear).
    Raises ConfigError for an invalid file and LoadError (one line) for everything that
    stops the models from loading.
    """
    config = load_config(config_path)
    notes: list[str] = []
    if name == AUTO:
        name, notes = choose_auto_preset(config)
    preset = config.find(name)
    cuda = torch.cuda.is_available()
    notes += _preset_notes(preset, cuda)

    # Tokenizers first: a mismatched pair fails before any weights load.
    target_source, tokenizer = _source_and_tokenizer(preset.target, preset)
    if load_draft is None:
        load_draft = preset.drafter == "model"
    draft_spec = preset.draft if load_draft else None
    draft_source = draft_tokenizer = None
    if draft_spec is not None:
        draft_source, draft_tokenizer = _source_and_tokenizer(draft_spec, preset)
        check_same_tokenizer(tokenizer, draft_tokenizer, preset.target.label, draft_spec.label)

    dtype = resolve_dtype(preset.dtype, cuda)
    draft, info = None, []
    if draft_spec is not None:  # first, so the target's device_map="auto" sees it on GPU 0
        quantization, note = draft_quantization(preset.draft_quantization, cuda)
        notes += [note] if note else []
        draft, draft_info = _load_model(preset, "draft", draft_source, dtype, quantization, cuda)
        info.append(draft_info)
    target, target_info = _load_model(preset, "target", target_source, dtype, None, cuda)
    notes += _offload_notes(target)
    weights = preset.cpu_weights if cpu_weights is None else cpu_weights
    if weights == "gguf" and target.device.type == "cpu":  # before compiling: it changes the model
        target_info, gguf_notes = _use_gguf_weights(preset.target, target, target_info)
        notes += gguf_notes
    if gguf_weight_summary(target):  # before compiling: the compiled steps keep it
        notes += _exact_rows(target)
    if load_eagle is None:
        load_eagle = preset.drafter in ("eagle", "hybrid")
    eagle_head = eagle_problem = eagle_info = None
    if preset.eagle is not None and load_eagle:  # before compiling: the compiled steps read its features
        try:
            eagle_head, eagle_info = _load_eagle_head(preset, target, tokenizer)
        except LoadError as error:
            eagle_problem = str(error)
            notes.append(f"EAGLE head unavailable: {eagle_problem}")
    setting = preset.compile if compile is None else compile
    feature_layers = eagle_head.layer_ids if eagle_head is not None else ()
    target_runner, draft_runner = _decode_runners(preset, target, draft, setting, notes, feature_layers)
    info = [target_info, *info, *([eagle_info] if eagle_info else [])]
    for role, model, runner in (("target", target, target_runner), ("draft", draft, draft_runner)):
        if model is not None and runner is None:  # eager decoding; compiled steps pick their own kernels
            notes += _pack_for_cpu(role, model, info)
    return LoadedModels(
        preset=preset,
        tokenizer=tokenizer,
        target=target,
        draft=draft,
        info=info,
        notes=notes,
        draft_tokenizer=draft_tokenizer,
        target_runner=target_runner,
        draft_runner=draft_runner,
        eagle_head=eagle_head,
        eagle_problem=eagle_problem,
    )


def load_plain_target(name: str = AUTO, config_path=None, dtype: torch.dtype = torch.bfloat16):
    """The preset's target alone, on stock layers with its weights in `dtype`: no 4-bit kernels,
    no prepacking, no compiling. For bulk batched work, not for decoding: the EAGLE trainer's
    data, where a CPU's bf16 matrix units (AMX) run batched generation faster than the 4-bit
    kernels (measured on SmolLM2-135M: 32 rows at a short prompt 79 ms a step against 180; a
    whole data shard 29 s against 43). LoadError (one line) when it can't be loaded."""
    config = load_config(config_path)
    if name == AUTO:
        name, _ = choose_auto_preset(config)
    preset = config.find(name)
    source, _ = _source_and_tokenizer(preset.target, preset)
    model, _ = _load_model(preset, "target", source, dtype, None, torch.cuda.is_available())
    return model


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
    memory = sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()])
    layers = ", ".join(str(i) for i in head.layer_ids)
    info = ModelInfo(
        role="eagle head",
        name=spec.label,
        parameters=parameters,
        memory_bytes=memory,
        device=str(head.device),
        dtype=str(head.dtype).removeprefix("torch."),
        quantization="none",
        load_s=time.perf_counter() - started,
        detail=f"draft vocabulary {head.draft_vocab_size:,} of {head.config.vocab_size:,} tokens, reads target layers {layers}",
    )
    return head, info


def _decode_runners(preset: Preset, target, draft, setting: bool | str, notes: list[str],
                    feature_layers: tuple[int, ...] = ()):
    """(target_runner, draft_runner): compiled steps when compiling is on, else None.

    On CUDA both models get a static cache and CUDA graphs (static_runner); on CPU the target
    gets steps compiled with inductor's C++ wrapper on its growing cache (compiled_runner),
    reading the target layers `feature_layers` for an EAGLE head too, and a draft stays eager. Compiles and warms up every step shape now (with a progress bar), so
    the first reply is not slow. A failure leaves that model eager: one log line and one note say why.
    """
    from ..policy import MAX_DRAFT_LENGTH
    from ..static_runner import DRAFT_STEP_SIZES, StaticSteps, step_buckets, wants_compile

    if not wants_compile(setting, target.device):
        return None, None
    if target.device.type == "cpu":
        from ..compiled_runner import CompiledSteps

        if draft is not None:
            notes.append("draft: decoding eagerly (on CPU only the target's steps are compiled)")
        return _noted(notes, "target", CompiledSteps(target, name="target", feature_layers=feature_layers)), None
    verify_sizes = step_buckets(max(MAX_DRAFT_LENGTH, preset.draft_length) + 1)  # 1 token, and k+1 padded up
    runners = []
    for role, model, sizes in (("target", target, verify_sizes), ("draft", draft, DRAFT_STEP_SIZES)):
        if model is None:
            runners.append(None)
            continue
        try:
            steps = StaticSteps(model, step_sizes=sizes, name=role)
        except ValueError as error:  # a model the static cache can't serve (sliding window)
            notes.append(f"{role}: decoding eagerly: {error}")
            runners.append(None)
            continue
        runners.append(_noted(notes, role, steps))
    return tuple(runners)


def _reads_features(runner, layer_ids: tuple[int, ...]) -> bool:
    """Whether engines on `runner` (a make_runner; None: eager) hand a drafter reading the target
    layers `layer_ids` its features: eager forwards always do (hooks); compiled steps only
    when compiled with them (CompiledSteps.reads_features); CUDA graphs don't."""
    if not layer_ids or runner is None or not getattr(runner, "compiled", False):
        return True
    return getattr(runner, "reads_features", lambda layers: False)(layer_ids)


def _noted(notes: list[str], role: str, steps):
    """A model's compiled steps (StaticSteps or CompiledSteps), with a note of how compiling went."""
    if steps.fallback_reason:
        notes.append(f"{role}: torch.compile failed, decoding eagerly ({steps.fallback_reason})")
    else:
        notes.append(f"{role}: compiled {len(steps.step_sizes)} step shapes in {steps.warmup_s:.0f} s")
    return steps


def _use_gguf_weights(spec: ModelSpec, model, info: ModelInfo) -> tuple[ModelInfo, list[str]]:
    """Run the target's linear layers on its GGUF file's 4-bit blocks (see int4_linear): the
    updated ModelInfo, and one note where that can't be done here (fp32 weights run then)."""
    from ..int4_linear import use_gguf_weights

    with load_errors(spec.label):
        path = gguf_file(spec)
    started = time.perf_counter()
    swap = use_gguf_weights(model, path)
    if swap.problem or not swap.swapped:
        why = swap.problem or "no Q4_0, Q4_1 or Q8_0 linear layers in the file"
        return info, [f"target: fp32 weights, not the GGUF's 4-bit ones ({why})"]
    reasons = sorted(set(swap.kept.values()))
    notes = [f"target: {sum(w == why for w in swap.kept.values())} linear layers stay fp32 ({why})" for why in reasons]
    kinds = "+".join(sorted(swap.swapped)).lower()
    info = replace(info, quantization=f"gguf {kinds}", memory_bytes=model.get_memory_footprint(),
                   load_s=info.load_s + time.perf_counter() - started)
    return info, notes


def _exact_rows(model) -> list[str]:
    """The 4-bit target's logits are bf16 and tie often: switch it to row-exact attention (see
    row_attention), so a verify step breaks every tie as a 1-token step does, eager or compiled;
    a note where that can't be done."""
    problem = use_row_exact_attention(model)
    if not problem:
        return []
    return [f"target: stock attention ({problem}): at a tie of its bf16 logits, greedy speculative output "
            "may differ from plain decoding"]


def _pack_for_cpu(role: str, model, info: list[ModelInfo]) -> list[str]:
    """Prepack the fp32 linear layers of a CPU model for oneDNN (see packed_linear) and update
    its memory in `info` (a packed copy of a tied output embedding is extra); a note if that
    can't be done here."""
    from ..packed_linear import pack_linear_layers

    if model.device.type != "cpu":
        return []
    swapped, problem = pack_linear_layers(model)
    if problem:
        return [f"{role}: stock linear layers ({problem})"]
    if swapped:
        at = next(i for i, item in enumerate(info) if item.role == role)
        info[at] = replace(info[at], memory_bytes=model.get_memory_footprint())
    return []


def _preset_notes(preset: Preset, cuda: bool) -> list[str]:
    notes = []
    if preset.requires_gpu and not cuda:
        notes.append(f"{preset.name} is meant for a GPU and there is none: it runs on the CPU, slowly")
    if preset.trust_remote_code:
        notes.append(f"preset {preset.name} runs code shipped with its models (trust_remote_code: true)")
    return notes


def unload(models: LoadedModels) -> None:
    """Drop the models and free their memory (engines built from them must be dropped too)."""
    compiled = any(getattr(r, "compiled", False) for r in (models.target_runner, models.draft_runner))
    models.target = None
    models.draft = None
    models.eagle_head = None
    models._engines.clear()
    models._kept.clear()
    models.target_runner = models.draft_runner = None  # they hold the models and KV caches
    if compiled:
        torch._dynamo.reset()  # compiled graphs (and CUDA graph pools) hold the weights too
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- choosing a preset


def choose_auto_preset(
    config: PresetFile,
    free_gpu_bytes: int | None = None,
    problem_of: Callable[[ModelSpec], str | None] = availability_problem,
) -> tuple[str, list[str]]:
    """The rule in models.yaml: the largest GPU preset that fits and can load, else the fallback.

    Returns the preset name and one line per preset passed over (and one for the pick).
    free_gpu_bytes and problem_of are parameters so tests can describe a machine.
    """
    if free_gpu_bytes is None:
        free_gpu_bytes = free_cuda_bytes()
    gpu_presets = sorted(
        (p for p in config.presets.values() if p.requires_gpu), key=lambda p: p.memory_gb, reverse=True
    )
    fallback = config.auto_fallback
    if not free_gpu_bytes:
        skipped = ", ".join(p.name for p in gpu_presets) or "none defined"
        return fallback, [f"auto: no CUDA GPU, picked {fallback} (GPU presets: {skipped})"]
    notes = []
    for preset in gpu_presets:
        why = _why_not_runnable(preset, free_gpu_bytes, problem_of)
        if why is None:
            notes.append(f"auto: picked {preset.name} ({free_gpu_bytes / _GB:.1f} GB of GPU memory free)")
            return preset.name, notes
        notes.append(f"auto: passed over {preset.name}: {why}")
    notes.append(f"auto: picked {fallback}")
    return fallback, notes


def _why_not_runnable(
    preset: Preset, free_gpu_bytes: int, problem_of: Callable[[ModelSpec], str | None]
) -> str | None:
    if preset.memory_gb * _GB > free_gpu_bytes:
        return f"needs {preset.memory_gb:g} GB of GPU memory, {free_gpu_bytes / _GB:.1f} GB free"
    for spec in (preset.target, preset.draft):
        problem = problem_of(spec) if spec is not None else None
        if problem:
            return f"{spec.label}: {problem}"
    return None


def free_cuda_bytes() -> int:
    """Free memory of all visible GPUs together (0 without CUDA)."""
    if not torch.cuda.is_available():
        return 0
    return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))


# ---------------------------------------------------------------- loading


def resolve_dtype(name: str, cuda: bool) -> torch.dtype:
    """auto: bf16 on CUDA (fp16 on GPUs without bf16), fp32 on CPU."""
    if name != "auto":
        return getattr(torch, name)
    if not cuda:
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def draft_quantization(kind: str, cuda: bool):
    """(BitsAndBytesConfig or None, a one-line note or None) for a draft quantization setting."""
    if kind == "none":
        return None, None
    from transformers import BitsAndBytesConfig
    from transformers.utils import is_bitsandbytes_available

    if not is_bitsandbytes_available():
        return None, f"bitsandbytes is not available here: the draft loads unquantized instead of {kind}"
    if kind == "8bit":
        # int8 matmuls on CPU cast fp32 inputs to fp16 and log that on every call.
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
        return BitsAndBytesConfig(load_in_8bit=True), None
    # bf16 compute: native on CUDA and what bitsandbytes' CPU kernels were measured with.
    return (
        BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        ),
        None,
    )


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose tokenizer maps tokens differently (padded model vocabularies may differ)."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
    raise LoadError(
        f"draft {draft_name} and target {target_name} use different tokenizers "
        f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {differing} mappings differ): "
        "pick a draft from the target's model family"
    )


def _source_and_tokenizer(spec: ModelSpec, preset: Preset):
    """Make the model loadable (download check, GGUF conversion) and load its tokenizer."""
    from transformers import AutoTokenizer

    with load_errors(spec.label):
        source = resolve(spec)
        tokenizer = AutoTokenizer.from_pretrained(
            source.path, local_files_only=source.local_files_only, trust_remote_code=preset.trust_remote_code
        )
    return source, tokenizer


def _load_model(
    preset: Preset, role: str, source: ResolvedSource, dtype: torch.dtype, quantization, cuda: bool
):
    """(model, ModelInfo) for the preset's target or draft."""
    from transformers import AutoModelForCausalLM

    spec = preset.target if role == "target" else preset.draft
    started = time.perf_counter()
    with load_errors(spec.label):
        model = AutoModelForCausalLM.from_pretrained(
            source.path,
            local_files_only=source.local_files_only,
            dtype=dtype,
            device_map=_device_map(role, cuda),
            quantization_config=quantization,
            trust_remote_code=preset.trust_remote_code,
        )
    model.eval()
    return model, model_info(model, role, spec.label, quantization, time.perf_counter() - started)


def _device_map(role: str, cuda: bool):
    if not cuda:
        return "cpu"  # bitsandbytes on CPU needs an explicit CPU placement
    return "auto" if role == "target" else {"": 0}


def model_info(model, role: str, name: str, quantization, load_s: float) -> ModelInfo:
    return ModelInfo(
        role=role,
        name=name,
        parameters=model.num_parameters(),  # counts 4-bit packed weights at full size
        memory_bytes=model.get_memory_footprint(),
        device=_devices(model),
        dtype=str(model.dtype).removeprefix("torch."),
        quantization=_quantization_name(quantization),
        load_s=load_s,
    )


def _quantization_name(quantization) -> str:
    if quantization is None:
        return "none"
    if getattr(quantization, "load_in_4bit", False):
        return quantization.bnb_4bit_quant_type
    return "int8"


def _devices(model) -> str:
    device_map = getattr(model, "hf_device_map", None) or {}
    devices = sorted({_device_name(d) for d in device_map.values()})
    return ",".join(devices) if len(devices) > 1 else str(model.device)


def _device_name(device) -> str:
    return f"cuda:{device}" if isinstance(device, int) else str(device)


def _offload_notes(model) -> list[str]:
    placed = {_device_name(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if torch.cuda.is_available() and placed & {"cpu", "disk"}:
        return ["the target does not fit on the GPUs: part of it runs from CPU memory (slow); "
                "a smaller preset would fit"]
    return []


# ---------------------------------------------------------------- errors


@contextmanager
def load_errors(name: str) -> Iterator[None]:
    """Turn what loading `name` can raise into a one-line LoadError; re-raise anything else."""
    try:
        yield
    except LoadError:
        raise
    except Exception as error:
        message = explain_load_error(error, name)
        if message is None:
            raise
        raise LoadError(message) from error


def explain_load_error(error: BaseException, name: str) -> str | None:
    """One line for a known failure while loading `name` (a hub id or path); None if unknown."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    chain = list(_exception_chain(error))
    if any(isinstance(e, GatedRepoError) for e in chain):
        return hub_problem_message(name, GATED)
    if any(isinstance(e, RepositoryNotFoundError) for e in chain):
        return hub_problem_message(name, MISSING)
    if any(isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError)) for e in chain):
        return hub_problem_message(name, UNREACHABLE)
    if any(_is_out_of_memory(e) for e in chain):
        return (
            f"out of memory while loading {name}: use a 4-bit draft (draft_quantization: 4bit) "
            "or a smaller preset (see `python -m specdec_core presets`)"
        )
    if isinstance(error, ValueError) and "trust_remote_code" in str(error):
        return (
            f"{name} ships its own model code: set trust_remote_code: true in its preset "
            "only if you trust that code"
        )
    if isinstance(error, OSError):
        return f"could not load {name}: {_first_line(error)}"
    return None


def _exception_chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
