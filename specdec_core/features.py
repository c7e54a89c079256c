"""The target's own features for drafters that read them (EAGLE heads): captured in passing.

A drafter names the target layers it reads (`Drafter.feature_layers`); the engine puts a
FeatureTap on exactly those layers, and every target forward it runs anyway (the prompt prefill,
each round's verify) leaves their inputs here: the residual stream entering each layer, which
is what EAGLE-3 calls the hidden state "of" that layer (vLLM's aux hidden state ids). No extra
target forward, and no output_hidden_states for all layers.

Hooks fire in eager forwards. Inside compiled code they are not guaranteed to, so an engine
with a feature-reading drafter decodes its target eagerly (presets/loading.py says so).
"""

from __future__ import annotations

import torch
from torch import nn


def decoder_layers(model) -> nn.ModuleList:
    """The target's stack of decoder layers (Llama, Qwen2 and the other causal LMs of transformers)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer stack to read features from")
    return layers


class FeatureTap:
    """Forward pre-hooks on the chosen decoder layers, active only while the engine asks.

    take() -> [n, len(layer_ids) * hidden] the concatenated inputs of those layers over the n
    tokens of the latest forward (or None when nothing was captured since the last take).
    """

    def __init__(self, model, layer_ids: tuple[int, ...]) -> None:
        self.layer_ids = tuple(layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        self._active = False
        self._handles = []
        if not self.layer_ids:
            return
        layers = decoder_layers(model)
        bad = [i for i in self.layer_ids if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"feature layers {bad} are outside the target's {len(layers)} layers")
        for i in sorted(set(self.layer_ids)):  # a shallow target may feed one layer twice
            self._handles.append(layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True))

    def _hook(self, index: int):
        def capture(module, args, kwargs):
            if self._active:
                hidden = args[0] if args else kwargs["hidden_states"]
                self._captured[index] = hidden[0].detach()  # [n, H]; batch size 1
        return capture

    def __enter__(self) -> FeatureTap:
        self._active = bool(self._handles)
        self._captured.clear()
        return self

    def __exit__(self, *exc) -> None:
        self._active = False

    def take(self) -> torch.Tensor | None:
        if not self.layer_ids or len(self._captured) != len(set(self.layer_ids)):
            return None
        first = self._captured[self.layer_ids[0]]
        features = torch.cat([self._captured[i].to(first.device) for i in self.layer_ids], dim=-1)
        self._captured.clear()
        return features

    def close(self) -> None:
        """Remove the hooks (the engine that owned them is gone)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
