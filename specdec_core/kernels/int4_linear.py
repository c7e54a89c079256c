"""Linear layers on CPU that run on a GGUF file's own 4-bit (and 8-bit) weights.

A GGUF model such as the bundled SmolLM2-135M-Instruct (Q4_1) stores its linear layers in
groups of 32 weights that share a scale (and, in Q4_1, a minimum). Dequantised to fp32 at
load, a decoding step streams eight times the bytes the file holds; on a CPU the step is
bound by exactly that. `use_gguf_weights(model, path)` swaps each `nn.Linear` whose GGUF tensor
is of a type in HANDLED_TYPES (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) for an
Int4Linear that keeps the file's groups of 32 and runs on torch's groupwise int4 CPU kernel
(`aten._weight_int4pack_mm_for_cpu`), which computes, per group,

    w = (q - 8) * scale + zero        q in 0..15, one (scale, zero) per 32 input features.

GGUF's types map onto it as follows (d, m: the file's fp16 scale and minimum of a group):

    Q4_0  w = d * (q - 8)      scale = d,  zero = 0
    Q4_1  w = d * q + m        scale = d,  zero = m + 8 d
    Q8_0  w = d * q, q int8    split into two 4-bit halves, q = 16 (hi - 8) + lo:
                               w = 16 d (hi - 8) + d (lo - 8) + 8 d, i.e. one int4 matmul over
                               the input read twice (2K columns: hi groups, then lo groups)
    Q4_K  super-blocks of 256 weights: an fp16 d and dmin, and per sub-block of 32 a 6-bit scale
          s and min m:  w = d s q - dmin m      scale = d s,  zero = 8 d s - dmin m
          (one sub-block is one group: GROUP is 32, so this is Q4_1 with other scales)
    Q5_K  as Q4_K with 5-bit q (0..31): split as Q8_0 is, hi = (q >> 4) + 8 (8 or 9):
          w = 16 d s (hi - 8) + d s (lo - 8) + 8 d s - dmin m    (the input read twice)
    Q5_0  w = d (q - 16), Q5_1  w = d q + m, q 5-bit in groups of 32: split as Q8_0 is
          (llama.cpp writes them where a K-quant file's row is not a multiple of 256)
    Q6_K  w = d s (q - 32), q 6-bit, an int8 s per 16 weights: two scales in each group of
          32, where the kernel takes one. So the input is read four times: twice for the first
          16 of each group (the other 16 at q = 8, i.e. 0), twice for the second, each pair
          splitting q - 32 = 16 (hi - 8) + (lo - 8) with no zero term: exact, at 4 times a
          Q4 layer's kernel work and 2.5 bytes a weight (against 4 in fp32, 0.82 in the file).

d s and dmin m are exact in fp32 (11 bits times 6 or 8); 8 d s - dmin m rounds once in fp32.
Types with no int4 form here (Q2_K, Q3_K, IQ*, float tensors) stay as transformers dequantised
them, in fp32, which is not row-exact (an fp32 matmul rounds a row in a batch otherwise than
alone, unlike the kernel below): dense_reason says so in the loading notes.

What changes numerically, against the fp32 weights transformers dequantises from the same file
(measured in tests/test_int4_linear.py):
  - scale and zero are held in bf16 (the kernel takes only bf16 here: fp32 and fp16 run a slow
    reference path, 25-50x slower). bf16 keeps 8 of fp16's 11 significant bits, so d moves by up
    to 2^-9 of itself, and Q4_1's zero (m + 8 d) by up to 2^-9 of the group's mid value:
    about a tenth of Q4_1's own rounding step (d / 2). The K-quants likewise: d s by up to
    2^-9 of itself, the zero (8 d s - dmin m, a group's value at q = 8) by up to 2^-9 of it.
  - the input rows are rounded to bf16 for the kernel; it accumulates in fp32 and returns
    bf16, which is cast back to the model's fp32.
  - each row is computed alone: the output for a row is bitwise the same whether the call
    carries 1 row or 9 (checked), so a verify step over drafts sees exactly what single steps
    see and greedy speculation stays token-for-token identical to plain decoding.
  - a call over DENSE_ROWS rows or more (reading a prompt) runs as one matmul over the weight
    unpacked from the kernel's buffer: in bf16 where oneDNN has bf16 matmuls (the weight
    (q - 8) * scale + zero, computed in fp32, is rounded to bf16 once: up to 2^-9 of itself;
    fp32 sums, a bf16 output), in fp32 elsewhere. The kernel dequantises every group again for
    each 4 rows, so reading a 729-token prompt this way takes under half the kernel's time (the
    break-even is about 100 rows; docs/decode-paths.md). Such rows differ from the kernel's in
    their last bits, so a token's keys and values depend on the call it was read in: engines
    compared token for token read a prompt from the same cache state, in the same calls (the
    bench: from an empty cache; the app's side by side: SpeculativeEngine.share_reading).
The model the user runs is then this 4-bit model; every method that decodes with it,
baseline, speculative and Hugging Face's `generate()`, runs the same layers.

Where the kernel is missing or disagrees with its reference here (other CPUs, other torch
builds), `kernel_problem()` says why in one line and nothing is swapped: the fp32 weights run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .gguf_index import read_tensors

GROUP = 32  # weights per GGUF block of Q4_0 / Q4_1 / Q8_0 and per K-quant sub-block, the kernel's group size
SUPER_BLOCK = 256  # weights per K-quant super-block (gguf's QK_K)
_INNER_K_TILES = 2  # a packing parameter of the GPU kernel; the CPU packing ignores its value
_KERNEL_DTYPE = torch.bfloat16
# decoding the file's blocks (before the bf16 rounding) must give transformers' fp32 weights
# up to float32 rounding of m + 8d: a mismatch means a wrong tensor, layout or permutation
_DECODE_RTOL, _DECODE_ATOL = 1e-6, 1e-7  # of the largest weight of the tensor
# rows from which a call unpacks its weight rather than run the kernel (see Int4Linear): unpacking
# the offline model's layers costs about as much as the kernel over 100 rows (two CPU threads)
DENSE_ROWS = 128
_CHECK_STRIDE = 5  # rows checked: 0, 5, 10, ... (coprime with the rope pairing of q/k rows)
HANDLED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
_DENSE = ("GGUF type {}: no int4 form here, so dequantised to fp32 (4 bytes a weight read per step) and not "
          "row-exact (at a tie, greedy speculative output may part from plain decoding); a Q4_K_M, Q5_K_M, Q6_K, "
          "Q4_0, Q4_1 or Q8_0 file runs on the int4 kernel")
_ARCHITECTURE = "general.architecture"
_KERNEL_OPS = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")  # torch >= 2.6


@dataclass(frozen=True)
class Groups:
    """A weight [N, K] as the kernel sees it: w = (q - 8) * scale + zero per group of GROUP
    input features. K is reads_input times the layer's input width (see the module docstring)."""

    q: torch.Tensor  # int32 [N, K], values 0..15
    scale: torch.Tensor  # float32 [N, K / GROUP]
    zero: torch.Tensor  # float32 [N, K / GROUP]
    reads_input: int  # how many times the layer's input is concatenated: 1; 2 for Q8_0, Q5_*; 4 for Q6_K

    def dequantise(self) -> torch.Tensor:
        """The fp32 weight [N, K / reads_input] these groups stand for (scale and zero unrounded)."""
        rows, width = self.q.shape
        grouped = self.q.view(rows, -1, GROUP).float().sub_(8).mul_(self.scale[..., None]).add_(self.zero[..., None])
        return sum(grouped.view(rows, width).chunk(self.reads_input, dim=1))


