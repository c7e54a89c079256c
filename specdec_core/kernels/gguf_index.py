"""The tensors of a GGUF file, found without parsing its metadata: names, types, raw bytes.

gguf's GGUFReader builds a numpy view of every metadata value first. A chat model's file holds
its tokenizer there (SmolLM2-135M: 49,152 tokens and 48,900 merges), and that took 5.5 s of a
2-core CPU on every start of the app or the CLI, for a 4-bit path that needs only the tensors'
names, types and bytes. Here the metadata is skipped: a string costs one length read. Kept to
the file layout of GGUF versions 2 and 3 (little-endian); the type tables are gguf's own.

    tensors, fields = read_tensors(path, keep_fields=("general.architecture",))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_GENERAL_ALIGNMENT
from gguf import GGMLQuantizationType, GGUFValueType

# bytes of each fixed-size metadata value type (strings and arrays are read by length)
_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_VERSIONS = (2, 3)


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # gguf's name of its GGML type: "Q4_1", "F32", ...
    rows: np.ndarray  # uint8 [rows, bytes per row], memory-mapped; [bytes] for a 1-D tensor


class _Cursor:
    """Little-endian reads from a memory-mapped file, moving forward."""

    def __init__(self, data: np.ndarray) -> None:
        self.buffer, self.at = memoryview(data), 0

    def read(self, layout: str):
        (value,) = struct.unpack_from(layout, self.buffer, self.at)
        self.at += struct.calcsize(layout)
        return value

    def string(self) -> str:
        return bytes(self._skip_string()).decode("utf-8")

    def _skip_string(self) -> memoryview:
        length = self.read("<Q")
        self.at += length
        return self.buffer[self.at - length : self.at]

    def value(self, kind: GGUFValueType, keep: bool):
        """One metadata value of `kind`: returned when `keep`, else only skipped (None)."""
        if kind == GGUFValueType.STRING:
            text = self._skip_string()
            return bytes(text).decode("utf-8") if keep else None
        if kind == GGUFValueType.ARRAY:
            item, count = GGUFValueType(self.read("<I")), self.read("<Q")
            if item in _SCALAR and not keep:  # a fixed-size array is skipped in one step
                self.at += count * struct.calcsize(_SCALAR[item])
                return None
            items = [self.value(item, keep) for _ in range(count)]
            return items if keep else None
        return self.read(_SCALAR[kind])


def read_tensors(path: str | Path, keep_fields: tuple[str, ...] = ()) -> tuple[list[GGUFTensor], dict]:
    """The file's tensors in file order, and the metadata values named in keep_fields (those
    present). ValueError for a file that is not GGUF 2/3 little-endian or ends too early."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(data)
    try:
        if cursor.read("<I") != GGUF_MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic)")
        version = cursor.read("<I")
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version} is not read here (read: 2, 3, little-endian)")
        tensor_count, field_count = cursor.read("<Q"), cursor.read("<Q")
        wanted = set(keep_fields) | {KEY_GENERAL_ALIGNMENT}
        fields = {}
        for _ in range(field_count):
            key = cursor.string()
            value = cursor.value(GGUFValueType(cursor.read("<I")), keep=key in wanted)
            if key in wanted:
                fields[key] = value
        infos = [_tensor_info(cursor) for _ in range(tensor_count)]
    except struct.error as error:
        raise ValueError(f"the GGUF file ends inside its header ({error})") from error
    alignment = fields.pop(KEY_GENERAL_ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    start = -(-cursor.at // alignment) * alignment
    tensors = [_tensor(data, start, *info) for info in infos]
    return tensors, fields


def _tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cursor.string()
    dims = tuple(cursor.read("<Q") for _ in range(cursor.read("<I")))  # innermost first
    return name, dims, GGMLQuantizationType(cursor.read("<I")), cursor.read("<Q")


def _tensor(data: np.ndarray, start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType,
            offset: int) -> GGUFTensor:
    block, block_bytes = GGML_QUANT_SIZES[kind]
    row_bytes = dims[0] // block * block_bytes
    rows = int(np.prod(dims[1:], dtype=np.int64))
    begin = start + offset
    if begin + rows * row_bytes > data.size:
        raise ValueError(f"tensor {name} runs past the end of the file")
    raw = data[begin : begin + rows * row_bytes]
    return GGUFTensor(name, kind.name, raw.reshape(rows, row_bytes) if len(dims) > 1 else raw)
