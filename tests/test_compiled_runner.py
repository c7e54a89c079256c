"""The compiled decode path on CPU (specdec_core/decoding/compiled.py): steps compiled with inductor's
C++ wrapper on the growing cache. Every row of a compiled step must be bitwise what a compiled
1-token step gives, so greedy speculation stays token-for-token plain decoding. The steps also
return the inputs of an EAGLE head's layers as outputs of their graphs, compiled now or in the
background, so they hand the head its features and its engines keep the compiled target."""

from __future__ import annotations

import logging
import sys
import time

import pytest
import torch

from specdec_core import (EagleDrafter, HybridDrafter, ModelDrafter, PromptLookupDrafter, SamplingParams, SpeculativeEngine)
from specdec_core.decoding import compiled as compiled_module
from specdec_core.decoding.compiled import COMPILED_DYNAMIC, COMPILING, MIN_CONTEXT, CompiledRunner, CompiledSteps
from specdec_core.decoding.features import StepFeatures, feature_tap, untapped
from specdec_core.kernels.row_attention import MAX_ROWS, use_row_exact_attention
from specdec_core.decoding.eager import CachedModel
from specdec_core.decoding.static import EAGER_DYNAMIC
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.tiny_models import perturbed_copy, random_eagle_head, tiny_llama

STEP_SIZES = (1, 4)  # two graphs keep the compile short; 2 and 3 tokens run padded, 5 and more in pieces


@pytest.fixture(scope="module")
def compiled():
    """A tiny Llama on the int4 kernel with row-exact attention, and its compiled steps, which
    read the features of a random EAGLE head's layers."""
    model = _int4_tiny_llama(seed=21)
    assert use_row_exact_attention(model) is None
    steps = CompiledSteps(model, step_sizes=STEP_SIZES, feature_layers=_head(model).layer_ids, progress=False)
    assert steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
    return model, steps


@pytest.fixture(scope="module")
def background():
    """The same, its steps compiled in the background (compile: auto), once that compile ended."""
    model = _int4_tiny_llama(seed=43)
    steps = CompiledSteps(model, step_sizes=STEP_SIZES, feature_layers=_head(model).layer_ids, background=True)
    assert steps.wait(600) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
    return model, steps


def _head(model):
    return random_eagle_head(model, draft_vocab=VOCAB, seed=3)


