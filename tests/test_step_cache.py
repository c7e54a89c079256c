"""Compiled steps kept in a cache folder (specdec_core/decoding/step_cache.py): a second process
loads them instead of tracing and compiling, and decodes the first process's tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from specdec_core.decoding.compiled import COMPILING, CompiledSteps
from specdec_core.decoding.step_cache import StepCache, step_key
from specdec_core.kernels.row_attention import use_row_exact_attention
from specdec_core.presets.loaded import _decode_path
from tests.test_row_attention import _int4_tiny_llama

ROOT = Path(__file__).resolve().parent.parent

# One process: a tiny int4 Llama's steps compiled (or loaded) in `folder`, then greedy replies,
# plain and with prompt lookup (verify steps), on them. Prints what it loaded, whether dynamo
# traced anything, and the tokens.
_DECODE = """
import json, sys
import torch
from torch._dynamo.utils import counters
from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core.decoding.compiled import CompiledSteps
from specdec_core.presets.loaded import _decode_path
from specdec_core.kernels.row_attention import use_row_exact_attention
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.tiny_models import load_smollm2_tokenizer, random_eagle_head

model = _int4_tiny_llama(seed=31)
assert use_row_exact_attention(model) is None
head = random_eagle_head(model, draft_vocab=VOCAB, seed=3)
steps = CompiledSteps(model, step_sizes=(1, 4), feature_layers=head.layer_ids, progress=False, cache_dir=sys.argv[1])
assert steps.compiled, steps.fallback_reason
tokenizer = load_smollm2_tokenizer()
prompt = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(5)).tolist() * 2
params = SamplingParams(max_new_tokens=30)
replies = {}
for name, drafter in (("plain", None), ("lookup", PromptLookupDrafter())):
    engine = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=3, adaptive=False, make_runner=steps)
    replies[name] = engine.generate(prompt, params).token_ids
print(json.dumps({"loaded": steps.loaded, "traced": counters["stats"]["calls_captured"], "compiled": steps.compiled,
                  "path": _decode_path(steps, detailed=True), "replies": replies}))
"""


def _decode_in_a_new_process(folder: Path, script: str = _DECODE) -> dict:
    done = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# A helper process's work (the app's background compile, presets/compile_helper.py, for a
# preset): the same tiny int4 Llama's steps compiled and saved in `folder`.
_COMPILE = """
import sys
from specdec_core.decoding.compiled import CompiledSteps
from specdec_core.kernels.row_attention import use_row_exact_attention
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.tiny_models import random_eagle_head

