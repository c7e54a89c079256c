"""The trainer's prompt source: offline, written here, never the benchmark questions.

Prompts are topic lists crossed with instruction templates, in the families the benchmark
measures (conversation, writing, translation both ways, summarization, QA, short facts, math,
coding, RAG), drawn with a seeded generator. Summarization, RAG-style "answer from this passage" and passage translation need a
passage: those prompts are built from a passage the target itself wrote for an earlier
"writing" prompt (`derived_prompts`). tests/test_train_prompts.py checks that no prompt shares an
8-word run with a Spec-Bench question or with the project's bench questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

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

# Sentences to translate into English (Spec-Bench translates into English; our own sentences).
FOREIGN = {
    "German": [
        "Der Zug fährt morgen um sieben Uhr ab.",
        "Ich habe meinen Regenschirm im Büro vergessen.",
        "Wir gehen am Wochenende in den Bergen wandern.",
        "Kannst du mir bitte das Salz geben?",
        "Mein Bruder arbeitet seit drei Jahren in einer Bäckerei.",
        "Im Winter wird es hier sehr früh dunkel.",
        "Die Stadt hat neue Regeln für den Verkehr beschlossen.",
        "Das Konzert wurde wegen des Regens abgesagt.",
        "Sie lernt jeden Abend eine halbe Stunde Spanisch.",
        "Nach dem Essen machen wir gern einen kleinen Spaziergang am Fluss.",
        "Die neue Brücke soll im nächsten Frühjahr fertig sein.",
        "Viele Menschen fahren heute mit dem Fahrrad zur Arbeit.",
    ],
    "French": [
        "Le marché ouvre tous les samedis matin.",
        "J'aimerais réserver une table pour deux personnes ce soir.",
        "Il fait très chaud cet été dans le sud du pays.",
        "Nous avons visité un vieux château près de la rivière.",
        "Les enfants apprennent à nager à l'école.",
        "Mon voisin répare des vélos dans son garage.",
    ],
    "Spanish": [
        "Mañana vamos a visitar a mis abuelos en el campo.",
        "El restaurante está cerca de la estación de tren.",
        "Me gusta leer un libro antes de dormir.",
        "La reunión empieza a las diez de la mañana.",
        "Los precios de la fruta han subido este mes.",
        "Mi hermana quiere estudiar medicina en la universidad.",
    ],
}

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "returns the largest number in a list", "converts Celsius to Fahrenheit", "removes duplicates from a list",
    "computes the factorial of n", "checks whether a word is a palindrome", "sorts a list of names alphabetically",
    "adds up the even numbers in a list", "finds the most common word in a text", "merges two dictionaries",
    "counts how many times each letter appears in a word", "returns the n-th Fibonacci number",
    "checks whether a year is a leap year", "splits a sentence into words and capitalises each one",
]

# Short factual questions (slots: a country, an invention, a place, a book, an animal).
COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Egypt", "Mexico", "Australia",
             "Italy", "Vietnam", "Peru", "Poland", "Morocco", "Thailand"]
INVENTIONS = ["the light bulb", "the telephone", "the airplane", "the printing press", "the bicycle", "paper",
              "the compass", "the steam engine", "the radio", "the microscope", "the telescope", "the computer mouse"]
PLACES = ["Mount Everest", "the Eiffel Tower", "the Nile", "the Grand Canyon", "Machu Picchu", "the Dead Sea",
          "Niagara Falls", "the Great Barrier Reef", "Stonehenge", "Lake Baikal", "the Andes", "the Colosseum"]
BOOKS = ["Pride and Prejudice", "Moby-Dick", "Hamlet", "War and Peace", "The Odyssey", "Don Quixote",
         "Frankenstein", "Jane Eyre", "Great Expectations", "The Little Prince"]
ANIMALS = ["a giraffe", "a dolphin", "an owl", "a cheetah", "a koala", "a honeybee", "a polar bear", "a salmon",
           "a bat", "an ant", "a camel", "a parrot"]

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
        "Imagine you are {person}. Describe a day in your life that involves {topic}.",
        "Pretend you are a tour guide and tell a group of visitors about {topic}.",
        "Draft a polite email to {person} asking for advice about {topic}.",
        "Act as a teacher and give a short lesson on {topic}, then ask the class one question.",
        "Compare {topic} and {topic2}: how are they alike, and how are they different?",
        "Write a dialogue between {person} and a friend who disagree about {topic}.",
        "I am {person}. What should I know before I get started with {topic}?",
        "Make a short quiz of three questions about {topic}, with the answers at the end.",
        "Rewrite this sentence so that it sounds more formal: {sentence}",
        "Suggest five names for a small business about {topic} and explain your favourite.",
        "What would happen if {topic} suddenly disappeared from the world? Think it through step by step.",
        "Give me a step-by-step plan to learn about {topic} in one month.",
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
        "Write a short news report about {topic}.",
        "Write a diary entry of {person} who spent the day learning about {topic}.",
        "Write the opening paragraph of a mystery novel that involves {topic}.",
        "Write a travel blog post about a trip that was all about {topic}.",
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
        "In two sentences, what is the connection between {topic} and {topic2}?",
        "What is a common misunderstanding about {topic}, and what is the truth?",
    ],
    "facts": [
        "What is the capital of {country}?",
        "What language do most people speak in {country}?",
        "Who invented {invention}, and when?",
        "Where is {place}?",
        "How tall, long or large is {place}?",
        "Who wrote {book}, and what is it about?",
        "What does {animal} eat?",
        "How long does {animal} usually live?",
        "What is {country} famous for?",
        "When was {invention} first used?",
    ],
    "coding": [
        "Write a Python function that {task}.",
        "How would you write a program that {task}? Explain the idea, then give the code.",
        "Write a function in JavaScript that {task}, with a short example of using it.",
        "Explain, for a beginner, how to write code that {task}.",
    ],
    "translation": [
        "Translate into {language}: {sentence}",
        "How do you say this in {language}? \"{sentence}\"",
        "Translate the following sentence to {language}.\n{sentence}",
        "Please translate this from English to {language}: {sentence}",
        "Translate {source_language} to English: {foreign}",
        "What does this {source_language} sentence mean in English? {foreign}",
        "Translate into English:\n{foreign}",
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
    "{name} buys {a} notebooks at {b} dollars each and a bag for {c} dollars. How much does {name} spend in all?",
    "A farmer has {a} hens and each lays {b} eggs a week. The eggs are sold in boxes of {c}. How many full boxes are filled each week?",
    "{name} is {b} years old. {name}'s mother is {a} years older, and the grandmother is twice the mother's age. How old is the grandmother?",
    "A bus has {a} passengers. At the first stop {c} get off and {b} get on. How many passengers are on the bus now?",
    "{name} earns {b} dollars an hour and works {c} hours a day for {a} days. How much does {name} earn? Explain each step.",
    "A tank holds {a} litres of water and {b} litres leak out every hour. How much water is left after {c} hours, if any?",
    "{name} had {a} stickers, gave a third of them to a friend, rounded down, and then bought {b} more. How many stickers does {name} have?",
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
    # Earlier turns ((role, content), ...) when the prompt is a conversation's next user message.
    history: tuple[tuple[str, str], ...] = ()
    # The shard whose replies the prompt builds on (passages, conversations), if any.
    from_shard: int | None = None
    prompt_ids: list[int] | None = field(default=None, compare=False)  # when already encoded (a shard written again)

    def messages(self) -> list[dict]:
        return [*({"role": role, "content": content} for role, content in self.history), {"role": "user", "content": self.text}]


def direct_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` prompts, no passage needed, drawn with a seeded generator (same seed, same list)."""
    rng = random.Random(seed)
    families = ["conversation", "conversation", "writing", "writing", "writing", "qa", "facts", "translation", "math",
                "coding"]
    prompts = []
    for _ in range(count):
        family = rng.choice(families)
        topic = rng.choice(TOPICS)
        if family == "math":
            a, b = rng.randint(2, 60), rng.randint(2, 30)
            text = rng.choice(MATH).format(name=rng.choice(NAMES), a=a, b=b, c=rng.randint(1, a + b))
        else:
            text = rng.choice(TEMPLATES[family]).format(topic=topic, **_slots(rng))
        prompts.append(Prompt(family, text, topic))
    return prompts


def _slots(rng: random.Random) -> dict[str, str]:
    """A value for every slot a template may have besides {topic} (unused ones are ignored)."""
    source_language = rng.choice(sorted(FOREIGN))
    return dict(
        topic2=rng.choice(TOPICS), person=rng.choice(PEOPLE), language=rng.choice(LANGUAGES),
        sentence=rng.choice(SENTENCES), source_language=source_language, foreign=rng.choice(FOREIGN[source_language]),
        task=rng.choice(CODE_TASKS), country=rng.choice(COUNTRIES), invention=rng.choice(INVENTIONS),
        place=rng.choice(PLACES), book=rng.choice(BOOKS), animal=rng.choice(ANIMALS),
    )


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
    texts = [*TOPICS, *PEOPLE, *SENTENCES, *MATH, *CODE_TASKS, *COUNTRIES, *INVENTIONS, *PLACES, *BOOKS, *ANIMALS]
    texts += [sentence for sentences in FOREIGN.values() for sentence in sentences]
    for group in (TEMPLATES, DERIVED):
        for templates in group.values():
            texts += templates
    return texts
