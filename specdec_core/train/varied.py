"""The varied prompt source (`--prompts varied`): what a shard asks the target, beyond the
template prompts of prompts.py.

A shard of N prompts mixes, by share (SHARES):
- templates: prompts.direct_prompts, plus short chat, longer maths and rewriting (MORE);
- prose: human prose pasted with a task (summarise, explain, rewrite, translate, continue,
  answer from it), from material.prose_pool: Python's docs and Debian's documentation;
- code: standard-library functions pasted with a task (explain, test, comment, port, review);
- self-instruct: requests the target writes itself, shown a few requests as examples and asked
  for another on a new subject; kept only when they look like a request and are new (no earlier
  request of the folder shares half of their 4-word runs with them);
- multi-turn: a conversation of the previous shard (its prompt and the target's reply) with a
  follow-up message the target writes playing the user (FOLLOW_UPS when its message is not
  usable), so the reply is a second turn;
- passages: the previous shard's writing replies, summarised or answered from (prompts.py).

Self-instruct requests and user turns are written by the target in one short batch before the
shard's replies (`requests(...)` then `assemble(...)`). Prompts that build on the previous shard
carry `from_shard`: the dataset leaves out of training those built on a held-out shard.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from .material import code_pool, debian_passages, _split
from .passages import documentation_passages
from .prompts import LANGUAGES, NAMES, TOPICS, Prompt, derived_prompts, direct_prompts

SHARES = {"templates": 0.25, "more": 0.08, "prose": 0.2, "code": 0.1, "self_instruct": 0.17, "multi_turn": 0.15}
# (the rest: prompts over the previous shard's writing replies)
REQUEST_TOKENS = 48  # a self-instruct request or a user turn is short
REQUEST_TEMPERATURE = 0.9

PROSE_TASKS = {
    "summarization": [
        "Summarize this in three sentences:\n\n{text}",
        "TL;DR:\n\n{text}",
        "What are the key points of the following text? Use a bulleted list.\n\n{text}",
        "Explain this to someone who has never programmed, in plain words:\n\n{text}",
    ],
    "rewriting": [
        "Rewrite the following paragraph in simpler English:\n\n{text}",
        "Make this text shorter without losing what it says:\n\n{text}",
        "Rewrite this in a friendly, informal tone:\n\n{text}",
        "Turn this text into a short step-by-step guide:\n\n{text}",
    ],
    "translation": ["Translate this into {language}:\n\n{text}", "{text}\n\nTranslate the text above into {language}."],
    "rag": [
        "{text}\n\nBased on the text above, what problem does it solve?",
        "Read this:\n\n{text}\n\nWhat should a user be careful about, according to it?",
        "{text}\n\nWrite two quiz questions about this text, with their answers.",
        "Here is a piece of documentation:\n\n{text}\n\nGive a short example of when this would be useful.",
    ],
    "continuation": ["Continue this text with one more paragraph:\n\n{text}"],
}
CODE_TASKS = [
    "Explain what this Python function does:\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}\n```",
    "Add helpful comments to this code:\n\n```python\n{code}\n```",
    "Rewrite this Python function in JavaScript:\n\n```python\n{code}\n```",
    "Review this code: is there an edge case it gets wrong?\n\n```python\n{code}\n```",
    "{code}\n\nWhat does this code return, and when? Explain line by line.",
    "Can you simplify this function and explain your changes?\n\n```python\n{code}\n```",
]
MORE = {
    "short": [
        "hi", "hello there!", "thanks, that helps", "what can you help me with?", "tell me a joke",
        "good morning! any ideas for breakfast?", "can you keep a secret?", "what's a haiku?",
        "recommend a book please", "I can't sleep", "is it rude to be late?", "why is the sky dark at night?",
        "say something nice", "are you a robot?", "how do I boil an egg", "what's 15% of 80?",
        "give me a word that rhymes with orange", "who are you?", "I'm bored", "what should I cook tonight?",
    ],
    "math": [
        "What is {a}% of {b}? Explain how you got it.",
        "Simplify the fraction {a}/{b} and show your steps.",
        "Convert {a} kilometres to miles, and explain the conversion.",
        "A recipe for {c} people uses {a} grams of flour. How much flour do {b} people need?",
        "{name} walks at {c} km/h. How long does it take to walk {a} km? Give hours and minutes.",
        "Is {a} a prime number? Explain how to check.",
        "Find the average of {a}, {b} and {c}.",
        "A price of {b} dollars goes up by {c}% and then down by {c}%. What is the final price, and why is it not {b}?",
    ],
    "rewriting": [
        "Make this sound more polite: {name}, send me the report now.",
        "Fix the grammar: me and {name} goes to the shop yesterday and buyed three apple.",
        "Rewrite as a tweet: our small bakery now opens at seven and sells fresh bread about {topic}.",
        "Say this more simply: the meeting has been postponed to a later date due to unforeseen circumstances.",
        "Write this as a formal email: hey, can't come on friday, sorry, let's move it to monday?",
        "Turn these notes into a paragraph: {topic}; first tried last year; cheap; easy to learn; fun with friends.",
    ],
}
FOLLOW_UPS = [
    "Can you make that shorter?", "Thanks! Can you give me an example?", "Why is that?",
    "Explain the second point in more detail.", "Now translate your answer into {language}.",
    "Can you put that in a table?", "What would you add for a beginner?", "Is there anything you left out?",
    "Great. Now write it as a short poem.", "Can you summarize that in one sentence?",
    "That's too formal, can you say it casually?", "What are the sources of that, roughly?",
    "OK, and what should I do first?", "Could you give three more ideas?", "Are you sure? Check it again.",
]
SELF_INSTRUCT = (
    "Here are some requests that people sent to a helpful assistant:\n{examples}\n"
    "Write one new request on a different subject, like a real person would type it. "
    "Write only the request."
)
PLAY_USER = (
    "Here is the start of a chat between a user and an assistant.\n\nUser: {prompt}\n\nAssistant: {reply}\n\n"
    "Write the user's next message: a short follow-up question or request about the assistant's answer. "
    "Write only the message."
)


def shard_plan(index: int, count: int, previous: list[dict], seed: int, held_out: bool) -> tuple[list[Prompt], list[dict]]:
    """(the prompts fixed before the target writes, the requests it should write first).
    A request is {"kind": "self_instruct" | "user_turn", "text": what the target is asked,
    plus for a user turn the conversation it continues}."""
    rng = random.Random(seed)
    quota = {name: int(count * share) for name, share in SHARES.items()}
    conversations = [row for row in previous if row.get("text") and row["family"] != "multi_turn" and len(row["reply_ids"]) >= 8]
    quota["multi_turn"] = min(quota["multi_turn"], len(conversations))
    prompts = direct_prompts(quota["templates"], seed=seed)
    prompts += [_more_prompt(rng) for _ in range(quota["more"])]
    prompts += [_prose_prompt(rng, held_out) for _ in range(quota["prose"])]
    codes = code_pool(held_out)
    prompts += [_code_prompt(rng, codes) for _ in range(quota["code"])]
    requests = [{"kind": "self_instruct", "text": SELF_INSTRUCT.format(examples=_examples(rng))} for _ in range(quota["self_instruct"])]
    for row in rng.sample(conversations, quota["multi_turn"]):
        requests.append({"kind": "user_turn", "row": row, "text": PLAY_USER.format(prompt=row["text"][:700], reply=row["reply_text"][:700])})
    return prompts, requests


def assemble(plan: list[Prompt], requests: list[dict], written: list[str], seen: set, rng: random.Random,
             index: int, passages: list[Prompt], count: int) -> list[Prompt]:
    """The shard's prompts: the plan, the requests the target wrote that pass (new ones are added
    to `seen`), user turns, the previous shard's passages, and template prompts to fill up to `count`."""
    prompts = list(plan)
    for request, text in zip(requests, written):
        if request["kind"] == "self_instruct":
            text = clean_request(text)
            if text and is_new(text, seen):
                prompts.append(Prompt("self_instruct", text))
        else:
            row = request["row"]
            follow = clean_request(text) or rng.choice(FOLLOW_UPS).format(language=rng.choice(LANGUAGES))
            history = (("user", row["text"]), ("assistant", row["reply_text"]))
            prompts.append(Prompt("multi_turn", follow, row.get("topic", ""), history=history, from_shard=index - 1))
    prompts += [replace(p, from_shard=index - 1) for p in passages[: max(0, count - len(prompts))]]
    if len(prompts) < count:
        prompts += direct_prompts(count - len(prompts), seed=rng.randrange(1 << 30))
    return prompts[:count]


