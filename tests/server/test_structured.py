"""Structured output, tools, usage chunks and timings (issue 42), on the tiny fixtures in-process:
the schema -> grammar converter, the envelope reader, the history rendering, and the app."""

from __future__ import annotations

import json
import random

import llama_cpp
import pytest

pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")
from starlette.testclient import TestClient  # noqa: E402

from llama_dflash.config import SpecConfig  # noqa: E402
from llama_dflash.highlevel import Llama, _check_grammar  # noqa: E402
from llama_dflash.server.app import create_app  # noqa: E402
from llama_dflash.server.envelope import EnvelopeReader  # noqa: E402
from llama_dflash.server.json_grammar import SchemaError, check_schema, schema_grammar  # noqa: E402
from llama_dflash.server.tools import ToolPlan, history  # noqa: E402

KW = dict(logits_all=True, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, flash_attn=True)
MSG = [{"role": "user", "content": "the dog"}]


# ---- schema -> grammar ------------------------------------------------------------------------------
def _parses(text, vocab):
    _check_grammar(llama_cpp.LlamaGrammar.from_string(text, verbose=False), vocab)


def test_long_strings_and_arrays_use_gbnf_repetition(spec_llm):
    """llama-cpp-python's converter nests one group per allowed character: maxLength 100 nested
    100 deep, past llama.cpp's limits (a 400 for an ordinary pydantic `max_length=100`)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 100},
                                               "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 200}},
              "required": ["s", "a"]}
    text = schema_grammar(schema)
    assert "char{2,100}" in text and '("," space integer){0,199}' in text
    _parses(text, spec_llm._model.vocab)


def test_strings_admit_no_raw_control_characters():
    """A raw newline inside a JSON string is not JSON: the reference converter's char rule admits it."""
    text = schema_grammar({"type": "object", "properties": {"s": {"type": "string"}}})
    char = next(line for line in text.splitlines() if line.startswith("char ::="))
    assert r"\x00-\x1F" in char


def test_refs_of_two_documents_do_not_share_rules():
    """The reference converter names a `$ref` rule after its last segment: the second tool's
    `#/$defs/Item` would reuse the first tool's rule."""
    def doc(kind):
        return {"$defs": {"Item": {"type": "object", "properties": {"v": {"type": kind}}, "required": ["v"]}},
                "type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"]}

    tools = [{"type": "function", "function": {"name": n, "parameters": doc(k)}}
             for n, k in (("a", "integer"), ("b", "boolean"))]
    rules = dict(line.split(" ::= ", 1) for line in ToolPlan.build(tools, "required", None).grammar.splitlines())

    def value_of(tool):  # the type of property v of the Item that this tool's x refers to
        item = rules[f"{tool}-arguments-x"]
        kv = rules[item].split()[2]  # '"{" space <v-kv> "}" space'
        return rules[kv].split()[-1]

    assert (value_of("tool0"), value_of("tool1")) == ("integer", "boolean")


@pytest.mark.parametrize("schema, strict, words", [
    ({"type": "string", "maxLength": 5000}, False, "maxLength 5000"),
    ({"type": "string", "pattern": "^a{1,99999}$"}, False, "pattern repeats"),
    ({"type": "integer", "minimum": 3}, True, "'minimum'"),
    ({"properties": {"a": {"type": "object", "properties": {"b": {"multipleOf": 2}}}}}, True, "'multipleOf'"),
    ({"type": "object", "required": "a"}, False, "not a valid JSON Schema"),
    ([1, 2], False, "JSON Schema object"),
])
def test_schema_checks(schema, strict, words):
    with pytest.raises(SchemaError, match=words):
        check_schema(schema, "s", strict=strict)


def test_unenforced_keywords_pass_without_strict():
    check_schema({"type": "integer", "minimum": 3}, "s", strict=False)
    check_schema({"type": "object", "properties": {"minimum": {"type": "string"}}}, "s", strict=True)  # a name


# ---- the envelope reader ------------------------------------------------------------------------------
def _read(text, rng):
    reader, events = EnvelopeReader(), []
    i = 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += reader.feed(text[i:i + n])
        i += n
    return reader, events


def test_envelope_pieces_add_up_whatever_the_chunking():
    rng = random.Random(0)
    calls = [{"name": "get_weather", "arguments": {"city": "Pa\"ris \u00e9\U0001F600", "days": [1, 2.5e3, None]}},
             {"name": "get_time", "arguments": {}}]
    text = json.dumps({"tool_calls": calls})
    for _ in range(20):
        reader, events = _read(text, rng)
        assert reader.done and not reader.broken and reader.content is None
        assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [(c["name"], c["arguments"]) for c in calls]
        args = {}
        for ev in events:
            if ev[0] == "arguments":
                args[ev[1]] = args.get(ev[1], "") + ev[2]
        assert [args[i] for i in range(2)] == [c.arguments for c in reader.calls]
        names = [ev for ev in events if ev[0] == "name"]
        assert names == [("name", 0, "get_weather"), ("name", 1, "get_time")]
    answer = "line one\nline \"two\" \\ \u00e9\U0001F600"
    for doc in ({"response": answer}, {"response": ""}):
        reader, events = _read(json.dumps(doc), rng)
        assert reader.content == doc["response"] == "".join(ev[1] for ev in events if ev[0] == "content")
    reader, _ = _read('{"response": {"a": [1, 2]} }', rng)
    assert json.loads(reader.content) == {"a": [1, 2]}
    reader, _ = _read('{"response": 42}', rng)
    assert reader.content == "42"


