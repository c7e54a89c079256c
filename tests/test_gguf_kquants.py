"""K-quant GGUF tensors (Q4_K, Q5_K, Q6_K) on the int4 CPU kernel (specdec_core/kernels/int4_linear.py).

gguf's own dequantisation (gguf.quants.dequantize, what transformers loads a GGUF file with) is the
reference. gguf has no K-quant quantiser, so the blocks are built here field by field (k_quantise:
plain min/max rounding, not llama.cpp's search, but blocks of the type as gguf reads them).
Tolerances as for Q4_1 (tests/test_int4_linear.py): decoding equals the reference up to float32
rounding; a layer's output within 1% of sum_k |x_k W_jk| of x W^T, and within one bf16 rounding of
the kernel's own arithmetic (bf16 x, bf16 scale and zero, fp32 sums).
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, get_tensor_name_map, MODEL_ARCH
from gguf.quants import dequantize, quantize
from torch import nn

from specdec_core.kernels import int4_linear
from specdec_core.kernels.gguf_index import read_tensors
from specdec_core.kernels.int4_linear import (
    GROUP, SUPER_BLOCK, Groups, Int4Linear, decode_blocks, kernel_problem, use_gguf_weights,
)
from tests.tiny_models import copy_of_smollm2_gguf, require, tiny_llama

ON_THE_KERNEL = ("Q4_K", "Q5_K", "Q6_K")
READS = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 4}  # times a layer reads its input


def _kernel_available():
    problem = kernel_problem()
    require(problem is None, f"torch's int4 CPU kernel is needed here: {problem}")


# ---------------------------------------------------------------- K-quant blocks built by hand


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    """float [n] -> uint8 [n, 2] little-endian fp16."""
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


def _safe_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, dtype=np.float64), where=b != 0)


def _k_scales_and_mins(weights: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """For [supers, 8, 32] weights: fp16 d and dmin [supers], 6-bit scales and mins [supers, 8],
    q [supers, 8, 32] in 0..levels, with w ~ d * scale * q - dmin * min."""
    low = np.minimum(weights.min(-1), 0)
    step = (weights.max(-1) - low) / levels
    d = (step.max(-1) / 63).astype(np.float16).astype(np.float64)
    dmin = (-low.min(-1) / 63).astype(np.float16).astype(np.float64)
    scales = np.clip(np.rint(_safe_divide(step, d[:, None])), 0, 63)
    mins = np.clip(np.rint(_safe_divide(-low, dmin[:, None])), 0, 63)
    q = _safe_divide(weights + (dmin[:, None] * mins)[..., None], (d[:, None] * scales)[..., None])
    return d, dmin, scales.astype(np.uint8), mins.astype(np.uint8), np.clip(np.rint(q), 0, levels).astype(np.uint8)


def _packed_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [supers, 8] -> the 12 bytes of each super-block (the layout gguf's
    Q4_K.get_scale_min unpacks: low 6 bits of 0-3 in bytes 0-3 and 4-7, 4-7 split over the rest)."""
    return np.concatenate([
        scales[:, :4] | ((scales[:, 4:] >> 4) << 6),
        mins[:, :4] | ((mins[:, 4:] >> 4) << 6),
        (scales[:, 4:] & 15) | ((mins[:, 4:] & 15) << 4),
    ], axis=1)


def k_quantise(weight: np.ndarray, type_name: str) -> np.ndarray:
    """Raw GGUF rows (uint8 [N, bytes per row]) of `type_name` blocks for a weight [N, K], K a
    multiple of 256."""
    rows = weight.shape[0]
    supers = weight.astype(np.float64).reshape(-1, SUPER_BLOCK)
    if type_name == "Q6_K":
        return _q6_k(supers).reshape(rows, -1)
    d, dmin, scales, mins, q = _k_scales_and_mins(supers.reshape(-1, 8, 32), 15 if type_name == "Q4_K" else 31)
    nibbles = q.reshape(-1, 4, 2, 32) & 15  # sub-blocks 2c and 2c + 1 share bytes 32c .. 32c + 31
    parts = [_fp16_bytes(d), _fp16_bytes(dmin), _packed_scales(scales, mins)]
    if type_name == "Q5_K":  # bit i of byte j: the high bit of weight j of sub-block i
        parts.append(((q >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1, dtype=np.uint8))
    parts.append((nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)).reshape(-1, 128))
    return np.concatenate(parts, axis=1).reshape(rows, -1)


