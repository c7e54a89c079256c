"""The trainer's prompts are never the questions we measure on: no prompt shares a run of 8 words
with a Spec-Bench question or with the project's bench questions."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specdec_core.train.prompts import all_template_texts, derived_prompts, direct_prompts
from tests.tiny_models import require

REPO = Path(__file__).resolve().parent.parent
SPEC_BENCH = REPO.parent / "shared" / "data" / "spec_bench_questions.jsonl"
BENCH = REPO / "specdec_core" / "bench" / "data" / "questions.jsonl"
RUN = 8


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + RUN]) for i in range(max(len(words) - RUN + 1, 0))} | ({tuple(words)} if len(words) < RUN else set())


def _question_turns(path: Path) -> list[str]:
    return [turn for line in path.read_text().splitlines() if line.strip() for turn in json.loads(line)["turns"]]


def _prompts() -> list[str]:
    texts = [p.text for seed in range(3) for p in direct_prompts(2000, seed)]
    texts += [p.text for p in derived_prompts([("volcanoes", "Volcanoes are openings in the crust.")] * 200, seed=0)]
    return texts + all_template_texts()


def test_no_prompt_overlaps_the_benchmark_questions():
    require(SPEC_BENCH.exists(), f"the Spec-Bench questions are not at {SPEC_BENCH}")
    questions = _question_turns(SPEC_BENCH) + _question_turns(BENCH)
    assert len(questions) > 480
    question_shingles = set().union(*(_shingles(q) for q in questions))
    question_texts = {" ".join(q.lower().split()) for q in questions}
    overlapping = [p for p in _prompts() if _shingles(p) & question_shingles or " ".join(p.lower().split()) in question_texts]
    assert not overlapping, overlapping[:3]


def test_the_check_would_see_a_copied_question():
    question = _question_turns(BENCH)[0]
    assert _shingles(f"Please answer: {question}") & _shingles(question)
