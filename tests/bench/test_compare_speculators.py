"""`llama-dflash bench --compare-speculators`: every speculator that applies, side by side (issue 41)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llama_dflash.bench.compare import applicable_speculators, format_comparison
from llama_dflash.bench.workloads import WORKLOADS
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
        assert name in r.stdout and rows[name]["verdict"].split(":")[0] in ("pays", "even", "loses", "never drafted here (no match, or its cost model chose no draft at every step)")
    assert data["winner"] is None or data["winner"] in rows
    assert "winner:" in r.stdout
    # the draft made for another target is named with the reason, not run
    assert [n["name"] for n in data["not_applicable"]] == ["n.dflash.gguf"]
    assert "dflash.target_layers" in data["not_applicable"][0]["reason"]


def test_several_workloads_get_a_column_each(qwen35, tmp_path):
    """The speculator x workload table: named workloads and prompt files, each a tau / speedup column,
    every cell measured on that workload's prompts alone."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"prompt": "the quick brown fox"}\n{"prompt": "and the lazy dog is"}\n')
    out = tmp_path / "cmp.json"
    r = _bench("--model", qwen35["target"], "--draft-model", qwen35["dflash"], "--compare-speculators",
               "--workload", "copy-heavy-heldout", "--prompt-file", str(chat), "--max-tokens", "12", "--runs", "1",
               "--warmup-tokens", "4", "--raw-prompt", "--draft-tokens", "2", "--threads", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["prompts"] == len(WORKLOADS["copy-heavy-heldout"]) + 2
    cols = data["by_workload"]
    assert list(cols) == ["copy-heavy-heldout", "chat.jsonl"]
    assert "by workload (tau / speedup):" in r.stdout
    header = next(line for line in r.stdout.splitlines() if "copy-heavy-heldout" in line and "chat.jsonl" in line)
    assert header.split()[0] == "speculator"
    for label in cols:
        assert f"winner on {label}: " in r.stdout
        w = data["winner_by_workload"][label]
        drafting = [c["speedup"] for c in cols[label].values() if not c["verdict"].startswith("never drafted")]
        assert w is None or (cols[label][w]["speedup"] == max(drafting) and cols[label][w]["verdict"].startswith("pays"))
    for row in data["speculators"]:
        per = [cols[w][row["name"]] for w in cols]
        assert all(c["verdict"].split(":")[0] in ("pays", "even", "loses", "never drafted here (no match, or its cost model "
                   "chose no draft at every step)") for c in per)
        assert all(c["tau"] >= 1.0 for c in per)
        # the whole row pools both columns' steps: its tau lies between theirs
        assert min(c["tau"] for c in per) - 1e-9 <= row["tau"] <= max(c["tau"] for c in per) + 1e-9


def test_a_target_without_an_mtp_head_lists_draft_mtp_as_not_applicable(qwen35):
    cands, skipped = applicable_speculators(qwen35["muse"])
    assert "draft-mtp" not in [c.name for c in cands]
    assert skipped and skipped[0][0] == "draft-mtp" and "MTP head" in skipped[0][1]
    assert [c.name for c in cands][-1] == "auto"  # auto over the lookup alone


def test_compare_refuses_an_explicit_spec_type(qwen35):
    r = _bench("--model", qwen35["target"], "--compare-speculators", "--spec-type", "lookup")
    assert r.returncode == 2
    assert "--compare-speculators picks the speculators itself" in r.stderr


def test_a_speculator_that_never_drafted_is_never_the_winner():
    """One that never drafted decoded as ordinary decoding does: a faster time is noise, not a win."""
    from llama_dflash.bench.compare import Comparison, SpeculatorResult
    from llama_dflash.stats import SpecStats

    ordinary = SpeculatorResult("ordinary", tokens=100, decode_seconds=1.0)
    idle = SpeculatorResult("ngram-cache", tokens=100, decode_seconds=0.5, stats=SpecStats(verification_steps=100))
    busy = SpeculatorResult("lookup", tokens=100, decode_seconds=0.8,
                            stats=SpecStats(drafted=40, accepted=30, verification_steps=70))
    c = Comparison("t.gguf", 1, 1, 100, ordinary, [idle, busy], [],
                   {"w": (ordinary, {"ngram-cache": idle, "lookup": busy})})
    assert c.winner is busy and c.workload_winners() == {"w": busy}
    assert c.verdict(idle).startswith("never drafted") and c.verdict(busy).startswith("pays")
    # a speedup above 1 but within noise is even, not a loss "because verifying costs more"
    level = SpeculatorResult("ngram-map-k", tokens=100, decode_seconds=0.99, stats=busy.stats)
    assert c.verdict(level).startswith("even: tau 1.43 > a step's cost of 1.41 ordinary decodes, within 2%")
    slow = SpeculatorResult("lookup", tokens=100, decode_seconds=1.5, stats=busy.stats)
    per = {"w": (ordinary, {"ngram-cache": idle, "lookup": slow}), "v": (ordinary, {"ngram-cache": idle, "lookup": busy})}
    c2 = Comparison("t.gguf", 2, 1, 100, ordinary, [idle, slow], [], per)
    assert c2.winner is None and c2.workload_winners() == {"w": None, "v": busy}
    text = format_comparison(c2)
    assert "winner on w: none" in text and "winner on v: lookup (1.25x; pays" in text
