"""`bench/load.py --servers llama-dflash,llama-server --parallel N --clients 1,4`: the llama-server
command it builds and the side-by-side table (issue 30)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "load.py"


@pytest.fixture(scope="module")
def load():
    spec = importlib.util.spec_from_file_location("bench_load_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_load_compare"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_load_compare"]


def test_arguments(load):
    a = load.parse_args(["--clients", "1,4,8", "--servers", "llama-dflash,llama-server", "--parallel", "4",
                         "--no-draft", "--model", "m.gguf"])
    assert a.clients == [1, 4, 8] and a.servers == ["llama-dflash", "llama-server"] and a.parallel == 4
    args, model, draft = load.server_args(a)
    assert model == "m.gguf" and draft is None
    assert args[args.index("--parallel") + 1] == "4"
    assert args[args.index("--max-queue") + 1] == "16"  # 2 x the largest client count, at least 16
    with pytest.raises(SystemExit):
        load.parse_args(["--servers", "vllm"])
    with pytest.raises(SystemExit):
        load.parse_args(["--clients", "4,0"])
    assert "--parallel" not in load.server_args(load.parse_args(["--no-draft", "--model", "m"]))[0]


def test_llama_server_command(load, tiny_target, tiny_draft):
    a = load.parse_args(["--parallel", "4", "--n-ctx", "512", "--n-threads", "2", "--llama-server", "/x/llama-server"])
    cmd = load.llama_server_command(a, tiny_target, tiny_draft, 1234)
    assert cmd[0] == "/x/llama-server"
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == "2048"  # 4 slots of 512
    assert cmd[cmd.index("-fa") + 1] == "on" and cmd[cmd.index("-t") + 1] == "2"
    assert cmd[cmd.index("-md") + 1] == tiny_draft and cmd[cmd.index("--spec-type") + 1] == "draft-dflash"
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "4"
    plain = load.llama_server_command(load.parse_args([]), tiny_target, None, 1234)
    assert "-md" not in plain and plain[plain.index("-np") + 1] == "1"


def test_side_by_side(load):
    outcomes = [load.Outcome("c", False, "ok", 0.2, None, 10), load.Outcome("c", True, "ok", 0.4, 0.1, 10)]
    reports = [dict(load.summarize(outcomes, 2.0), clients=c, server=s, parallel=4, draft=None)
               for c in (4, 1) for s in ("llama-server", "llama-dflash")]
    table = load.side_by_side(reports).splitlines()
    assert len(table) == 2 + 4
    assert [line.split("|")[1:3] for line in table[2:]] == [
        [" 1 ", " llama-dflash "], [" 1 ", " llama-server "], [" 4 ", " llama-dflash "], [" 4 ", " llama-server "]]
    assert "| 10.0 |" in table[2] and "| 300 ms |" in table[2]  # 20 tokens in 2 s; p50 of 0.2 and 0.4