def test_a_truncated_envelope_keeps_what_was_written():
    reader = EnvelopeReader()
    reader.feed('{"tool_calls": [{"name": "f", "arguments": {"a": "x')
    assert not reader.done and [(c.name, c.arguments) for c in reader.calls] == [("f", '{"a": "x')]
    reader = EnvelopeReader()
    reader.feed("plain words")
    assert reader.broken and reader.calls == [] and reader.content is None


# ---- the history --------------------------------------------------------------------------------------
def test_history_writes_calls_and_results_as_text():
    msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}},
                {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12C"},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"}]
    out = history(msgs)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}},
                                                            {"name": "t", "arguments": "not json"}]}
    lines = out[3]["content"].splitlines()
    assert lines[0] == "Tool results:" and [json.loads(x)["name"] for x in lines[1:]] == ["w", "t"]
    assert all(isinstance(m["content"], str) for m in out)


# ---- the app ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spec_llm(tiny_target, tiny_draft):
    llm = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), **KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def plain_llm(tiny_target):
    llm = Llama(tiny_target, **KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def clients(spec_llm, plain_llm):
    with TestClient(create_app(spec_llm)) as spec, TestClient(create_app(plain_llm)) as plain:
        yield spec, plain


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}


@pytest.mark.parametrize("fmt", [{"type": "json_object"},
                                 {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}])
def test_json_under_speculation_equals_plain_and_rejects_forbidden_drafts(clients, fmt):
    spec, plain = clients
    body = {"messages": MSG, "max_tokens": 24, "temperature": 0, "response_format": fmt}
    got, ref = spec.post("/v1/chat/completions", json=body).json(), plain.post("/v1/chat/completions", json=body).json()
    text = got["choices"][0]["message"]["content"]
    assert text == ref["choices"][0]["message"]["content"]
    t = got["timings"]
    assert t["draft_n"] > t["draft_n_accepted"]  # the random draft's proposals: most forbidden, none emitted
    if got["choices"][0]["finish_reason"] == "stop":
        value = json.loads(text)
        jsonschema.validate(value, fmt.get("json_schema", {}).get("schema", {"type": "object"}))
    free = spec.post("/v1/chat/completions", json={**body, "response_format": {"type": "text"}}).json()
    assert free["choices"][0]["message"]["content"] != text  # the grammar was what shaped it


def test_timings_and_usage_chunk_in_streams(clients):
    spec, _ = clients
    for path, body in (("/v1/completions", {"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}),
                       ("/v1/chat/completions", {"messages": MSG, "max_tokens": 12, "temperature": 0})):
        whole = spec.post(path, json=body).json()
        assert set(whole["timings"]) >= {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                                         "predicted_n", "predicted_ms", "predicted_per_token_ms",
                                         "predicted_per_second", "draft_n", "draft_n_accepted"}
        assert whole["timings"]["draft_n"] == whole["speculative"]["drafted"] > 0
        r = spec.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        *chunks, last = events
        assert last["choices"] == [] and last["usage"] == whole["usage"]
        assert chunks[-1]["choices"][0]["finish_reason"] and "timings" in chunks[-1]
        assert all(c["usage"] is None for c in chunks)
        r = spec.post(path, json={**body, "stream": True})
        plain_events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert all("usage" not in c for c in plain_events) and "timings" in plain_events[-1]


def test_tool_calls_streamed_equal_whole(clients):
    spec, plain = clients
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"w": {"enum": ["the", "dog"]}}, "required": ["w"]}}}
    body = {"messages": MSG, "max_tokens": 60, "temperature": 0, "tools": [tool], "tool_choice": "required",
            "parallel_tool_calls": False}
    whole = spec.post("/v1/chat/completions", json=body).json()
    ref = plain.post("/v1/chat/completions", json=body).json()
    calls = whole["choices"][0]["message"]["tool_calls"]
    assert [c["function"] for c in calls] == [c["function"] for c in ref["choices"][0]["message"]["tool_calls"]]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "pick"
    if whole["choices"][0]["finish_reason"] == "tool_calls":
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), tool["function"]["parameters"])
    r = spec.post("/v1/chat/completions", json={**body, "stream": True})
    deltas = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    parts = [d["choices"][0]["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["choices"][0]["delta"]]
    assert parts[0]["function"]["name"] == "pick" and parts[0]["id"].startswith("call_")
    assert "".join(p["function"]["arguments"] for p in parts) == calls[0]["function"]["arguments"]
    assert deltas[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_props_and_slots(clients):
    spec, _ = clients
    props = spec.get("/props").json()
    assert props["total_slots"] == 1 and props["default_generation_settings"]["speculative"] is True
    assert spec.get("/slots").json() == [{"id": 0, "n_ctx": 512, "speculative": True, "is_processing": False}]