def _q6_k(supers: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16
    weights), fp16 d; w = d * scale * (q - 32), q in 0..63."""
    groups = supers.reshape(-1, 16, 16)
    extreme = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], -1)[..., 0]
    step = extreme / -32  # signed, as llama.cpp does: the largest magnitude lands on q - 32 = -32
    d = (np.abs(step).max(-1) / 127).astype(np.float16).astype(np.float64)
    scales = np.clip(np.rint(_safe_divide(step, d[:, None])), -128, 127)
    q = np.rint(_safe_divide(groups, (d[:, None] * scales)[..., None]))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128 weights
    low = q & 15  # weight r of a half: byte r % 64 of its 64, the high nibble for r >= 64
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    high = (q >> 4).reshape(-1, 2, 4, 32)  # weight r of a half: byte r % 32 of its 32, bits 2 (r // 32)
    qh = (high << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(axis=2, dtype=np.uint8).reshape(-1, 64)
    return np.concatenate([ql, qh, scales.astype(np.int8).view(np.uint8), _fp16_bytes(d)], axis=1)


def _reference(raw: np.ndarray, type_name: str) -> torch.Tensor:
    return torch.from_numpy(dequantize(raw, GGMLQuantizationType[type_name]).astype(np.float32))


def _weight(rows: int, width: int, seed: int) -> np.ndarray:
    generator = np.random.default_rng(seed)
    weight = generator.standard_normal((rows, width)) * 0.05 + generator.standard_normal((rows, 1)) * 0.02
    return weight.astype(np.float32)


@pytest.mark.parametrize("type_name,levels", [("Q4_K", 15), ("Q5_K", 31), ("Q6_K", 63)])
def test_the_hand_built_blocks_are_blocks_of_their_type(type_name, levels):
    """gguf reads them back to the weight within a step of the coarsest sub-block (half a step, plus
    the scales' own rounding; a layout error breaks it), in the type's bytes per super-block."""
    weight = _weight(6, 2 * SUPER_BLOCK, seed=1)
    raw = k_quantise(weight, type_name)
    assert raw.shape[1] == 2 * {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[type_name]
    error = (_reference(raw, type_name) - torch.from_numpy(weight)).abs().amax()
    assert error <= 2 * np.abs(weight).max() / levels  # the coarsest step: a sub-block spanning -max .. max
    assert error > 0


# ---------------------------------------------------------------- on the kernel


@pytest.mark.parametrize("type_name", ON_THE_KERNEL)
def test_decoded_k_blocks_equal_ggufs_dequantisation(type_name):
    raw = k_quantise(_weight(40, 3 * SUPER_BLOCK, seed=2), type_name)
    groups = decode_blocks(raw, type_name)
    assert groups.q.min() >= 0 and groups.q.max() <= 15
    assert groups.reads_input == READS[type_name]
    torch.testing.assert_close(groups.dequantise(), _reference(raw, type_name), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("type_name", ON_THE_KERNEL)
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_a_k_quant_layer_matches_the_reference_within_the_stated_tolerance(type_name, rows):
    _kernel_available()
    raw = k_quantise(_weight(64, 2 * SUPER_BLOCK, seed=rows), type_name)
    weight = _reference(raw, type_name)
    layer = Int4Linear(decode_blocks(raw, type_name), gguf_type=type_name)
    x = torch.randn(2, rows, weight.shape[1])
    y = layer(x)
    assert y.shape == (2, rows, 64) and y.dtype == torch.float32
    assert ((y - x @ weight.T).abs() <= 0.01 * (x.abs() @ weight.abs().T) + 1e-6).all()
    groups = decode_blocks(raw, type_name)
    rounded = Groups(groups.q, groups.scale.bfloat16().float(), groups.zero.bfloat16().float(), groups.reads_input)
    exact = x.bfloat16().float() @ rounded.dequantise().T
    assert ((y - exact).abs() <= 2**-8 * exact.abs() + 1e-6).all()


@pytest.mark.parametrize("type_name", ON_THE_KERNEL)
def test_a_prompt_long_call_on_the_unpacked_k_weight_agrees_with_the_kernel(type_name):
    """DENSE_ROWS rows or more run one matmul over the weight unpacked from the kernel's buffer (4
    or 2 reads' worth of it for Q6_K and Q5_K): within a bf16 rounding of the kernel's rows."""
    _kernel_available()
    raw = k_quantise(_weight(128, SUPER_BLOCK, seed=4), type_name)
    weight = _reference(raw, type_name)
    layer = Int4Linear(decode_blocks(raw, type_name), gguf_type=type_name)
    assert layer.packing_block is not None
    x = torch.randn(int4_linear.DENSE_ROWS + 5, SUPER_BLOCK)
    long_call = layer(x)
    by_kernel = torch.cat([layer(part) for part in x.split(int4_linear.DENSE_ROWS - 1)])
    scale = x.abs() @ weight.abs().T
    assert ((long_call - by_kernel).abs() <= 2**-8 * scale + 2**-8 * by_kernel.abs() + 1e-6).all()
    assert ((long_call - x @ weight.T).abs() <= 0.01 * scale + 1e-6).all()


# ---------------------------------------------------------------- a K-quant file written here


def _tensor_names(model) -> dict[str, str]:
    """GGUF tensor name -> the model's weight name (gguf's own name table)."""
    names = get_tensor_name_map(MODEL_ARCH.LLAMA, model.config.num_hidden_layers)
    return {f"{names.get_name(parameter.removesuffix('.weight'))}.weight": parameter
            for parameter, _ in model.named_parameters() if names.get_name(parameter.removesuffix(".weight"))}


def _gguf_row_order(model, gguf_name: str, rows: int) -> np.ndarray:
    """The model row each GGUF row holds: transformers' permutation of llama's q/k rows, inverted."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    processor = TENSOR_PROCESSORS["llama"](config={"num_attention_heads": model.config.num_attention_heads,
                                                   "num_key_value_heads": model.config.num_key_value_heads})
    to_model = processor.process(weights=np.arange(rows).reshape(-1, 1), name=gguf_name).weights.reshape(-1)
    return np.argsort(to_model)


