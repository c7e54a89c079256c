"""What the reports record about the machine a measurement ran on (its name, load, package
versions), and its memory-bandwidth ceiling: weight bytes one decoding step reads over the
bytes per second this machine reads. One home for these, shared by every bench command."""

from __future__ import annotations

import gc
import importlib.metadata
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..kernels.gguf_index import read_tensors
from ..kernels.int4_linear import Int4Linear
from ..kernels.packed_linear import PackedLinear

_SHAPE_ONLY = (PackedLinear, Int4Linear)  # they keep a `weight` (the tied head's) only for code that reads it


# Peak memory bandwidth in GB/s by GPU name (first match wins: specific names come first).
GPU_BANDWIDTH_GBS: tuple[tuple[str, float], ...] = (
    ("H200", 4800), ("H100 PCIe", 2000), ("H100 NVL", 3900), ("H100", 3350), ("GH200", 4000),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555),
    ("L40S", 864), ("L40", 864), ("L4", 300), ("A10G", 600), ("A10", 600),
    ("RTX 6000 Ada", 960), ("RTX A6000", 768), ("RTX 4090", 1008), ("RTX 3090", 936),
    ("V100", 900), ("T4", 320),
)
REPORTED_PACKAGES = ("torch", "transformers", "accelerate", "bitsandbytes", "numpy", "matplotlib", "tqdm")


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


def safetensors_bytes_per_step(folder, bytes_per_weight: int = 2) -> int:
    """Bytes a server reading a save_pretrained folder's weights in another dtype (vLLM's bfloat16:
    2 bytes a weight) reads per step: every tensor once (a tied head is stored once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():
                total += math.prod(weights.get_slice(name).get_shape()) * bytes_per_weight
    return total


def bandwidth_ceiling(
    model: torch.nn.Module,
    tokens_per_second: dict[str, float],
    bandwidth: float | None = None,
    own_weight_bytes: dict[str, int] | None = None,
) -> dict:
    """The ceiling of plain decoding (read bandwidth / weight bytes per step) and each method's
    tokens/s as a share of it. A method that runs its own copy of the weights (llamacpp, vLLM) is
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


# ---------------------------------------------------------------- what ran where


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU with the threads torch decodes with."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads of {os.cpu_count()} cores"


def model_device(model) -> str:
    """Where a model sits, with the GPU's name: `cuda:0 (NVIDIA H100 80GB HBM3)`, `cpu`."""
    device = str(model.device)
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(model.device)})"
    return device


def machine(load_before: list[float] | None) -> dict:
    """The CPU, its cores and memory, the OS, torch's threads, and the load before and now."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        ram_gb = None
    cores = os.cpu_count()
    return {
        "summary": f"{cpu}, {cores} logical cores" + (f", {ram_gb:.0f} GB RAM" if ram_gb else "")
        + f", {platform.system()} {platform.release()}",
        "cpu": cpu,
        "logical_cores": cores,
        "ram_gb": ram_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": load_average(),
    }


def package_versions(packages) -> dict[str, str | None]:
    """Each package's installed version (None where it is not installed)."""
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def versions() -> dict:
    """Python, the installed ones of REPORTED_PACKAGES, and this checkout's commit."""
    installed = {k: v for k, v in package_versions(REPORTED_PACKAGES).items() if v is not None}
    return {"python": platform.python_version(), **installed, "specdec": git_commit()}


def git_commit() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or "unknown"


# ---------------------------------------------------------------- timing on a device


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for a device's queued work, so a timer measures the work and not its launch."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def free_memory() -> None:
    """Give back what dropped models held (on a GPU, to the driver too)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_bandwidth(device: torch.device, override_gbs: float | None = None) -> tuple[float, str]:
    """(bytes/s, where the number comes from): the flag, the GPU table, or a CPU memcpy."""
    if override_gbs:
        return override_gbs * 1e9, "--bandwidth-gbs"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, gbs in GPU_BANDWIDTH_GBS:
            if key in name:
                return gbs * 1e9, f"table: {key}"
        raise ValueError(f"no bandwidth known for GPU '{name}': pass --bandwidth-gbs")
    return measure_memcpy_bandwidth(), "measured CPU memcpy (read + write)"


def measure_memcpy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy on the CPU, counting the read and the write."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.numel() * 4 / best
