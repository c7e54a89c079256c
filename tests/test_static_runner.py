"""The fast decode path (issue 6): static KV cache, fixed-shape (compiled) steps, eager fallback,
and the cost-model command. Greedy output must stay token-for-token the eager baseline's."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from specdec_core import ModelDrafter, PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core import theory
from specdec_core import cost_model as cost_model_command
from specdec_core.bench import architectures, cli, cost_model, cost_model_report
from specdec_core.decoding.eager import CachedModel
from specdec_core.decoding.static import (
    COMPILED_STATIC,
    DEFAULT_STEP_SIZES,
    DRAFT_STEP_SIZES,
    EAGER_DYNAMIC,
    EAGER_STATIC,
    StaticCacheRunner,
    StaticSteps,
)
from tests.tiny_models import perturbed_copy, tiny_llama, tiny_qwen2

NEW_TOKENS = 28
# Target step sizes: exact (no padding), and bucketed (most steps padded, 1 token padded too).
STEP_SIZES = [DEFAULT_STEP_SIZES, (1, 3, 6, 9), (2, 5, 9)]


def random_prompt(seed: int, vocab: int = 1000) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(3, 40, (1,), generator=generator))
    # Ids of a small range repeat, so prompt lookup finds n-grams to copy.
    return torch.randint(3, vocab, (length,), generator=generator).tolist()


def eager_baseline(target, tokenizer, prompt, new_tokens=NEW_TOKENS) -> list[int]:
    return SpeculativeEngine(target, tokenizer).generate(prompt, SamplingParams(max_new_tokens=new_tokens)).token_ids


@pytest.mark.parametrize("seed", range(6))
def test_static_cache_greedy_identity(seed, smol_tokenizer):
    """Static target and draft caches (eager, so fast): every k, adaptive or not, model and
    prompt-lookup drafters, one cache reused across generations; rejections and full
    acceptances both happen, so rollbacks are exercised."""
    build = tiny_llama if seed % 2 == 0 else tiny_qwen2
    target = build(seed=seed, vocab=1000)
    draft = perturbed_copy(target, noise=0.08, seed=seed + 100)
    target_steps = StaticSteps(target, compile=False, step_sizes=STEP_SIZES[seed % 3], max_length=160)
    draft_steps = StaticSteps(draft, compile=False, step_sizes=DRAFT_STEP_SIZES, max_length=160)
    assert target_steps.decode_path == EAGER_STATIC
    drafted = accepted = full_rounds = 0
    for offset in range(2):
        prompt = random_prompt(10 * seed + offset, vocab=50 if offset else 1000)
        expected = eager_baseline(target, smol_tokenizer, prompt)
        # Mostly fixed k: the adaptive policy may decide to decode plainly when drafts don't pay.
        for k, adaptive in [(1, False), (2, True), (4, False), (5, False), (8, False)]:
            drafter = ModelDrafter(draft, make_runner=draft_steps)
            if k == 5:
                drafter = PromptLookupDrafter()
            engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=k,
                                       adaptive=adaptive, make_runner=target_steps)
            result = engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS))
            assert result.token_ids == expected, (seed, offset, k, adaptive)
            stats = result.stats
            drafted += stats.drafted_tokens
            accepted += stats.accepted_tokens
            full_rounds += result.sources.count("bonus")
    assert 0 < accepted < drafted  # some drafts rejected (rollback), some kept
    assert full_rounds > 0  # all drafts accepted: the draft cache catches up 2 tokens


def test_logits_match_uncached_forward_through_rollbacks_padding_and_spill():
    """Runner logits equal a plain full forward, across prefill, padded steps, rollbacks,
    a reused (stale) cache and a sequence that outgrows the static cache."""
    model = tiny_llama(seed=3, vocab=1000)
    steps = StaticSteps(model, compile=False, step_sizes=(1, 4, 6), max_length=24)
    sequence = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([sequence])).logits[0]

    for _ in range(2):  # the second generation reuses the cache full of stale entries
        runner = steps(model)
        assert isinstance(runner, StaticCacheRunner)
        position = 0
        # (tokens to feed, tokens to keep afterwards): prefill, padded steps, rollbacks
        plan = [(9, 9), (3, 10), (1, 11), (5, 12), (6, 14), (2, 16), (4, 17), (8, 20), (9, 22), (12, 30)]
        for feed, keep in plan:
            logits = runner.forward(sequence[position : position + feed])
            torch.testing.assert_close(logits, reference[position : position + feed], atol=1e-5, rtol=1e-4)
            assert runner.length == position + feed
            runner.crop(keep)
            position = keep
        assert runner._dynamic is not None  # went past max_length=24: continued on a dynamic cache
        last = runner.forward(sequence[position : position + 3], last_only=True)
        torch.testing.assert_close(last, reference[position + 2 : position + 3], atol=1e-5, rtol=1e-4)
        del runner


def test_a_spilled_sequence_returns_to_the_static_cache_once_it_fits_again():
    """Past max_length the runner goes on a dynamic cache; a rollback (a retry, a new chat) that
    brings it back within the cache moves it back, and its logits stay exact."""
    model = tiny_llama(seed=4, vocab=1000)
    steps = StaticSteps(model, compile=False, step_sizes=(1, 4), max_length=24)
    sequence = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([sequence])).logits[0]
    runner = steps(model)
    runner.forward(sequence[:22])
    runner.forward(sequence[22:30])
    assert runner._dynamic is not None and runner.length == 30
    runner.crop(18)  # 18 + the largest step (4) fits the 24 slots again
    assert runner._dynamic is None and runner.length == 18
    logits = runner.forward(sequence[18:22])
    torch.testing.assert_close(logits, reference[18:22], atol=1e-5, rtol=1e-4)
    runner.crop(21)
    runner.forward(sequence[21:26])  # and out again: still exact
    assert runner._dynamic is not None
    torch.testing.assert_close(runner.forward(sequence[26:27]), reference[26:27], atol=1e-5, rtol=1e-4)


def test_default_step_sizes_are_a_few_buckets_padded_up():
    from specdec_core.decoding.compiling import step_buckets
    from specdec_core.policy import MAX_DRAFT_LENGTH

    assert DEFAULT_STEP_SIZES == (1, 2, 4, 8, 9) and step_buckets(9) == DEFAULT_STEP_SIZES
    assert DEFAULT_STEP_SIZES[-1] == MAX_DRAFT_LENGTH + 1  # the adaptive policy's longest verify, one graph
    assert step_buckets(1) == (1,) and step_buckets(5) == (1, 2, 4, 5)


def test_outgrowing_the_cache_stays_identical_and_logs_once(smol_tokenizer, caplog):
    target = tiny_llama(seed=5, vocab=1000)
    draft = perturbed_copy(target, noise=0.05, seed=6)
    prompt = random_prompt(7)
    expected = eager_baseline(target, smol_tokenizer, prompt, new_tokens=40)
    steps = StaticSteps(target, compile=False, max_length=len(prompt) + 12)
    draft_steps = StaticSteps(draft, compile=False, step_sizes=DRAFT_STEP_SIZES, max_length=len(prompt) + 12)
    with caplog.at_level(logging.WARNING, logger="specdec_core.decoding.static"):
        for _ in range(2):
            engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft, make_runner=draft_steps),
                                       draft_length=3, adaptive=False, make_runner=steps)
            assert engine.generate(prompt, SamplingParams(max_new_tokens=40)).token_ids == expected
    spills = [r for r in caplog.records if "outgrew" in r.message]
    assert len(spills) == 2  # once per model, not once per generation


def test_interleaved_generations_get_separate_caches(smol_tokenizer):
    target = tiny_llama(seed=8, vocab=1000)
    steps = StaticSteps(target, compile=False, max_length=128)
    prompts = [random_prompt(20), random_prompt(21)]
    expected = [eager_baseline(target, smol_tokenizer, p) for p in prompts]
    engines = [SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), draft_length=3,
                                 adaptive=False, make_runner=steps) for _ in prompts]
    streams = [e.stream(p, SamplingParams(max_new_tokens=NEW_TOKENS)) for e, p in zip(engines, prompts)]
    outputs = [[], []]
    for pair in zip(*streams):  # one token of each in turn
        for output, event in zip(outputs, pair):
            output.append(event.token_id)
    assert outputs == expected
    assert len(steps._slots) == 2


def test_compiled_steps_are_lossless(smol_tokenizer):
    """torch.compile (inductor) on one tiny model and one step shape: every step, including
    1-token ones, is padded to 4 tokens; prefill runs eagerly on the same cache."""
    target = tiny_llama(seed=11, vocab=1000)
    draft = perturbed_copy(target, noise=0.05, seed=12)
    steps = StaticSteps(target, compile=True, step_sizes=(4,), max_length=96, progress=False)
    assert steps.decode_path == COMPILED_STATIC, steps.fallback_reason
    assert steps.warmup_s > 0
    drafted = accepted = 0
    for seed, k in [(30, 1), (31, 2), (32, 3), (33, 3)]:
        prompt = random_prompt(seed)
        expected = eager_baseline(target, smol_tokenizer, prompt)
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft), draft_length=k,
                                   adaptive=False, make_runner=steps)
        result = engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS))
        assert result.token_ids == expected, (seed, k)
        drafted, accepted = drafted + result.stats.drafted_tokens, accepted + result.stats.accepted_tokens
    assert 0 < accepted < drafted
    assert steps.compiled  # no fallback happened along the way


@pytest.mark.parametrize("compile", [False, True])
def test_static_steps_return_an_eagle_heads_features_so_it_decodes_on_them(compile, smol_tokenizer):
    """Built with an EAGLE head's layers, the fixed-shape steps return their inputs beside the
    logits (CUDA graphs run no hooks): the tap gets each real token's rows, padding left out,
    as an eager forward gives them, and a head fitted to the target is accepted on those steps
    with the output still the target's. compile=True traces the steps with dynamo
    (backend "eager", fullgraph, as on CUDA, without generating code); CUDA graphs themselves
    are not run here."""
    from specdec_core import EagleDrafter, HybridDrafter
    from specdec_core.decoding.features import feature_tap
    from tests.tiny_models import fitted_eagle_head

    target = tiny_llama(seed=15, vocab=1000, init=0.2)
    prompts = [random_prompt(60 + i) for i in range(2)]
    expected = [eager_baseline(target, smol_tokenizer, prompt) for prompt in prompts]
    head = fitted_eagle_head(target, [p + e for p, e in zip(prompts, expected)])
    steps = StaticSteps(target, compile=compile, step_sizes=(1, 4), max_length=96, progress=False,
                        backend="eager", feature_layers=head.layer_ids)
    assert steps.reads_features(head.layer_ids) and steps.fallback_reason is None
    tap = feature_tap(target, head.layer_ids)  # made after the steps: they need none of its hooks
    tokens = expected[0][:9]
    rows = {}
    for name, reader in (("eager", CachedModel(target)), ("static", steps())):
        tap.start()
        reader.forward(prompts[0], last_only=True)
        rows[name] = [tap.take()]
        for piece in (tokens[:1], tokens[1:4], tokens[4:8], tokens[8:]):  # padded to 1, 4, exact, 1
            tap.start()
            reader.forward(piece)
            rows[name].append(tap.take())
    assert [len(r) for r in rows["static"]] == [len(prompts[0]), 1, 3, 4, 1]
    for got, want in zip(rows["static"], rows["eager"]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for drafter in (EagleDrafter(head), HybridDrafter(EagleDrafter(head))):
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=2, adaptive=False,
                                   make_runner=steps)
        accepted = 0
        for prompt, reference in zip(prompts, expected):
            result = engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS, seed=0))
            assert result.token_ids == reference, drafter.name
            accepted += result.stats.accepted_tokens
        assert accepted > 0, drafter.name  # the features lined up: the fitted head was accepted
    assert steps.compiled == compile and steps.fallback_reason is None


def _unavailable_compile(*args, **kwargs):
    raise RuntimeError("torch.compile is not available on this machine")


def test_fallback_when_compile_is_unavailable(smol_tokenizer, monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", _unavailable_compile)
    target = tiny_llama(seed=13, vocab=1000)
    with caplog.at_level(logging.INFO, logger="specdec_core.decoding.static"):
        steps = StaticSteps(target, compile=True, progress=False)
    lines = [r for r in caplog.records if r.name == "specdec_core.decoding.static"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "not available on this machine" in lines[0].message and "eagerly" in lines[0].message
    assert steps.decode_path == EAGER_DYNAMIC and not steps.compiled
    assert isinstance(steps(target), CachedModel)
    prompt = random_prompt(40)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), make_runner=steps)
    assert engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS)).token_ids == eager_baseline(
        target, smol_tokenizer, prompt)


def test_fallback_when_a_compiled_step_fails_mid_generation(smol_tokenizer, monkeypatch, caplog):
    """Compilation errors surface at the first call of the compiled function: the step that
    failed is rerun eagerly, the generation goes on, one line is logged."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: _unavailable_compile)
    target = tiny_llama(seed=14, vocab=1000)
    steps = StaticSteps(target, compile=True, warmup=False, step_sizes=(1, 2, 4), max_length=96)
    assert steps.decode_path == COMPILED_STATIC
    prompt = random_prompt(41)
    with caplog.at_level(logging.WARNING, logger="specdec_core.decoding.static"):
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), draft_length=3,
                                   adaptive=False, make_runner=steps)
        result = engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert result.token_ids == eager_baseline(target, smol_tokenizer, prompt)
    lines = [r for r in caplog.records if r.name == "specdec_core.decoding.static"]
    assert len(lines) == 1 and "eagerly" in lines[0].message
    assert steps.decode_path == EAGER_DYNAMIC


