"""What the reports record about the machine a measurement ran on, and its memory-bandwidth
ceiling: weight bytes one decoding step reads over the bytes per second this machine reads."""

from __future__ import annotations

import os
import time

import torch

from ..kernels.gguf_index import read_tensors
from ..kernels.int4_linear import Int4Linear
from ..kernels.packed_linear import PackedLinear

_SHAPE_ONLY = (PackedLinear, Int4Linear)  # they keep a `weight` (the tied head's) only for code that reads it


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on every platform
        return None


def weight_bytes_read_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights a one-token decoding step streams from memory: every parameter and buffer
    as stored (fp32, prepacked, int4 blocks with their scales, nf4), each tensor once, except
    the input embedding, of which a step reads one row (tied to the head, it is counted there
    when the head computes with it)."""
    embedding = model.get_input_embeddings()
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if module is embedding:
            continue
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, tensor in tensors:
            if tensor is None or id(tensor) in seen or (name == "weight" and isinstance(module, _SHAPE_ONLY)):
                continue
            seen.add(id(tensor))
            total += _stored_bytes(tensor)
    return total


def _stored_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()  # a prepacked oneDNN weight: its logical size


def measure_read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s this CPU reads: the best of `repeats` sums over a tensor far larger than its caches,
    with torch's current thread count (what decoding uses)."""
    data = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.numel() * 4 / best


def gguf_bytes_per_step(path) -> int:
    """Bytes of a GGUF file's tensors, as llama.cpp reads them per step (its tied head reads the
    whole token embedding)."""
    tensors, _ = read_tensors(path)
    return int(sum(tensor.rows.nbytes for tensor in tensors))


def bandwidth_ceiling(
    model: torch.nn.Module,
    tokens_per_second: dict[str, float],
    bandwidth: float | None = None,
    own_weight_bytes: dict[str, int] | None = None,
) -> dict:
    """The ceiling of plain decoding (read bandwidth / weight bytes per step) and each method's
    tokens/s as a share of it. A method that runs its own copy of the weights (llamacpp) is
    measured against its own bytes (own_weight_bytes). Speculative methods can pass 100%: one
    step reads the weights once for several tokens."""
    weight_bytes = weight_bytes_read_per_step(model)
    bandwidth = measure_read_bandwidth() if bandwidth is None else bandwidth
    own = own_weight_bytes or {}
    return {
        "weight_bytes_per_step": weight_bytes,
        "own_weight_bytes_per_step": own,
        "read_bandwidth_gbs": round(bandwidth / 1e9, 1),
        "bandwidth_source": "measured: sum over a 512 MiB tensor, best of 5",
        "ceiling_tokens_per_s": round(bandwidth / weight_bytes, 1),
        "share_of_ceiling": {
            m: round(tps * own.get(m, weight_bytes) / bandwidth, 3) for m, tps in tokens_per_second.items()
        },
    }
