"""The background compile's helper process (decoding/helper_process.py, presets/compile_helper.py):
stopped while replies decode and resumed when they are quiet, ended on demand, a failure said in
one line; and the loader's recipe rebuilds the app's target exactly (the same step cache key), so
the steps the helper saves are the ones the app loads. (test_step_cache runs a helper that
compiles for real.)"""

from __future__ import annotations

import pickle
import sys
import time

import pytest
import torch

from specdec_core.decoding import compiled
from specdec_core.decoding.helper_process import HelperCommand, HelperProcess

# A helper that counts: the file holds how many 10 ms ticks it has run.
_COUNTER = """
import sys, time
path = sys.argv[1]
for tick in range(100_000):
    open(path, "w").write(str(tick))
    time.sleep(0.01)
"""


def _ticks(path) -> int:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else 0


def test_a_helper_is_stopped_while_replies_decode_and_resumed_when_they_are_quiet(tmp_path):
    counter = tmp_path / "ticks"
    helper = HelperProcess(HelperCommand((sys.executable, "-c", _COUNTER, str(counter)), b"", tmp_path / "log"),
                           quiet_s=0.5)
    try:
        assert helper.wait(lambda: _ticks(counter) > 5) is None  # it runs while nothing decodes
        helper.decoding()
        time.sleep(0.2)  # (a write under way when it stopped may still land)
        stopped_at = _ticks(counter)
        time.sleep(0.3)
        assert _ticks(counter) == stopped_at  # stopped: no tick while replies decode
        waited = time.monotonic()
        assert helper.wait(lambda: _ticks(counter) > stopped_at + 5) is None  # resumed once quiet
        assert time.monotonic() - waited < 5
    finally:
        helper.stop()
    assert helper._process.poll() is not None  # ended, its group with it


def test_a_failed_helper_is_one_line_with_its_last_words(tmp_path):
    command = HelperCommand((sys.executable, "-c", "import sys; print('loading'); sys.exit('no such model: x')"),
                            b"", tmp_path / "helper.log")
    helper = HelperProcess(command, quiet_s=0.1)
    code = helper.wait(lambda: False)
    assert code == 1
    assert helper.failure(code) == f"exit code 1: no such model: x (all of its output in {command.log})"


def test_the_helpers_recipe_loads_the_target_the_app_loaded(smollm2_local, monkeypatch, tmp_path):
    """The offline preset loaded with compile: auto (its EAGLE and Medusa heads too) hands its helper a recipe;
    loaded from that recipe, the helper's target has the app's step cache key: the same structure,
    features and options, so the app loads what the helper saves. (torch.compile is the identity
    and the helper's work runs in this process: the key is what is checked here.)"""
    from specdec_core.presets.compile_helper import compile_steps
    from specdec_core.presets.loading import load_preset
    from specdec_core.presets.sources import cache_root

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    # An empty step cache (a warm one starts no helper), the GGUF's converted folder linked in.
    (tmp_path / "gguf").symlink_to(cache_root() / "gguf")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    helper_keys = []

    class HelperInThisProcess:
        def __init__(self, command: HelperCommand, quiet_s: float) -> None:
            helper_keys.append(compile_steps(pickle.loads(command.stdin))._cache.key)

        def wait(self, done) -> int:
            return 0

        def decoding(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(compiled, "HelperProcess", HelperInThisProcess)
    app_models = load_preset("smollm2-135m-local")
    steps = app_models.path("target")
    try:
        assert steps.wait(300), steps.fallback_reason
        # the EAGLE head's layers and, for the Medusa heads, the last layer's output
        layers = app_models.target.config.num_hidden_layers
        assert app_models.eagle_head is not None and app_models.medusa_heads is not None
        assert steps.feature_layers == (*app_models.eagle_head.layer_ids, layers)
        assert helper_keys == [steps._cache.key]
    finally:
        steps.close()


def test_a_helper_that_cant_start_leaves_the_compile_to_this_process(monkeypatch, tmp_path, caplog):
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC, CompiledSteps
    from specdec_core.kernels.row_attention import use_row_exact_attention
    from tests.test_row_attention import _int4_tiny_llama

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    model = _int4_tiny_llama(seed=33)
    assert use_row_exact_attention(model) is None
    missing = HelperCommand((str(tmp_path / "no-such-python"),), b"", tmp_path / "helper.log")
    steps = CompiledSteps(model, step_sizes=(1,), background=True, cache_dir=tmp_path, helper=missing)
    assert steps.wait(120) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
    assert "the compile helper of" in caplog.text and "could not start" in caplog.text