def _write_k_quant_file(path, model, types: dict[str, str]) -> None:
    """A GGUF file of the model's linear weights in the given types (GGUF name -> type; the rest
    F32), and each weight of the model set to what transformers would load from it (gguf's
    dequantisation, rows permuted as it permutes them)."""
    writer = GGUFWriter(str(path), "llama")
    state = model.state_dict()
    for gguf_name, parameter in _tensor_names(model).items():
        weight = state[parameter]
        if weight.ndim != 2 or "token_embd" in gguf_name:
            continue
        order = _gguf_row_order(model, gguf_name, weight.shape[0])
        in_file = weight.numpy()[order]
        kind = types.get(gguf_name, "F32")
        if kind == "F32":
            writer.add_tensor(gguf_name, np.ascontiguousarray(in_file))
            continue
        raw = k_quantise(in_file, kind)
        writer.add_tensor(gguf_name, raw, raw_dtype=GGMLQuantizationType[kind])
        loaded = _reference(raw, kind)[np.argsort(order)]
        with torch.no_grad():
            weight.copy_(loaded)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _q4_k_m_like(layers: int) -> dict[str, str]:
    """Types as llama.cpp's Q4_K_M mixes them: Q4_K, with Q6_K for some ffn_down and the output,
    and a Q5_K here for attn_v and the other ffn_down (as in a Q5_K_M file); one layer left F32
    (a type with no int4 form)."""
    types = {}
    for i in range(layers):
        for part in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            if (i, part) != (1, "attn_output"):
                types[f"blk.{i}.{part}.weight"] = "Q4_K"
        types[f"blk.{i}.attn_v.weight"] = "Q5_K"
        types[f"blk.{i}.ffn_down.weight"] = "Q6_K" if i == 0 else "Q5_K"
    types["output.weight"] = "Q6_K"
    return types


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory):
    """(model loaded 'from' a K-quant file written here, the file): a tiny Llama 256 wide."""
    model = tiny_llama(seed=3, vocab=512, init=0.05, hidden_size=256, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=2)
    path = tmp_path_factory.mktemp("kquants") / "tiny-q4_k_m.gguf"
    _write_k_quant_file(path, model, _q4_k_m_like(model.config.num_hidden_layers))
    return model, path


