"""The trainer's prompts are never the questions we measure on: no prompt shares a run of 8 words
with a Spec-Bench question or with the project's bench questions. Its human passages are prose,
and held-out shards read none that a training shard reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specdec_core.train.data import DataSettings, generate_data, held_out_shards, passage_prompts
from specdec_core.train.passages import MAX_WORDS, MIN_WORDS, documentation_passages, passage_pool
from specdec_core.train.material import code_snippets, debian_passages, material_licences, prose_pool
from specdec_core.train.prompts import all_template_texts, derived_prompts, direct_prompts
from specdec_core.train.varied import shard_plan, varied_template_texts
from tests.tiny_models import require

REPO = Path(__file__).resolve().parent.parent
SPEC_BENCH = REPO.parent / "shared" / "data" / "spec_bench_questions.jsonl"
BENCH = REPO / "specdec_core" / "bench" / "data" / "questions.jsonl"
EVERYDAY = REPO / "specdec_core" / "train" / "data" / "everyday_prompts.jsonl"
RUN = 8


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + RUN]) for i in range(max(len(words) - RUN + 1, 0))} | ({tuple(words)} if len(words) < RUN else set())


def _question_turns(path: Path) -> list[str]:
    return [turn for line in path.read_text().splitlines() if line.strip() for turn in json.loads(line)["turns"]]


def _prompts() -> list[str]:
    texts = [p.text for seed in range(3) for p in direct_prompts(2000, seed)]
    texts += [p.text for p in derived_prompts([("volcanoes", "Volcanoes are openings in the crust.")] * 200, seed=0)]
    texts += [passage for _, passage in documentation_passages()]
    texts += [passage for _, passage in debian_passages()] + [code for _, code in code_snippets()]
    previous = [{"family": "writing", "text": "Write about tea.", "reply_ids": [1] * 20, "reply_text": "Tea is a drink."}] * 40
    for index in range(20):
        plan, requests = shard_plan(index, 256, previous, seed=index, held_out=index % 10 == 8)
        texts += [p.text for p in plan] + [r["text"] for r in requests]
    return texts + all_template_texts() + varied_template_texts()


def _everyday() -> list[str]:
    return [json.loads(line)["prompt"] for line in EVERYDAY.read_text().splitlines() if line.strip()]


def test_no_prompt_overlaps_the_benchmark_questions():
    require(SPEC_BENCH.exists(), f"the Spec-Bench questions are not at {SPEC_BENCH}")
    questions = _question_turns(SPEC_BENCH) + _question_turns(BENCH)
    assert len(questions) > 480
    question_shingles = set().union(*(_shingles(q) for q in questions))
    question_texts = {" ".join(q.lower().split()) for q in questions}
    overlapping = [p for p in _prompts() if _shingles(p) & question_shingles or " ".join(p.lower().split()) in question_texts]
    assert not overlapping, overlapping[:3]


def test_the_everyday_prompts_are_held_out_from_the_training_source_and_the_benchmarks():
    everyday = _everyday()
    assert 40 <= len(everyday) == len(set(everyday))
    sources = _prompts()
    source_shingles = set().union(*(_shingles(p) for p in sources))
    source_texts = {" ".join(p.lower().split()) for p in sources}
    require(SPEC_BENCH.exists(), f"the Spec-Bench questions are not at {SPEC_BENCH}")
    questions = _question_turns(SPEC_BENCH) + _question_turns(BENCH)
    question_shingles = set().union(*(_shingles(q) for q in questions))
    for prompt in everyday:
        assert not _shingles(prompt) & (source_shingles | question_shingles), prompt
        assert " ".join(prompt.lower().split()) not in source_texts, prompt


def test_every_source_of_pasted_material_is_under_a_recorded_licence():
    licences = dict(material_licences())
    assert all(licences.values()) and len(licences) >= 3
    assert prose_pool(held_out=False) and not {p for _, p in prose_pool(True)} & {p for _, p in prose_pool(False)}


def test_the_check_would_see_a_copied_question():
    question = _question_turns(BENCH)[0]
    assert _shingles(f"Please answer: {question}") & _shingles(question)


def test_human_passages_are_prose_of_a_passages_length():
    passages = documentation_passages()
    assert len(passages) > 200 and len({passage for _, passage in passages}) == len(passages)
    for topic, passage in passages:
        assert topic and MIN_WORDS <= len(passage.split()) <= MAX_WORDS, (topic, passage)
        assert "\n" not in passage and ">>>" not in passage  # joined prose, no interpreter sessions


def test_mixed_shards_read_human_passages_and_held_out_ones_only_from_their_own_pool():
    settings = DataSettings(shards=20, per_shard=32, passages="mixed")
    held, pools = held_out_shards(settings.shards), {flag: {p for _, p in passage_pool(flag)} for flag in (True, False)}
    assert pools[True] and pools[False] and not pools[True] & pools[False]
    for index in range(settings.shards):
        # With no previous shard to read, every passage prompt is over a human passage.
        prompts = passage_prompts(index, previous=[], tokenizer=None, settings=settings)
        assert len(prompts) == settings.per_shard // 3
        for prompt in prompts:
            assert any(passage in prompt.text for passage in pools[index in held])
            assert not any(passage in prompt.text for passage in pools[index not in held])
    assert passage_prompts(3, previous=[], tokenizer=None, settings=DataSettings(shards=20)) == []


def test_a_data_folder_keeps_the_recipe_its_shards_were_written_with(tmp_path):
    layers = (1, 2, 3)
    generate_data(None, None, tmp_path, DataSettings(shards=4), layers, indices=[])
    generate_data(None, None, tmp_path, DataSettings(shards=8), layers, indices=[])  # more of the same data
    with pytest.raises(ValueError, match="other settings \\(passages, writer\\)"):
        generate_data(None, None, tmp_path, DataSettings(shards=8, passages="mixed"), layers, indices=[], writer="bfloat16")