def clean_request(text: str) -> str | None:
    """The target's request as a user would send it, or None when it is not one (too short or
    long, talk about the task itself, a list of several, an unfinished sentence)."""
    text = text.strip().strip('"').strip()
    text = re.sub(r"^(new request|request|user|message)\s*\d*\s*[:.-]\s*", "", text, flags=re.I).strip()
    words = text.split()
    if not 3 <= len(words) <= 60 or "\n\n" in text or text[-1] not in ".?!":
        return None
    if sum(c.isascii() for c in text) < 0.97 * len(text):  # the small target drifts into noise in other scripts
        return None
    if re.search(r"\b(request|assistant|as an ai)\b", text, re.I) or text.lower().startswith(("sure", "here ", "of course")):
        return None
    return text


def _four_grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + 4]) for i in range(max(len(words) - 3, 1))}


def is_new(text: str, seen: set) -> bool:
    """Whether no earlier request shares half of this one's 4-word runs; records it if so."""
    grams = _four_grams(text)
    if len(grams & seen) * 2 >= len(grams):
        return False
    seen.update(grams)
    return True


def _examples(rng: random.Random) -> str:
    picked = [p.text for p in direct_prompts(3, seed=rng.randrange(1 << 30))] + [rng.choice(MORE["short"])]
    rng.shuffle(picked)
    return "\n".join(f"- {text}" for text in picked)


