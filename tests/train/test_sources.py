"""Prompt sources of the mixed data set: stdlib functions, topic seeds, held-out split, dedupe."""

from llama_dflash.train.dataset import question_from_answer
from llama_dflash.train.sources import (CODE_TASKS, Prompt, code_task_prompts, dedupe, held_out, split_by_source,
                                        stdlib_prompts, topic_chat_prompts, topic_seed_prompts)


def test_stdlib_prompts_raw_and_chat(fake_stdlib):
    ps = stdlib_prompts(fake_stdlib)
    assert {p.source for p in ps} == {"stdlib:alpha", "stdlib:beta"}
    raw = [p for p in ps if p.kind == "raw"]
    assert len(raw) == 2
    add = next(p for p in raw if "add_numbers" in p.text)
    # signature + docstring, nothing of the body: the target completes the body
    assert add.text.startswith("def add_numbers(a, b):\n") and add.text.rstrip().endswith('"""')
    assert "return a + b" not in add.text
    area = next(p for p in raw if "area" in p.text)
    assert area.text.startswith("def area(self, w, h):")  # dedented method
    chat = [p.text for p in ps if p.kind == "chat"]
    assert any(t.startswith("Write a Python function `def add_numbers(a, b)`") and "Add two numbers" in t for t in chat)
    assert any(t.startswith("Explain what this Python function does:") and "return a + b" in t for t in chat)
    assert not any("_private" in p.text or "nodoc" in p.text or "skipped" in p.text for p in ps)


def test_split_holds_out_whole_sources():
    ps = [Prompt(f"p{i} {j}", f"topic:t{i}") for i in range(200) for j in range(3)] + [Prompt("b", "builtin")]
    tr, ev = split_by_source(ps, 0.2)
    src_tr, src_ev = {p.source for p in tr}, {p.source for p in ev}
    assert src_tr.isdisjoint(src_ev)
    assert 15 <= len(src_ev) <= 65  # about 20% of 200 sources
    assert "builtin" in src_tr  # never held out
    assert all(len([p for p in ev if p.source == s]) == 3 for s in src_ev)  # whole sources
    # stable, and a different salt gives a different split
    assert split_by_source(ps, 0.2)[1] == ev
    assert {p.source for p in split_by_source(ps, 0.2, salt="x")[1]} != src_ev
    assert not held_out("topic:t1", 0.0)


def test_dedupe_by_kind_and_normalised_text():
    ps = [Prompt("Hello  World", "a"), Prompt("hello world", "b"), Prompt("hello world", "a", "raw"), Prompt("x", "a")]
    out = dedupe(ps)
    assert [(p.text, p.kind) for p in out] == [("Hello  World", "chat"), ("hello world", "raw"), ("x", "chat")]


def test_topic_seeds_and_questions():
    ps = topic_seed_prompts(["bees"])
    assert {p.kind for p in ps} == {"seed", "raw"} and all(p.source == "topic:bees" for p in ps)
    assert question_from_answer('A curious person might ask: "How do bees make honey?"') == "How do bees make honey?"
    assert question_from_answer("Question: Why do bees dance?\n\nMore text") == "Why do bees dance?"
    assert question_from_answer("ok") is None


def test_topic_chat_and_code_task_prompts():
    chat = topic_chat_prompts(["bees", "tea"])
    assert len(chat) == 2 * len({p.text for p in chat if p.source == "topic:bees"})
    assert all(p.kind == "chat" and p.source in ("topic:bees", "topic:tea") for p in chat)
    assert "How does bees work?" in {p.text for p in chat}
    code = code_task_prompts([("gcd(a, b)", "Return the greatest common divisor."), ("class Point:", "A point.")])
    raw = {p.source: p.text for p in code if p.kind == "raw"}
    assert raw["code:gcd"] == 'def gcd(a, b):\n    """Return the greatest common divisor."""\n'
    assert raw["code:Point"].startswith('class Point:\n    """A point."""\n')
    assert {p.source for p in code if p.kind == "chat"} == {"code:gcd", "code:Point"}
    assert len({p.source for p in code_task_prompts()}) == len(CODE_TASKS)  # one source per task


def test_shipped_held_out_bench_prompts_are_in_no_training_source():
    """The bench prompts in llama_dflash/drafts/heldout_*.jsonl check drafts on text they never saw."""
    import json
    from pathlib import Path

    import llama_dflash

    drafts = Path(llama_dflash.__file__).parent / "drafts"
    chat = [json.loads(x)["prompt"] for x in (drafts / "heldout_chat.jsonl").read_text().splitlines() if x.strip()]
    code = [json.loads(x)["prompt"] for x in (drafts / "heldout_code.jsonl").read_text().splitlines() if x.strip()]
    planned = {p.text for p in topic_chat_prompts() + topic_seed_prompts() + code_task_prompts()}
    assert not planned & set(chat + code)
    names = {c.split("(")[0].split(":")[0].split()[-1] for c in code}  # fizzbuzz, merge_intervals, Stack, ...
    assert len(names) == len(code) and not names & {p.source.split(":")[1] for p in code_task_prompts()}
