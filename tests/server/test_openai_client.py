"""The official `openai` client against live `llama-dflash serve` processes on loopback (issue 42).

SmolLM2 with its shipped draft, served one request at a time (`auto` over the draft) and with
`--parallel 2` (the batched engine; grammar requests beside it), each compared with the same
request to a server that does not speculate (`--spec-type none`): greedy answers must be equal.
Sync, async, streaming with `include_usage`, structured output through the client's `parse`
helper with a pydantic model, and a tool-calling round trip.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("fastapi")
from pydantic import BaseModel  # noqa: E402

from llama_dflash.defaults import DefaultModelMissing, default_draft_path, smollm2_path  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "openai-client-key"
MAX_TOKENS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `llama-dflash serve` process and clients for it."""

    def __init__(self, *flags: str):
        try:
            model = smollm2_path()
        except DefaultModelMissing as exc:  # pragma: no cover - `make test` installs it
            pytest.skip(str(exc))
        self.port = _free_port()
        cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--model", model, "--port", str(self.port),
               "--api-key", KEY, "--n-ctx", "1024", "--n-batch", "256", "--n-threads", "1", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=120)

    def wait(self) -> "Server":
        import urllib.request

        for _ in range(1200):
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stdout.read().decode(errors="replace"))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def aclient(self) -> "openai.AsyncOpenAI":
        return openai.AsyncOpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=120)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.returncode in (0, -15), self.proc.stdout.read().decode(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def servers():
    draft = default_draft_path(smollm2_path())
    # a fixed draft length: every step drafts (auto could find drafting does not pay on this CPU)
    started = {"plain": Server("--spec-type", "none"),
               "spec": Server("--draft-model", draft, "--spec-type", "draft-dspark", "--draft-n-max", "3"),
               "batch": Server("--draft-model", draft, "--parallel", "2", "--draft-n-max", "3")}
    try:
        yield {k: s.wait() for k, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module", params=["spec", "batch"])
def pair(request, servers):
    """(the speculating server, the plain one)."""
    return servers[request.param], servers["plain"]


MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


def _extra(obj, name):
    return (obj.model_extra or {}).get(name)


def test_sync_chat_and_completion_equal_plain(pair):
    spec, plain = pair
    got = spec.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    ref = plain.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert got.choices[0].message.content == ref.choices[0].message.content
    assert got.usage.completion_tokens == ref.usage.completion_tokens
    timings = _extra(got, "timings")
    assert timings["predicted_n"] >= got.usage.completion_tokens and timings["predicted_per_second"] > 0
    assert timings["draft_n"] == _extra(got, "speculative")["drafted"]
    assert _extra(ref, "timings")["draft_n"] == 0
    got = spec.client.completions.create(model="x", prompt="The capital of France is", max_tokens=12, temperature=0)
    ref = plain.client.completions.create(model="x", prompt="The capital of France is", max_tokens=12, temperature=0)
    assert got.choices[0].text == ref.choices[0].text and _extra(got, "timings")["prompt_n"] >= 1


def test_async_concurrent_chats_equal_plain(pair):
    spec, plain = pair
    prompts = ["Name a color.", "Name a fruit."]
    ref = [plain.client.chat.completions.create(model="x", messages=[{"role": "user", "content": p}],
                                                max_tokens=16, temperature=0).choices[0].message.content
           for p in prompts]

    async def run():
        async with spec.aclient() as client:
            replies = await asyncio.gather(*[client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": p}], max_tokens=16, temperature=0) for p in prompts])
        return [r.choices[0].message.content for r in replies]

    assert asyncio.run(run()) == ref


def test_stream_with_usage_equals_plain(pair):
    spec, plain = pair
    ref = plain.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    chunks = list(spec.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (ref.usage.prompt_tokens,
                                                                        ref.usage.completion_tokens)
    finish = chunks[-2]
    assert finish.choices[0].finish_reason == ref.choices[0].finish_reason
    assert _extra(finish, "timings")["predicted_n"] >= ref.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


class City(BaseModel):
    name: str
    country: str


def test_structured_output_with_parse(pair):
    spec, plain = pair
    messages = [{"role": "user", "content": "Give the capital of Italy as JSON with its name and country."}]
    got = spec.client.chat.completions.parse(model="x", messages=messages, response_format=City, max_tokens=64,
                                             temperature=0)
    ref = plain.client.chat.completions.parse(model="x", messages=messages, response_format=City, max_tokens=64,
                                              temperature=0)
    city = got.choices[0].message.parsed
    assert isinstance(city, City) and city.name
    jsonschema.validate(json.loads(got.choices[0].message.content), City.model_json_schema())
    assert got.choices[0].message.content == ref.choices[0].message.content
    timings = _extra(got, "timings")
    assert timings["draft_n"] > 0  # drafted under the grammar: what it forbade was rejected, not emitted


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _ask(server, messages, **kw):
    return server.client.chat.completions.create(model="x", messages=messages, tools=[WEATHER, TIME],
                                                 temperature=0, max_tokens=48, **kw)


def test_tool_call_round_trip(pair):
    spec, plain = pair
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    got = _ask(spec, messages, tool_choice="required")
    ref = _ask(plain, messages, tool_choice="required")
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in ref.choices[0].message.tool_calls]
    for c in calls:
        tool = WEATHER if c.function.name == "get_weather" else TIME
        jsonschema.validate(json.loads(c.function.arguments), tool["function"]["parameters"])
    # the same call streamed: deltas that add up to the same calls
    chunks = list(spec.client.chat.completions.create(model="x", messages=messages, tools=[WEATHER, TIME],
                                                      tool_choice="required", temperature=0, max_tokens=48,
                                                      stream=True))
    streamed: dict[int, list] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = streamed.setdefault(d.index, [None, ""])
            if d.function.name:
                entry[0] = d.function.name
            entry[1] += d.function.arguments or ""
    assert [tuple(v) for _, v in sorted(streamed.items())] == [(c.function.name, c.function.arguments) for c in calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the round trip: the answer's message and a result per call go back; the model answers in words
    history = messages + [choice.message.model_dump(exclude_none=True)]
    history += [{"role": "tool", "tool_call_id": c.id, "content": '{"temperature_c": 21, "sky": "clear"}'}
                for c in calls]
    final = _ask(spec, history, tool_choice="auto", parallel_tool_calls=False)
    ref_history = messages + [ref.choices[0].message.model_dump(exclude_none=True)]
    ref_history += [{"role": "tool", "tool_call_id": c.id, "content": '{"temperature_c": 21, "sky": "clear"}'}
                    for c in ref.choices[0].message.tool_calls]
    ref_final = _ask(plain, ref_history, tool_choice="auto", parallel_tool_calls=False)
    msg, ref_msg = final.choices[0].message, ref_final.choices[0].message
    assert (msg.content, [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]) == \
        (ref_msg.content, [(c.function.name, c.function.arguments) for c in ref_msg.tool_calls or []])
    assert msg.content or msg.tool_calls
    named = _ask(spec, messages, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"]


def test_bad_input_is_openai_400_and_the_server_answers_the_same(pair):
    spec, _ = pair
    before = spec.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=8, temperature=0)
    with pytest.raises(openai.BadRequestError) as err:
        _ask(spec, MESSAGES, tool_choice={"type": "function", "function": {"name": "get_stock_price"}})
    assert err.value.body["param"] == "tool_choice"
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}
    with pytest.raises(openai.BadRequestError) as err:
        spec.client.chat.completions.create(model="x", messages=MESSAGES, tools=[bad_tool])
    assert err.value.body["param"] == "tools.0.function.parameters"
    with pytest.raises(openai.BadRequestError) as err:
        spec.client.chat.completions.create(model="x", messages=MESSAGES, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "a+"}}})
    assert err.value.body["param"] == "response_format"
    after = spec.client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=8, temperature=0)
    assert after.choices[0].message.content == before.choices[0].message.content


def test_props_and_slots(servers):
    import urllib.request

    for name, slots in (("spec", 1), ("batch", 2)):
        s = servers[name]
        req = urllib.request.Request(f"http://127.0.0.1:{s.port}/props", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            props = json.loads(r.read())
        assert props["total_slots"] == slots and props["default_generation_settings"]["speculative"] is True
        assert "im_start" in props["chat_template"]
        req = urllib.request.Request(f"http://127.0.0.1:{s.port}/slots", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert [x["id"] for x in json.loads(r.read())] == list(range(slots))