def _more_prompt(rng: random.Random) -> Prompt:
    family = rng.choice(sorted(MORE))
    a, b = rng.randint(2, 90), rng.randint(2, 60)
    text = rng.choice(MORE[family]).format(a=a, b=b, c=rng.randint(2, 25), name=rng.choice(NAMES), topic=rng.choice(TOPICS))
    return Prompt("math" if family == "math" else family, text)


def _prose_prompt(rng: random.Random, held_out: bool) -> Prompt:
    pools = [_split(list(documentation_passages()), held_out), _split(list(debian_passages()), held_out)]
    pool = rng.choice([p for p in pools if p])
    topic, passage = rng.choice(pool)
    family = rng.choice(sorted(PROSE_TASKS))
    text = rng.choice(PROSE_TASKS[family]).format(text=passage, language=rng.choice(LANGUAGES))
    return Prompt(family, text, topic)


def _code_prompt(rng: random.Random, pool: list[tuple[str, str]]) -> Prompt:
    where, code = rng.choice(pool)
    return Prompt("code", rng.choice(CODE_TASKS).format(code=code), where)


def varied_template_texts() -> list[str]:
    """Every fixed piece of text this source adds, for the overlap check."""
    texts = [SELF_INSTRUCT, PLAY_USER, *CODE_TASKS, *FOLLOW_UPS]
    for group in (PROSE_TASKS, MORE):
        for templates in group.values():
            texts += templates
    return texts


__all__ = ["shard_plan", "assemble", "clean_request", "is_new", "varied_template_texts", "derived_prompts"]
