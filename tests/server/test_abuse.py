"""HTTP abuse suite (issue 13), in process with FastAPI's TestClient on the tiny fixtures.

Every bad request gets a 4xx with an OpenAI-style error body; after each one the server still
answers /health and gives the same greedy output as ordinary decoding.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from llama_dflash.config import SpecConfig  # noqa: E402
from llama_dflash.highlevel import Llama  # noqa: E402
from llama_dflash.server.app import create_app  # noqa: E402
from llama_dflash.server.guard import loopback_hosts  # noqa: E402

KEY = "abuse-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECK = {"prompt": "the quick brown fox", "max_tokens": 8, "temperature": 0}
MAX_BODY = 64 * 1024
CAP = 64
MSG = [{"role": "user", "content": "hi"}]
GBNF = 'root ::= ("the" | "a" | "dog") (" " ("the" | "a" | "dog"))*'


@pytest.fixture(scope="module")
def llm(tiny_target, tiny_draft):
    model = Llama(tiny_target, speculative=SpecConfig(tiny_draft, draft_n_max=4), logits_all=True, n_ctx=256, n_batch=64,
                  n_ubatch=64, n_threads=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def client(llm):
    app = create_app(llm, api_key=KEY, max_body_bytes=MAX_BODY, max_tokens_cap=CAP)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def expected(tiny_target):
    ref = Llama(tiny_target, logits_all=True, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        yield ref.create_completion(CHECK["prompt"], max_tokens=8, temperature=0)["choices"][0]["text"]
    finally:
        ref.close()


def _raw(client, path, text, content_type="application/json", headers=None):
    return client.post(path, content=text, headers={**AUTH, "Content-Type": content_type, **(headers or {})})


def _assert_error(r, status, param=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    if param is not None:
        assert err["param"] == param or err["param"].startswith(param + "."), err
    return err


def _assert_still_fine(client, expected):
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/v1/completions", json=CHECK, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected


def _tool(name, parameters):
    fn = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": fn}


#: JSON Schemas (valid or not) that no grammar can express here
UNGRAMMATICAL = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "a+"}}},  # unanchored
    {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9},
    {"type": "wat"},
    {"$ref": "#/$defs/missing"},
    {"$ref": "https://example.com/schema.json"},  # never fetched
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},  # left recursion: llama.cpp's parser refuses it
    {"type": "object", "properties": {"a": True}},
    {"enum": [f"value-{i:05d}" for i in range(3600)]},  # a grammar longer than the limit
]


COMPLETION_BODIES = [
    # item 1: non-finite or out-of-range penalties with a grammar (NaN logits killed the process)
    ('{"prompt": "the", "max_tokens": 8, "grammar": %s, "presence_penalty": NaN}' % json.dumps(GBNF), None),
    ('{"prompt": "the", "max_tokens": 8, "grammar": %s, "frequency_penalty": -1e999}' % json.dumps(GBNF), None),
    ('{"prompt": "the", "max_tokens": 8, "grammar": %s, "frequency_penalty": Infinity}' % json.dumps(GBNF), None),
    ({"prompt": "the", "max_tokens": 8, "grammar": GBNF, "frequency_penalty": -1e30}, "frequency_penalty"),
    ({"prompt": "the", "max_tokens": 8, "grammar": GBNF, "repeat_penalty": 0}, "repeat_penalty"),
    # item 1: a grammar that overflows llama.cpp's recursive parser
    ({"prompt": "the", "max_tokens": 4, "grammar": "root ::= " + "(" * 30000 + '"a"' + ")" * 30000}, "grammar"),
    ({"prompt": "the", "max_tokens": 4, "grammar": 'root ::= "a"{999999999}'}, "grammar"),
    # item 2: a seed that is not an integer used to poison every later request
    ({"prompt": "the", "max_tokens": 2, "seed": [1, 2]}, "seed"),
    ({"prompt": "the", "max_tokens": 2, "seed": "1"}, "seed"),
    ({"prompt": "the", "max_tokens": 2, "seed": 1.5}, "seed"),
    ({"prompt": "the", "max_tokens": 2, "seed": 2**70}, "seed"),
    # item 4: wrong types and values
    ({"prompt": "the", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": "the", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"prompt": "the", "logit_bias": {"-1": 1}}, "logit_bias"),
    ({"prompt": "the", "logit_bias": {"1": 1000}}, "logit_bias.1"),
    ({"prompt": "the", "logit_bias": {str(i): 1 for i in range(2000)}}, "logit_bias"),
    ({"prompt": "the", "max_tokens": "10"}, "max_tokens"),
    ({"prompt": "the", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "the", "max_tokens": CAP + 1}, "max_tokens"),
    ('{"prompt": "the", "top_k": 1e999}', None),
    ({"prompt": "the", "top_k": 1.5}, "top_k"),
    ({"prompt": "the", "top_k": -3}, "top_k"),
    ({"prompt": None}, "prompt"),
    ({"max_tokens": 2}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "the", "stop": [5]}, "stop"),
    ({"prompt": "the", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "the", "stop": 5}, "stop"),
    ({"prompt": "the", "logprobs": 21}, "logprobs"),
    ({"prompt": "the", "logprobs": True}, "logprobs"),
    ({"prompt": "the", "stream": "false"}, "stream"),
    ({"prompt": "the", "stream": 0}, "stream"),
    ({"prompt": "the", "echo": "yes"}, "echo"),
    ({"prompt": "the", "temperature": 2.5}, "temperature"),
    ({"prompt": "the", "temperature": "0"}, "temperature"),
    ({"prompt": "the", "top_p": 0}, "top_p"),
    ({"prompt": "the", "min_p": 1.5}, "min_p"),
    ({"prompt": "the", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "the", "grammar": 5}, "grammar"),
    ({"prompt": "the", "grammar": ""}, "grammar"),
    # item 4: unsupported OpenAI fields and unknown fields are named, not ignored
    ({"prompt": "the", "n": 2}, "n"),
    ({"prompt": "the", "best_of": 3}, "best_of"),
    ({"prompt": "the", "response_format": {"type": "json_schema"}}, "response_format"),
    ({"prompt": "the", "response_format": {"type": "xml"}}, "response_format"),
    ({"prompt": "the", "tools": []}, "tools"),
    ({"prompt": "the", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "the", "mirostat_mode": 2}, "mirostat_mode"),
    ({"prompt": "the", "frobnicate": 1}, "frobnicate"),
    # item 4: bodies that are not a JSON object, or nested without end
    ("[1, 2]", None),
    ("not json", None),
    ('{"prompt": "the"', None),
    (b'\xff\xfe', None),
    ('{"prompt": ' + "[" * 30000 + "]" * 30000 + "}", None),
    ('{"prompt": "the", "logit_bias": ' + '{"1": ' * 40 + "1" + "}" * 40 + "}", None),
]


@pytest.mark.parametrize("body, param", COMPLETION_BODIES, ids=range(len(COMPLETION_BODIES)))
def test_bad_completion_requests_are_400(client, expected, body, param):
    if isinstance(body, dict):
        r = client.post("/v1/completions", json=body, headers=AUTH)
    else:
        r = _raw(client, "/v1/completions", body)
    err = _assert_error(r, 400, param)
    assert err["type"] == "invalid_request_error"
    _assert_still_fine(client, expected)


CHAT_BODIES = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0.tool_calls"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "logprobs": 3}, "logprobs"),
    ({"messages": MSG, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": MSG, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MSG, "functions": []}, "functions"),
    # issue 42 item 6: schemas that cannot become a grammar, tools that are not JSON Schema, unknown
    # tool choices -- each a 400 naming the field, the server answering identically afterwards
    *[({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
       "response_format") for schema in UNGRAMMATICAL],
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "integer", "minimum": 1}}}}, "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_object", "schema": {"type": "wat"}}}, "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_object"}, "grammar": GBNF}, None),
    ({"messages": MSG, "tools": [_tool("f", {"type": "object", "properties": {"a": {"type": "wat"}}})]},
     "tools.0.function.parameters"),
    ({"messages": MSG, "tools": [_tool("f", {"type": "object", "required": "a"})]}, "tools.0.function.parameters"),
    ({"messages": MSG, "tools": [_tool("f", {"type": "string", "pattern": "a+"})]}, "tools"),
    ({"messages": MSG, "tools": [_tool("f", {"type": "object", "properties": {"a": {"type": "string",
                                                                                     "maxLength": 10**12}}})]},
     "tools.0.function.parameters"),
    ({"messages": MSG, "tools": [_tool("f b", None)]}, "tools.0.function.name"),
    ({"messages": MSG, "tools": [_tool("f", None), _tool("f", None)]}, "tools.1.function.name"),
    ({"messages": MSG, "tools": [_tool("f", None)], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    ({"messages": MSG, "tools": [_tool("f", None)], "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": MSG, "tool_choice": "required"}, "tool_choice"),
    ({"messages": MSG, "tools": [_tool("f", None)], "grammar": GBNF}, "grammar"),
    ({"messages": MSG, "tools": [_tool("f", None)], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages.0"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                          "function": {"name": "f"}}]}]},
     "messages.0.tool_calls.0.function.arguments"),
    ({"messages": MSG, "stream": True, "stream_options": {"include_usage": True, "shout": 1}},
     "stream_options.shout"),
    ({"messages": MSG, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"messages": MSG, "n": 3}, "n"),
    ({"messages": MSG, "max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"messages": MSG, "max_completion_tokens": CAP + 1}, "max_completion_tokens"),
    ({"messages": MSG, "stream": "true"}, "stream"),
]


@pytest.mark.parametrize("body, param", CHAT_BODIES, ids=range(len(CHAT_BODIES)))
def test_bad_chat_requests_are_400(client, expected, body, param):
    _assert_error(client.post("/v1/chat/completions", json=body, headers=AUTH), 400, param)
    _assert_still_fine(client, expected)


def test_content_type_must_be_json(client, expected):
    body = json.dumps(CHECK)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        _assert_error(_raw(client, "/v1/completions", body, content_type=ctype), 415)
    assert _raw(client, "/v1/completions", body, content_type="application/json; charset=utf-8").status_code == 200
    _assert_still_fine(client, expected)


def test_body_size_limit(client, expected):
    big = json.dumps({"prompt": "a " * MAX_BODY})
    _assert_error(_raw(client, "/v1/completions", big), 413)

    def chunks():  # no Content-Length: the limit holds while the body is read
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"a" * 1024
        yield b'"}'

    _assert_error(client.post("/v1/completions", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}),
                  413)
    _assert_still_fine(client, expected)


def test_key_required_everywhere_but_health(client):
    assert client.get("/health").status_code == 200
    for method, path in (("GET", "/metrics"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/redoc"),
                         ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/nowhere")):
        _assert_error(client.request(method, path), 401)
        _assert_error(client.request(method, path, headers={"Authorization": "Bearer wrong"}), 401)
    for path in ("/docs", "/openapi.json", "/nowhere"):  # no interactive docs at all; 404 in OpenAI's shape
        _assert_error(client.get(path, headers=AUTH), 404)
    assert client.get("/metrics", headers={"x-api-key": KEY}).status_code == 200


def test_empty_api_key_refused(llm):
    for key in ("", "   "):
        with pytest.raises(ValueError, match="empty"):
            create_app(llm, api_key=key)


def test_host_check_on_loopback(llm, expected):
    app = create_app(llm, allowed_hosts=loopback_hosts(8000))
    with TestClient(app, base_url="http://localhost:8000") as c:
        assert c.post("/v1/completions", json=CHECK).json()["choices"][0]["text"] == expected
        for host in ("127.0.0.1:8000", "[::1]:8000", "localhost"):
            assert c.get("/health", headers={"Host": host}).status_code == 200
        for host in ("evil.example:8000", "localhost:9999", "localhost.evil.example", "127.0.0.1.nip.io:8000"):
            _assert_error(c.post("/v1/completions", json=CHECK, headers={"Host": host}), 421)


def test_model_named_by_file_name(client, llm):
    name = llm.model_path.rsplit("/", 1)[-1]
    assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == name
    r = client.post("/v1/completions", json=CHECK, headers=AUTH)
    assert r.json()["model"] == name
    with client.stream("POST", "/v1/completions", json=dict(CHECK, stream=True), headers=AUTH) as s:
        text = "".join(s.iter_text())
    assert "/" not in json.loads(text.split("data: ", 2)[1].split("\n")[0])["model"]
    assert llm.model_path not in text and llm.model_path not in r.text


def test_max_tokens_zero_generates_nothing(client, llm):
    r = client.post("/v1/completions", json={"prompt": "the quick", "max_tokens": 0}, headers=AUTH)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["choices"][0]["text"] == "" and data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 0
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 0}, headers=AUTH)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0


def test_default_max_tokens_is_capped(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "temperature": 0.9, "seed": 3,
                                                  "logit_bias": {"0": -100}}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= CAP


def test_stream_errors_before_the_first_byte_are_4xx(client, expected):
    too_long = {"prompt": "a " * 400, "max_tokens": 4, "stream": True}  # > n_ctx: found when the stream starts
    _assert_error(client.post("/v1/completions", json=too_long, headers=AUTH), 400)
    bad_grammar = {"prompt": "the", "max_tokens": 4, "stream": True, "grammar": "root ::= ("}
    _assert_error(client.post("/v1/completions", json=bad_grammar, headers=AUTH), 400)
    _assert_still_fine(client, expected)


def test_accepted_forms(client, expected):
    """What the schemas accept besides the basics: token prompts, content parts, n=1, text format."""
    ids = client.app.state.llm.tokenize(CHECK["prompt"].encode())
    r = client.post("/v1/completions", json=dict(CHECK, prompt=ids, n=1, best_of=1, seed=-1, user="u",
                                                  model="anything", response_format={"type": "text"}),
                    headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    a = client.post("/v1/chat/completions", json={"messages": parts, "max_completion_tokens": 6, "temperature": 0},
                    headers=AUTH)
    b = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 6, "temperature": 0}, headers=AUTH)
    assert a.status_code == 200 and a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]