def test_steps_refuse_another_model():
    model = tiny_llama(seed=15, vocab=1000)
    steps = StaticSteps(model, compile=False, max_length=32)
    with pytest.raises(ValueError, match="belong"):
        steps(tiny_llama(seed=16, vocab=1000))


# ---------------------------------------------------------------- the cost model


def test_leviathan_formula():
    assert theory.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert theory.expected_tokens(1.0, 4) == 5
    # c = 0.1, verify as dear as one step: 3.3616 tokens for 1.4 steps
    assert theory.leviathan_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    best = cost_model.best_speedup(0.8, 0.1, {1: 1.0, 4: 1.0, 8: 3.0})
    assert best["draft_length"] == 4


def test_cost_model_command_on_tiny_configs(tmp_path, capsys):
    """`python -m specdec_core.cost_model` (and bench.py's --cost-model, which passes its argv on)."""
    out = tmp_path / "cm"
    argv = ["--cost-model", "--target-config", "tiny", "--draft-config", "tiny-draft", "--device", "cpu",
            "--context", "8", "--max-k", "3", "--repeats", "2", "--modes", "eager", "--out", str(out)]
    assert cli.main(argv) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    eager = result["modes"]["eager"]
    assert list(eager["verify_ms"]) == ["1", "2", "3"]
    assert eager["c"] == pytest.approx(eager["draft_step_ms"] / eager["target_step_ms"], rel=1e-2)
    assert set(eager["predicted_speedup"]) == {"0.6", "0.7", "0.8"}
    assert 0 < eager["bandwidth_fraction"] and result["bandwidth_source"].startswith("measured")
    table = out.with_suffix(".md").read_text()
    assert "| target verify k=3 (ms) |" in table and "predicted speedup at acceptance 0.8" in table
    assert "| target 1-token step (ms) |" in capsys.readouterr().out


