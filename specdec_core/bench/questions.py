"""Benchmark questions in the Spec-Bench JSONL format, grouped into Spec-Bench's six task families.

A line is {"question_id": ..., "category": ..., "turns": [first user message, ...]}; only the
first turn is used. Spec-Bench files the multi-turn conversation questions (MT-bench) under eight
categories (writing, roleplay, ...); they form the one family `mt_bench`, which is how
Spec-Bench reports them. The other five families are their own categories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The project's own small question set (a few per family), used when no file is given.
DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "data" / "questions.jsonl"

MT_BENCH = "mt_bench"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
FAMILIES = (MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag")
FAMILY_LABELS = {  # how tables and plots name the families
    MT_BENCH: "conversation (mt_bench)",
    "translation": "translation",
    "summarization": "summarization",
    "qa": "question answering (qa)",
    "math_reasoning": "math reasoning",
    "rag": "retrieval-augmented (rag)",
}


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str  # as written in the file, e.g. "writing"
    family: str  # one of FAMILIES (or the category itself if it is none of Spec-Bench's)
    prompt: str  # the first turn


def family_of(category: str) -> str:
    return MT_BENCH if category in MT_BENCH_CATEGORIES else category


def load_questions(
    path: str | Path | None = None, categories: list[str] | None = None, limit: int | None = None
) -> list[Question]:
    """Questions in family order, at most `limit` per family.

    categories: family names or raw category names to keep (None: all). Within a family the
    limit takes its categories in turn (round robin, in file order), so five mt_bench questions
    come from five different MT-bench categories. Raises ValueError for a bad file, an unknown
    category or a selection that comes out empty.
    """
    path = Path(path) if path is not None else DEFAULT_QUESTIONS
    questions = _read(path)
    if categories:
        known = {q.category for q in questions} | {q.family for q in questions}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ValueError(
                f"unknown categories {', '.join(unknown)} in {path}; available: {', '.join(sorted(known))}"
            )
        wanted = set(categories)
        questions = [q for q in questions if q.category in wanted or q.family in wanted]
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    selected: list[Question] = []
    for family in _family_order(questions):
        members = [q for q in questions if q.family == family]
        selected += _round_robin(members, limit)
    if not selected:
        raise ValueError(f"no questions selected from {path}")
    return selected


def _read(path: Path) -> list[Question]:
    if not path.is_file():
        raise ValueError(f"question file {path} does not exist")
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            category, turns = str(row["category"]), row["turns"]
            prompt = turns[0] if isinstance(turns, list) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError("'turns' must be a list whose first item is the question text")
            questions.append(Question(str(row["question_id"]), category, family_of(category), prompt))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} line {number}: not a Spec-Bench question ({error})") from None
    return questions


def _family_order(questions: list[Question]) -> list[str]:
    present = {q.family for q in questions}
    others = sorted(present - set(FAMILIES))
    return [f for f in FAMILIES if f in present] + others


def _round_robin(members: list[Question], limit: int | None) -> list[Question]:
    """Up to `limit` questions, one category at a time in turn; the file's order within each."""
    by_category: dict[str, list[Question]] = {}
    for q in members:
        by_category.setdefault(q.category, []).append(q)
    queues = list(by_category.values())
    picked: list[Question] = []
    while any(queues) and (limit is None or len(picked) < limit):
        for queue in queues:
            if queue and (limit is None or len(picked) < limit):
                picked.append(queue.pop(0))
    return picked