def test_the_written_file_holds_k_quant_tensors(k_quant_model):
    _, path = k_quant_model
    kinds = {tensor.type_name for tensor in read_tensors(path)[0]}
    assert {"Q4_K", "Q5_K", "Q6_K"} <= kinds


def test_the_k_quant_layers_of_a_file_run_on_the_kernel_and_another_type_says_what_it_costs(k_quant_model):
    _kernel_available()
    model, path = k_quant_model
    four_bit = copy.deepcopy(model)
    swap = use_gguf_weights(four_bit, path)
    assert swap.problem is None
    assert swap.swapped == {"Q4_K": 9, "Q5_K": 3, "Q6_K": 2}  # q, k, o, gate, up x2 but one; v x2, down x2; head
    assert list(swap.kept) == ["model.layers.1.self_attn.o_proj"]
    (why,) = swap.kept.values()
    assert why.startswith("GGUF type F32: no int4 form here") and "row-exact" in why and "\n" not in why
    assert type(four_bit.model.layers[1].self_attn.o_proj) is nn.Linear
    assert four_bit.lm_head.gguf_type == "Q6_K" and four_bit.lm_head.reads_input == 4
    assert four_bit.model.layers[1].mlp.down_proj.gguf_type == "Q5_K"
    assert four_bit.model.layers[0].self_attn.q_proj.gguf_type == "Q4_K"
    # the model on its 4-bit layers: logits near the reference model's (bf16 inputs and scales)
    ids = torch.tensor([[1, 17, 300, 42, 7, 99]])
    with torch.no_grad():
        reference, ours = model(ids).logits, four_bit(ids).logits
    assert (ours - reference).abs().amax() <= 0.02 * reference.abs().amax()


def test_a_type_without_an_int4_form_is_one_line_saying_what_to_do(tmp_path):
    """A Q2_K-like case: here the file's F32 layers (any type outside HANDLED_TYPES takes this path)."""
    _kernel_available()
    plain = tiny_llama(seed=3, vocab=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=1)
    path = tmp_path / "f32.gguf"
    _write_k_quant_file(path, plain, {})
    swap = use_gguf_weights(plain, path, include_head=False)
    assert swap.swapped == {} and len(swap.kept) == 7
    (why,) = set(swap.kept.values())
    assert why.startswith("GGUF type F32:") and "Q4_K_M" in why and "\n" not in why
    assert int4_linear.dense_reason("IQ2_XS").startswith("GGUF type IQ2_XS: no int4 form here")
    assert "IQ2_XS" not in int4_linear.HANDLED_TYPES


def test_the_preset_notes_name_the_k_quant_layers_and_the_fp32_ones(k_quant_model, monkeypatch):
    """loading's dispatch: the info names the kinds on the kernel, one note per fp32 reason."""
    _kernel_available()
    from specdec_core.presets import loading
    from specdec_core.presets.loaded import ModelInfo

    model, path = k_quant_model
    four_bit = copy.deepcopy(model)
    monkeypatch.setattr(loading, "gguf_file", lambda spec: path)
    info = ModelInfo(role="target", name="tiny", parameters=1, memory_bytes=1, device="cpu", dtype="float32",
                     quantization="none", load_s=0.0)
    info, notes = loading._use_gguf_weights(type("Spec", (), {"label": "tiny"})(), four_bit, info)
    assert info.quantization == "gguf q4_k+q5_k+q6_k"
    assert len(notes) == 1 and notes[0].startswith("target: 1 linear layers stay fp32 (GGUF type F32: no int4 form")


