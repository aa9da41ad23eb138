"""Parsing and running llama.cpp's C++ driver (llama-speculative-simple).

The sample is the real output of the binary built by ../shared/tools/build-cpp-reference.sh, run
on SmolLM2-135M with our trained draft (-n 48 --spec-draft-n-max 4); it stopped at EOS after 13.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from llama_dflash.bench.cpp_reference import ATTEMPTS, IncompleteOutput, parse_cpp_output, run_cpp_reference

SAMPLE = Path(__file__).parent / "data" / "speculative_simple_smollm2.txt"


def test_parse_recorded_output():
    r = parse_cpp_output(SAMPLE.read_text())
    assert (r.decoded_tokens, r.seconds, r.tokens_per_second) == (13, 0.304, 42.697)
    assert (r.n_drafted, r.n_accept) == (32, 5)
    assert r.acceptance_rate == pytest.approx(0.15625)


def test_parse_rejects_other_text():
    with pytest.raises(ValueError, match="decoded N tokens"):
        parse_cpp_output("error: invalid argument: --foo\n")


def _fake_binary(tmp_path: Path, exit_code: int = 0, lose: int = 0, cut: str = "decoded") -> tuple[str, Path]:
    """A stand-in executable that records its argv and prints the recorded sample.

    `lose`: its first `lose` runs end with exit code 0 but lose the sample's tail from the first
    line containing `cut` on (as the driver's asynchronous log does at exit).  Each run appends
    whether its stderr was a regular file (not a pipe) to `runs.txt` beside the argv file."""
    argv_file = tmp_path / "argv.txt"
    runs = tmp_path / "runs.txt"
    script = tmp_path / "llama-speculative-simple"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, stat, sys\n"
        f"open({str(argv_file)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
        f"runs = {str(runs)!r}\n"
        "n = len(open(runs).read().split()) if os.path.exists(runs) else 0\n"
        "open(runs, 'a').write(('file' if stat.S_ISREG(os.fstat(2).st_mode) else 'pipe') + '\\n')\n"
        f"text = open({str(SAMPLE)!r}).read()\n"
        f"if n < {lose}:\n"
        f"    text = text[: text.index({cut!r})]\n"
        f"sys.stderr.write(text if {exit_code} == 0 else 'boom: bad draft\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), argv_file


def _runs(argv_file: Path) -> list[str]:
    return (argv_file.parent / "runs.txt").read_text().split()


def _run(binary: str, **kw):
    args = dict(n_predict=48, draft_n_max=4, draft_p_min=0.0, n_ctx=1024, n_batch=64, n_ubatch=64,
                threads=2, repack=False)
    args.update(kw)
    return run_cpp_reference(binary, "target.gguf", "draft.gguf", "hi", **args)


def test_run_passes_our_settings(tmp_path):
    binary, argv_file = _fake_binary(tmp_path)
    r = _run(binary)
    assert r.decoded_tokens == 13
    argv = argv_file.read_text().split("\n")

    def value(flag):
        return argv[argv.index(flag) + 1]

    assert value("-m") == "target.gguf" and value("-md") == "draft.gguf"
    assert value("--spec-type") == "draft-dflash"
    assert value("-n") == "48" and value("--spec-draft-n-max") == "4" and value("--temp") == "0"
    assert value("-c") == "1024" and value("-b") == "64" and value("-ub") == "64" and value("-t") == "2"
    assert "--no-repack" in argv


def test_run_failure_is_a_clear_error(tmp_path):
    binary, argv_file = _fake_binary(tmp_path, exit_code=3)
    with pytest.raises(ValueError, match=r"failed \(exit 3\): boom: bad draft"):
        _run(binary)
    assert len(_runs(argv_file)) == 1  # a failure is not a lost log: not run again


@pytest.mark.parametrize("cut", ["decoded", "n_drafted", "n_accept"])
def test_a_run_that_lost_its_summary_is_run_again(tmp_path, cut):
    """The driver's log loses its last lines at exit now and then: the first run here ends with exit
    0 but without its summary (or with only part of it), the second prints it.  Both runs of
    run_cpp_reference (with -lv 5 for the steps, without for the timing) get the counts, from output
    written to a file (a pipe makes the driver's log fall behind and lose its tail)."""
    binary, argv_file = _fake_binary(tmp_path, lose=1, cut=cut)
    r = _run(binary)
    assert (r.decoded_tokens, r.n_drafted, r.n_accept) == (13, 32, 5)
    assert _runs(argv_file) == ["file"] * 3


def test_a_summary_cut_after_decoded_is_not_read_as_zero():
    text = SAMPLE.read_text()
    with pytest.raises(IncompleteOutput, match="n_accept"):
        parse_cpp_output(text[: text.index("n_accept")])


def test_a_summary_lost_every_time_is_a_clear_error(tmp_path):
    binary, argv_file = _fake_binary(tmp_path, lose=100)
    with pytest.raises(ValueError, match=rf"no 'decoded N tokens in S seconds' line \(in {ATTEMPTS} runs"):
        _run(binary)
    assert len(_runs(argv_file)) == ATTEMPTS


def test_generated_bytes_that_are_not_utf8(tmp_path):
    """The driver prints the generated text: any bytes (a random tiny model emits byte tokens)."""
    script = tmp_path / "llama-speculative-simple"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "sys.stdout.buffer.write(b'the \\xf4\\x28 fox\\n')\n"
        f"sys.stderr.write(open({str(SAMPLE)!r}).read())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert _run(str(script)).decoded_tokens == 13


def test_not_executable(tmp_path):
    f = tmp_path / "x"
    f.write_text("")
    os.chmod(f, 0o644)
    with pytest.raises(ValueError, match="not an executable file"):
        _run(str(f))


def test_ignore_eos_is_passed_through(tmp_path):
    binary, argv_file = _fake_binary(tmp_path)
    _run(binary)
    assert "--ignore-eos" not in argv_file.read_text().split("\n")
    _run(binary, ignore_eos=True)
    assert "--ignore-eos" in argv_file.read_text().split("\n")


def test_bench_compares_the_same_tokens_with_the_cpp_driver(tmp_path, tiny_target, tiny_draft):
    """The chat-formatted (here raw) prompt text, n_predict, draft length, threads and ignore-eos reach
    the C++ driver; the block sets both sides' counts side by side and says whether they are identical."""
    import json
    import subprocess

    binary, argv_file = _fake_binary(tmp_path, lose=1)  # its first run loses the summary: run again
    out = tmp_path / "b.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model", tiny_draft,
         "--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--raw-prompt", "--prompt", "the quick brown fox",
         "--warmup-tokens", "0", "--max-tokens", "10", "--runs", "1", "--draft-tokens", "3", "--threads", "1",
         "--ignore-eos", "--no-cost-probe", "--cpp-reference", binary, "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(_runs(argv_file)) == 3 and "running it again" in proc.stderr
    argv = argv_file.read_text().split("\n")

    def value(flag):
        return argv[argv.index(flag) + 1]

    assert value("-p") == "the quick brown fox" and value("-n") == "10" and value("--spec-draft-n-max") == "3"
    assert value("-t") == "1" and value("-td") == "1" and "--ignore-eos" in argv
    d = json.loads(out.read_text())
    c = d["cpp_reference"]
    ours = d["speculative"]["runs"][0]
    assert c["ours"]["n_accept"] == ours["accepted"] and c["ours"]["n_drafted"] == ours["drafted"]
    assert (c["n_accept"], c["n_drafted"]) == (5, 32)  # the recorded sample
    assert c["accepted_identical"] is ((ours["accepted"], ours["drafted"]) == (5, 32))
    assert c["threads"] == 1 and c["ignore_eos"] is True
    text = proc.stdout
    assert "[comparison: ours vs llama.cpp's C++ driver" in text
    for row in ("token/s (decode)", "draft accepted", "draft proposed", "accepted identical"):
        assert row in text


def _cpp_binary():
    path = os.environ.get("LLAMA_SPECULATIVE_SIMPLE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "llama-cpp-reference", "build", "bin", "llama-speculative-simple")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@pytest.mark.slow
@pytest.mark.skipif(_cpp_binary() is None, reason="llama-speculative-simple not built "
                    "(run /work/shared/tools/build-cpp-reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")
def test_cpp_driver_accepts_exactly_what_we_accept_on_smollm2(tmp_path):
    """SmolLM2 with the shipped trained draft, greedy, --ignore-eos: identical accepted counts."""
    import json
    import subprocess

    out = tmp_path / "b.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--draft-tokens", "4", "--max-tokens", "96",
         "--runs", "1", "--warmup-tokens", "0", "--ignore-eos", "--no-cost-probe", "--threads", "2",
         "--cpp-reference", _cpp_binary(), "--json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    c = json.loads(out.read_text())["cpp_reference"]
    budget = c["within_budget"]
    assert budget["drafted"] > 0 and budget["n_predict"] == 96
    assert (c["ours"]["n_accept"], c["ours"]["n_drafted"]) == (budget["accepted"], budget["drafted"]), proc.stdout
    assert c["accepted_identical"] is True


@pytest.fixture(scope="module")
def dflash2_converted(tiny_dir, tiny_target):
    """A DFlash2 draft made by llama.cpp's own converter from its Hugging Face checkpoint."""
    from dflash2_fixture import write_dflash2_draft
    from hf_converter import convert, find_converter
    from llama_dflash.train.hf_export import export_hf
    from llama_dflash.train.hf_target import write_target_dir

    try:
        converter = find_converter()
    except RuntimeError as e:
        pytest.skip(str(e))
    ours = write_dflash2_draft(str(tiny_dir / "cpp-dflash2.gguf"), tiny_target, block_size=8, top_k=4, seed=21)
    export_hf(ours, str(tiny_dir / "cpp-dflash2-hf"))
    write_target_dir(tiny_target, str(tiny_dir / "cpp-target-hf"))
    return convert(converter, str(tiny_dir / "cpp-dflash2-hf"), str(tiny_dir / "cpp-target-hf"),
                   str(tiny_dir / "cpp-dflash2-converted.gguf"))


@pytest.mark.slow
@pytest.mark.skipif(_cpp_binary() is None, reason="llama-speculative-simple not built "
                    "(run /work/shared/tools/build-cpp-reference.sh, or set LLAMA_SPECULATIVE_SIMPLE)")
@pytest.mark.parametrize("kind", ["dflash", "dflash2_converted"])
def test_cpp_driver_same_counts_on_tiny_pair(tmp_path, tiny_target, tiny_draft, kind, request):
    """The tiny pair, greedy, --ignore-eos, with an ordinary DFlash draft and a converter-made DFlash2 one."""
    import json
    import subprocess

    draft = tiny_draft if kind == "dflash" else request.getfixturevalue("dflash2_converted")
    out = tmp_path / "b.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", tiny_target, "--draft-model", draft,
         "--n-ctx", "256", "--n-batch", "64", "--n-ubatch", "64", "--raw-prompt", "--prompt", "the quick brown fox",
         "--warmup-tokens", "0", "--max-tokens", "64", "--runs", "1", "--draft-tokens", "7", "--threads", "1",
         "--ignore-eos", "--no-cost-probe", "--cpp-reference", _cpp_binary(), "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    c = json.loads(out.read_text())["cpp_reference"]
    budget = c["within_budget"]
    assert budget["drafted"] > 0
    assert (c["ours"]["n_accept"], c["ours"]["n_drafted"]) == (budget["accepted"], budget["drafted"]), proc.stdout
    assert c["accepted_identical"] is True


def test_a_dspark_draft_runs_as_draft_dspark(tmp_path, tiny_target):
    """The C++ driver is told the draft's own type: forcing draft-dflash on a DSpark draft would
    run it without its anchor-first layout."""
    from llama_dflash.bench.cpp_reference import cpp_spec_type
    from llama_dflash.writer import write_random_draft

    d = write_random_draft(str(tmp_path / "dspark.gguf"), tiny_target, block_size=4, markov_rank=8,
                           confidence_head=True)
    assert cpp_spec_type(d) == "draft-dspark"
    assert cpp_spec_type(write_random_draft(str(tmp_path / "dflash.gguf"), tiny_target, block_size=4)) == "draft-dflash"
    assert cpp_spec_type(str(tmp_path / "missing.gguf")) == "draft-dflash"
