"""Prompt sources for self-distillation that are not a handful of templates.

Every prompt carries its source (e.g. `stdlib:json`, `topic:volcanoes`, `builtin:code`) and its
kind: `chat` (wrapped in the target's chat template) or `raw` (plain completion, no template).
Held-out evaluation takes WHOLE sources (`split_by_source`), so a held-out prompt never shares a
module or a topic with the training data.

- stdlib: Python functions with docstrings from the standard library on this machine: the
  signature + docstring as a raw completion prompt, "write a function that <summary>" and
  "explain this function" as chat prompts.
- topics: user-style chat prompts per topic ("How does <topic> work?", ...), seeds the target
  expands itself ("write a question about <topic>", sampled at T>0; the question then becomes a
  chat prompt, see dataset.question_from_answer), and raw article openings.
- code: small everyday functions and classes as raw completions (signature + docstring) and as
  chat requests.
- builtin: the combinatorial built-in set (prompts.builtin_prompts), chat.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

__all__ = ["Prompt", "TOPICS", "CODE_TASKS", "stdlib_prompts", "topic_seed_prompts", "topic_chat_prompts",
           "code_task_prompts", "builtin_source_prompts", "split_by_source", "dedupe", "held_out", "question_prompt"]


@dataclass(frozen=True)
class Prompt:
    text: str
    source: str  # e.g. "stdlib:json"; held-out splits take whole sources
    kind: str = "chat"  # "chat" or "raw"

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode("utf-8")).hexdigest()[:16]


TOPICS = (
    "photosynthesis", "the water cycle", "gravity", "volcanoes", "the internet", "vaccines", "climate change",
    "black holes", "democracy", "inflation", "machine learning", "the moon", "electricity", "recycling",
    "the human heart", "earthquakes", "bees", "rainbows", "the printing press", "solar panels", "coffee",
    "the Roman Empire", "chess", "jazz music", "the stock market", "sleep", "dinosaurs", "the ocean tides",
    "bread baking", "bicycles", "vitamins", "the French Revolution", "tea", "hurricanes", "DNA", "antibiotics",
    "the immune system", "rockets", "renewable energy", "cats", "dogs", "gardening", "marathon running",
    "meditation", "the Great Wall of China", "ancient Egypt", "bridges", "batteries", "smartphones",
    "cloud computing", "databases", "encryption", "open source software", "the Python language",
    "sorting algorithms", "linked lists", "recursion", "prime numbers", "fractions", "probability",
    "geometry", "the Pythagorean theorem", "budgeting", "job interviews", "public speaking", "time management",
    "learning a new language", "friendship", "volunteering", "photography", "painting", "poetry",
    "the piano", "football", "the Olympic Games", "mountains", "deserts", "rainforests", "penguins",
    "whales", "mushrooms", "cheese", "chocolate", "pizza", "electric cars", "airplanes", "trains",
    "the solar system", "Mars", "telescopes", "microscopes", "the periodic table", "magnets", "light",
    "sound", "weather forecasts", "maps", "libraries", "museums", "recipes for soup", "first aid",
    # everyday life, work, health, culture, nature, science and technology: what people ask assistants about
    "saving for retirement", "credit cards", "renting an apartment", "buying a used car", "moving to a new city",
    "writing a resume", "negotiating a salary", "working from home", "starting a small business", "online shopping",
    "email etiquette", "team meetings", "customer service", "project management", "leadership",
    "procrastination", "habits", "stress", "happiness", "gratitude", "motivation", "creativity", "critical thinking",
    "memory", "dreams", "emotions", "parenting", "toddlers", "teenagers", "grandparents", "weddings", "birthdays",
    "holidays", "gift giving", "table manners", "houseplants", "composting", "lawn care", "home repairs",
    "painting a room", "cleaning the kitchen", "laundry", "saving energy at home", "water conservation",
    "air pollution", "plastic waste", "endangered species", "coral reefs", "wolves", "elephants", "owls",
    "butterflies", "ants", "spiders", "sharks", "octopuses", "horses", "parrots", "frogs", "trees", "flowers",
    "seeds", "soil", "rivers", "lakes", "glaciers", "islands", "caves", "the Arctic", "the Amazon river",
    "the Sahara", "tornadoes", "lightning", "snow", "fog", "the seasons", "clouds", "wind power", "nuclear energy",
    "oil and gas", "hydrogen fuel", "the Big Bang", "stars", "galaxies", "comets", "satellites",
    "the International Space Station", "astronauts", "time zones", "calendars", "clocks", "the metric system",
    "measuring temperature", "atoms", "molecules", "chemical reactions", "acids and bases", "evolution",
    "genetics", "cells", "bacteria", "viruses", "the brain", "the lungs", "bones", "muscles", "digestion",
    "nutrition", "protein", "sugar", "hydration", "exercise", "yoga", "stretching", "swimming", "cycling",
    "hiking", "camping", "fishing", "skiing", "basketball", "tennis", "baseball", "cricket", "golf",
    "board games", "video games", "card games", "puzzles", "magic tricks", "movies", "television", "podcasts",
    "radio", "newspapers", "social media", "blogging", "video editing", "graphic design", "architecture",
    "sculpture", "classical music", "rock music", "hip hop", "opera", "dance", "theater", "novels",
    "short stories", "mythology", "fairy tales", "folk tales", "philosophy", "ethics", "logic", "economics",
    "taxes", "banks", "money", "trade", "supply and demand", "globalization", "the United Nations",
    "elections", "human rights", "the law", "courts", "the police", "firefighters", "doctors", "nurses",
    "teachers", "farmers", "engineers", "pilots", "chefs", "scientists", "homework", "exams", "online courses",
    "reading habits", "note taking", "studying math", "learning to code", "spreadsheets", "word processors",
    "passwords", "computer viruses", "privacy online", "artificial intelligence", "robots", "3D printing",
    "virtual reality", "self-driving cars", "drones", "the web browser", "search engines", "operating systems",
    "computer memory", "processors", "networks", "Wi-Fi", "Bluetooth", "GPS", "version control",
    "debugging", "unit testing", "APIs", "web servers", "JavaScript", "SQL", "regular expressions",
    "data structures", "hash tables", "binary trees", "graphs", "big O notation", "object-oriented programming",
    "functional programming", "the command line", "spreadsheet formulas", "statistics", "averages", "percentages",
    "algebra", "calculus", "triangles", "circles", "infinity", "zero", "the number pi", "ancient Greece",
    "the Middle Ages", "the Renaissance", "the Industrial Revolution", "the Vikings", "the Silk Road",
    "castles", "pyramids", "knights", "samurai", "explorers", "the Titanic", "the first airplane flight",
    "the invention of the telephone", "the light bulb", "the wheel", "writing systems", "languages of the world",
    "sign language", "translation", "grammar", "punctuation", "spelling", "storytelling", "humor",
    "kindness", "honesty", "patience", "teamwork", "conflict resolution", "apologizing", "making friends",
    "pets", "adopting a dog", "aquariums", "bird watching", "beekeeping", "knitting", "woodworking",
    "pottery", "origami", "baking cookies", "pasta", "rice", "spices", "vegetables", "fruit", "breakfast",
    "coffee shops", "restaurants", "street food", "vegetarian cooking", "food safety", "grocery shopping",
    "travel on a budget", "packing a suitcase", "airports", "hotels", "road trips", "passports", "Japan",
    "Italy", "Brazil", "India", "Canada", "Australia", "Kenya", "Mexico", "Norway", "cities", "villages",
    "public transport", "traffic", "bridges and tunnels", "skyscrapers", "lighthouses", "ships", "submarines",
)

_QUESTION = ("Write one question that a curious person might ask an assistant about {t}. "
             "Reply with the question only.")
_TASK = ("Write one short task that a user might ask an assistant to do that involves {t}. "
         "Reply with the task only.")
_RAW_OPENINGS = ("Here is a short article about {t}.\n\n", "{T}\n\nIntroduction\n\n", "Q: What should I know about {t}?\nA:",
                 "Five facts about {t}:\n1.")


#: how users ask assistants about a topic: each topic gets these chat prompts (answered greedily and
#: sometimes sampled); with ~400 topics the answers, not the wording, carry the variety
_CHAT_TEMPLATES = (
    "Explain {t} in simple terms.", "How does {t} work?", "Why is {t} important?", "What is the history of {t}?",
    "Give me three tips about {t}.", "What are the pros and cons of {t}?", "Tell me an interesting fact about {t}.",
    "What are common misconceptions about {t}?", "How would you explain {t} to a child?",
    "Write a short paragraph about {t}.", "What should a beginner know about {t}?",
    "Summarize the key ideas of {t} in a few sentences.", "Write a short poem about {t}.",
    "List five important terms related to {t} and define each one.", "What questions do people often ask about {t}?",
    "Write a short story that involves {t}.",
)

#: small everyday functions as raw completion prompts (signature + docstring, the target writes the
#: body), the way users complete code; each task is its own source so held-out splits take whole tasks
CODE_TASKS = (
    ("is_even(n)", "Return True if n is even."), ("celsius_to_fahrenheit(c)", "Convert a temperature from Celsius to Fahrenheit."),
    ("reverse_words(sentence)", "Return the sentence with the order of its words reversed."),
    ("is_palindrome(s)", "Return True if s reads the same forwards and backwards, ignoring case."),
    ("factorial(n)", "Return n! for a non-negative integer n."), ("fibonacci(n)", "Return the n-th Fibonacci number."),
    ("gcd(a, b)", "Return the greatest common divisor of a and b."), ("lcm(a, b)", "Return the least common multiple of a and b."),
    ("is_prime(n)", "Return True if n is a prime number."), ("primes_up_to(n)", "Return a list of all primes up to n using a sieve."),
    ("flatten(nested)", "Flatten a list of lists into a single list."), ("chunk(items, size)", "Split items into lists of at most size elements."),
    ("unique(items)", "Return the items without duplicates, keeping the first occurrence order."),
    ("average(numbers)", "Return the arithmetic mean of a list of numbers, or 0 for an empty list."),
    ("median(numbers)", "Return the median of a non-empty list of numbers."),
    ("max_index(values)", "Return the index of the largest value in a list."),
    ("binary_search(items, target)", "Return the index of target in the sorted list items, or -1."),
    ("bubble_sort(items)", "Sort a list in place with bubble sort and return it."),
    ("insertion_sort(items)", "Return a new sorted list using insertion sort."),
    ("merge_sorted(a, b)", "Merge two sorted lists into one sorted list."),
    ("capitalize_words(text)", "Capitalize the first letter of every word in text."),
    ("count_vowels(text)", "Return the number of vowels in text."), ("is_anagram(a, b)", "Return True if a and b are anagrams of each other."),
    ("caesar_cipher(text, shift)", "Shift every letter in text by shift positions in the alphabet."),
    ("to_snake_case(name)", "Convert a CamelCase name to snake_case."), ("to_camel_case(name)", "Convert a snake_case name to CamelCase."),
    ("read_lines(path)", "Read a text file and return its lines without trailing newlines."),
    ("write_json(path, data)", "Write data to path as indented JSON."), ("load_config(path)", "Load a JSON configuration file and return it as a dict."),
    ("parse_csv_line(line)", "Split one line of comma-separated values into a list of stripped strings."),
    ("seconds_to_hms(seconds)", "Format a number of seconds as an H:MM:SS string."),
    ("days_between(d1, d2)", "Return the number of days between two datetime.date objects."),
    ("is_leap_year(year)", "Return True if year is a leap year in the Gregorian calendar."),
    ("roman_to_int(s)", "Convert a Roman numeral string to an integer."), ("int_to_roman(n)", "Convert an integer between 1 and 3999 to a Roman numeral."),
    ("matrix_multiply(a, b)", "Multiply two matrices given as lists of rows."), ("transpose(matrix)", "Return the transpose of a matrix given as a list of rows."),
    ("dot_product(u, v)", "Return the dot product of two equal-length vectors."),
    ("distance(p, q)", "Return the Euclidean distance between two points given as (x, y) tuples."),
    ("clamp(value, low, high)", "Limit value to the range [low, high]."),
    ("group_by_length(words)", "Return a dict mapping each word length to the list of words with that length."),
    ("most_common(items)", "Return the item that occurs most often in items."),
    ("invert_dict(d)", "Return a new dict with the keys and values of d swapped."),
    ("deep_merge(a, b)", "Recursively merge dict b into a copy of dict a and return it."),
    ("validate_email(address)", "Return True if address looks like a valid email address."),
    ("slugify(title)", "Turn a title into a lowercase URL slug with words joined by hyphens."),
    ("word_wrap(text, width)", "Wrap text into lines of at most width characters without breaking words."),
    ("running_total(numbers)", "Return the list of cumulative sums of numbers."),
    ("pairs_with_sum(numbers, target)", "Return all pairs of numbers whose sum equals target."),
    ("rotate_list(items, k)", "Rotate a list to the right by k positions."),
    ("balanced_brackets(text)", "Return True if the brackets (), [] and {} in text are balanced."),
    ("longest_common_prefix(words)", "Return the longest common prefix of a list of strings."),
    ("power_set(items)", "Return a list of all subsets of items."), ("permutations(items)", "Return a list of all orderings of items."),
    ("retry(func, attempts)", "Call func until it succeeds, at most attempts times, and return its result."),
    ("timed(func)", "A decorator that prints how long each call of func takes."),
    ("memoize(func)", "A decorator that caches the results of func by its arguments."),
    ("download(url, path)", "Download the file at url and save it to path."),
    ("file_size_human(n_bytes)", "Format a size in bytes as a human readable string like '1.5 MB'."),
    ("random_password(length)", "Return a random password of the given length with letters, digits and symbols."),
    ("shuffle_deck()", "Return a shuffled list of the 52 playing cards as strings like 'Q of hearts'."),
    ("tokenize(text)", "Split text into lowercase words, dropping punctuation."),
    ("class Counter:", "A counter that can be incremented, decremented and reset."),
    ("class Queue:", "A first-in first-out queue with enqueue, dequeue and is_empty methods."),
    ("class BankAccount:", "A bank account with a balance, deposits and withdrawals."),
    ("class Point:", "A point in the plane with x and y coordinates."),
    ("class Rectangle:", "A rectangle with a width and a height that can compute its area and perimeter."),
    ("class LinkedList:", "A singly linked list with append, prepend and iteration."),
    ("class Timer:", "A context manager that measures the time spent in its block."),
    ("class Inventory:", "Keep track of item names and quantities in a store."),
    ("class TodoList:", "A list of tasks that can be added, completed and listed."),
)


def code_task_prompts(tasks: Sequence[tuple[str, str]] = CODE_TASKS) -> list[Prompt]:
    """Per task: the raw completion prompt (a signature or class line + docstring) and a chat request."""
    out = []
    for sig, doc in tasks:
        name = sig.split("(")[0].removeprefix("class ").rstrip(":")
        src = "code:" + name
        if sig.startswith("class "):
            raw = f'{sig}\n    """{doc}"""\n\n    def __init__(self'
            chat = f"Write a Python class `{name}`: {doc[:1].lower() + doc[1:]}"
        else:
            raw = f'def {sig}:\n    """{doc}"""\n'
            chat = f"Write a Python function `{sig}`. {doc}"
        out.append(Prompt(raw, src, "raw"))
        out.append(Prompt(chat, src, "chat"))
    return out


def topic_chat_prompts(topics: Sequence[str] = TOPICS) -> list[Prompt]:
    """Per topic: the user-style chat prompts of `_CHAT_TEMPLATES`."""
    return [Prompt(question_prompt(tpl, t), "topic:" + t, "chat") for t in topics for tpl in _CHAT_TEMPLATES]


def question_prompt(template: str, topic: str) -> str:
    return template.format(t=topic, T=topic[:1].upper() + topic[1:])


def topic_seed_prompts(topics: Sequence[str] = TOPICS) -> list[Prompt]:
    """Per topic: two chat prompts asking the target for a question/task (its answer becomes a new
    prompt) and the raw article openings."""
    out = []
    for t in topics:
        src = "topic:" + t
        out.append(Prompt(question_prompt(_QUESTION, t), src, "seed"))
        out.append(Prompt(question_prompt(_TASK, t), src, "seed"))
        for o in _RAW_OPENINGS:
            out.append(Prompt(question_prompt(o, t), src, "raw"))
    return out


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n")[0]
    first = re.sub(r"\s+", " ", first).strip()
    m = re.match(r"(.+?[.!?])(\s|$)", first)
    return (m.group(1) if m else first).strip()


def _iter_stdlib_files(root: str) -> Iterable[tuple[str, str]]:
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "ensurepip",
            "turtledemo", "config-3.11-x86_64-linux-gnu", "pydoc_data", "encodings"}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name in skip or name.startswith((".", "_")) and name != "__future__.py":
            continue
        if os.path.isfile(path) and name.endswith(".py"):
            yield name[:-3], path
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
            for d, dirs, files in os.walk(path):
                dirs[:] = sorted(x for x in dirs if x not in skip)
                for f in sorted(files):
                    if f.endswith(".py"):
                        yield name, os.path.join(d, f)


def stdlib_prompts(root: Optional[str] = None, *, max_per_package: int = 60, max_lines: int = 40) -> list[Prompt]:
    """Prompts from documented functions of the Python standard library under `root`."""
    root = root or sysconfig.get_paths()["stdlib"]
    per_pkg: dict[str, int] = {}
    out: list[Prompt] = []
    for pkg, path in _iter_stdlib_files(root):
        if per_pkg.get(pkg, 0) >= max_per_package:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 30 or len(doc) > 1200 or not node.body:
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            doc_end = node.body[0].end_lineno or node.lineno
            head = lines[start:doc_end]
            if len(head) > max_lines:
                continue
            indent = len(head[0]) - len(head[0].lstrip())
            head = [ln[indent:] for ln in head]
            raw = "\n".join(head) + "\n"
            src = "stdlib:" + pkg
            summary = _summary(doc)
            if len(summary) < 15:
                continue
            out.append(Prompt(raw, src, "raw"))
            sig = head[0].strip() if len(node.decorator_list) == 0 else lines[node.lineno - 1].strip()
            out.append(Prompt(f"Write a Python function `{sig.rstrip(':')}` that does the following: {summary}",
                              src, "chat"))
            body = lines[start:(node.end_lineno or doc_end)]
            if len(body) <= max_lines:
                code = "\n".join(ln[indent:] for ln in body)
                out.append(Prompt(f"Explain what this Python function does:\n```python\n{code}\n```", src, "chat"))
            per_pkg[pkg] = per_pkg.get(pkg, 0) + 1
            if per_pkg[pkg] >= max_per_package:
                break
    return out


def builtin_source_prompts(n: int = 10_000, seed: int = 0) -> list[Prompt]:
    from .prompts import builtin_prompts

    return [Prompt(p, "builtin", "chat") for p in builtin_prompts(n, seed=seed)]


def held_out(source: str, fraction: float, salt: str = "") -> bool:
    """Whether a whole source is held out (a stable hash of its name)."""
    if fraction <= 0:
        return False
    h = int(hashlib.sha256((salt + source).encode("utf-8")).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def split_by_source(prompts: Sequence[Prompt], fraction: float, *, never: Sequence[str] = ("builtin",),
                    salt: str = "") -> tuple[list[Prompt], list[Prompt]]:
    """(train, held out): whole sources go to one side; sources in `never` always train."""
    tr, ev = [], []
    for p in prompts:
        (ev if p.source not in never and held_out(p.source, fraction, salt) else tr).append(p)
    return tr, ev


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def dedupe(prompts: Iterable[Prompt]) -> list[Prompt]:
    """Drop prompts whose kind and whitespace/case-normalised text were seen before (first kept)."""
    seen, out = set(), []
    for p in prompts:
        k = (p.kind, _norm(p.text))
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out