def test_cost_model_packed_mode_times_a_prepacked_copy():
    result = cost_model.run_cost_model("tiny", "tiny-draft", context=8, max_k=2, repeats=1, modes=("eager", "packed"),
                                       bandwidth_gbs=10.0, progress=False)
    packed = result["modes"]["packed"]
    assert packed["target_path"] == packed["draft_path"] == EAGER_DYNAMIC + ", prepacked weights"
    assert result["modes"]["eager"]["target_path"] == EAGER_DYNAMIC  # the copy was packed, not the model
    assert packed["target_step_ms"] > 0 and list(packed["verify_ms"]) == ["1", "2"]
    with pytest.raises(ValueError, match="CPU"):
        cost_model.run_cost_model("tiny", "tiny-draft", device="meta", modes=("packed",))


def test_cost_model_compiled_column_reports_a_fallback(monkeypatch):
    monkeypatch.setattr(torch, "compile", _unavailable_compile)
    result = cost_model.run_cost_model("tiny", "tiny-draft", context=8, max_k=2, repeats=1,
                                       bandwidth_gbs=10.0, progress=False)
    compiled = result["modes"]["compiled"]
    assert compiled["target_path"] == EAGER_DYNAMIC
    assert "not available" in compiled["fallback"]["target"]
    assert "fell back to eager" in cost_model_report.markdown_table(result)


