"""Prompts for self-distillation: a built-in mixed set, prompt files, chat-template wrapping."""

from __future__ import annotations

import itertools
import json
import os
import random

__all__ = ["builtin_prompts", "load_prompts", "chat_wrap"]

_TOPICS = ["photosynthesis", "the water cycle", "gravity", "volcanoes", "the internet", "vaccines",
           "climate change", "black holes", "democracy", "inflation", "machine learning", "the moon",
           "electricity", "recycling", "the human heart", "earthquakes", "bees", "rainbows",
           "the printing press", "solar panels"]
_ITEMS = ["fruits", "countries in Europe", "programming languages", "healthy breakfast ideas",
          "ways to save money", "animals that live in the ocean", "tips for better sleep",
          "famous scientists", "board games", "hobbies to try", "uses of a paperclip", "colors",
          "things to pack for a trip", "exercises you can do at home"]
_CODE_TASKS = ["reverses a string", "checks whether a number is prime", "computes the factorial of n",
               "returns the n-th Fibonacci number", "sorts a list with bubble sort",
               "counts the vowels in a string", "finds the maximum of a list", "checks if a word is a palindrome",
               "merges two sorted lists", "removes duplicates from a list", "computes the sum of digits of a number",
               "converts Celsius to Fahrenheit", "implements binary search", "flattens a nested list",
               "counts word frequencies in a text"]
_LANGS = ["Python", "JavaScript", "C", "Rust", "Go"]
_MATH = ["What is {a} plus {b}?", "What is {a} times {b}?", "Solve for x: {a}x + {b} = {c}.",
         "What is {a} percent of {c}?", "A train travels {a} km in {b} hours. What is its average speed?",
         "If I have {a} apples and give away {b}, how many are left?",
         "What is the area of a rectangle with sides {a} and {b}?"]
_CHAT = ["Hi! How are you today?", "Can you recommend a good book?", "Tell me a joke.",
         "What should I cook for dinner tonight?", "Write a short poem about {t}.",
         "Give me a motivational quote.", "How do I make a cup of tea?", "Write a haiku about {t}.",
         "What is your favorite season and why?", "Write a short story about a robot who likes {t}.",
         "Write a polite email asking my manager for a day off.", "How can I learn to play the guitar?"]
_EXPLAIN = ["Explain {t} in simple terms.", "What is {t}?", "Why is {t} important?",
            "Explain {t} to a five year old.", "Give three facts about {t}.", "Summarize how {t} works."]
_LISTS = ["List five {i}.", "Name ten {i}.", "Give me a numbered list of {i}.", "List three {i} and explain each briefly."]


def builtin_prompts(n: int = 400, seed: int = 0) -> list[str]:
    """A mixed set (code, math, lists, explanations, chat) built combinatorially from templates."""
    rng = random.Random(seed)
    groups: list[list[str]] = []
    groups.append([f"Write a {lang} function that {task}." for lang, task in itertools.product(_LANGS, _CODE_TASKS)])
    math = []
    for tpl in _MATH:
        for _ in range(12):
            a, b = rng.randint(2, 99), rng.randint(2, 40)
            math.append(tpl.format(a=a, b=b, c=a * rng.randint(2, 9) + b))
    groups.append(math)
    groups.append([tpl.format(i=i) for tpl, i in itertools.product(_LISTS, _ITEMS)])
    groups.append([tpl.format(t=t) for tpl, t in itertools.product(_EXPLAIN, _TOPICS)])
    groups.append(sorted({tpl.format(t=t) for tpl, t in itertools.product(_CHAT, _TOPICS)}))
    for g in groups:
        rng.shuffle(g)
    # round-robin over the groups so any prefix is mixed
    out: list[str] = []
    for row in itertools.zip_longest(*groups):
        out.extend(p for p in row if p is not None)
    return out[:n]


def load_prompts(path: str) -> list[str]:
    """One prompt per line, or JSONL objects with a "prompt" field (blank lines ignored)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: invalid JSON ({exc})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise ValueError(f"{path}:{n}: a JSONL line needs a string field \"prompt\"")
                if obj["prompt"].strip():
                    prompts.append(obj["prompt"])
            else:
                prompts.append(line)
    if not prompts:
        raise ValueError(f"prompt file {path} contains no prompts")
    return prompts


def chat_wrap(template: str, prompt: str) -> str:
    """Wrap a user prompt in the target's chat template (ChatML detected), else return it as is."""
    if template and "<|im_start|>" in template:
        return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    return prompt
