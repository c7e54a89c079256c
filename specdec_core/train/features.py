"""The target's features for the head: the residual stream entering three layers, and the final
hidden state (after the target's last norm), captured with hooks while the target runs.

Only those four points are captured, not every hidden state. Features are kept in fp16: the
head reads them at its own precision, and the target's logits over the draft vocabulary are
recomputed from the final hidden state with the lm_head rows of that vocabulary (cheaper than
storing logits).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..decoding.base import decoder_of


def decoder_parts(model):
    """(the decoder layers, the final norm) of a transformers causal LM."""
    decoder = decoder_of(model)
    return decoder.layers, decoder.norm


@contextmanager
def capture_features(model, layer_ids: tuple[int, ...]):
    """While inside, every forward of `model` appends (aux [B, n, 3H], final [B, n, H]) fp16
    to the yielded list: aux is the residual stream entering each of `layer_ids`."""
    layers, norm = decoder_parts(model)
    seen: dict[int, torch.Tensor] = {}
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def entering(index):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[index] = hidden.detach().to(torch.float16)

        return hook

    def finished(_module, _args, output):
        aux = torch.cat([seen[i] for i in layer_ids], dim=-1)  # ids may repeat in shallow targets
        calls.append((aux, output.detach().to(torch.float16)))

    handles = [layers[i].register_forward_pre_hook(entering(i), with_kwargs=True) for i in sorted(set(layer_ids))]
    handles.append(norm.register_forward_hook(finished))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def sequence_features(model, ids: list[int], layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [n, 3H], final [n, H]) fp16 for one token sequence, from one target forward."""
    with capture_features(model, layer_ids) as calls:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    aux, final = calls[0]
    return aux[0], final[0]


@torch.no_grad()
def replayed_features(model, sequences: list[list[int]], layer_ids: tuple[int, ...], batch_size: int = 32) -> list[dict]:
    """{"aux": [n-1, 3H], "final": [n-1, H]} fp16 for each token sequence (n tokens), from
    teacher-forced forwards of its first n-1 tokens: what generation captures, computed again
    (for shards whose token file outlived its features file). Batches of similar lengths,
    right-padded: under causal attention a row's padding comes after its real positions, so
    it changes none of them, and the positions count from 0 as they should."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    features: list[dict | None] = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(sequences[i]) - 1 for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(sequences[i]) - 1] = torch.tensor(sequences[i][:-1])
        with capture_features(model, layer_ids) as calls:
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        aux, final = calls[0]
        for row, i in enumerate(batch):
            kept = len(sequences[i]) - 1
            features[i] = {"aux": aux[row, :kept].clone(), "final": final[row, :kept].clone()}
    return features
