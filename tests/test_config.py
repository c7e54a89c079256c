"""models.yaml validation: the shipped presets, and one-line errors naming the preset and key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdec_core.presets.config import _PRESET_KEYS, REPO_CONFIG, ConfigError, ModelSpec, load_config, load_presets, parse_model_source

GOOD_PRESET = """\
    description: a test preset
    target: ./target
    drafter: prompt_lookup
    memory_gb: 1
"""


def write_config(tmp_path: Path, preset_body: str = GOOD_PRESET, top: str = "auto_fallback: p\n") -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(f"{top}presets:\n  p:\n{preset_body}")
    return path


def config_error(tmp_path: Path, **kwargs) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path, **kwargs))
    message = str(raised.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- the shipped file


def test_shipped_presets_are_the_issue_list():
    presets = load_presets()
    assert list(presets) == ["smollm2-135m-local", "qwen2.5-7b", "qwen2.5-1.5b", "llama-3.1-8b", "vicuna-7b-medusa",
                             "smollm2-1.7b"]
    assert load_config().auto_fallback == "smollm2-135m-local"


def test_offline_preset_is_the_bundled_gguf_with_prompt_lookup_and_an_nf4_copy():
    local = load_presets()["smollm2-135m-local"]
    assert local.target == ModelSpec("bundled", "smollm2-135m-instruct", "bundled:smollm2-135m-instruct")
    assert local.draft == local.target
    assert (local.drafter, local.draft_quantization, local.dtype) == ("prompt_lookup", "4bit", "auto")
    assert local.offline and not local.requires_gpu and not local.trust_remote_code


@pytest.mark.parametrize(
    "name, target, draft",
    [
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
        ("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ],
)
def test_gpu_presets(name, target, draft):
    preset = load_presets()[name]
    assert (preset.target.kind, preset.target.location) == ("hub", target)
    assert (preset.draft.kind, preset.draft.location) == ("hub", draft)
    assert preset.requires_gpu and preset.drafter == "model" and preset.download_gb > 0
    assert preset.gated == (name == "llama-3.1-8b")
    assert "gated" in preset.needs() if preset.gated else "gated" not in preset.needs()


def test_every_preset_key_is_commented_in_the_shipped_file():
    lines = REPO_CONFIG.read_text().splitlines()
    keys = ["auto_fallback", *_PRESET_KEYS]  # every key the schema knows, so new keys need comments too
    for key in keys:
        first = next(i for i, line in enumerate(lines) if re.match(rf"\s*{key}:", line))
        assert lines[first - 1].lstrip().startswith("#") or "#" in lines[first], f"key {key} has no comment"


# ---------------------------------------------------------------- errors


def test_valid_minimal_preset_gets_defaults(tmp_path):
    preset = load_config(write_config(tmp_path)).presets["p"]
    assert preset.target == ModelSpec("local", str((tmp_path / "target").resolve()), "./target")
    assert (preset.draft, preset.dtype, preset.draft_quantization) == (None, "auto", "none")
    assert (preset.draft_length, preset.adaptive, preset.trust_remote_code) == (5, True, False)


def test_unknown_key_names_preset_and_key(tmp_path):
    message = config_error(tmp_path, preset_body=GOOD_PRESET + "    draft_lenght: 4\n")
    assert "preset 'p'" in message and "'draft_lenght'" in message


def test_missing_key_names_preset_and_key(tmp_path):
    message = config_error(tmp_path, preset_body=GOOD_PRESET.replace("    memory_gb: 1\n", ""))
    assert "preset 'p'" in message and "missing key 'memory_gb'" in message


@pytest.mark.parametrize(
    "line, key",
    [
        ("draft_length: four", "draft_length"),
        ("draft_length: true", "draft_length"),  # YAML booleans are ints to Python
        ("adaptive: 1", "adaptive"),
        ("dtype: float64", "dtype"),
        ("draft_quantization: 3bit", "draft_quantization"),
        ("trust_remote_code: yes please", "trust_remote_code"),
        ("draft_length: 0", "draft_length"),
        ("download_gb: -1", "download_gb"),
        ("draft: not a model id", "draft"),
        ("cpu_weights: int4", "cpu_weights"),
        ("cpu_weights: gguf", "cpu_weights"),  # the target ./target is a folder, not a GGUF file
    ],
)
def test_wrong_value_names_preset_and_key(tmp_path, line, key):
    message = config_error(tmp_path, preset_body=GOOD_PRESET + f"    {line}\n")
    assert "preset 'p'" in message and f"'{key}'" in message


def test_cpu_weights_defaults_to_fp32_and_gguf_needs_a_gguf_target(tmp_path):
    assert load_config(write_config(tmp_path)).presets["p"].cpu_weights == "fp32"
    gguf = GOOD_PRESET.replace("./target", "./model.gguf") + "    cpu_weights: gguf\n"
    assert load_config(write_config(tmp_path, preset_body=gguf)).presets["p"].cpu_weights == "gguf"
    message = config_error(tmp_path, preset_body=GOOD_PRESET + "    cpu_weights: gguf\n")
    assert "not a GGUF file" in message and "cpu_weights: fp32" in message


def test_model_drafter_needs_a_draft(tmp_path):
    message = config_error(tmp_path, preset_body=GOOD_PRESET.replace("prompt_lookup", "model"))
    assert "preset 'p'" in message and "'drafter'" in message and "draft" in message


def test_auto_is_a_reserved_name(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(f"auto_fallback: auto\npresets:\n  auto:\n{GOOD_PRESET}")
    with pytest.raises(ConfigError, match="reserved"):
        load_config(path)


def test_auto_fallback_must_name_a_cpu_preset(tmp_path):
    assert "auto_fallback" in config_error(tmp_path, top="auto_fallback: nope\n")
    message = config_error(tmp_path, preset_body=GOOD_PRESET + "    requires_gpu: true\n")
    assert "auto_fallback" in message and "without a GPU" in message


def test_unknown_top_level_key(tmp_path):
    assert "'preset'" in config_error(tmp_path, top="auto_fallback: p\npreset: {}\n")


def test_invalid_yaml_and_missing_file(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("presets: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nowhere.yaml")


# ---------------------------------------------------------------- model sources


@pytest.mark.parametrize(
    "text, kind",
    [
        ("Qwen/Qwen2.5-7B-Instruct", "hub"),
        ("bundled:smollm2-135m-instruct", "bundled"),
        ("./models/mine", "local"),
        ("/abs/folder", "local"),
        ("~/models/x", "local"),
        ("weights/model.Q4_K_M.gguf", "gguf"),
    ],
)
def test_model_source_kinds(tmp_path, text, kind):
    spec = parse_model_source(text, tmp_path)
    assert spec.kind == kind and spec.label == text
    if kind in ("local", "gguf"):
        assert Path(spec.location).is_absolute()


@pytest.mark.parametrize("text", ["bundled:", "no slash", "a/b/c"])
def test_bad_model_sources(tmp_path, text):
    with pytest.raises(ValueError):
        parse_model_source(text, tmp_path)


def test_eagle_drafter_needs_an_eagle_source(tmp_path):
    message = config_error(tmp_path, preset_body=GOOD_PRESET.replace("drafter: prompt_lookup", "drafter: eagle"))
    assert "'drafter' is 'eagle' but the preset has no 'eagle' head source" in message
    message = config_error(tmp_path, preset_body=GOOD_PRESET.replace("drafter: prompt_lookup", "drafter: hybrid"))
    assert "neither an 'eagle' head nor a 'draft'" in message


def test_medusa_drafter_needs_a_medusa_source_and_the_gpu_preset_names_medusas_heads(tmp_path):
    message = config_error(tmp_path, preset_body=GOOD_PRESET.replace("drafter: prompt_lookup", "drafter: medusa"))
    assert "'drafter' is 'medusa' but the preset has no 'medusa' heads source" in message
    vicuna = load_presets()["vicuna-7b-medusa"]
    assert vicuna.medusa == ModelSpec("hub", "FasterDecoding/medusa-vicuna-7b-v1.3", "FasterDecoding/medusa-vicuna-7b-v1.3")
    assert vicuna.drafter == "medusa" and vicuna.requires_gpu and vicuna.target.location == "lmsys/vicuna-7b-v1.3"


# ---------------------------------------------------------------- sampling defaults


def test_the_offline_preset_sets_the_sampling_defaults_its_gguf_file_lacks():
    # The API takes a model's generation_config values for omitted fields; the bundled GGUF has none.
    assert dict(load_presets()["smollm2-135m-local"].sampling) == {"temperature": 0.2, "top_p": 0.9}


@pytest.mark.parametrize("line, words", [
    ("sampling: {temperature: -1}", "temperature must be 0"),
    ("sampling: {top_p: 0}", "top_p must be in (0, 1]"),
    ("sampling: {min_p: 0.1}", "may set temperature, top_p, top_k, got 'min_p'"),
    ("sampling: {top_k: high}", "takes numbers"),
    ("sampling: 0.7", "key 'sampling' must be dict or null"),
])
def test_bad_sampling_defaults_are_one_line(tmp_path, line, words):
    message = config_error(tmp_path, preset_body=GOOD_PRESET + f"    {line}\n")
    assert "preset 'p'" in message and words in message and "\n" not in message


def test_sampling_defaults_reach_the_loaded_targets_generation_config(tmp_path, smol_tokenizer):
    from specdec_core.presets.loading import load_preset
    from tests.tiny_models import tiny_llama

    tiny_llama(seed=0).save_pretrained(tmp_path / "target")
    smol_tokenizer.save_pretrained(tmp_path / "target")
    config = write_config(tmp_path, preset_body=GOOD_PRESET + "    sampling: {temperature: 0.6, top_k: 7}\n")
    target = load_preset("p", config, load_draft=False, compile=False).target
    assert (target.generation_config.temperature, target.generation_config.top_k) == (0.6, 7)
