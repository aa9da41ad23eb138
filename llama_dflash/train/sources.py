"""Prompt sources for self-distillation that are not a handful of templates.

Every prompt carries its source (e.g. `stdlib:json`, `topic:volcanoes`, `builtin:code`) and its
kind: `chat` (wrapped in the target's chat template) or `raw` (plain completion, no template).
Held-out evaluation takes WHOLE sources (`split_by_source`), so a held-out prompt never shares a
module or a topic with the training data.

- stdlib: Python functions with docstrings from the standard library on this machine: the
  signature + docstring as a raw completion prompt, "write a function that <summary>" and
  "explain this function" as chat prompts.
- topics: seeds the target expands itself: "write a question about <topic>" (sampled at T>0; the
  question then becomes a chat prompt, see data.question_from_answer), and raw article openings.
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

__all__ = ["Prompt", "TOPICS", "stdlib_prompts", "topic_seed_prompts", "builtin_source_prompts",
           "split_by_source", "dedupe", "held_out", "question_prompt"]


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
)

_QUESTION = ("Write one question that a curious person might ask an assistant about {t}. "
             "Reply with the question only.")
_TASK = ("Write one short task that a user might ask an assistant to do that involves {t}. "
         "Reply with the task only.")
_RAW_OPENINGS = ("Here is a short article about {t}.\n\n", "{T}\n\nIntroduction\n\n", "Q: What should I know about {t}?\nA:",
                 "Five facts about {t}:\n1.")


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
