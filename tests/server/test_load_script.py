"""`bench/load.py`: concurrent clients against `llama-dflash serve` on the tiny fixtures (issue 13),
and the answer checking that makes its verdict worth something."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "load.py"


@pytest.fixture(scope="module")
def load():
    spec = importlib.util.spec_from_file_location("bench_load", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_load"]


def test_check_catches_a_wrong_answer(load):
    ref = ("Paris is the capital.", "length")
    assert load.check(ref, load.Reply(200, "Paris is the capital.", "length")) is None
    assert "text" in load.check(ref, load.Reply(200, "Paris is the capital!", "length"))
    assert "finish_reason" in load.check(ref, load.Reply(200, "Paris is the capital.", "stop"))
    assert load.check(ref, load.Reply(200, "Paris is", None, closed_early=True)) is None
    assert "prefix" in load.check(ref, load.Reply(200, "Lyon", None, closed_early=True))


def test_classify_and_verdict(load):
    ref = ("abc", "stop")
    kinds = [load.classify("c", False, reply, ref, 3).kind for reply in (
        load.Reply(200, "abc", "stop"), load.Reply(200, "abd", "stop"), load.Reply(500, error="boom"),
        load.Reply(0, error="ConnectionResetError"), load.Reply(503, error='{"code": "queue_full"}'),
        load.Reply(200, "ab", None, closed_early=True),
        load.Reply(200, "abc", "stop", error="stream ended without [DONE]"))]
    assert kinds == ["ok", "wrong", "error", "error", "rejected", "disconnected", "error"]
    outcomes = [load.Outcome("c", False, "ok", 0.1, None, 3), load.Outcome("c", True, "ok", 0.3, 0.05, 3)]
    base = {"reference_problems": [], "after_problems": [], "health_ok": True, "server_crashed": False}
    good = {**base, **load.summarize(outcomes, 1.0)}
    assert good["completed"] == 2 and good["completion_tokens_per_second"] == 6.0
    assert good["latency_p50_s"] == pytest.approx(0.2) and good["first_chunk_p50_s"] == 0.05
    assert not load.failed(good)
    bad = {**base, **load.summarize(outcomes + [load.Outcome("c", False, "wrong", 0.1, None, 0, "x")], 1.0)}
    assert bad["wrong_answers"] == 1 and load.failed(bad)
    assert load.failed({**good, "health_ok": False})
    assert load.failed({**good, "after_problems": ["c: after the load: text differs"]})


def test_plan_mixes_streams_and_spreads_disconnects(load):
    plan = load.Plan([("a", "/", {}), ("b", "/", {}), ("c", "/", {})], disconnect_every=2)
    reqs = [plan.request(k) for k in range(12)]
    assert [r[1] for r in reqs[:6]] == [False] * 3 + [True] * 3
    early = [(i, s) for i, s, e in reqs if e]
    assert early and all(s for _, s in early)
    assert len({i for i, _ in early}) > 1  # not always the same case
    assert not any(e for _, _, e in (load.Plan(plan.cases, 0).request(k) for k in range(12)))


def test_load_script_on_tiny_fixtures(tiny_target, tiny_draft, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", tiny_target, "--draft", tiny_draft, "--clients", "4",
         "--requests", "12", "--duration", "20", "--n-threads", "1", "--n-ctx", "512", "--max-tokens", "24",
         "--disconnect-every", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["errors"] == 0 and report["wrong_answers"] == 0, report["failures"]
    assert report["requests_sent"] == 12 and report["rejected_queue_full"] == 0
    assert report["disconnected_early"] >= 1 and report["completed_streamed"] >= 1
    assert report["completed"] + report["disconnected_early"] == 12
    assert report["health_ok"] and not report["after_problems"] and not report["server_crashed"]
    assert report["latency_p50_s"] > 0 and report["requests_per_second"] > 0
    assert "RESULT: ok" in proc.stdout and "requests/s" in proc.stdout
