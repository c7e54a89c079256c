"""The target's own features for drafters that read them (EAGLE heads): captured in passing.

A drafter names the target layers it reads (`Drafter.feature_layers`); the engine reads them
through the model's FeatureTap on exactly those layers (`feature_tap`), and every target
forward it runs anyway (the prompt prefill, each round's verify) leaves their inputs there: the
residual stream entering each layer, which is what EAGLE-3 calls the hidden state "of" that
layer (vLLM's aux hidden state ids). No extra target forward, and no output_hidden_states for
all layers. Layer id num_hidden_layers names the stream leaving the last layer: the input of
the final norm (what Medusa heads read, after that norm).

Two ways fill a tap:
- Eager forwards of the model run its hooks: each overwrites the latest input its layer saw.
- Compiled steps (decoding/compiled.py on CPU, decoding/static.py's CUDA graphs) run an
  untapped twin of the model (`untapped`) with hooks of its own (`StepFeatures`) that the
  step function reads back and returns as outputs of the compiled graph, beside the logits.
  The runner then hands those rows to the model's taps (`settle_features(..., given=...)`).
  So no compiled graph ever writes into a tap an engine reads (a compile on another thread
  can't reach it), CUDA graphs need no hook to run at replay, and the steps serve whatever
  layers they were built with, whenever the taps engines read were made.
A runner that reads one forward in several model calls (compiled steps in pieces) settles each
call's rows (`settle_features`). transformers' own output_hidden_states would break the
compiled graph: it adds hooks per call.
"""

from __future__ import annotations

import copy
import functools
import types
import weakref

import torch
from torch import nn

from .base import decoder_of

