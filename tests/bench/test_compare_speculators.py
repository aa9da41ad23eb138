"""`llama-dflash bench --compare-speculators`: every speculator that applies, side by side (issue 41)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llama_dflash.bench.compare import applicable_speculators
from llama_dflash.testing.drafts import write_rigged_draft
from llama_dflash.testing.targets import write_target


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    fx = write_target(str(root / "qwen35.gguf"), "qwen35", mtp=True)
    other = write_target(str(root / "nemotron.gguf"), "nemotron_h")
    return {"target": fx.path, "dflash": write_rigged_draft(str(root / "q.dflash.gguf"), fx, "dflash"),
            "foreign": write_rigged_draft(str(root / "n.dflash.gguf"), other, "dflash"), "muse":
            write_target(str(root / "muse.gguf"), "muse-glimmer").path}


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", *args], capture_output=True,
                          text=True, timeout=600)


def test_a_qwen35_target_with_a_dflash_draft_prints_mtp_dflash_lookup_and_auto(qwen35, tmp_path):
    out = tmp_path / "cmp.json"
    r = _bench("--model", qwen35["target"], "--draft-model", f"{qwen35['dflash']},{qwen35['foreign']}",
               "--compare-speculators", "--max-tokens", "32", "--runs", "1", "--warmup-tokens", "4", "--raw-prompt",
               "--prompt", "the quick brown fox and the lazy dog is", "--draft-tokens", "4", "--threads", "2",
               "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = {row["name"]: row for row in data["speculators"]}
    assert {"draft-mtp", "draft-dflash (q.dflash.gguf)", "lookup", "auto,draft-mtp,draft-dflash"} <= set(rows)
    assert all(row["output_matches"] for row in rows.values())
    assert rows["draft-mtp"]["accepted"] > 0 and rows["draft-dflash (q.dflash.gguf)"]["accepted"] > 0
    for name in ("draft-mtp", "draft-dflash (q.dflash.gguf)", "ngram-simple,draft-dflash (q.dflash.gguf)", "lookup",
                 "auto,draft-mtp,draft-dflash"):
        assert name in r.stdout and rows[name]["verdict"].split(":")[0] in ("pays", "loses", "never drafted here (no match, or its cost model chose no draft at every step)")
    assert data["winner"] is None or data["winner"] in rows
    assert "winner:" in r.stdout
    # the draft made for another target is named with the reason, not run
    assert [n["name"] for n in data["not_applicable"]] == ["n.dflash.gguf"]
    assert "dflash.target_layers" in data["not_applicable"][0]["reason"]


def test_a_target_without_an_mtp_head_lists_draft_mtp_as_not_applicable(qwen35):
    cands, skipped = applicable_speculators(qwen35["muse"])
    assert "draft-mtp" not in [c.name for c in cands]
    assert skipped and skipped[0][0] == "draft-mtp" and "MTP head" in skipped[0][1]
    assert [c.name for c in cands][-1] == "auto"  # auto over the lookup alone


def test_compare_refuses_an_explicit_spec_type(qwen35):
    r = _bench("--model", qwen35["target"], "--compare-speculators", "--spec-type", "lookup")
    assert r.returncode == 2
    assert "--compare-speculators picks the speculators itself" in r.stderr
