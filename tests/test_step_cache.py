"""Compiled steps kept in a cache folder (specdec_core/decoding/step_cache.py): a second process
loads them instead of tracing and compiling, and decodes the first process's tokens. (A single
test goes through helper, background load and second process: each compile of the tiny steps
takes about 20 s.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core.bench.architectures import NumberTokenizer
from specdec_core.decoding.compiled import COMPILED_DYNAMIC, COMPILING, CompiledSteps
from specdec_core.decoding.helper_process import HelperCommand
from specdec_core.decoding.step_cache import StepCache, step_key
from specdec_core.kernels.row_attention import use_row_exact_attention
from specdec_core.presets.loaded import _decode_path
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.test_tree import OracleTreeDrafter, random_shape
from tests.tiny_models import random_eagle_head

ROOT = Path(__file__).resolve().parent.parent

def tiny_steps(**kwargs) -> CompiledSteps:
    """A tiny int4 Llama's compiled steps: a one-token step returning an EAGLE head's features (a
    verify step runs as one-token steps in turn) and a tree step of 4 nodes (each process builds
    the same model). One step size keeps the helper's compile short."""
    model = _int4_tiny_llama(seed=31)
    assert use_row_exact_attention(model) is None
    head = random_eagle_head(model, draft_vocab=VOCAB, seed=3)
    return CompiledSteps(model, step_sizes=(1,), tree_sizes=(4,), feature_layers=head.layer_ids, **kwargs)


def greedy_replies(steps: CompiledSteps) -> tuple[dict, int]:
    """Greedy replies on the steps: plain, with prompt lookup (verify steps) and with oracle trees
    (tests/test_tree.py; tree steps); and how many tree rounds the last one had."""
    prompt = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(5)).tolist() * 2
    params = SamplingParams(max_new_tokens=30)

    def reply(drafter):
        # ids as text: the tokens are what's compared (a real tokenizer costs the second process 5 s)
        engine = SpeculativeEngine(steps.model, NumberTokenizer(), drafter=drafter, draft_length=3,
                                   adaptive=False, make_runner=steps)
        return engine.generate(prompt, params)

    replies = {"plain": reply(None).token_ids, "lookup": reply(PromptLookupDrafter()).token_ids}
    decoys = [t for t in range(VOCAB) if t not in replies["plain"]]
    tree = reply(OracleTreeDrafter(prompt + replies["plain"], random_shape, 4, decoys, 0))
    replies["tree"] = tree.token_ids
    return replies, tree.stats.tree_rounds


# A helper process's work (the app's background compile, presets/compile_helper.py, for a
# preset): the steps compiled and saved in the folder it is given.
_COMPILE = """
import sys
from tests.test_step_cache import tiny_steps
sys.exit(tiny_steps(progress=False, cache_dir=sys.argv[1]).fallback_reason)
"""

# A second process: the steps loaded from the folder, the same replies. Prints what it loaded,
# whether dynamo traced anything, and the replies.
_DECODE = """
import json, sys
from torch._dynamo.utils import counters
from specdec_core.presets.loaded import _decode_path
from tests.test_step_cache import greedy_replies, tiny_steps

steps = tiny_steps(progress=False, cache_dir=sys.argv[1])
assert steps.compiled, steps.fallback_reason
replies, tree_rounds = greedy_replies(steps)
print(json.dumps({"loaded": steps.loaded, "traced": counters["stats"]["calls_captured"], "compiled": steps.compiled,
                  "tree_nodes": steps.tree_nodes_ready, "path": _decode_path(steps, detailed=True),
                  "replies": replies, "tree_rounds": tree_rounds}))
"""


def test_a_helper_process_compiles_the_steps_a_background_compile_loads_as_a_second_process_does(tmp_path):
    """The steps (chain and tree) compiled in a helper process (the app's background compile) are
    saved in the cache folder; this process's background compile loads them and traces nothing
    itself; a second process loads them too; both decode the same tokens, plain, speculative and
    with trees alike."""
    from torch._dynamo.utils import counters

    log = tmp_path / "helper.log"
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{_COMPILE}"
    traced_before = counters["stats"]["calls_captured"]
    steps = tiny_steps(background=True, cache_dir=tmp_path,
                       helper=HelperCommand((sys.executable, "-c", script, str(tmp_path)), b"", log))
    assert steps.wait(1200) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason or log.read_text()[-3000:]
    assert steps.loaded == 2 and counters["stats"]["calls_captured"] == traced_before  # loaded, nothing traced here
    assert steps.tree_nodes_ready == 4
    assert len(list(tmp_path.glob("step-*.bin"))) == 1  # a file per step size
    assert len(list(tmp_path.glob("tree-*-4.bin"))) == 1  # and per tree size
    assert (tmp_path / "inductor").is_dir()  # inductor's built libraries kept beside them
    replies, tree_rounds = greedy_replies(steps)
    assert replies["lookup"] == replies["plain"] and replies["tree"] == replies["plain"]  # speculation stays plain decoding
    assert tree_rounds > 0
    done = subprocess.run([sys.executable, "-c", _DECODE, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["loaded"] == 2 and second["traced"] == 0 and second["compiled"]  # loaded, nothing traced
    assert "(loaded from the compile cache)" in second["path"]
    assert second["tree_nodes"] == 4 and second["replies"] == replies and second["tree_rounds"] == tree_rounds


def test_the_key_follows_the_models_structure_and_the_steps_outputs(tmp_path):
    model = _int4_tiny_llama(seed=31)
    same_shape = _int4_tiny_llama(seed=32)  # other weights: inputs of the graph, the same compiled code
    key = step_key(model, (0, 1), {"cpp_wrapper": True})
    assert step_key(same_shape, (0, 1), {"cpp_wrapper": True}) == key
    assert step_key(model, (1,), {"cpp_wrapper": True}) != key  # other features returned
    assert step_key(model, (0, 1), {"cpp_wrapper": False}) != key
    model.model.layers[0].self_attn.scaling = 0.5  # a plain attribute a traced step reads
    assert step_key(model, (0, 1), {"cpp_wrapper": True}) != key


def test_an_unreadable_step_file_is_compiled_again(tmp_path):
    cache = StepCache(tmp_path, _int4_tiny_llama(seed=31), (), {})
    cache.path(1).write_bytes(b"not a compiled step")
    assert cache.load(1) is None
    assert cache.load(2) is None  # none saved


def test_the_models_panel_shows_how_far_a_background_compile_is(tmp_path):
    model = _int4_tiny_llama(seed=33)
    assert use_row_exact_attention(model) is None
    steps = CompiledSteps(model, step_sizes=(1, 4), background=True, cache_dir=tmp_path)
    try:
        assert _decode_path(steps, detailed=True).startswith(f"{COMPILING} (0/2 step shapes ready)")
    finally:
        steps.close()
        steps.wait(120)
