"""Sweeps, workloads, the filled feedback report, plots and progress output on the tiny pair."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from _equivalence import offload_supported
from llama_dflash.bench.backend import backend_info
from llama_dflash.bench.report import TEMPLATE_FIELDS, parse_report
from llama_dflash.bench.workloads import WORKLOADS, load_prompt_file

TINY = ["--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--raw-prompt", "--warmup-tokens", "4"]


def _bench(tiny_target, tiny_draft, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model", tiny_draft,
         *TINY, *args],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory, tiny_target, tiny_draft):
    d = tmp_path_factory.mktemp("sweep")
    paths = {k: str(d / f"r.{k}") for k in ("json", "md", "png")}
    proc = _bench(tiny_target, tiny_draft, "--sweep-draft-tokens", "1,2,4", "--workload", "all",
                  "--max-tokens", "12", "--runs", "2", "--json", paths["json"], "--report", paths["md"],
                  "--plot", paths["png"])
    assert proc.returncode == 0, proc.stderr
    return proc, paths


def test_sweep_table_names_best_setting(sweep_run):
    proc, _ = sweep_run
    for name in WORKLOADS:
        assert f"[sweep: workload {name}, 12 tokens, 2 runs]" in proc.stdout
    assert proc.stdout.count("best draft length") == len(WORKLOADS)
    for k in ("1", "2", "4"):
        assert any(line.split()[:1] == [f"k={k}"] for line in proc.stdout.splitlines())
    # one meaning per word: the default of generate/serve (--spec-type auto) beside the draft's lengths
    assert any(line.startswith("  spec-type auto ") for line in proc.stdout.splitlines())
    assert proc.stdout.count("by default          : spec-type auto") == len(WORKLOADS)


def test_sweep_json_has_every_setting(sweep_run):
    _, paths = sweep_run
    d = json.load(open(paths["json"]))
    assert [c["workload"] for c in d["cells"]] == list(WORKLOADS)
    for cell in d["cells"]:
        assert set(cell["speculative"]) == {"1", "2", "4"}
        n_prompts = len(WORKLOADS[cell["workload"]])
        for k, m in cell["speculative"].items():
            assert m["output_tokens_match"] is True
            assert m["stats"]["draft_n_max"] == int(k)
            assert len(m["runs"]) == 2 and m["runs"][0]["tokens"] == 12 * n_prompts
        fastest = max(cell["speculative"], key=lambda k: cell["speculative"][k]["aggregate_tokens_per_second"])
        best = cell["best_draft_tokens"]
        assert best is None or str(best) == fastest


def test_report_fields_match_the_json(sweep_run):
    _, paths = sweep_run
    d = json.load(open(paths["json"]))
    sections = parse_report(open(paths["md"]).read())
    assert len(sections) == len(d["cells"])
    for fields, cell in zip(sections, d["cells"]):
        assert list(fields) == TEMPLATE_FIELDS  # every field present, in template order
        assert all(v.strip() for v in fields.values())
        fastest = max(cell["speculative"], key=lambda k: cell["speculative"][k]["aggregate_tokens_per_second"])
        m = cell["speculative"][fastest]
        assert fields["draft_n_max"] == fastest
        assert fields["Draft tokens proposed"] == str(m["stats"]["drafted"])
        assert fields["Draft tokens accepted"] == str(m["stats"]["accepted"])
        assert fields["Verification steps"] == str(m["stats"]["verification_steps"])
        assert fields["Ordinary throughput"] == f"{cell['ordinary']['aggregate_tokens_per_second']:.2f} token/s"
        assert fields["Speculative throughput"] == f"{m['aggregate_tokens_per_second']:.2f} token/s"
        # the copy-heavy prompts do not fit in 256: the sweep raises n_ctx, says so, and reports what ran
        assert int(d["n_ctx"]) > 256 and any(n.startswith("n_ctx raised from 256") for n in d["notes"])
        assert fields["n_ctx"] == str(d["n_ctx"]) and fields["n_batch"] == "64" and fields["ignore_eos"] == "False"
        assert fields["Target quantization"] == "ALL_F32"
        assert fields["Algorithm"] == "DFlash"
        # the bench offloads every layer where it can: exact on the CPU, a reported position on a GPU
        # (batch-shape rounding; tests/_equivalence.py checks such divergences against the logits)
        div = fields["First divergence from ordinary decoding"]
        if offload_supported():
            assert div == "none (outputs identical)" or re.fullmatch(r"generated token \d+", div), div
        else:
            assert div == "none (outputs identical)"
        info = backend_info()  # what this build runs on (CPU, CUDA, ...), not a fixed name
        assert (fields["Backend"], fields["GPU"], fields["GPU memory"]) == (info.name, info.gpu, info.gpu_memory)


def test_plot_is_a_png(sweep_run):
    _, paths = sweep_run
    with open(paths["png"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_no_progress_bar_when_stderr_is_not_a_terminal(sweep_run):
    proc, _ = sweep_run
    assert "gen/s" not in proc.stderr and "\r" not in proc.stderr and "%|" not in proc.stderr


def test_single_prompt_report(tmp_path, tiny_target, tiny_draft):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    proc = _bench(tiny_target, tiny_draft, "--max-tokens", "10", "--runs", "2", "--report", str(md),
                  "--json", str(js), "--draft-tokens", "3", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    (fields,) = parse_report(md.read_text())
    d = json.loads(js.read_text())
    s = d["speculative"]["stats"]
    assert fields["Generated token count"] == "20"
    assert fields["draft_n_max"] == "3" and fields["ignore_eos"] == "True"
    assert fields["Rollback count"] == f"{s['rollbacks']} (native: {s['native_rollbacks']})"
    assert fields["Outputs deterministic across repeated runs"] == "True"
    assert fields["Speedup"] == f"{d['comparison']['speedup']:.3f}x"


def test_prompt_files(tmp_path, tiny_target, tiny_draft):
    txt = tmp_path / "p.txt"
    txt.write_text("the and\n\nis of the\n")
    jsl = tmp_path / "p.jsonl"
    jsl.write_text('{"prompt": "the and"}\n"is of"\n')
    assert load_prompt_file(str(txt)) == ["the and", "is of the"]
    assert load_prompt_file(str(jsl)) == ["the and", "is of"]
    js = tmp_path / "out.json"
    proc = _bench(tiny_target, tiny_draft, "--prompt-file", str(jsl), "--max-tokens", "6", "--runs", "1",
                  "--json", str(js))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(js.read_text())["cells"][0]["workload"] == "p.jsonl"


def test_several_workloads_named_sets_and_files_each_a_cell(tmp_path, tiny_target, tiny_draft):
    """--workload takes a comma list, --prompt-file repeats, and both mix: one workload each, in order."""
    a, b = tmp_path / "chat.jsonl", tmp_path / "code.txt"
    a.write_text('{"prompt": "the and"}\n')
    b.write_text("is of the\nand the\n")
    js = tmp_path / "out.json"
    proc = _bench(tiny_target, tiny_draft, "--workload", "structured,copy-heavy-heldout,structured",
                  "--prompt-file", str(a), "--prompt-file", str(b), "--max-tokens", "4", "--runs", "1",
                  "--json", str(js))
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(js.read_text())["cells"]
    assert [c["workload"] for c in cells] == ["structured", "copy-heavy-heldout", "chat.jsonl", "code.txt"]


def test_two_prompt_files_of_one_name_exit_2(tmp_path, tiny_target, tiny_draft):
    (tmp_path / "x").mkdir()
    for d in (tmp_path, tmp_path / "x"):
        (d / "p.txt").write_text("the and\n")
    proc = _bench(tiny_target, tiny_draft, "--prompt-file", str(tmp_path / "p.txt"), "--prompt-file",
                  str(tmp_path / "x" / "p.txt"), "--max-tokens", "4", "--runs", "1")
    assert proc.returncode == 2 and "already given" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("content,needle", [("", "contains no prompts"), ('{"text": 1}\n', 'no non-empty "prompt"'),
                                            ("{bad json\n", "not valid JSON")])
def test_bad_prompt_file_exit_2(tmp_path, tiny_target, tiny_draft, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    proc = _bench(tiny_target, tiny_draft, "--prompt-file", str(f), "--runs", "1")
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["--plot", "x.png"], "--plot draws a sweep"),
    (["--sweep-draft-tokens", "1,x"], "expected an integer or 'auto'"),
    (["--sweep-draft-tokens", "0,2"], "values must be >= 1"),
    (["--workload", "poetry"], "invalid choice"),
    (["--workload", "structured,poetry"], "invalid choice: 'poetry'"),
    (["--workload", ","], "expected at least one workload"),
    (["--cpp-reference", "/nonexistent/llama-speculative-simple"], "not an executable file"),
])
def test_bad_sweep_arguments_exit_2(tiny_target, tiny_draft, args, needle):
    proc = _bench(tiny_target, tiny_draft, "--runs", "1", "--max-tokens", "2", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
