"""Built-in prompt sets, and reading a user's prompt file (text: one prompt per line; or JSONL).

A prompt is a string (one user turn) or, in the copy-heavy sets' multi-turn chats, a tuple of
turns alternating user / assistant and ending with a user turn (`copy_workloads.messages`); the
bench formats either with the model's chat template (`bench.cli.chat_wrap`) into one string.
"""

from __future__ import annotations

import json
import os

from .copy_workloads import CONTROL_WORKLOAD, COPY_HEAVY, COPY_HEAVY_HELDOUT, Prompt

__all__ = ["WORKLOADS", "WORKLOAD_HELP", "Prompt", "load_prompt_file", "workload_prompts"]


def _copy_tasks(sets: dict[str, list[Prompt]]) -> list[Prompt]:
    """Every copy-heavy category's prompts in one list, the open-chat control left out (the
    "low-repetition" workload is the control here)."""
    return [p for category, prompts in sets.items() if category != CONTROL_WORKLOAD for p in prompts]


#: Our own prompts.  "structured": code, lists, math, formatted answers (drafts tend to do well);
#: "low-repetition": open prose and chat (drafts tend to do poorly); "copy-heavy": answers that
#: copy from the prompt (edit a given function, reformat JSON/CSV as YAML/Markdown, repeat a
#: paragraph with small changes, quote a document, repeat an earlier turn of a multi-turn chat):
#: the lookup/n-gram drafters' home ground; "copy-heavy-heldout": the same categories, other
#: texts (the lookup's defaults were tuned on "copy-heavy", this set is for the final check).
WORKLOADS: dict[str, list[Prompt]] = {
    "structured": [
        "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and three doctests.",
        "List the planets of the solar system in order from the Sun, one per line, with their number of moons.",
        "Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed in km/h and in m/s?",
        "Write a JSON object describing a book with the fields title, author, year, isbn and a list of three tags.",
        "Convert this list into a Markdown table with columns Name and Age: Alice 31, Bob 27, Carol 45, Dan 38.",
        "Write a SQL query that selects the ten customers with the highest total order value from tables customers and orders.",
    ],
    "low-repetition": [
        "Tell me a short story about a lighthouse keeper who finds an unexpected visitor one stormy night.",
        "What do you think makes a city pleasant to live in? Share your opinion in a few paragraphs.",
        "Describe the smell and sounds of a busy market on a summer morning.",
        "I feel unmotivated to study today. Can you talk with me about it and suggest something gentle?",
        "Write a letter to a friend you have not seen in ten years, telling them what has changed in your life.",
        "Imagine you are an old oak tree. Describe the last hundred years from your point of view.",
    ],
    "copy-heavy": _copy_tasks(COPY_HEAVY),
    "copy-heavy-heldout": _copy_tasks(COPY_HEAVY_HELDOUT),
}

#: One line per workload, for --help and listings.
WORKLOAD_HELP: dict[str, str] = {
    "structured": "code, lists, math, formatted answers",
    "low-repetition": "open prose and chat",
    "copy-heavy": "answers that copy from the prompt: edit a function, reformat JSON/CSV, repeat with small "
                  "changes, quote a document, repeat an earlier chat turn (multi-turn)",
    "copy-heavy-heldout": "the copy-heavy categories on other texts (held out from tuning)",
}


def workload_prompts(name: str) -> list[Prompt]:
    try:
        return list(WORKLOADS[name])
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}") from None


def load_prompt_file(path: str) -> list[str]:
    """Prompts from a text file (one per non-empty line) or JSONL (objects with "prompt" or strings)."""
    if not os.path.isfile(path):
        raise ValueError(f"--prompt-file {path}: no such file")
    with open(path, encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    prompts: list[str] = []
    for i, line in enumerate(lines, 1):
        if line.startswith("{") or line.startswith('"'):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--prompt-file {path}: line {i} is not valid JSON ({exc.msg})") from None
            text = obj.get("prompt") if isinstance(obj, dict) else obj
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"--prompt-file {path}: line {i} has no non-empty \"prompt\" string")
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"--prompt-file {path}: contains no prompts")
    return prompts
