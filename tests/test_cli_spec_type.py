"""--spec-type in every front end: `generate`, `bench` and `serve` take llama.cpp's names, comma
lists and ours; bad choices end with one line and exit code 2 before any model is loaded."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest


TINY = ["--n-ctx", "512", "--n-batch", "64", "--n-ubatch", "64", "--raw-prompt"]
PROMPT = " ".join(["the quick brown fox and the lazy dog is"] * 3)  # repeats: the token drafters find matches


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _generate(tiny_target, *args, json_path=None):
    extra = ["--json", str(json_path)] if json_path else []
    return _cli("generate", "--model", tiny_target, *TINY, "--prompt", PROMPT, "--max-tokens", "40",
                "--ignore-eos", *args, *extra)


@pytest.fixture(scope="module")
def ordinary_text(tiny_target):
    proc = _generate(tiny_target, "--spec-type", "none")
    assert proc.returncode == 0, proc.stderr
    assert "ordinary: 40 tokens" in proc.stderr
    return proc.stdout


@pytest.mark.parametrize("spec_type,extra", [
    ("ngram-simple", ["--ngram-size-n", "2", "--ngram-size-m", "8"]),
    ("ngram-map-k4v", ["--ngram-size-n", "2", "--ngram-min-hits", "1"]),
    ("ngram-mod", []),
    ("lookup", []),
    ("ngram-map-k,draft-dflash", ["--ngram-size-n", "2", "--draft-tokens", "3"]),
    ("auto", ["--draft-tokens", "auto"]),
])
def test_generate_gives_the_ordinary_text_with_every_type(tmp_path, tiny_target, tiny_draft, ordinary_text,
                                                         spec_type, extra):
    out = tmp_path / "g.json"
    draft = ["--draft-model", tiny_draft] if "draft" in spec_type or spec_type == "auto" else []
    proc = _generate(tiny_target, "--spec-type", spec_type, *draft, *extra, json_path=out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ordinary_text
    d = json.loads(out.read_text())
    assert len(d["tokens"]) == 40 and d["stats"]["generated_tokens"] == 40
    names = d["speculators"]
    assert names and set(names) - {"auto"} <= set(d["speculator_stats"])
    if spec_type == "lookup":
        assert d["speculator_stats"]["lookup"]["drafted"] > 0
        assert d["stats"]["accepted"] == d["speculator_stats"]["lookup"]["accepted"] > 0


def test_generate_defaults_to_auto_over_the_draft(tmp_path, tiny_target, tiny_draft, ordinary_text):
    """Without --spec-type a draft model is chosen from per step by `auto` (the lookup, its block
    or nothing); --spec-type draft keeps the draft model alone."""
    out = tmp_path / "g.json"
    proc = _generate(tiny_target, "--draft-model", tiny_draft, json_path=out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ordinary_text
    d = json.loads(out.read_text())
    assert d["speculators"][0] == "auto" and "lookup" in d["speculator_stats"]
    proc = _generate(tiny_target, "--draft-model", tiny_draft, "--spec-type", "draft", json_path=out)
    assert proc.returncode == 0, proc.stderr
    assert "auto" not in json.loads(out.read_text())["speculators"]


def test_bench_reports_per_speculator_counts(tmp_path, tiny_target, tiny_draft):
    out = tmp_path / "b.json"
    proc = _cli("bench", "--model", tiny_target, "--draft-model", tiny_draft, "--spec-type", "lookup,draft-dflash",
                *TINY, "--prompt", PROMPT, "--max-tokens", "32", "--runs", "1", "--warmup-tokens", "0",
                "--draft-tokens", "3", "--no-cost-probe", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "per speculator:" in proc.stdout and "output tokens match : True" in proc.stdout
    d = json.loads(out.read_text())
    spec = d["speculative"]
    assert set(spec["speculators"]) == {"lookup", "draft-dflash"}
    total = sum(v["drafted"] for v in spec["speculators"].values())
    assert total == spec["stats"]["drafted"]
    for v in spec["speculators"].values():
        assert len(v["acceptance_per_position"]) <= 16 and all(0 <= r <= 1 for r in v["acceptance_per_position"])


def test_bench_without_a_draft_model_loads_none(tiny_target):
    proc = _cli("bench", "--model", tiny_target, "--spec-type", "ngram-simple", "--ngram-size-n", "2", *TINY,
                "--prompt", PROMPT, "--max-tokens", "24", "--runs", "1", "--warmup-tokens", "0")
    assert proc.returncode == 0, proc.stderr
    assert "[ngram-simple]" in proc.stdout and "output tokens match : True" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["generate", "--spec-type", "bogus"], "bogus"),
    (["generate", "--spec-type", "draft-dflash,draft-dspark"], "draft types"),
    (["generate", "--spec-type", "none,lookup"], "none"),
    (["generate", "--spec-type", "auto,ngram-simple"], "auto"),
    (["generate", "--spec-type", "none", "--draft-model", "x.gguf"], "drafts nothing"),
    (["bench", "--spec-type", "none"], "drafts nothing"),
    (["bench", "--spec-type", "lookup", "--cpp-reference", sys.executable], "no speculative type 'lookup'"),
])
def test_bad_choices_exit_2_with_one_line(tiny_target, args, message):
    proc = _cli(*args[:1], "--model", tiny_target, *args[1:], timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _serve_args(*argv):
    from llama_dflash.server.cli import configure

    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(list(argv))


def test_serve_builds_the_same_choice(tiny_target, tiny_draft):
    from llama_dflash.server.cli import build_spec

    assert build_spec(_serve_args(), tiny_target) is None  # no draft, no type: ordinary
    assert build_spec(_serve_args("--spec-type", "none"), tiny_target) is None
    spec = build_spec(_serve_args("--spec-type", "ngram-map-k", "--ngram-size-n", "2"), tiny_target)
    assert spec.spec_types == ("ngram-map-k",) and spec.draft_model is None and spec.ngram_size_n == 2
    spec = build_spec(_serve_args("--spec-type", "lookup,draft-dflash", "--draft-model", tiny_draft), tiny_target)
    assert spec.spec_types == ("lookup", "draft-dflash") and spec.draft_model == tiny_draft
    # the default with a draft: auto over it one request at a time, the draft alone in a batch
    spec = build_spec(_serve_args("--draft-model", tiny_draft), tiny_target)
    assert spec.spec_types == ("auto", "draft") and spec.draft_model == tiny_draft
    spec = build_spec(_serve_args("--draft-model", tiny_draft, "--parallel", "4"), tiny_target)
    assert spec.spec_type is None and spec.draft_model == tiny_draft
    with pytest.raises(ValueError, match="drafts nothing"):
        build_spec(_serve_args("--spec-type", "none", "--draft-model", tiny_draft), tiny_target)
    with pytest.raises(ValueError, match="ngram"):
        build_spec(_serve_args("--ngram-size-n", "2"), tiny_target)


def test_serve_without_arguments_serves_the_default_pair():
    """`llama-dflash serve` alone: the embedded target with its shipped draft, under `auto` (as
    `generate` and `bench` use the pair), not the target alone."""
    from llama_dflash.defaults import default_draft_path, smollm2_path
    from llama_dflash.server.cli import build_spec

    try:
        model = smollm2_path()
    except Exception as exc:  # noqa: BLE001 - the default model is an optional wheel
        pytest.skip(str(exc))
    spec = build_spec(_serve_args(), model)
    assert spec is not None and spec.draft_model == default_draft_path(model)
    assert spec.spec_types == ("auto", "draft")
    assert build_spec(_serve_args("--spec-type", "none"), model) is None  # ordinary on request
    spec = build_spec(_serve_args("--spec-type", "ngram-simple"), model)  # a type without a model: no draft
    assert spec.draft_model is None
