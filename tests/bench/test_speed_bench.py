"""bench/speed_bench.py: llama.cpp's SPEED-Bench client, unchanged, fed local samples, reads our
server's answers (usage and llama-server's `timings`) as it reads llama-server's (issue 42)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "speed_bench.py"
pytest.importorskip("requests")
pytest.importorskip("tqdm")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_speed_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed_bench"] = module
    spec.loader.exec_module(module)
    if not os.path.isfile(module.default_client()):
        pytest.skip(f"llama.cpp's speed_bench.py is not at {module.default_client()} "
                    "(../shared/tools/build-cpp-reference.sh extracts it)")
    yield module
    del sys.modules["bench_speed_bench"]


def test_the_client_loads_local_samples_through_its_own_loader(bench):
    before = sys.modules.get("datasets")
    client = bench.load_client(bench.default_client(), bench.PROMPTS)
    assert sys.modules.get("datasets") is before  # the stand-in served the import only
    args = type("Args", (), {"bench": "local", "category": "coding,qa", "limit": 2})()
    samples = client.load_samples(args)
    assert [(s.category, s.id) for s in samples] == [("coding", "code-1"), ("coding", "code-2"), ("qa", "qa-1"),
                                                     ("qa", "qa-2")]
    args.bench = "qualitative"
    with pytest.raises(ValueError):
        client.load_samples(args)


def _run(bench, tmp_path, server):
    out = tmp_path / f"{server}.json"
    status = bench.main(["--servers", server, "--limit", "1", "--osl", "32", "--n-threads", "1", "--json", str(out)])
    runs = json.loads(out.read_text())
    assert status == 0, runs
    (run,) = runs
    overall = next(row for row in run["summary"] if row["category"] == "overall")
    assert run["failed"] == 0 and overall["requests"] == 3, run["output"]
    return overall


@pytest.mark.slow
def test_speed_bench_reports_acceptance_and_speed_for_our_server(bench, tmp_path):
    overall = _run(bench, tmp_path, "llama-dflash")
    assert overall["draft_n"] > 0 and overall["accept_rate"] > 0, overall
    assert overall["avg_pred_t_s"] > 0 and overall["avg_prompt_t_s"] > 0, overall


@pytest.mark.slow
def test_speed_bench_on_llama_server_the_same_way(bench, tmp_path):
    import load

    if not os.access(load._default_llama_server(), os.X_OK):
        pytest.skip("llama-server is not built (../shared/tools/build-cpp-reference.sh)")
    overall = _run(bench, tmp_path, "llama-server")
    assert overall["draft_n"] > 0 and overall["avg_pred_t_s"] > 0, overall
