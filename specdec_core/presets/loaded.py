"""A preset's loaded models and the engines they make (LoadedModels), what each model is and
costs (ModelInfo), and unloading them. Loading itself is loading.py's."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from ..decoding.base import DecodePath
from ..decoding.eager import EagerPath
from ..errors import LoadError
from ..kernels.int4_linear import gguf_weight_summary
from ..kernels.lean_layers import uses_lean_layers
from ..kernels.packed_linear import has_packed_layers
from ..kernels.row_attention import uses_row_exact_attention
from .config import DRAFTERS, Preset

__all__ = ["LoadedModels", "ModelInfo", "unload"]


@dataclass(frozen=True)
class ModelInfo:
    """What one loaded model is and what it costs."""

    role: str  # "target" | "draft" | "eagle head"
    name: str  # the source as written in models.yaml
    parameters: int
    memory_bytes: int  # weights and buffers, as the model reports them
    device: str  # "cpu", "cuda:0", or "cuda:0,cuda:1" when sharded
    dtype: str  # dtype of the unquantized parts, e.g. "float32"
    # "nf4" | "int8" | "none"; on int4 kernels "gguf q4_1+q8_0" (a target), "q8_0 on int4 kernels" (a head)
    quantization: str
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
    # The decode path of each model, the make_runner of its engines (who owns its KV cache):
    # EagerPath, or compiled steps (StaticSteps on CUDA, CompiledSteps on CPU). None: eager.
    target_runner: DecodePath | None = None
    draft_runner: DecodePath | None = None
    # The preset's EAGLE-3 head (shared by every engine that drafts with it), or why there is none.
    eagle_head: torch.nn.Module | None = None
    eagle_problem: str | None = None
    # The preset's Medusa heads (shared by every engine that drafts with them), or why there are none.
    medusa_heads: torch.nn.Module | None = None
    medusa_problem: str | None = None
    _engines: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # see engine()
    # One kept conversation per model, shared by every engine made here (see make_engine):
    # KeptRunners by (role, make_runner), and "eagle": the one EagleDrafter of the head.
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # The preset's retrieval datastore, read on first use (drafter retrieval): no cache, one per preset.
    _retrieval: object | None = field(default=None, init=False, repr=False, compare=False)

    def make_engine(
        self,
        drafter: str | None = None,
        draft_length: int | None = None,
        adaptive: bool | None = None,
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
        target_path = self.path("target")
        if built is not None and not target_path.reads_features(built.feature_layers):
            # Steps built without these layers (compiled steps return the features they were
            # built for, an EAGLE head's at load): eager forwards read any layer. The models panel says so.
            target_path = EagerPath(self.target)
        return SpeculativeEngine(
            self.target,
            self.tokenizer,
            drafter=built,
            draft_length=draft_length,
            adaptive=adaptive,
            make_runner=target_path,
            kept=self._kept_cache("target", target_path),
        )

    def path(self, role: str) -> DecodePath:
        """The decode path of the "target" or the "draft" (eager where none was chosen)."""
        model, path = (self.target, self.target_runner) if role == "target" else (self.draft, self.draft_runner)
        return path if path is not None else EagerPath(model)

    def _kept_cache(self, role: str, path: DecodePath):
        """The one KeptRunner of a model's cache on a decode path (an EAGLE engine on compiled
        steps that can't hand it features reads the target eagerly, on a cache of its own)."""
        from ..decoding.eager import KeptRunner

        key = (role, path)
        if key not in self._kept:
            self._kept[key] = KeptRunner(path, path.model)
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
        parts = [f"{role} {sizes[role] / 1e6:,.1f} MB" for role in ("target", "draft", "eagle", "layer_skip")
                 if role in sizes]
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

    def wait_for_compiling(self, timeout: float | None = None) -> bool:
        """Wait for a background compile of the decoding steps (compile: auto on CPU) to end;
        whether it has ended (at once without one), so the decode path is the one it will keep."""
        compiling = [path for path in self._paths() if path.compiling]
        for path in compiling:
            path.wait(timeout)
        return not any(path.compiling for path in compiling)

    def _paths(self) -> list[DecodePath]:
        return [self.path(role) for role, model in (("target", self.target), ("draft", self.draft)) if model is not None]

    @property
    def decode_path(self) -> str:
        """The decode path engines take: "compiled static cache" or "eager dynamic cache" (or
        "eager static cache"); per model when the target's and the draft's differ."""
        target = _decode_path(self.path("target"))
        draft = _decode_path(self.path("draft")) if self.draft is not None else target
        return target if draft == target else f"target {target}, draft {draft}"

    def low_precision(self) -> str | None:
        """What the target computes in if greedy identity with plain decoding can break at a
        rounding tie: bf16 or fp16 weights, or GGUF weights on int4 kernels (which compute in
        bf16) without row-exact attention (with it, a verify step breaks every tie as a 1-token
        step does). None: greedy speculative output is identical, or it is a bug."""
        name = str(getattr(self.target, "dtype", "")).removeprefix("torch.")
        if name in ("bfloat16", "float16"):
            return name
        if not uses_row_exact_attention(self.target) and gguf_weight_summary(self.target):
            return "bfloat16 int4 kernels"
        return None

    def describe(self) -> str:
        """One line per model: parameters, memory, device, dtype, quantization, load time, decode path."""
        lines = []
        for info in self.info:
            if info.role in ("target", "draft"):
                lines.append(f"{info.line()}  decode: {_decode_path(self.path(info.role), detailed=True)}")
            else:  # a head runs eagerly; the target under it as its steps allow
                layers = self.eagle_head.layer_ids if info.role == "eagle head" else (self.target.config.get_text_config().num_hidden_layers,)
                eager_target = not self.path("target").reads_features(layers)
                target_path = "; the target decodes eagerly with it" if eager_target else ""
                lines.append(f"{info.line()}  decode: eager{target_path}")
        if self._retrieval is not None:  # once its engine was made
            lines.insert(1, self._retrieval.line())  # under the target: it drafts the target's own words
        layer_skip = self._kept.get("layer_skip")
        if layer_skip is not None and layer_skip.calibration is not None:  # once its engine was made
            lines.insert(1, layer_skip.calibration.line())  # under the target: it drafts with its layers
        return "\n".join(lines)

    def _drafter(self, kind: str):
        """A new drafter of the kind named in DRAFTERS (None for "none")."""
        from ..drafters import PromptLookupDrafter

        builders = {"model": self._model_drafter, "prompt_lookup": PromptLookupDrafter,
                    "eagle": self._eagle_drafter, "hybrid": self._hybrid_drafter, "medusa": self._medusa_drafter,
                    "layer_skip": self._layer_skip_drafter, "retrieval": self._retrieval_drafter,
                    "none": lambda: None}
        if kind not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {kind!r}")
        return builders[kind]()

    def _hybrid_drafter(self):
        from ..drafters import HybridDrafter

        if self.eagle_head is not None:
            return HybridDrafter(self._eagle_drafter())
        if self.draft is None:
            raise LoadError(f"preset {self.preset.name} has no EAGLE head and no draft model for hybrid "
                            f"({self._eagle_missing()}): use drafter prompt_lookup")
        return HybridDrafter(self._model_drafter())

    def _model_drafter(self):
        from ..drafters import ModelDrafter

        if self.draft is None:
            missing = "has no draft model" if self.preset.draft is None else "was loaded without its draft model"
            raise LoadError(f"preset {self.preset.name} {missing}: use drafter prompt_lookup or none")
        draft_path = self.path("draft")
        return ModelDrafter(self.draft, tokenizer=self.draft_tokenizer, make_runner=draft_path,
                            kept=self._kept_cache("draft", draft_path))

    def _eagle_drafter(self):
        """The one EagleDrafter of this preset's head: it keeps the head's KV cache of the last
        conversation, so the eagle and hybrid engines of every setting share that one cache."""
        from ..drafters import EagleDrafter

        if "eagle" not in self._kept:
            self._kept["eagle"] = EagleDrafter(self._eagle_head(), source=self.preset.eagle.label)
        return self._kept["eagle"]

    def _medusa_drafter(self):
        from ..drafters import MedusaDrafter

        if self.medusa_heads is None:
            if self.medusa_problem:
                why = self.medusa_problem
            elif self.preset.medusa is None:
                why = f"preset {self.preset.name} has no medusa: heads source (add one in models.yaml)"
            else:
                why = f"preset {self.preset.name} was loaded without its Medusa heads"
            raise LoadError(f"{why}: use drafter prompt_lookup or model")
        layers = self.target.config.get_text_config().num_hidden_layers
        return MedusaDrafter(self.medusa_heads, layers, source=self.preset.medusa.label)

    def _layer_skip_drafter(self):
        """The one LayerSkipDrafter of this target: it calibrates once (at its first bind, a few
        seconds) and keeps its KV cache of the last conversation for every setting's engine."""
        from ..drafters import LayerSkipDrafter

        if "layer_skip" not in self._kept:
            self._kept["layer_skip"] = LayerSkipDrafter()
        return self._kept["layer_skip"]

    def _retrieval_drafter(self):
        """The one RetrievalDrafter of this preset's datastore, read and indexed on first use
        (about a second for two million tokens)."""
        from ..drafters import RetrievalDrafter

        if self._retrieval is None:
            spec = self.preset.retrieval
            if spec is None:
                raise LoadError(f"preset {self.preset.name} has no retrieval: datastore (build one with python -m "
                                "specdec_core.train_retrieval): use drafter prompt_lookup")
            if spec.kind != "local":
                raise LoadError(f"retrieval: {spec.label}: a retrieval datastore is a local folder, not a {spec.kind} source")
            self._retrieval = RetrievalDrafter.load(spec.location, source=spec.label)
        return self._retrieval

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