# ---------------------------------------------------------------- the bundled model's tensors requantised


def test_the_bundled_models_ffn_down_requantised_runs_on_the_kernel_as_ggufs_reference(smollm2, tmp_path):
    """SmolLM2's ffn_down tensors (1536 wide: the only ones a multiple of 256) taken from the
    bundled file, requantised to Q4_K, Q5_K and Q6_K, written to a file; the model's weights set to
    gguf's dequantisation of those blocks (what transformers would load): each layer decodes to it
    exactly and computes within the stated tolerance."""
    _kernel_available()
    from specdec_core.presets.sources import bundled_gguf

    model, _ = smollm2
    tensors = {tensor.name: tensor for tensor in read_tensors(bundled_gguf("smollm2-135m-instruct"))[0]}
    kinds = {0: "Q4_K", 1: "Q5_K", 2: "Q6_K"}
    changed = copy.deepcopy(model)
    path = tmp_path / "smollm2-k.gguf"
    writer = GGUFWriter(str(path), "llama")
    references, blocks = {}, {}
    for layer, kind in kinds.items():
        source = tensors[f"blk.{layer}.ffn_down.weight"]
        weight = dequantize(np.asarray(source.rows), GGMLQuantizationType[source.type_name])  # [576, 1536]
        raw = k_quantise(weight, kind)
        writer.add_tensor(f"blk.{layer}.ffn_down.weight", raw, raw_dtype=GGMLQuantizationType[kind])
        references[layer], blocks[layer] = _reference(raw, kind), raw
        assert (references[layer] - torch.from_numpy(weight)).abs().amax() < 0.1 * np.abs(weight).max()
        with torch.no_grad():
            changed.model.layers[layer].mlp.down_proj.weight.copy_(references[layer])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    swap = use_gguf_weights(changed, path, include_head=False)
    assert swap.swapped == {"Q4_K": 1, "Q5_K": 1, "Q6_K": 1} and swap.kept == {}
    x = torch.randn(5, 1536, generator=torch.Generator().manual_seed(0))
    for layer in kinds:
        down = changed.model.layers[layer].mlp.down_proj
        weight = references[layer]
        assert down.gguf_type == kinds[layer]
        torch.testing.assert_close(decode_blocks(blocks[layer], kinds[layer]).dequantise(), weight,
                                   rtol=1e-6, atol=1e-7)
        y = down(x)
        assert ((y - x @ weight.T).abs() <= 0.01 * (x.abs() @ weight.abs().T) + 1e-6).all()



@pytest.mark.parametrize("kind", ON_THE_KERNEL)
def test_lean_decoder_layers_run_a_k_quant_model_bitwise_as_transformers_layers_do(tmp_path, kind):
    """A Q4_K model (or Q5_K, Q6_K: each layer reads its input 2, 4 times): q, k and v stack into one
    kernel call, gate and up into another, and every step's logits are transformers' own, bitwise."""
    _kernel_available()
    from specdec_core.decoding.eager import CachedModel
    from specdec_core.kernels.lean_layers import use_lean_layers, uses_lean_layers
    from specdec_core.kernels.row_attention import use_row_exact_attention

    model = tiny_llama(seed=5, vocab=512, init=0.05, hidden_size=256, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=2)
    layers = model.config.num_hidden_layers
    parts = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    path = tmp_path / f"tiny-{kind}.gguf"
    _write_k_quant_file(path, model, {f"blk.{i}.{part}.weight": kind for i in range(layers) for part in parts})
    assert use_gguf_weights(model, path, include_head=False).swapped == {kind: 7 * layers}
    assert use_row_exact_attention(model) is None
    lean = copy.deepcopy(model)
    assert use_lean_layers(lean) is None and uses_lean_layers(lean)
    runners = CachedModel(model), CachedModel(lean)
    tokens = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    start = 0
    for size in (20, 1, 2, 5, 1):  # a prompt (transformers' layer), then steps (the lean one)
        logits = [runner.forward(tokens[start : start + size]) for runner in runners]
        assert torch.equal(*logits), size
        start += size


