"""Varied prompts for the target to answer: templates x topics x audiences x styles, small tasks with random
numbers, and questions the target writes itself (self_prompt). Nothing comes from a hub.

Every draw uses the caller's seeded random.Random, so a shard's prompts depend only on (seed, split, index).
Every HELD_OUT-th topic is kept out of training and used only for the held-out evaluation shard.
"""
from __future__ import annotations

import random

HELD_OUT = 7

TOPICS = """photosynthesis; black holes; the French Revolution; machine learning; climate change; the immune system;
volcanoes; the stock market; compound interest; the Roman Empire; quantum computing; electric cars; sleep; coffee;
the water cycle; plate tectonics; vaccines; the internet; blockchain; renewable energy; the human brain; bees;
the Moon landing; inflation; democracy; jazz; the Renaissance; chess; photography; gardening; meditation;
marathon training; baking bread; the Great Wall of China; ancient Egypt; dinosaurs; DNA; antibiotics; recycling;
time management; public speaking; job interviews; learning a language; budgeting; remote work; social media;
video games; the Olympics; football; the solar system; Mars; tides; rainbows; earthquakes; hurricanes;
the printing press; the industrial revolution; World War I; the Cold War; the Silk Road; the Vikings; origami;
knitting; wine making; cheese; chocolate; tea ceremonies; sushi; vegetarian cooking; nutrition; vitamins;
exercise; yoga; first aid; dogs; cats; whales; coral reefs; rainforests; deserts; the Arctic; penguins;
elephants; evolution; genetics; cells; viruses; bacteria; the heart; the lungs; eyesight; hearing; memory;
emotions; friendship; happiness; stress; motivation; habits; creativity; philosophy; ethics; logic; prime numbers;
geometry; probability; statistics; calculus; algebra; fractions; the Pythagorean theorem; infinity; cryptography;
passwords; computer viruses; operating systems; databases; sorting algorithms; recursion; linked lists; hash tables;
binary numbers; compilers; Python; JavaScript; Rust; SQL; Git; Linux; cloud computing; web browsers; email;
smartphones; batteries; solar panels; wind turbines; nuclear power; electricity; magnets; gravity; light; sound;
friction; airplanes; rockets; submarines; bridges; skyscrapers; trains; bicycles; maps; GPS; weather forecasts;
clouds; snow; seasons; calendars; clocks; money; banks; taxes; trade; supply and demand; startups; marketing;
negotiation; leadership; teamwork; teaching; homework; libraries; museums; poetry; Shakespeare; novels; mythology;
fairy tales; movies; music theory; the piano; the guitar; painting; sculpture; architecture; fashion; perfume;
board games; camping; hiking; fishing; sailing; travel on a budget; packing a suitcase; moving house; houseplants;
composting; bird watching; astronomy; telescopes; the periodic table; acids and bases; chemical reactions; rust;
plastics; glass; paper; the alphabet; punctuation; grammar; writing an essay; writing a resume; small talk"""
TOPICS = [t.strip() for t in TOPICS.replace("\n", " ").split(";") if t.strip()]

AUDIENCES = ["a five-year-old", "a high school student", "a busy parent", "a software engineer", "a retired teacher",
             "a complete beginner", "an expert", "a tourist", "a nurse", "a small business owner", "a grandparent",
             "a university student"]

TEMPLATES = [
    "Explain {topic} to {audience}.", "What is {topic}?", "Why does {topic} matter?", "How does {topic} work?",
    "Give me {n} interesting facts about {topic}.", "Write a short poem about {topic}.",
    "Write a short story that involves {topic}.", "What are the pros and cons of {topic}?",
    "What are common misconceptions about {topic}?", "Give me {n} tips about {topic} for {audience}.",
    "Summarize the history of {topic} in a few sentences.", "Compare {topic} and {other}.",
    "How are {topic} and {other} related?", "Write a haiku about {topic}.",
    "Create a quiz with {n} questions about {topic}.",
    "What would happen if {topic} did not exist?", "Describe {topic} in simple words.",
    "Write a tweet about {topic}.", "Write an email to a friend about {topic}.", "Tell me a joke about {topic}.",
    "What should {audience} know about {topic}?", "List {n} key terms related to {topic} and define them.",
    "Write a dialogue between two people discussing {topic}.", "Outline a lesson plan about {topic}.",
    "What questions do people often ask about {topic}?", "Give an analogy that explains {topic}.",
    "Write a product description for something related to {topic}.", "Argue for and against {topic}.",
    "I am {audience}. Help me understand {topic}.", "Plan a one-week project about {topic}.",
]