def decode_blocks(raw: np.ndarray, type_name: str) -> Groups:
    """The groups of a GGUF tensor's raw rows (uint8 [N, bytes per row]) of a type in HANDLED_TYPES."""
    rows = raw.shape[0]
    if type_name == "Q8_0":  # per block: fp16 d, 32 int8
        blocks = raw.reshape(rows, -1, 2 + GROUP)
        d = _fp16(blocks[..., :2])
        q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).astype(np.int32).reshape(rows, -1))
        return _two_reads(q, d, torch.zeros_like(d))
    if type_name in ("Q4_K", "Q5_K"):
        return _k_quant_groups(raw, type_name)
    if type_name == "Q6_K":
        return _q6_k_groups(raw)
    if type_name in ("Q5_0", "Q5_1"):  # per block: fp16 d, (Q5_1: fp16 m), 4 bytes of high bits, 16 of nibbles
        blocks = raw.reshape(rows, -1, (6 if type_name == "Q5_1" else 4) + 2 + GROUP // 2)
        d = _fp16(blocks[..., :2])
        high = np.ascontiguousarray(blocks[..., -20:-16]).view("<u4")  # bit j: weight j's fifth bit
        fifth = (high >> np.arange(GROUP, dtype=np.uint32)) & 1  # [N, blocks, 32]
        q = _nibbles(blocks[..., -16:]) | torch.from_numpy(fifth.astype(np.int32).reshape(rows, -1) << 4)
        if type_name == "Q5_0":
            return _two_reads(q - 16, d, torch.zeros_like(d))
        return _two_reads(q, d, _fp16(blocks[..., 2:4]))
    if type_name == "Q4_0":  # per block: fp16 d, 16 bytes of nibbles
        blocks = raw.reshape(rows, -1, 2 + GROUP // 2)
        d = _fp16(blocks[..., :2])
        return Groups(_nibbles(blocks[..., 2:]), d, torch.zeros_like(d), reads_input=1)
    if type_name == "Q4_1":  # per block: fp16 d, fp16 m, 16 bytes of nibbles
        blocks = raw.reshape(rows, -1, 4 + GROUP // 2)
        d, m = _fp16(blocks[..., :2]), _fp16(blocks[..., 2:4])
        return Groups(_nibbles(blocks[..., 4:]), d, m + 8 * d, reads_input=1)
    raise ValueError(f"GGUF type {type_name} is not handled (handled: {', '.join(HANDLED_TYPES)})")


def _two_reads(q: torch.Tensor, step: torch.Tensor, offset: torch.Tensor) -> Groups:
    """Groups for w = step * q + offset (step, offset: one per group of GROUP) with integer q of up
    to 8 bits (int32 [N, K], q >> 4 in -8..7), as two 4-bit halves over the input read twice:
    q = 16 (hi - 8) + lo with hi = (q >> 4) + 8 and lo = q & 15 (two's complement), so
    w = 16 step (hi - 8) + step (lo - 8) + (8 step + offset)."""
    hi, lo = (q >> 4) + 8, q & 15
    return Groups(torch.cat([hi, lo], dim=1), torch.cat([16 * step, step], dim=1),
                  torch.cat([torch.zeros_like(step), 8 * step + offset], dim=1), reads_input=2)


def _k_quant_groups(raw: np.ndarray, type_name: str) -> Groups:
    """Groups of Q4_K or Q5_K rows. A super-block (SUPER_BLOCK weights) holds fp16 d and dmin,
    12 bytes of 6-bit scales and mins (one each per sub-block of GROUP, unpacked by gguf's own
    Q4_K.get_scale_min), for Q5_K 32 bytes of high bits (bit i of byte j: weight j of sub-block i),
    then 128 bytes of nibbles: sub-blocks 2c and 2c + 1 are the low and high nibbles of bytes
    32c .. 32c + 31."""
    from gguf.quants import Q4_K

    rows, high_bytes = raw.shape[0], SUPER_BLOCK // 8 if type_name == "Q5_K" else 0
    blocks = raw.reshape(rows, -1, 16 + high_bytes + SUPER_BLOCK // 2)
    supers = blocks.shape[1]
    d, dmin = _fp16(blocks[..., :2])[..., None], _fp16(blocks[..., 2:4])[..., None]  # [N, supers, 1]
    scales, mins = (torch.from_numpy(part.reshape(rows, supers, -1).astype(np.float32))
                    for part in Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12)))
    step, offset = (d * scales).reshape(rows, -1), (-(dmin * mins)).reshape(rows, -1)  # exact in fp32
    packed = blocks[..., 16 + high_bytes :].reshape(rows, supers, 4, 1, 32)
    q = np.concatenate([packed & 15, packed >> 4], axis=3).astype(np.int32)  # [N, supers, 4, 2, 32]
    if type_name == "Q4_K":
        return Groups(torch.from_numpy(q.reshape(rows, -1)), step, 8 * step + offset, reads_input=1)
    high = blocks[..., 16 : 16 + high_bytes].reshape(rows, supers, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
    q = q.reshape(rows, supers, 8, 32) | ((high & 1).astype(np.int32) << 4)
    return _two_reads(torch.from_numpy(q.reshape(rows, -1)), step, offset)


def _q6_k_groups(raw: np.ndarray) -> Groups:
    """Groups of Q6_K rows, the input read four times (see the module docstring). A super-block
    (SUPER_BLOCK weights) holds 128 bytes of low nibbles (weight r of each half of 128: byte r % 64
    of the half's 64, the high nibble for r >= 64), 64 bytes of 2-bit pairs (byte r % 32 of the
    half's 32, bits 2 (r // 32)), an int8 scale per 16 weights and an fp16 d."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 210)
    supers = blocks.shape[1]
    low = blocks[..., :128].reshape(rows, supers, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8)[:, None]
    pairs = blocks[..., 128:192].reshape(rows, supers, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    q = ((low & 15).reshape(rows, -1).astype(np.int32) | ((pairs & 3).reshape(rows, -1).astype(np.int32) << 4)) - 32
    scales = torch.from_numpy(np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32))
    step = (_fp16(blocks[..., 208:210])[..., None] * scales).reshape(rows, -1, 2)  # [N, groups, half], exact
    q = torch.from_numpy(q).view(rows, -1, 2, GROUP // 2)  # [N, groups, half, 16]
    hi = torch.div(q + 8, 16, rounding_mode="floor")  # q = 16 hi + lo, lo in -8..7
    lo = q - 16 * hi
    codes, scale = [], []
    for half in (0, 1):  # the other half's weights at code 8: (8 - 8) * scale adds nothing
        mine = torch.zeros_like(q, dtype=torch.bool)
        mine[:, :, half] = True
        codes += [torch.where(mine, hi + 8, 8).view(rows, -1), torch.where(mine, lo + 8, 8).view(rows, -1)]
        scale += [16 * step[..., half], step[..., half]]
    scale = torch.cat(scale, dim=1)
    return Groups(torch.cat(codes, dim=1), scale, torch.zeros_like(scale), reads_input=4)


def _fp16(pairs: np.ndarray) -> torch.Tensor:
    """uint8 [..., 2] little-endian fp16 -> float32 [...] (exact)."""
    return torch.from_numpy(np.ascontiguousarray(pairs).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(packed: np.ndarray) -> torch.Tensor:
    """uint8 [N, blocks, 16] -> int32 [N, blocks * 32]: GGUF puts weight j of a block in the low
    nibble of byte j and weight j + 16 in its high nibble."""
    low, high = packed & 15, packed >> 4
    return torch.from_numpy(np.concatenate([low, high], axis=-1).astype(np.int32).reshape(packed.shape[0], -1))


class Int4Linear(nn.Module):
    """y = x W^T (+ bias) with W held as groupwise int4 (see Groups), on torch's CPU kernel.

    forward: x [..., in_features] (any float dtype) -> [..., out_features] in x's dtype.

    A call over at least DENSE_ROWS rows (reading a prompt) unpacks the weight for that call
    instead: the kernel dequantises every group again for each 4 rows it computes, so a
    700-token prompt paid for 175 dequantisations of the whole model (see dense_weight)."""

    def __init__(self, groups: Groups, bias: torch.Tensor | None = None, gguf_type: str = "") -> None:
        super().__init__()
        self.out_features, width = groups.q.shape
        self.in_features = width // groups.reads_input
        self.reads_input, self.gguf_type = groups.reads_input, gguf_type
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.q, _INNER_K_TILES))
        # [K / GROUP, N, 2]: the kernel's layout of scales and zeros
        scales_and_zeros = torch.stack([groups.scale.T, groups.zero.T], dim=-1).to(_KERNEL_DTYPE).contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.packing_block = _packing_block(self.packed, groups.q)  # None: no dense path

    @classmethod
    def stacked(cls, layers: list[Int4Linear]) -> Int4Linear | None:
        """One layer computing the outputs of `layers` (same input, no bias) side by side in one
        kernel call: [x W1^T, x W2^T, ...]. Its packed weight is theirs laid end to end, and each
        layer's `packed` becomes a view of it, so no weight is held twice. The kernel computes
        each output column alone, so the stacked call gives bitwise each layer's own output where
        the packing's blocks of rows don't straddle two layers: checked on a probe here. None
        where it does not hold (nothing is changed then). The layers must read their input alike
        (all once, or all twice as Q8_0 and Q5_K do)."""
        first = layers[0]
        if any(layer.bias is not None or layer.reads_input != first.reads_input
               or layer.in_features != first.in_features for layer in layers):
            return None
        stack = cls.__new__(cls)
        nn.Module.__init__(stack)
        stack.out_features, stack.in_features = sum(layer.out_features for layer in layers), first.in_features
        stack.reads_input, stack.gguf_type = first.reads_input, "+".join(sorted({layer.gguf_type for layer in layers}))
        stack.register_buffer("packed", torch.cat([layer.packed for layer in layers]))
        stack.register_buffer("scales_and_zeros", torch.cat([layer.scales_and_zeros for layer in layers], dim=1))
        stack.register_buffer("bias", None)
        blocks = {layer.packing_block for layer in layers}
        stack.packing_block = blocks.pop() if len(blocks) == 1 else None
        probe = torch.randn(3, first.in_features * first.reads_input,
                            generator=torch.Generator().manual_seed(0)).to(_KERNEL_DTYPE)
        if not torch.equal(stack.kernel(probe), torch.cat([layer.kernel(probe) for layer in layers], dim=1)):
            return None
        start = 0
        for layer in layers:
            layer.packed = stack.packed[start : start + len(layer.packed)]
            start += len(layer.packed)
        return stack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(_KERNEL_DTYPE)
        if self.reads_input > 1:
            rows = rows.repeat(1, self.reads_input)
        if len(rows) >= DENSE_ROWS and self.packing_block is not None:
            y = (rows.to(_dense_dtype()) @ self.dense_weight()).to(_KERNEL_DTYPE)  # bf16, as the kernel's
        else:
            y = self.kernel(rows)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """The int4 kernel's product: rows [M, in_features * reads_input] (rounded to bf16 here) ->
        bf16 [M, out_features]."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(_KERNEL_DTYPE), self.packed, GROUP,
                                                          self.scales_and_zeros)

    def dense_weight(self) -> torch.Tensor:
        """W^T [K, N] as the kernel computes it, (q - 8) * scale + zero in fp32 from the bf16
        scales, unpacked from the kernel's own buffer (no second copy of the weights is kept) and
        stored in _dense_dtype(): bf16 where oneDNN has bf16 matmuls (one more rounding of the
        weight, of 2^-9, and a bf16 output as the kernel's), fp32 elsewhere."""
        width = self.packed.shape[1] * 2
        q = _unpacked(self.packed, self.packing_block).permute(1, 0, 2)  # [K, N / block, block]
        q = q.reshape(width // GROUP, GROUP, self.out_features).float()
        scale, zero = self.scales_and_zeros.float().unbind(-1)  # [K / GROUP, N] each
        weight = q.sub_(8).mul_(scale[:, None]).add_(zero[:, None])
        return weight.view(width, self.out_features).to(_dense_dtype())

    def _apply(self, fn, recurse=True):
        # model.to(dtype) would cast the scales too, and the kernel takes bf16 scales only: keep
        # them as they are (moved, if the call moved them). The bias follows the model's dtype.
        scales = self.scales_and_zeros
        super()._apply(fn, recurse)
        self.scales_and_zeros = scales.to(self.scales_and_zeros.device)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, gguf={self.gguf_type}"


def _packing_block(packed: torch.Tensor, q: torch.Tensor) -> int | None:
    """The block of rows in which torch's CPU packing put `q` (int32 [N, K]) into `packed`, laid
    out [N / block, K, block / 2] with row j + block / 2 of a block in the high nibble of row j's
    byte: 64 rows a block with AVX-512, 32 otherwise. The layout is the kernel's own business, so
    it is tried here on the first and last blocks against q itself; None (no dense path: the
    kernel serves every call) when no known layout reproduces them."""
    rows, width = q.shape
    for block in (64, 32):
        if rows % block or packed.shape != (rows, width // 2):
            continue
        first_and_last = _unpacked(packed, block)[[0, -1]]  # [2, K, block]
        expected = torch.stack([q[:block].T, q[-block:].T]).to(torch.uint8)
        if torch.equal(first_and_last, expected):
            return block
    return None


def _unpacked(packed: torch.Tensor, block: int) -> torch.Tensor:
    """uint8 [N, K / 2] packed in blocks of `block` rows (see _packing_block) -> q, uint8
    [N / block, K, block]: entry [b, k, j] is weight (b * block + j, k)."""
    halves = packed.view(-1, packed.shape[1] * 2, block // 2)  # [N / block, K, block / 2]
    return torch.cat([halves & 15, halves >> 4], dim=-1)


@cache
def _dense_dtype() -> torch.dtype:
    """bf16 where oneDNN runs bf16 matmuls natively (AVX-512 BF16, AMX), else fp32 (a torch
    build without oneDNN included)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return torch.bfloat16 if supported is not None and supported() else torch.float32
    except RuntimeError:
        return torch.float32


@dataclass(frozen=True)
class Swap:
    """What use_gguf_weights did: counts per GGUF type, layers left in fp32 and why, or why nothing."""

    swapped: dict[str, int]  # GGUF type -> number of layers now on the int4 kernel
    kept: dict[str, str]  # module name -> why it stays fp32 (another GGUF type, a mismatch)
    problem: str | None = None  # why nothing was swapped (kernel missing, unreadable file)

    @property
    def summary(self) -> str:
        """e.g. "GGUF Q4_1 x210, Q8_0 x1" (empty when nothing was swapped)."""
        return "GGUF " + ", ".join(f"{t} x{n}" for t, n in sorted(self.swapped.items())) if self.swapped else ""


def use_gguf_weights(model: nn.Module, gguf_path: str | Path, *, include_head: bool = True) -> Swap:
    """Swap, in place, every nn.Linear of a CPU model loaded from `gguf_path` whose GGUF tensor is
    of a type in HANDLED_TYPES for an Int4Linear built from the file's own blocks.

    Each tensor's rows get the permutation transformers applies when it dequantises the file
    (llama.cpp reorders q/k rows for its rope), and each swapped layer's decoded weights (every 5th row) are
    checked against the model's fp32 ones first: a layer that doesn't match stays fp32 (named
    in Swap.kept). A tied output embedding uses the input embedding's tensor; the embedding
    itself stays fp32 (a lookup reads one row per token). include_head=False keeps it fp32.
    """
    problem = kernel_problem()
    if problem:
        return Swap({}, {}, problem)
    try:
        tensors = _gguf_tensors_by_parameter(model, Path(gguf_path))
    except (OSError, ValueError, KeyError, NotImplementedError) as error:
        return Swap({}, {}, f"could not read {Path(gguf_path).name}: {_first_line(error)}")
    swapped: dict[str, int] = {}
    kept: dict[str, str] = {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module_name, module in list(model.named_modules()):
        if not _swappable(module) or (module is head and not include_head):
            continue
        found = tensors.get(f"{module_name}.weight")
        if found is None:
            continue
        type_name, rows = found
        if type_name not in HANDLED_TYPES:
            kept[module_name] = dense_reason(type_name)
            continue
        groups = decode_blocks(rows, type_name)
        if not _agrees(groups, module.weight.detach()):
            kept[module_name] = "its GGUF tensor does not match the loaded weights"
            continue
        layer = Int4Linear(groups, module.bias, gguf_type=type_name)
        if module is head:
            layer.weight = module.weight  # code reads the head's weight (tied: the embedding's)
        _replace(model, module_name, layer)
        swapped[type_name] = swapped.get(type_name, 0) + 1
    return Swap(swapped, kept)


def dense_reason(type_name: str) -> str:
    """Why a GGUF tensor of `type_name` (not in HANDLED_TYPES) runs dequantised to fp32, what that
    costs and what to do: one line for the loading notes."""
    return _DENSE.format(type_name)


def quantise_linear_layers(model: nn.Module, type_name: str = "Q4_1") -> int:
    """Swap, in place, every fp32 CPU nn.Linear of `model` for an Int4Linear built from
    `type_name` blocks of its own weights (gguf's quantiser): the 4-bit path for a model that has
    no GGUF file (a test model, an EAGLE head). Returns how many layers were swapped."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    swapped = 0
    for name, module in list(model.named_modules()):
        if _swappable(module):
            raw = quantize(module.weight.detach().numpy(), GGMLQuantizationType[type_name])
            _replace(model, name, Int4Linear(decode_blocks(raw, type_name), module.bias, gguf_type=type_name))
            swapped += 1
    return swapped


def gguf_weight_summary(model: nn.Module) -> str:
    """"GGUF Q4_1 x210, Q8_0 x1" for a model with Int4Linear layers, "" without."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, Int4Linear):
            counts[module.gguf_type] = counts.get(module.gguf_type, 0) + 1
    return Swap(counts, {}).summary


def _agrees(groups: Groups, loaded: torch.Tensor) -> bool:
    """Decoded blocks == transformers' fp32 weights, up to float32 rounding, on every
    _CHECK_STRIDE-th row (a wrong tensor, layout or row permutation moves nearly every row;
    checking them all doubled the load time on a busy machine)."""
    rows, width = groups.q.shape
    if (rows, width // groups.reads_input) != tuple(loaded.shape):
        return False
    sample = torch.arange(0, rows, _CHECK_STRIDE)
    subset = Groups(groups.q[sample], groups.scale[sample], groups.zero[sample], groups.reads_input)
    expected = loaded[sample]
    difference = subset.dequantise().sub_(expected).abs_().amax().item()
    return difference <= _DECODE_ATOL + _DECODE_RTOL * expected.abs().amax().item()


def _swappable(module: nn.Module) -> bool:
    if type(module) is not nn.Linear:  # exactly: subclasses are quantized or otherwise special
        return False
    return module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)


def _gguf_tensors_by_parameter(model: nn.Module, path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """model parameter name -> (GGUF type name, raw rows uint8 [N, bytes per row]) with the
    row permutation transformers applies when it dequantises (found by passing it row numbers)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    stat = path.stat()
    architecture, file_tensors = _gguf_file(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    config = model.config
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(
        config={"num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads}
    )
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ValueError(f"gguf {gguf_version()} does not know the architecture {architecture!r}")
    # gguf's own HF -> GGUF name table, as transformers uses it (built once here: transformers
    # rebuilds it for every submodule, 4 s for this model)
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    to_parameter = {}
    for parameter in model.state_dict():
        stem, _, suffix = parameter.rpartition(".")
        gguf_name = names.get_name(stem)
        if gguf_name is not None:
            to_parameter[f"{gguf_name}.{suffix}"] = parameter
    found = {}
    for name, type_name, raw in file_tensors:
        parameter = to_parameter.get(name)
        if parameter is None or raw.ndim != 2:
            continue
        order = processor.process(weights=np.arange(raw.shape[0]).reshape(-1, 1), name=name).weights
        found[parameter] = (type_name, raw[order.reshape(-1)])
    tied = _tied_head_name(model)
    if tied is not None and tied[0] not in found and tied[1] in found:
        found[tied[0]] = found[tied[1]]
    return found


@lru_cache(maxsize=4)
def _gguf_file(path: str, size: int, mtime_ns: int) -> tuple[str, list[tuple[str, str, np.ndarray]]]:
    """(architecture, [(tensor name, GGUF type name, raw rows memory-mapped)]) of one version of
    a GGUF file (size and mtime tell versions apart). Kept per process: the app loads a preset
    again whenever the user switches back to it."""
    tensors, fields = read_tensors(path, keep_fields=(_ARCHITECTURE,))
    if _ARCHITECTURE not in fields:
        raise KeyError(f"{Path(path).name} names no {_ARCHITECTURE}")
    return fields[_ARCHITECTURE], [(tensor.name, tensor.type_name, tensor.rows) for tensor in tensors]


def _tied_head_name(model: nn.Module) -> tuple[str, str] | None:
    """(head weight name, input embedding weight name) when the two share one tensor."""
    if not (hasattr(model, "get_output_embeddings") and hasattr(model, "get_input_embeddings")):
        return None
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embedding is None or head.weight is not embedding.weight:
        return None
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    return f"{names[id(head)]}.weight", f"{names[id(embedding)]}.weight"


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@cache
def kernel_problem() -> str | None:
    """Why torch's int4 CPU kernel can't serve here, or None: its ops must exist, run, agree with
    a dequantised reference on a small random layer, and give each row alone what it gives in
    a batch of rows."""
    if not all(hasattr(torch.ops.aten, op) for op in _KERNEL_OPS):
        return f"torch {torch.__version__} has no int4 CPU kernel (aten.{', aten.'.join(_KERNEL_OPS)})"
    generator = torch.Generator().manual_seed(0)  # its own: loading must not move the global seed
    n, k = 48, 2 * GROUP
    groups = Groups(
        torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32),
        torch.rand(n, k // GROUP, generator=generator) / 8,
        torch.randn(n, k // GROUP, generator=generator) / 8,
        reads_input=1,
    )
    rows = torch.randn(3, k, generator=generator)
    try:
        layer = Int4Linear(groups)
        out = layer(rows)
        alone = torch.cat([layer(rows[i : i + 1]) for i in range(len(rows))])
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        return f"torch's int4 CPU kernel failed here ({_first_line(error)})"
    reference = rows.bfloat16().float() @ _rounded(groups).T
    if out.shape != reference.shape or not torch.allclose(out, reference, rtol=2e-2, atol=2e-2):
        return "torch's int4 CPU kernel disagrees with its reference here"
    if not torch.equal(out, alone):
        return "torch's int4 CPU kernel gives a row in a batch other values than alone"
    return None


def _rounded(groups: Groups) -> torch.Tensor:
    """The weight the kernel uses: scale and zero rounded to bf16."""
    rounded = Groups(groups.q, groups.scale.bfloat16().float(), groups.zero.bfloat16().float(), groups.reads_input)
    return rounded.dequantise()