def test_cost_model_rejects_an_unknown_architecture(capsys):
    assert cost_model_command.main(["--target-config", "gpt-9", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown architecture 'gpt-9'") and err.count("\n") == 1


# ---------------------------------------------------------------- presets and loading


PRESETS = """\
auto_fallback: plain
presets:
  plain:
    description: tiny target and draft, compile left at its default (auto, off on CPU)
    target: ./target
    draft: ./draft
    drafter: model
    draft_length: 3
    adaptive: false
    memory_gb: 0.1
  fast:
    description: the same, compiled
    target: ./target
    draft: ./draft
    drafter: model
    draft_length: 3
    adaptive: false
    memory_gb: 0.1
    compile: true
"""


@pytest.fixture(scope="module")
def compile_presets(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("compile-presets")
    target = tiny_llama(seed=21, vocab=1000)
    for name, model in (("target", target), ("draft", perturbed_copy(target, noise=0.05, seed=22))):
        model.save_pretrained(folder / name)
        smol_tokenizer.save_pretrained(folder / name)
    (folder / "models.yaml").write_text(PRESETS)
    return folder / "models.yaml"


def test_preset_compile_key(compile_presets, tmp_path):
    from specdec_core.presets.config import ConfigError, load_presets

    presets = load_presets(compile_presets)
    assert presets["plain"].compile == "auto" and presets["fast"].compile is True
    for bad in ("always", "1"):
        (tmp_path / "bad.yaml").write_text(PRESETS.replace("compile: true", f"compile: {bad}"))
        with pytest.raises(ConfigError, match="preset 'fast'.*'compile'"):
            load_presets(tmp_path / "bad.yaml")


def test_loading_builds_compiled_runners_and_says_so(compile_presets, monkeypatch):
    """compile on, on CPU: the target gets CompiledSteps built at load (the draft stays eager),
    engines use them, describe() and decode_path say so. (On CUDA both would get StaticSteps;
    torch.compile is replaced by the identity here to keep this fast.)"""
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC, CPU_STEP_SIZES, CompiledSteps
    from specdec_core.presets.loaded import unload
    from specdec_core.presets.loading import load_preset

    plain = load_preset("plain", compile_presets)
    assert plain.decode_path == EAGER_DYNAMIC and plain.target_runner is None
    # on CPU the eager models' linear layers are prepacked for oneDNN (packed_linear)
    assert all(line.endswith("decode: eager dynamic cache, prepacked weights") for line in plain.describe().splitlines())
    prompt = random_prompt(50)
    expected = plain.make_engine(drafter="none").generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS)).token_ids

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    fast = load_preset("fast", compile_presets)
    assert fast.decode_path == f"target {COMPILED_DYNAMIC}, draft {EAGER_DYNAMIC}"
    assert isinstance(fast.target_runner, CompiledSteps) and fast.target_runner.step_sizes == CPU_STEP_SIZES
    assert fast.draft_runner is None
    target_line, draft_line = fast.describe().splitlines()
    assert f"decode: {COMPILED_DYNAMIC}" in target_line and "decode: eager dynamic cache" in draft_line
    assert any(f"compiled {len(CPU_STEP_SIZES)} step shapes" in note for note in fast.notes)
    engine = fast.make_engine()
    assert engine.make_runner is fast.target_runner
    result = engine.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert result.token_ids == expected and result.stats.accepted_tokens > 0
    assert load_preset("fast", compile_presets, compile=False).decode_path == EAGER_DYNAMIC  # the flag wins
    unload(fast)
    assert fast.target_runner is None and fast.draft_runner is None


def test_cost_model_times_an_eagle_head_of_the_targets_shape(tmp_path):
    result = cost_model.run_cost_model("tiny", "tiny-draft", context=8, max_k=2, repeats=1, modes=("eager",),
                                       bandwidth_gbs=10.0, progress=False, eagle=True)
    head = result["eagle"]
    assert head["step_ms"] > 0 and head["parameters"] > 0 and len(head["layer_ids"]) == 3
    assert head["modes"]["eager"]["c"] == pytest.approx(head["step_ms"] / result["modes"]["eager"]["target_step_ms"],
                                                        rel=1e-2)
    table = cost_model_report.markdown_table(result)
    assert "| c of the EAGLE-3 head |" in table and "EAGLE-3: predicted speedup at acceptance 0.8" in table
    assert "llama-3.1-8b" in architectures.ARCHITECTURES and "llama-3.2-1b" in architectures.ARCHITECTURES


# ---------------------------------------------------------------- trees on the static cache


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "traced"])
def test_static_steps_verify_trees_and_greedy_tree_rounds_equal_hf_generate(compile, smol_tokenizer):
    """StaticSteps(trees=True): a tree's step runs on the static cache (positions by depth, its 4D
    mask over every slot; traced as one graph with backend "eager" where compiled, as CUDA graphs
    would take it), each row scoring what the eager tree step scores; keep_rows moves the accepted
    path into place; and greedy tree rounds of every shape reply as Hugging Face's generate does."""
    from tests.test_tree import SHAPES, OracleTreeDrafter, decoys_for

    target = tiny_llama(seed=0)
    steps = StaticSteps(target, max_length=96, step_sizes=(1, 4, 9), compile=compile, progress=False, backend="eager",
                        trees=True)
    assert steps.max_tree_nodes == 8 and steps()._steps is steps
    prompt = random_prompt(3)
    parents = [-1, -1, 0, 0, 1, 3, -1]  # 7 nodes: run in the step of 9 tokens, padded
    tokens = torch.randint(3, 1000, (len(parents),), generator=torch.Generator().manual_seed(4)).tolist()
    runner, eager = steps(), CachedModel(target)
    for reader in (runner, eager):
        reader.forward(prompt[:-1], last_only=True)
    rows = runner.forward_tree([prompt[-1], *tokens], parents)
    torch.testing.assert_close(rows, eager.forward_tree([prompt[-1], *tokens], parents), atol=1e-4, rtol=1e-4)
    for reader in (runner, eager):
        reader.keep_rows(len(prompt) - 1, [0, 1, 4, 6])  # the path of nodes 0 -> 3 -> 5: rows that move
    torch.testing.assert_close(runner.forward([11, 12]), eager.forward([11, 12]), atol=1e-4, rtol=1e-4)
    assert steps.tree_fallback_reason is None and (steps.compiled == compile)

    for shape in ("chain", "wide", "random"):
        ids = smol_tokenizer("The quick brown fox jumps over the lazy dog. The quick brown")["input_ids"]
        expected = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
        drafter = OracleTreeDrafter(ids + expected, SHAPES[shape], 6, decoys_for(expected), seed=1)
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False,
                                   make_runner=steps)
        result = engine.generate(ids, SamplingParams(max_new_tokens=16))
        assert result.token_ids == expected, shape
        assert engine.stats.tree_rounds > 0 and [len(p) for p in drafter.kept] == drafter.planted[: len(drafter.kept)]


def test_static_steps_verify_chains_only_unless_asked():
    target = tiny_llama(seed=0)
    assert StaticSteps(target, max_length=64, compile=False)().max_tree_nodes == 0
    assert StaticSteps(target, max_length=64, compile=False, trees=True)().max_tree_nodes == 8  # 9-token steps