def _tokens(seed: int, count: int) -> list[int]:
    return torch.randint(0, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_every_row_of_a_compiled_step_is_bitwise_a_compiled_one_token_steps_row(compiled):
    model, steps = compiled
    prompt, tokens = _tokens(0, 30), _tokens(1, 26)
    single = steps()
    assert isinstance(single, CompiledRunner)
    single.forward(prompt, last_only=True)  # a prompt: read eagerly
    expected = [single.forward([token])[0] for token in tokens]
    for size in (2, 3, 4, 7, MAX_ROWS):  # padded, exact, and in pieces of the largest graph
        runner = steps()
        runner.forward(prompt, last_only=True)
        for start in range(0, len(tokens), size):
            rows = runner.forward(tokens[start : start + size])
            assert runner.length == len(prompt) + min(start + size, len(tokens))  # padding forgotten
            for i, row in enumerate(rows):
                assert torch.equal(row, expected[start + i]), (size, start + i)
    eager = CachedModel(model)  # and the same model as the eager path computes it, up to rounding
    eager.forward(prompt, last_only=True)
    torch.testing.assert_close(eager.forward(tokens), torch.stack(expected), rtol=0, atol=0.1)


def test_a_sequence_with_no_context_starts_eagerly_then_compiles_exactly(compiled):
    _, steps = compiled
    tokens = _tokens(2, 12)
    single = steps()
    expected = [single.forward([token])[0] for token in tokens]
    runner = steps()
    rows = runner.forward(tokens[:6])  # the first MIN_CONTEXT positions eagerly, the rest compiled
    rows = torch.cat([rows, runner.forward(tokens[6:])])
    assert MIN_CONTEXT == 2 and all(torch.equal(row, expected[i]) for i, row in enumerate(rows))


def test_speculation_on_compiled_steps_gives_plain_decodings_tokens(compiled, smol_tokenizer):
    model, steps = compiled
    draft = perturbed_copy(tiny_llama(seed=21, vocab=VOCAB, init=0.2), noise=0.02, seed=22)  # the target unquantised
    drafted = 0
    for seed in range(3):
        prompt = _tokens(10 + seed, 24) * 2  # repeats, so prompt lookup finds text to copy
        params = SamplingParams(max_new_tokens=40)
        plain = SpeculativeEngine(model, smol_tokenizer, make_runner=steps).generate(prompt, params)
        for drafter in (PromptLookupDrafter(), ModelDrafter(draft)):
            engine = SpeculativeEngine(model, smol_tokenizer, drafter=drafter, draft_length=5, adaptive=False,
                                       make_runner=steps)
            result = engine.generate(prompt, params)
            assert result.token_ids == plain.token_ids, (seed, type(drafter).__name__)
            drafted += result.stats.drafted_tokens
    assert drafted > 0 and steps.compiled  # it drafted, and nothing fell back along the way


@pytest.mark.parametrize("compiled_steps", ["compiled", "background"])
@torch._dynamo.config.patch(error_on_recompile=True)  # a recompile would fall back
def test_compiled_steps_hand_the_tap_each_real_tokens_features_without_recompiling(compiled_steps, request):
    model, steps = request.getfixturevalue(compiled_steps)
    tap = feature_tap(model, steps.feature_layers)  # an engine's, made after the steps were compiled
    ran = _counting_compiled_calls(steps)
    prompt, tokens = _tokens(3, 30), _tokens(4, 40)

    def features(reader, sizes):
        """What the tap holds after the prompt, then after each step of `sizes` tokens."""
        tap.start()
        reader.forward(prompt, last_only=True)  # a prompt: read eagerly by every reader
        rows = [tap.take()]
        for start in torch.tensor((0, *sizes)).cumsum(0)[:-1].tolist():
            tap.start()
            reader.forward(tokens[start : start + sizes[len(rows) - 1]])
            rows.append(tap.take())
        assert [len(r) for r in rows] == [len(prompt), *sizes]  # the real tokens' rows, no padding
        return rows[0], torch.cat(rows[1:])

    eager_prompt, eager_one_token = features(CachedModel(model), [1] * 32)
    _, one_token = features(steps(), [1] * 32)
    torch.testing.assert_close(one_token, eager_one_token, rtol=0, atol=1e-4)  # compiled as eager, up to rounding
    for sizes in ((1, 3, 4, 7, MAX_ROWS), (2,)):  # padded to 4, exact, and in pieces of 4
        prompt_rows, rows = features(steps(), list(sizes))
        assert torch.equal(prompt_rows, eager_prompt)
        assert torch.equal(rows, one_token[: len(rows)])  # each row bitwise a compiled 1-token step's
    assert steps.compiled and ran  # the compiled steps ran, and nothing recompiled or fell back


def _counting_compiled_calls(steps) -> list:
    """A list that grows by one at each compiled step the steps run."""
    calls = []
    original_run = steps.run
    steps.run = lambda *args: calls.append(args) or original_run(*args)
    return calls


@pytest.mark.parametrize("compiled_steps", ["compiled", "background"])
@torch._dynamo.config.patch(error_on_recompile=True)
def test_an_eagle_head_on_compiled_steps_keeps_plain_decodings_tokens(compiled_steps, request, smol_tokenizer):
    model, steps = request.getfixturevalue(compiled_steps)
    ran = _counting_compiled_calls(steps)
    drafted = 0
    for seed in range(2):
        prompt = _tokens(20 + seed, 24) * 2
        params = SamplingParams(max_new_tokens=40)
        plain = SpeculativeEngine(model, smol_tokenizer, make_runner=steps).generate(prompt, params)
        for drafter in (EagleDrafter(_head(model)), HybridDrafter(EagleDrafter(_head(model)))):
            engine = SpeculativeEngine(model, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False,
                                       make_runner=steps)
            result = engine.generate(prompt, params)
            assert result.token_ids == plain.token_ids, (seed, type(drafter).__name__)
            drafted += result.stats.drafted_tokens
    assert drafted > 0 and ran and steps.compiled


def test_a_tap_no_engine_reads_holds_only_the_last_forwards_rows(compiled, smol_tokenizer):
    model, steps = compiled
    prompt = _tokens(30, 24) * 2
    tap = feature_tap(model, steps.feature_layers)  # made (as an EAGLE engine would) before this reply, not after
    engine = SpeculativeEngine(model, smol_tokenizer, drafter=PromptLookupDrafter(), draft_length=5, make_runner=steps)
    engine.generate(prompt, SamplingParams(max_new_tokens=40))  # reads no features: nobody takes from the tap
    rows = tap.take()
    assert rows is not None and len(rows) <= MAX_ROWS  # the last verify's rows, not every step's since the prompt


def test_each_models_steps_are_its_own_though_the_guards_inside_models_are_skipped(compiled):
    """The steps skip dynamo's guards inside the model (their cost is a tenth of a step), so no
    two models may share compiled graphs: the same weights with another activation get theirs."""
    model, steps = compiled
    other = _int4_tiny_llama(seed=21)  # the fixture's weights,
    for layer in other.model.layers:
        layer.mlp.act_fn = torch.nn.ReLU()  # another computation inside the modules
    assert use_row_exact_attention(other) is None
    other_steps = CompiledSteps(other, step_sizes=(1,), progress=False)
    prompt, token = _tokens(40, 20), _tokens(41, 1)
    rows = {}
    for name, reader in (("model", steps()), ("other", other_steps()), ("other eager", CachedModel(other))):
        reader.forward(prompt, last_only=True)
        rows[name] = reader.forward(token)[0]
    assert other_steps.compiled and not torch.allclose(rows["other"], rows["model"], atol=0.5)
    torch.testing.assert_close(rows["other"], rows["other eager"], rtol=0, atol=0.1)


def test_where_compiling_fails_it_decodes_eagerly_and_says_why_once(monkeypatch, caplog):
    def unavailable(*args, **kwargs):
        raise RuntimeError("torch.compile is not available on this machine")

    monkeypatch.setattr(torch, "compile", unavailable)
    model = _int4_tiny_llama(seed=23)
    with caplog.at_level(logging.INFO, logger="specdec_core.decoding.compiled"):
        steps = CompiledSteps(model, step_sizes=STEP_SIZES, progress=False)
    lines = [r for r in caplog.records if r.name == "specdec_core.decoding.compiled"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "not available on this machine" in lines[0].message and "eagerly" in lines[0].message
    assert steps.decode_path == EAGER_DYNAMIC and type(steps()) is CachedModel


# ---------------------------------------------------------------- compiled in the background (compile: auto)


def _rows(runner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    runner.begin()
    runner.forward(prompt, last_only=True)
    return torch.stack([runner.forward([token])[0] for token in tokens])


def test_steps_compiled_in_the_background_leave_eager_decoding_exact_meanwhile_then_take_over(monkeypatch):
    """While another thread compiles, this one decodes eagerly, bitwise as with no compile
    running (torch.compiler.is_compiling() is true in every thread then: the cache must not ask
    it); a runner takes the compiled steps at its next generation once they are ready. The
    compile goes on in the pauses between replies."""
    monkeypatch.setattr(compiled_module, "_QUIET_S", 0.01)
    model = _int4_tiny_llama(seed=25)
    prompt, tokens = _tokens(50, 30), _tokens(51, 12)
    eager = _rows(CachedModel(model), prompt, tokens)
    steps = CompiledSteps(model, step_sizes=STEP_SIZES, feature_layers=_head(model).layer_ids, background=True)
    made_while_compiling = steps()
    checked_while_compiling = 0
    # A few replies while it compiles: the compile waits out each one (it gives way to decoding),
    # so checking all along made it crawl (54-70 s of the suite for a 20 s compile).
    while steps.compiling and checked_while_compiling < 3:
        assert steps.decode_path == COMPILING
        assert torch.equal(_rows(steps(), prompt, tokens), eager)
        checked_while_compiling += steps.compiling
        time.sleep(0.05)  # a pause between replies
    assert checked_while_compiling > 0 and steps.wait() and steps.decode_path == COMPILED_DYNAMIC
    calls = _counting_compiled_calls(steps)
    compiled_rows = _rows(made_while_compiling, prompt, tokens)
    assert len(calls) >= len(tokens)  # its begin() took the compiled steps: every token ran on them
    # What a compile in this thread gives: the same rows (its 1-token step alone, the one these
    # rows ran on; a step's rows are bitwise its 1-token step's, tested above).
    foreground = CompiledSteps(model, step_sizes=(1,), progress=False)
    assert torch.equal(compiled_rows, _rows(foreground(), prompt, tokens))
    torch.testing.assert_close(compiled_rows, eager, rtol=0, atol=0.1)


def test_a_generation_keeps_the_path_it_began_on():
    """Compiled and eager steps may round a tie apart: no reply switches in its middle."""
    model = _int4_tiny_llama(seed=27)
    steps = CompiledSteps(model, step_sizes=(1,), background=True)  # one graph: the compile is the test's time
    runner = steps()
    runner.begin()
    prompt, tokens = _tokens(60, 30), _tokens(61, 2)
    runner.forward(prompt, last_only=True)
    assert steps.wait()
    calls = _counting_compiled_calls(steps)
    runner.forward(tokens[:1])
    assert calls == []  # still eager: this generation began before the steps were ready
    runner.begin()
    runner.forward(tokens[1:])
    assert len(calls) == 1


def test_a_background_compile_waits_while_a_runner_decodes_and_never_writes_an_engines_tap():
    """Its tracing is Python and would hold the GIL against every step: while runners decode,
    the compiling thread waits in its trace function, and it goes on when they stop. Its
    warm-up runs the untapped twin: the features it computes are its graphs' outputs, never
    written into a tap that an engine on the main thread reads."""
    model = _int4_tiny_llama(seed=35)
    layers = _head(model).layer_ids
    tap = feature_tap(model, layers)  # an engine's tap, made before the compile starts
    tap.start()
    steps = CompiledSteps(model, step_sizes=STEP_SIZES, feature_layers=layers, background=True)
    waiting = False
    deadline = time.monotonic() + 10
    while not waiting and time.monotonic() < deadline:
        steps.decoding()  # what a runner's every step says
        time.sleep(0.01)
        frame = sys._current_frames().get(steps._compiling.ident)
        waiting = frame is not None and frame.f_code.co_name == "_give_way"
    assert waiting and steps.compiling
    assert steps.wait(300) and steps.decode_path == COMPILED_DYNAMIC
    assert tap.take() is None  # the warm-up (eager prompt and compiled steps) left nothing in it


def test_closing_ends_a_background_compile_at_its_next_python_call():
    """unload() and the exit close the steps: the compile stops, as no failure, and they stay eager."""
    steps = CompiledSteps(_int4_tiny_llama(seed=33), step_sizes=STEP_SIZES, background=True)
    steps.close()
    assert not steps.wait(30) and not steps.compiling
    assert steps.fallback_reason is None and steps.decode_path == EAGER_DYNAMIC


def test_the_untapped_twin_computes_as_the_model_without_writing_its_tap():
    model = tiny_llama(31, vocab=VOCAB)
    tap = feature_tap(model, (0, 1))
    twin = untapped(model)
    assert all(a is b for a, b in zip(twin.parameters(), model.parameters()))  # one set of weights
    _assert_twin_computes_as_model_without_its_tap(model, twin, tap, _tokens(70, 12))


def _assert_twin_computes_as_model_without_its_tap(model, twin, tap, tokens: list[int]) -> None:
    tap.start()
    expected = CachedModel(model).forward(tokens)
    assert tap.take() is not None
    tap.start()
    assert torch.equal(CachedModel(twin).forward(tokens), expected)
    assert tap.take() is None


def test_the_twin_of_a_model_with_device_hooks_runs_its_own_layers():
    """accelerate's device hooks (a sharded or offloaded model) bind each module's forward to
    that module: the twin's are bound to the twin, so its own layers (and their feature hooks)
    run, and the model's taps stay untouched."""
    from accelerate import dispatch_model

    model = tiny_llama(31, vocab=VOCAB)
    children = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "model.rotary_emb", "lm_head"]
    model = dispatch_model(model, dict.fromkeys(children, "cpu"), force_hooks=True)
    assert "_old_forward" in vars(model) and "_old_forward" in vars(model.model.layers[0])
    tap = feature_tap(model, (0, 1))
    twin = untapped(model)
    features = StepFeatures(twin, (0, 1))
    tokens = _tokens(71, 12)
    _assert_twin_computes_as_model_without_its_tap(model, twin, tap, tokens)
    assert all(hidden is not None and len(hidden) == len(tokens) for hidden in features.take())


# ---------------------------------------------------------------- dynamo's configuration, shared by the process


def test_a_key_patched_and_restored_as_the_suite_does_leaves_background_compiles_working():
    """The suite changes dynamo's configuration with config.patch, which restores what it found
    (pytest >= 9.2's monkeypatch deleted the key on undo, and every later compile failed)."""
    config = torch._dynamo.config
    with config.patch(error_on_recompile=True):
        assert config.error_on_recompile
    assert config.error_on_recompile is False
    steps = CompiledSteps(_int4_tiny_llama(seed=37), step_sizes=(1,), background=True)
    assert steps.wait(300) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason


def test_a_background_compile_needs_no_key_another_caller_deleted():
    """Deleting a key hides it from every thread until someone sets it again: the steps read
    the key they change with a default, and setting it brings it back."""
    config = torch._dynamo.config
    limit = config.recompile_limit
    delattr(config, "recompile_limit")  # what pytest >= 9.2's monkeypatch undo does to a patched key
    try:
        assert not hasattr(config, "recompile_limit")
        steps = CompiledSteps(_int4_tiny_llama(seed=39), step_sizes=(1,), background=True)
        assert steps.wait(300) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
        assert hasattr(config, "recompile_limit")
    finally:
        config.recompile_limit = limit


def test_a_background_compile_that_fails_says_so_once_and_waiting_ends(monkeypatch, caplog):
    """Whatever fails on the compiling thread (here before the warm-up, where an error used to
    escape the thread and leave the steps 'compiled' but never ready) ends the compile: one log
    line, the steps eager with the reason, the models panel's decode path naming it."""
    from specdec_core.presets.loaded import _decode_path

    def fails() -> None:
        raise AttributeError("torch._dynamo.config.recompile_limit does not exist")

    monkeypatch.setattr(compiled_module, "_lower_this_threads_priority", fails)
    with caplog.at_level(logging.INFO, logger="specdec_core.decoding.compiled"):
        steps = CompiledSteps(_int4_tiny_llama(seed=41), step_sizes=STEP_SIZES, background=True)
        started = time.monotonic()
        assert steps.wait(60) is False
    assert time.monotonic() - started < 30 and not steps.compiling
    lines = [r for r in caplog.records if r.name == "specdec_core.decoding.compiled"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and "does not exist" in lines[0].message
    assert steps.decode_path == EAGER_DYNAMIC and "does not exist" in steps.fallback_reason
    assert "torch.compile failed: AttributeError" in _decode_path(steps, detailed=True)
    assert type(steps()) is CachedModel


def test_a_closed_compile_never_stops_where_a_lock_is_being_released():
    """Stopping as logging's Handler.release (or a context manager's __exit__) is called skips
    its body and leaves its lock held: the process then hung at exit, in logging."""
    import logging as logging_module
    from types import SimpleNamespace

    def frame_of(function) -> SimpleNamespace:
        return SimpleNamespace(f_code=function.__code__, f_globals=function.__globals__)

    may_stop_in = compiled_module._may_stop_in
    assert not may_stop_in(frame_of(logging_module.Handler.release))
    assert not may_stop_in(frame_of(logging_module.Logger.isEnabledFor))
    assert may_stop_in(frame_of(CompiledSteps.warm_up))
    steps = CompiledSteps(_int4_tiny_llama(seed=43), step_sizes=(1,), background=True)
    steps.close()
    steps._give_way(frame_of(logging_module.Handler.release), "call", None)  # returns: no stop there
    with pytest.raises(compiled_module._Closed):
        steps._give_way(frame_of(CompiledSteps.warm_up), "call", None)
    steps.wait(30)


def test_a_compiled_reply_step_makes_a_background_compile_give_way_and_the_warm_up_does_not(compiled):
    """The tree steps compile after the chain steps are ready: replies then run compiled steps,
    and those too must make the compile wait (its tracing holds the GIL). The compile's own
    warm-up runner must not make it wait for itself."""
    _, steps = compiled
    steps._last_decoded = 0.0
    runner = steps()
    runner.begin()
    runner.forward(_tokens(80, 20), last_only=True)
    runner.forward(_tokens(81, 3))
    assert runner._compiled and time.monotonic() - steps._last_decoded < 1.0
    steps._last_decoded = 0.0
    warm_up = CompiledRunner(steps, warming_up=True)
    warm_up.forward(_tokens(82, 20), last_only=True)
    warm_up.forward(_tokens(83, 3))
    assert steps._last_decoded == 0.0
