"""The chat page and the request extensions behind it (issue 43, item 3), in-process on the rigged
qwen35 fixture: `token_origins` marks each token (accepted draft and its speculator, or the
target's own) in answers and stream chunks; `speculative: false` decodes ordinarily on the same
model; requests without them see nothing new; `/` serves a self-contained page."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from llama_dflash.config import SpecConfig  # noqa: E402
from llama_dflash.highlevel import Llama  # noqa: E402
from llama_dflash.server.app import create_app  # noqa: E402
from llama_dflash.testing.drafts import write_rigged_draft  # noqa: E402
from llama_dflash.testing.targets import write_target  # noqa: E402

BODY = {"prompt": "the quick brown fox and the lazy dog is", "max_tokens": 24, "temperature": 0}
KEY = "page-key"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("page")
    fx = write_target(str(d / "qwen35.gguf"), "qwen35")
    draft = write_rigged_draft(str(d / "dspark.gguf"), fx, "dspark")
    llm = Llama(fx.path, speculative=SpecConfig(draft, draft_n_max=4), logits_all=True, n_ctx=512, n_batch=64,
                n_ubatch=64, n_threads=2, flash_attn=True, verbose=False)
    with TestClient(create_app(llm, api_key=KEY, close_model_on_shutdown=True)) as c:
        c.headers["Authorization"] = f"Bearer {KEY}"
        yield c


def _stream(client, body):
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]


def test_answers_carry_origins_only_when_asked(client):
    plain = client.post("/v1/completions", json=BODY).json()
    assert "token_origins" not in plain
    marked = client.post("/v1/completions", json={**BODY, "token_origins": True}).json()
    assert marked["choices"] == plain["choices"]  # the same answer
    origins = marked["token_origins"]
    assert "".join(o["text"] for o in origins) == marked["choices"][0]["text"]
    drafts = [o for o in origins if o["origin"] != "target"]
    assert drafts and {o["origin"] for o in drafts} == {"draft-dspark"}
    assert all(o["depth"] >= 1 for o in drafts) and all("drafted" in o for o in origins if o["origin"] == "target")
    assert origins[0]["origin"] == "target"  # the first token follows the prompt: no draft yet
    # the answer's statistics count every step but the last (its verdict comes with the next draft)
    assert len(drafts) >= marked["speculative"]["accepted"]


def test_stream_chunks_carry_the_tokens_since_the_last_chunk(client):
    plain = _stream(client, BODY)
    assert all("token_origins" not in c for c in plain)
    chunks = _stream(client, {**BODY, "token_origins": True})
    assert [c["choices"] for c in chunks] == [c["choices"] for c in plain]
    origins = [o for c in chunks for o in c["token_origins"]]
    reference = client.post("/v1/completions", json={**BODY, "token_origins": True}).json()["token_origins"]
    assert origins == reference


def test_speculative_false_decodes_without_drafting(client):
    spec = client.post("/v1/completions", json={**BODY, "token_origins": True}).json()
    off = client.post("/v1/completions", json={**BODY, "token_origins": True, "speculative": False}).json()
    assert off["choices"][0]["text"] == spec["choices"][0]["text"]
    assert off["speculative"]["drafted"] == 0 and off["speculative"]["tau"] == 1.0
    assert {o["origin"] for o in off["token_origins"]} == {"target"}
    again = client.post("/v1/completions", json={**BODY, "token_origins": True}).json()  # drafts again
    assert any(o["origin"] != "target" for o in again["token_origins"])


def test_extension_fields_are_typed(client):
    r = client.post("/v1/completions", json={**BODY, "token_origins": "yes"})
    assert r.status_code == 400 and "token_origins" in r.text


def test_the_page_is_served_without_a_key_and_loads_nothing_from_elsewhere(client):
    r = client.get("/", headers={"Authorization": ""})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "token_origins" in page and "/v1/chat/completions" in page
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)  # no script, style or image fetched
    assert "http://" not in page and "https://" not in page
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert client.get("/props", headers={"Authorization": ""}).status_code == 401  # the rest keeps its key