# ---------------------------------------------------------------- a K-quant SmolLM2 file, as a preset


def _k_quant_type(name: str) -> str | None:
    """The type the K-quant copy of the bundled model gives a tensor (None: as in the bundled file):
    ffn_down (1536 wide) Q4_K, Q5_K, Q6_K by turns; attn_v Q5_0 in even layers and ffn_up Q5_1 in
    odd ones (llama.cpp's fallbacks for rows of 576, not a multiple of 256)."""
    block = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if block is None:
        return None
    layer, part = int(block.group(1)), block.group(2)
    if part == "ffn_down":
        return ("Q4_K", "Q5_K", "Q6_K")[layer % 3]
    if part == "attn_v" and layer % 2 == 0:
        return "Q5_0"
    if part == "ffn_up" and layer % 2 == 1:
        return "Q5_1"
    return None


K_QUANT_LAYERS = 6  # of the bundled model's 30: every type above at least twice, a third of the conversion's time


@pytest.fixture(scope="module")
def k_quant_smollm2(tmp_path_factory):
    """A models.yaml whose preset's target is the bundled SmolLM2 file's first layers rewritten with
    K-quant tensors (metadata and the other tensors copied), loaded through transformers as any GGUF is."""

    def k_quant(tensor):
        kind = _k_quant_type(tensor.name)
        if kind is None:
            return None
        weight = dequantize(tensor.data, tensor.tensor_type)
        raw = k_quantise(weight, kind) if kind.endswith("_K") else quantize(weight, GGMLQuantizationType[kind])
        return raw, GGMLQuantizationType[kind]

    folder = tmp_path_factory.mktemp("k-smollm2")
    copy_of_smollm2_gguf(folder / "smollm2-k.gguf", layers=K_QUANT_LAYERS, retype=k_quant)
    config = folder / "models.yaml"
    config.write_text("auto_fallback: k\npresets:\n  k:\n    description: SmolLM2 K-quants\n"
                      "    target: ./smollm2-k.gguf\n    drafter: prompt_lookup\n    memory_gb: 1\n"
                      "    cpu_weights: gguf\n    compile: false\n")
    return config


def test_a_k_quant_gguf_preset_runs_on_the_kernel_and_speculation_gives_plain_decodings_tokens(
        k_quant_smollm2, tmp_path_factory, monkeypatch):
    """transformers dequantises the file (gguf's reference); every linear layer, K-quants and the
    Q5_0/Q5_1 fallbacks included, decodes to those weights (checked at load, rtol 1e-6) and runs on
    the int4 kernel; greedy prompt lookup gives plain decoding's tokens exactly (row-exact steps)."""
    _kernel_available()
    from specdec_core import SamplingParams
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.presets.loading import load_preset

    config = k_quant_smollm2
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path_factory.mktemp("specdec-cache")))
    models = load_preset("k", config, load_eagle=False)
    assert not any("fp32" in note for note in models.notes), models.notes
    assert models.info[0].quantization == "gguf q4_1+q4_k+q5_0+q5_1+q5_k+q6_k+q8_0"
    line = models.describe().splitlines()[0]
    assert f"Q4_K x{len(range(0, K_QUANT_LAYERS, 3))}" in line and f"Q6_K x{len(range(2, K_QUANT_LAYERS, 3))}" in line
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content":
                             "Repeat this list twice: apples, pears, plums, figs, dates, limes."}])
    params = SamplingParams(max_new_tokens=48)
    plain = models.make_engine(drafter="none").generate(prompt, params)
    speculative = models.make_engine(drafter="prompt_lookup", adaptive=False).generate(prompt, params)
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.drafted_tokens > 0 and speculative.stats.accepted_tokens > 0