# model -> {layer ids: its FeatureTap}; the taps (and their hooks) live as long as the model
_TAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoder_layers(model) -> nn.ModuleList:
    """The target's stack of decoder layers (Llama, Qwen2 and the other causal LMs of transformers)."""
    layers = getattr(decoder_of(model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer stack to read features from")
    return layers


def feature_modules(model, layer_ids) -> list[nn.Module]:
    """The modules whose inputs are the features of `layer_ids`: decoder layer i, and for
    i == the number of layers the decoder's final norm (the last layer's output goes there).
    ValueError for ids outside."""
    layers = decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i <= len(layers)]
    if bad:
        raise ValueError(f"feature layers {bad} are outside the target's {len(layers)} layers "
                         f"(and {len(layers)}, the last layer's output)")
    return [layers[i] if i < len(layers) else decoder_of(model).norm for i in layer_ids]


def feature_tap(model, layer_ids: tuple[int, ...]) -> FeatureTap:
    """The model's tap on `layer_ids`, made (and its hooks put on the layers) the first time it
    is asked for; an empty tap, with no hooks, for no layers."""
    layer_ids = tuple(layer_ids)
    if not layer_ids:
        return FeatureTap(model, ())
    taps = _TAPS.setdefault(model, {})
    if layer_ids not in taps:
        taps[layer_ids] = FeatureTap(model, layer_ids)
    return taps[layer_ids]


def untapped(model, layer_ids: tuple[int, ...] = ()):
    """A twin of `model` that runs exactly as it does but never writes into its taps: it shares
    every module and weight except the path down to the decoder layers, which are shallow copies,
    the layers without the taps' hooks (and without any hook put on the model after this). For
    steps compiled on another thread while engines read the model's taps (decoding/compiled.py).
    The final norm is copied too where a tap hooks it or `layer_ids` (the twin's own features)
    name the last layer's output; otherwise it stays shared: a copy of it made a background
    compile of the 4-bit tiny Llama fail (a guard on the kernels package's global state, which
    eager decoding on the main thread changes meanwhile), so only Medusa's steps pay that risk."""
    tap_hooks = {hook for tap in _TAPS.get(model, {}).values() for hook in tap.hook_ids}
    decoder = decoder_of(model)
    layers = nn.ModuleList([_shallow_copy(layer, tap_hooks) for layer in decoder_layers(model)])
    norm = getattr(decoder, "norm", None)
    hooked = isinstance(norm, nn.Module) and (tap_hooks & set(norm._forward_pre_hooks) or len(layers) in layer_ids)
    twin_decoder = _shallow_copy(decoder, layers=layers, **({"norm": _shallow_copy(norm, tap_hooks)} if hooked else {}))
    if decoder is model:
        return twin_decoder
    (name,) = [name for name, child in model.named_children() if child is decoder]
    return _shallow_copy(model, **{name: twin_decoder})


def _shallow_copy(module: nn.Module, dropped_hooks: set[int] = frozenset(), **children: nn.Module) -> nn.Module:
    """A new module object sharing `module`'s weights, attributes and submodules but `children`,
    with its own forward pre-hooks: the module's, less `dropped_hooks`."""
    twin = copy.copy(module)  # a new __dict__ holding the same values
    twin._modules = {**module._modules, **children}
    twin._forward_pre_hooks = type(module._forward_pre_hooks)(
        (hook_id, hook) for hook_id, hook in module._forward_pre_hooks.items() if hook_id not in dropped_hooks)
    # Its own: hooks registered on the twin (StepFeatures) note here how they are called.
    twin._forward_pre_hooks_with_kwargs = type(module._forward_pre_hooks_with_kwargs)(
        module._forward_pre_hooks_with_kwargs)
    if "_old_forward" in module.__dict__:
        _rebind_device_hook(module, twin)
    return twin


def _rebind_device_hook(module: nn.Module, twin: nn.Module) -> None:
    """accelerate's device hooks (a model sharded over GPUs or offloaded) replace a module's
    forward with one bound to that module, which would run the original's children, not the
    twin's: bind the twin's to the twin."""
    forward, old_forward = module.forward, module._old_forward
    if not (isinstance(forward, functools.partial) and forward.args[:1] == (module,)
            and getattr(old_forward, "__self__", None) is module):
        raise ValueError(f"{type(module).__name__} has a forward hook this path can't copy: decode it eagerly")
    twin._old_forward = types.MethodType(old_forward.__func__, twin)
    twin.forward = functools.update_wrapper(functools.partial(forward.func, twin), old_forward)


def start_features(model) -> None:
    """A forward in several model calls begins: each of the model's taps captures it afresh, so
    what a tap holds stays one forward's rows even when no engine reads that tap."""
    for tap in _TAPS.get(model, {}).values():
        tap.start()


def settle_features(model, rows: int, given: dict[int, torch.Tensor] | None = None) -> None:
    """The model call just made is one part of a longer forward: keep the first `rows` rows it
    left in each of the model's taps, before the next call overwrites them. `given`: the layer
    inputs a compiled step returned (by layer), for a call that ran no hooks of the model."""
    for tap in _TAPS.get(model, {}).values():
        tap.settle(rows, given)


class FeatureTap:
    """Forward pre-hooks on the chosen decoder layers (made through feature_tap, once a model).

    start() before a forward, then take() -> [n, len(layer_ids) * hidden]: the concatenated
    inputs of those layers over the n tokens of that forward (None when nothing was captured
    since, or the layers were not all reached).
    """

    def __init__(self, model, layer_ids: tuple[int, ...]) -> None:
        self.layer_ids = tuple(layer_ids)
        # Written by the hooks: each layer's input in the last model call, None when taken. Its keys
        # never change: dynamo guards on the dict's length, so a changing one would recompile.
        self._latest: dict[int, torch.Tensor | None] = {i: None for i in self.layer_ids}
        self._settled: dict[int, list[torch.Tensor]] = {}  # earlier calls of the same forward
        self.hook_ids: set[int] = set()  # its hooks' handles, for untapped()
        if not self.layer_ids:
            return
        ids = sorted(set(self.layer_ids))  # a shallow target may feed one layer twice
        for i, module in zip(ids, feature_modules(model, ids)):
            self.hook_ids.add(module.register_forward_pre_hook(self._hook(i), with_kwargs=True).id)

    def _hook(self, index: int):
        def capture(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._latest[index] = hidden[0].detach()  # [n, H]; batch size 1. Only assigned: see the module
        return capture

    def start(self) -> None:
        """Forget what earlier forwards left: the next one is captured afresh."""
        self._latest.update(dict.fromkeys(self._latest))
        self._settled.clear()

    def settle(self, rows: int | None, given: dict[int, torch.Tensor] | None = None) -> None:
        """Keep the first `rows` rows of the last model call (see settle_features): what the
        hooks left, or for a compiled step the layer inputs it returned (`given`)."""
        for index, hidden in self._latest.items():
            if given is not None:
                hidden = given.get(index)
            if hidden is not None:
                self._settled.setdefault(index, []).append(hidden[:rows])
        self._latest.update(dict.fromkeys(self._latest))

    def take(self) -> torch.Tensor | None:
        self.settle(None)
        if not self.layer_ids or len(self._settled) != len(set(self.layer_ids)):
            return None
        by_layer = {i: torch.cat(parts) if len(parts) > 1 else parts[0] for i, parts in self._settled.items()}
        self._settled.clear()
        first = by_layer[self.layer_ids[0]]
        return torch.cat([by_layer[i].to(first.device) for i in self.layer_ids], dim=-1)


class StepFeatures:
    """The layer inputs a compiled step returns as outputs of its graph (see the module).

    Forward pre-hooks on the layers of `twin`, an untapped twin of the target that only the
    compiled step function runs: they leave each layer's input in a dict of their own, and the
    step function, right after the model's forward, takes them out (`take`) and returns them.
    Taking empties the dict inside the traced function too, so a compiled graph's outputs (CUDA
    graphs' buffers, overwritten at the next replay) are never held here between calls.
    """

    def __init__(self, twin, layer_ids: tuple[int, ...]) -> None:
        self.layer_ids = tuple(sorted(set(layer_ids)))  # each layer once, in order
        modules = feature_modules(twin, self.layer_ids) if self.layer_ids else []
        # Fixed keys, values only assigned: dynamo guards on neither (see FeatureTap._latest).
        self._latest: dict[int, torch.Tensor | None] = dict.fromkeys(self.layer_ids)
        for i, module in zip(self.layer_ids, modules):
            module.register_forward_pre_hook(self._hook(i), with_kwargs=True)

    def _hook(self, index: int):
        def capture(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._latest[index] = hidden[0]  # [n, H]; batch size 1
        return capture

    def take(self) -> tuple[torch.Tensor, ...]:
        """The inputs of layer_ids in the model call just made (called inside the step function)."""
        taken = tuple(self._latest[i] for i in self.layer_ids)
        for i in self.layer_ids:
            self._latest[i] = None
        return taken

    def by_layer(self, taken: tuple[torch.Tensor, ...]) -> dict[int, torch.Tensor]:
        """A compiled step's returned features by layer id (settle_features' `given`)."""
        return dict(zip(self.layer_ids, taken))
