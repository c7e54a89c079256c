"""The trainer's prompt source: offline, written here, never the benchmark questions.

Prompts are topic lists crossed with instruction templates, in the families the benchmark
measures (conversation, writing, translation, summarization, QA, math, RAG), drawn with a seeded
generator. Summarization, RAG-style "answer from this passage" and passage translation need a
passage: those prompts are built from a passage the target itself wrote for an earlier
"writing" prompt (`derived_prompts`). tests/test_train_prompts.py checks that no prompt shares an
8-word run with a Spec-Bench question or with the project's bench questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TOPICS = [
    "volcanoes", "the water cycle", "honeybees", "the printing press", "black holes", "coral reefs",
    "the Roman aqueducts", "photosynthesis", "electric cars", "the Silk Road", "jazz music", "glaciers",
    "vaccines", "the history of chess", "wind turbines", "octopuses", "the Great Wall of China",
    "sourdough bread", "plate tectonics", "the human heart", "recycling plastic", "solar eclipses",
    "the Industrial Revolution", "rainforests", "the moon landing", "cryptography", "migratory birds",
    "the invention of the telephone", "earthquakes", "tea ceremonies", "the immune system",
    "renewable energy", "ancient Egypt", "the Olympic Games", "deserts", "the stock market",
    "machine learning", "the Amazon river", "dinosaurs", "climate change", "origami", "penguins",
    "the metric system", "public libraries", "the French Revolution", "submarines", "compost",
    "the speed of light", "mountain climbing", "sleep", "the periodic table", "bicycles",
    "the Renaissance", "tornadoes", "coffee", "the internet", "whales", "the Mayan calendar",
    "batteries", "friendship", "city parks", "the violin", "microplastics", "the Sahara",
    "rice farming", "lighthouses", "the human brain", "satellites", "the Vikings", "fermentation",
    "wolves", "the theory of evolution", "hot air balloons", "bridges", "the Arctic", "mushrooms",
    "chocolate", "the Beatles", "quantum computers", "castles", "the postal service", "elephants",
    "trains", "gardening", "the ozone layer", "pirates", "the piano", "recycling glass",
    "the solar system", "a healthy breakfast", "learning a new language", "time management",
    "saving money", "board games", "camping", "painting with watercolours", "running a marathon",
    "writing a resume", "public speaking", "moving to a new city", "keeping a journal", "yoga",
    "baking cookies", "adopting a cat", "the first day at a new job", "a rainy weekend",
    "planting a tree", "fixing a flat tyre", "the night sky", "a school science fair",
    "a family reunion", "a small bakery", "a lost umbrella", "a robot that learns to paint",
    "a village by the sea", "an old clock", "a trip to the mountains", "the first snow of winter",
]

PEOPLE = [
    "a student", "my grandmother", "a new employee", "a ten-year-old", "a tourist", "a nurse",
    "a software engineer", "a farmer", "a teacher", "a retired sailor", "a chef", "a librarian",
]

LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Chinese", "Japanese", "Russian"]

SENTENCES = [
    "The train leaves at seven o'clock tomorrow morning.",
    "Could you please tell me where the nearest pharmacy is?",
    "My brother likes to read books about history.",
    "We are going to the beach if the weather is good.",
    "This soup is too hot to eat right now.",
    "I have lived in this small town for ten years.",
    "The museum is closed on Mondays.",
    "She forgot her keys at the office again.",
    "How much does a ticket to the concert cost?",
    "The children played in the garden until it got dark.",
    "Please turn off the lights when you leave the room.",
    "I would like a cup of tea with milk, please.",
    "The meeting has been moved to Thursday afternoon.",
    "Our neighbours have a very friendly dog.",
    "It is important to drink enough water every day.",
    "The library opens at nine and closes at six.",
]

TEMPLATES = {
    "conversation": [
        "Hi! Can you tell me something interesting about {topic}?",
        "I'm feeling a bit bored today. Could you suggest something fun related to {topic}?",
        "What do you think is the most surprising fact about {topic}?",
        "My friend says {topic} is boring. How would you convince them otherwise?",
        "Can you help me plan a weekend around {topic}?",
        "I want to explain {topic} to {person}. What should I say?",
        "Hello, how are you? I'd love to chat about {topic}.",
        "Give me three tips about {topic} for {person}.",
    ],
    "writing": [
        "Write a short paragraph about {topic}.",
        "Write a short story about {topic}.",
        "Write a poem about {topic}.",
        "Write a short blog post about {topic} for {person}.",
        "Write a letter to {person} about {topic}.",
        "Describe {topic} in a few sentences.",
        "Write an encyclopedia-style introduction to {topic}.",
        "Write a persuasive paragraph about why people should learn about {topic}.",
        "Write a product description for something related to {topic}.",
        "Write a short speech about {topic}.",
    ],
    "qa": [
        "What is {topic}?",
        "Explain how {topic} works.",
        "Why is {topic} important?",
        "What are the main facts everyone should know about {topic}?",
        "What are the advantages and disadvantages of {topic}?",
        "How has {topic} changed over time?",
        "List five key words related to {topic} and explain each one.",
        "What questions do people often ask about {topic}? Answer two of them.",
    ],
    "translation": [
        "Translate into {language}: {sentence}",
        "How do you say this in {language}? \"{sentence}\"",
        "Translate the following sentence to {language}.\n{sentence}",
        "Please translate this from English to {language}: {sentence}",
    ],
}

MATH = [
    "{name} has {a} apples and buys {b} more. Then {name} gives away {c}. How many apples are left?",
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost?",
    "A train travels {a} kilometres per hour for {b} hours. How far does it go?",
    "There are {a} students in a class and {b} of them are absent. How many are present?",
    "{name} saves {a} dollars every week. How much does {name} save in {b} weeks?",
    "A rectangle is {a} metres long and {b} metres wide. What is its area and its perimeter?",
    "{name} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {name} read in total?",
    "A box holds {a} eggs. How many boxes are needed for {c} eggs?",
    "What is {a} plus {b}, times {c}? Show your steps.",
    "If {name} runs {a} laps of {b} metres each, how many metres is that?",
    "A pizza is cut into {a} slices and {name} eats {c} of them. What fraction is left?",
    "Solve for x: {a}x + {b} = {c}.",
]
NAMES = ["Anna", "Ben", "Carlos", "Dina", "Emil", "Fatima", "George", "Hana", "Ivan", "Julia", "Kofi", "Lena"]

# Prompts over a passage the target wrote; {passage} is that reply.
DERIVED = {
    "summarization": [
        "Summarize the following text in two sentences.\n\n{passage}",
        "Give a one-sentence summary of this passage:\n{passage}",
        "Read the text below and list its main points.\n\n{passage}",
    ],
    "rag": [
        "Answer the question using only the passage.\n\nPassage: {passage}\n\nQuestion: What is the passage mainly about?",
        "Based on the passage below, what is one important detail it mentions?\n\n{passage}",
        "Passage:\n{passage}\n\nUsing the passage above, explain {topic} in simple words.",
    ],
    "translation": [
        "Translate this text into {language}:\n\n{passage}",
    ],
}


@dataclass(frozen=True)
class Prompt:
    family: str
    text: str
    topic: str = ""


def direct_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` prompts, no passage needed, drawn with a seeded generator (same seed, same list)."""
    rng = random.Random(seed)
    families = ["conversation", "writing", "writing", "qa", "translation", "math"]
    prompts = []
    for _ in range(count):
        family = rng.choice(families)
        topic = rng.choice(TOPICS)
        if family == "math":
            a, b = rng.randint(2, 60), rng.randint(2, 30)
            text = rng.choice(MATH).format(name=rng.choice(NAMES), a=a, b=b, c=rng.randint(1, a + b))
        else:
            text = rng.choice(TEMPLATES[family]).format(
                topic=topic, person=rng.choice(PEOPLE), language=rng.choice(LANGUAGES), sentence=rng.choice(SENTENCES)
            )
        prompts.append(Prompt(family, text, topic))
    return prompts


def derived_prompts(passages: list[tuple[str, str]], seed: int) -> list[Prompt]:
    """One prompt per (topic, passage): summarize it, answer from it, or translate it."""
    rng = random.Random(seed)
    prompts = []
    for topic, passage in passages:
        family = rng.choice(["summarization", "summarization", "rag", "rag", "translation"])
        text = rng.choice(DERIVED[family]).format(passage=passage.strip(), topic=topic, language=rng.choice(LANGUAGES))
        prompts.append(Prompt(family, text, topic))
    return prompts


def all_template_texts() -> list[str]:
    """Every fixed piece of text prompts are made from, for the overlap check."""
    texts = [*TOPICS, *PEOPLE, *SENTENCES, *MATH]
    for group in (TEMPLATES, DERIVED):
        for templates in group.values():
            texts += templates
    return texts
