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

from llama_dflash.bench.cpp_reference import parse_cpp_output, run_cpp_reference

SAMPLE = Path(__file__).parent / "data" / "speculative_simple_smollm2.txt"


def test_parse_recorded_output():
    r = parse_cpp_output(SAMPLE.read_text())
    assert (r.decoded_tokens, r.seconds, r.tokens_per_second) == (13, 0.304, 42.697)
    assert (r.n_drafted, r.n_accept) == (32, 5)
    assert r.acceptance_rate == pytest.approx(0.15625)


def test_parse_rejects_other_text():
    with pytest.raises(ValueError, match="decoded N tokens"):
        parse_cpp_output("error: invalid argument: --foo\n")


def _fake_binary(tmp_path: Path, exit_code: int = 0) -> tuple[str, Path]:
    """A stand-in executable that records its argv and prints the recorded sample."""
    argv_file = tmp_path / "argv.txt"
    script = tmp_path / "llama-speculative-simple"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(argv_file)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
        f"sys.stderr.write(open({str(SAMPLE)!r}).read() if {exit_code} == 0 else 'boom: bad draft\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), argv_file


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
    binary, _ = _fake_binary(tmp_path, exit_code=3)
    with pytest.raises(ValueError, match=r"failed \(exit 3\): boom: bad draft"):
        _run(binary)


def test_not_executable(tmp_path):
    f = tmp_path / "x"
    f.write_text("")
    os.chmod(f, 0o644)
    with pytest.raises(ValueError, match="not an executable file"):
        _run(str(f))