model = _int4_tiny_llama(seed=31)
assert use_row_exact_attention(model) is None
head = random_eagle_head(model, draft_vocab=VOCAB, seed=3)
steps = CompiledSteps(model, step_sizes=(1, 4), feature_layers=head.layer_ids, progress=False, cache_dir=sys.argv[1])
sys.exit(steps.fallback_reason)
"""


def test_a_helper_process_compiles_the_steps_a_background_compile_loads_as_a_second_process_does(tmp_path):
    """The steps compiled in a helper process (the app's background compile) are saved in the cache
    folder; this process's background compile loads them and traces nothing itself; a second
    process loads them too; both decode the same tokens, plain and speculative alike."""
    from torch._dynamo.utils import counters

    from specdec_core import PromptLookupDrafter, SamplingParams, SpeculativeEngine
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC
    from specdec_core.decoding.helper_process import HelperCommand
    from tests.test_row_attention import VOCAB
    from tests.tiny_models import load_smollm2_tokenizer, random_eagle_head

    log = tmp_path / "helper.log"
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{_COMPILE}"
    model = _int4_tiny_llama(seed=31)
    assert use_row_exact_attention(model) is None
    head = random_eagle_head(model, draft_vocab=VOCAB, seed=3)
    traced_before = counters["stats"]["calls_captured"]
    steps = CompiledSteps(model, step_sizes=(1, 4), feature_layers=head.layer_ids, background=True,
                          cache_dir=tmp_path, helper=HelperCommand((sys.executable, "-c", script, str(tmp_path)), b"", log))
    assert steps.wait(1200) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason or log.read_text()[-3000:]
    assert steps.loaded == 2 and counters["stats"]["calls_captured"] == traced_before  # loaded, nothing traced here
    assert len(list(tmp_path.glob("step-*.bin"))) == 2  # a file per step size
    assert (tmp_path / "inductor").is_dir()  # inductor's built libraries kept beside them
    prompt = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(5)).tolist() * 2
    replies = {}
    for name, drafter in (("plain", None), ("lookup", PromptLookupDrafter())):
        engine = SpeculativeEngine(model, load_smollm2_tokenizer(), drafter=drafter, draft_length=3, adaptive=False,
                                   make_runner=steps)
        replies[name] = engine.generate(prompt, SamplingParams(max_new_tokens=30)).token_ids
    assert replies["lookup"] == replies["plain"]  # speculation stays plain decoding
    second = _decode_in_a_new_process(tmp_path)
    assert second["loaded"] == 2 and second["traced"] == 0 and second["compiled"]  # loaded, nothing traced
    assert "(loaded from the compile cache)" in second["path"]
    assert second["replies"] == replies


# The same with tree steps: a 1-token step and a tree step of 4 nodes, then a plain reply and one
# of oracle trees (tests/test_tree.py) on them.
_DECODE_TREES = """
import json, sys
import torch
from torch._dynamo.utils import counters
from specdec_core import SamplingParams, SpeculativeEngine
from specdec_core.decoding.compiled import CompiledSteps
from specdec_core.kernels.row_attention import use_row_exact_attention
from tests.test_row_attention import VOCAB, _int4_tiny_llama
from tests.test_tree import OracleTreeDrafter, random_shape
from tests.tiny_models import load_smollm2_tokenizer

model = _int4_tiny_llama(seed=31)
assert use_row_exact_attention(model) is None
steps = CompiledSteps(model, step_sizes=(1,), tree_sizes=(4,), progress=False, cache_dir=sys.argv[1])
assert steps.compiled, steps.fallback_reason
tokenizer = load_smollm2_tokenizer()
prompt = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(6)).tolist()
params = SamplingParams(max_new_tokens=24)
plain = SpeculativeEngine(model, tokenizer, make_runner=steps).generate(prompt, params).token_ids
drafter = OracleTreeDrafter(prompt + plain, random_shape, 4, [t for t in range(VOCAB) if t not in plain], 0)
tree = SpeculativeEngine(model, tokenizer, drafter=drafter, draft_length=3, adaptive=False, make_runner=steps)
result = tree.generate(prompt, params)
print(json.dumps({"loaded": steps.loaded, "traced": counters["stats"]["calls_captured"], "compiled": steps.compiled,
                  "tree_nodes": steps.tree_nodes_ready, "tree_rounds": result.stats.tree_rounds,
                  "replies": {"plain": plain, "tree": result.token_ids}}))
"""


def test_a_second_process_loads_the_tree_steps_and_decodes_the_same_tokens(tmp_path):
    first = _decode_in_a_new_process(tmp_path, _DECODE_TREES)
    assert first["loaded"] == 0 and first["traced"] > 0 and first["tree_nodes"] == 4
    assert len(list(tmp_path.glob("step-*.bin"))) == 1 and len(list(tmp_path.glob("tree-*-4.bin"))) == 1
    second = _decode_in_a_new_process(tmp_path, _DECODE_TREES)
    assert second["loaded"] == 2 and second["traced"] == 0 and second["compiled"] and second["tree_nodes"] == 4
    assert second["replies"] == first["replies"] and second["tree_rounds"] > 0
    assert first["replies"]["tree"] == first["replies"]["plain"]  # tree rounds stay plain decoding


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