STYLES = ["", "", "", "Be concise.", "Use bullet points.", "Answer in one paragraph.", "Explain step by step.",
          "Use a friendly tone.", "Keep it under 100 words.", "Use an example.", "Answer formally.",
          "Use simple words.", "Add a short summary at the end."]

LANGUAGES = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "SQL", "Bash"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "counts the words in a text",
              "finds the largest element of a list", "computes the factorial of n", "sorts a list with bubble sort",
              "merges two sorted lists", "checks whether a string is a palindrome", "computes Fibonacci numbers",
              "removes duplicates from a list", "converts Celsius to Fahrenheit", "reads a file line by line",
              "computes the average of a list of numbers", "finds the greatest common divisor of two numbers",
              "counts the vowels in a string", "flattens a nested list", "parses a date string",
              "validates an email address", "implements binary search", "computes the sum of the digits of a number"]
SENTENCES = ["the meeting has been moved to next tuesday", "I can't believe how fast this year went by",
             "our team finished the project two days early", "please remember to bring your own lunch",
             "the weather was terrible but we still had fun", "this product changed the way I work",
             "we are looking for a new member to join our team", "the train was late again this morning"]
REWRITES = ["Rewrite this sentence in a formal tone: {s}", "Translate to French: {s}", "Fix the grammar: {s}",
            "Make this sentence more exciting: {s}", "Translate to Spanish: {s}", "Turn this into a question: {s}"]
FOLLOW_UPS = ["Can you give an example?", "Can you explain that more simply?", "Summarize that in one sentence.",
              "Why?", "Can you make it shorter?", "Tell me more.", "What is the most important point?",
              "Can you write that as a list?", "Thanks! What else should I know?", "Are you sure?",
              "Can you explain it to a child?", "What are the next steps?"]
SELF_PROMPTS = ["Write one question that {audience} might ask about {topic}. Reply with the question only.",
                "Write a request someone could send to an AI assistant about {topic}. Reply with the request only.",
                "Invent a task about {topic} for a helpful assistant. Write only the task."]


def topics(split: str) -> list[str]:
    return [t for i, t in enumerate(TOPICS) if (i % HELD_OUT == 0) == (split == "eval")]


def _fill(rng: random.Random, template: str, split: str) -> str:
    pool = topics(split)
    return template.format(topic=rng.choice(pool), other=rng.choice(pool), audience=rng.choice(AUDIENCES),
                           n=rng.randint(2, 6))


def prompt(rng: random.Random, split: str) -> str:
    kind = rng.random()
    if kind < 0.82:  # open questions and code, with a style instruction
        text = (_fill(rng, rng.choice(TEMPLATES), split) if kind < 0.7
                else f"Write a {rng.choice(LANGUAGES)} function that {rng.choice(CODE_TASKS)}.")
        return f"{text} {rng.choice(STYLES)}".strip()
    if kind < 0.92:  # arithmetic with fresh numbers
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        return rng.choice([f"What is {a} + {b}?", f"What is {a} times {c}?", f"Solve for x: {c}x + {a} = {b}.",
                           f"A shop sells pens at {c} dollars each. How much do {a} pens cost?",
                           f"If a train travels {a} km in {c} hours, what is its average speed?"])
    return rng.choice(REWRITES).format(s=rng.choice(SENTENCES))


def self_prompt(rng: random.Random, split: str) -> str:
    """A request for the target to write a prompt of its own: the answers become prompts (more variety)."""
    return _fill(rng, rng.choice(SELF_PROMPTS), split)


def follow_up(rng: random.Random) -> str:
    return rng.choice(FOLLOW_UPS)


def as_prompt(written: str) -> str | None:
    """The first usable line of a target-written request, or None if it wrote nothing usable."""
    for line in written.splitlines():
        line = line.strip().strip('"').strip()
        if len(line) >= 12:
            return line[:300]
    return None