def _decode_path(decode_path: DecodePath, detailed: bool = False) -> str:
    """The path's name; `detailed`: with why compiling failed and what runs the steps."""
    path = decode_path.decode_path
    if not detailed:
        return path
    if decode_path.fallback_reason:  # (a background compile fails long after the load's notes were written)
        path += f" (torch.compile failed: {decode_path.fallback_reason})"
    elif decode_path.compiling:
        path += f" ({_progress(decode_path)})"
    elif getattr(decode_path, "loaded", 0):
        path += " (loaded from the compile cache)"
    model = decode_path.model
    gguf = gguf_weight_summary(model)
    if gguf:
        path += f", {gguf} on int4 kernels"
    if uses_row_exact_attention(model):
        path += ", row-exact attention"
    if uses_lean_layers(model):
        path += ", lean decoder layers"
    return f"{path}, prepacked weights" if has_packed_layers(model) else path


def _progress(steps) -> str:
    """How far a background compile is: "2/4 step shapes ready"."""
    return f"{getattr(steps, 'shapes_ready', 0)}/{len(steps.step_sizes)} step shapes ready"


def unload(models: LoadedModels) -> None:
    """Drop the models and free their memory (engines built from them must be dropped too)."""
    paths = models._paths() if models.target is not None else []
    for path in paths:
        path.close()  # a background compile stops at once
    compiled = any(path.compiled for path in paths)
    compiling = any(path.compiling for path in paths)
    models.target = None
    models.draft = None
    models.eagle_head = None
    models._retrieval = None
    models._engines.clear()
    models._kept.clear()
    models.target_runner = models.draft_runner = None  # they hold the models and KV caches
    if compiled and not compiling:  # (a compile still running drops its graphs when it stops)
        torch._dynamo.reset()  # compiled graphs (and CUDA graph pools) hold the weights too
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
