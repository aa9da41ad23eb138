"""Every incompatibility is a Python exception naming file, field, found and expected value,
raised before llama.cpp sees the file; via the CLI it is one line on stderr and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gguf import GGUFValueType

from helpers import rewrite_gguf
from llama_dflash import LlamaDFlashDecoding, SpecConfig, TargetConfig
from llama_dflash.errors import GGUFFileError, IncompatibleModelError, UnsupportedTargetError
from llama_dflash.inspect import read_gguf, validate_pair
from llama_dflash.writer import write_random_draft, write_tiny_target

U32, ARR, STR, I32 = GGUFValueType.UINT32, GGUFValueType.ARRAY, GGUFValueType.STRING, GGUFValueType.INT32


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_target, tiny_draft):
    d = tmp_path_factory.mktemp("broken")
    files = {
        "no_layers": rewrite_gguf(tiny_draft, str(d / "no_layers.gguf"), drop_keys=["dflash.target_layers"]),
        "layers_out_of_range": rewrite_gguf(
            tiny_draft, str(d / "range.gguf"), set_keys={"dflash.target_layers": ([1, 2, 99], ARR, I32)}),
        "no_mask": rewrite_gguf(tiny_draft, str(d / "no_mask.gguf"), drop_keys=["tokenizer.ggml.mask_token_id"]),
        "mask_out_of_vocab": rewrite_gguf(
            tiny_draft, str(d / "mask.gguf"), set_keys={"tokenizer.ggml.mask_token_id": (100000, U32)}),
        "block_one": rewrite_gguf(tiny_draft, str(d / "block1.gguf"), set_keys={"dflash.block_size": (1, U32)}),
        "block_huge": rewrite_gguf(tiny_draft, str(d / "block9k.gguf"), set_keys={"dflash.block_size": (9000, U32)}),
        "no_heads": rewrite_gguf(tiny_draft, str(d / "noheads.gguf"), drop_keys=["dflash.attention.head_count"]),
        "bad_kv_heads": rewrite_gguf(
            tiny_draft, str(d / "kv.gguf"), set_keys={"dflash.attention.head_count_kv": (3, U32)}),
    }
    # a draft for a different, wider target: embedding length mismatch
    wide = write_tiny_target(str(d / "wide_target.gguf"), n_embd=96, n_head=4, seed=5)
    files["n_embd"] = write_random_draft(str(d / "wide_draft.gguf"), wide)
    # vocabulary mismatches: one token text changed; one token fewer
    from llama_dflash.writer import tiny_vocab

    tokens, _, _ = tiny_vocab()
    changed = [t.encode() for t in tokens]
    changed[300] = b"\xe2\x96\x81zzz"
    files["token_text"] = rewrite_gguf(
        tiny_draft, str(d / "tok.gguf"), set_keys={"tokenizer.ggml.tokens": (changed, ARR, STR)})
    files["vocab_size"] = rewrite_gguf(
        tiny_draft, str(d / "vsize.gguf"),
        set_keys={"tokenizer.ggml.tokens": ([t.encode() for t in tokens[:-1]], ARR, STR)})
    files["gemma3_target"] = rewrite_gguf(tiny_target, str(d / "gemma3.gguf"), arch="gemma3")
    files["qwen2_target"] = rewrite_gguf(tiny_target, str(d / "qwen2.gguf"), arch="qwen2")
    not_gguf = d / "text.gguf"
    not_gguf.write_text("this is not a model\n")
    files["not_gguf"] = str(not_gguf)
    truncated = d / "truncated.gguf"
    truncated.write_bytes(open(tiny_draft, "rb").read()[:200])
    files["truncated"] = str(truncated)
    return files


CASES = [
    # (file key, field named in the message)
    ("no_layers", "dflash.target_layers"),
    ("layers_out_of_range", "dflash.target_layers"),
    ("no_mask", "tokenizer.ggml.mask_token_id"),
    ("mask_out_of_vocab", "tokenizer.ggml.mask_token_id"),
    ("block_one", "dflash.block_size"),
    ("block_huge", "dflash.block_size"),
    ("no_heads", "dflash.attention.head_count"),
    ("bad_kv_heads", "dflash.attention.head_count_kv"),
    ("n_embd", "dflash.embedding_length"),
    ("token_text", "tokenizer.ggml.tokens[300]"),
    ("vocab_size", "vocabulary size"),
]


@pytest.mark.parametrize("key,field", CASES)
def test_bad_draft_raises_naming_file_and_field(broken, tiny_target, key, field):
    with pytest.raises(IncompatibleModelError) as exc:
        validate_pair(read_gguf(tiny_target), read_gguf(broken[key]))
    msg = str(exc.value)
    assert broken[key] in msg and field in msg and "expected" in msg
    assert exc.value.path == broken[key]


def test_non_dflash_file_as_draft(tiny_target):
    with pytest.raises(IncompatibleModelError, match="general.architecture is 'llama', expected 'dflash'"):
        validate_pair(read_gguf(tiny_target), read_gguf(tiny_target))


@pytest.mark.parametrize("arch", ["gemma3", "qwen2"])
def test_unsupported_target_architecture(broken, tiny_draft, arch):
    with pytest.raises(UnsupportedTargetError, match=f"general.architecture is '{arch}'"):
        validate_pair(read_gguf(broken[f"{arch}_target"]), read_gguf(tiny_draft))


def test_draft_given_as_target(tiny_draft):
    with pytest.raises(IncompatibleModelError, match="this file is a DFlash draft"):
        validate_pair(read_gguf(tiny_draft), read_gguf(tiny_draft))


@pytest.mark.parametrize("key,reason", [("not_gguf", "not a GGUF file"), ("truncated", "truncated")])
def test_unreadable_files(broken, key, reason):
    with pytest.raises(GGUFFileError, match=reason):
        read_gguf(broken[key])


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(GGUFFileError, match="no such file"):
        read_gguf(str(tmp_path / "absent.gguf"))
    with pytest.raises(GGUFFileError, match="is a directory"):
        read_gguf(str(tmp_path))


def test_forced_algorithm_must_match_file(tiny_target, tiny_draft):
    with pytest.raises(IncompatibleModelError, match="algorithm is 'dspark', expected 'dflash'"):
        validate_pair(read_gguf(tiny_target), read_gguf(tiny_draft), "dspark")


def test_engine_validates_before_loading(broken, tiny_target):
    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64)
    with pytest.raises(IncompatibleModelError, match="dflash.embedding_length"):
        LlamaDFlashDecoding(cfg, SpecConfig(broken["n_embd"]))


def test_reads_real_metadata(tiny_target, tiny_draft):
    t, d = read_gguf(tiny_target), read_gguf(tiny_draft)
    assert (t.architecture, t.n_layer, t.n_embd, t.file_type) == ("llama", 4, 64, "ALL_F32")
    info = validate_pair(t, d)
    assert info.algorithm == "dflash" and info.block_size == 16 and info.max_draft_tokens == 15
    assert all(0 <= x <= t.n_layer for x in info.target_layers)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", *args],
                          capture_output=True, text=True, timeout=180)


CLI_CASES = [(k, f) for k, f in CASES] + [("gemma3_target", "gemma3"), ("not_gguf", "not a GGUF file")]


@pytest.mark.parametrize("key,needle", CLI_CASES)
def test_cli_exits_2_with_one_line(broken, tiny_target, tiny_draft, key, needle):
    if key.endswith("_target"):
        args = ["--model", broken[key], "--draft-model", tiny_draft]
    else:
        args = ["--model", tiny_target, "--draft-model", broken[key]]
    proc = _cli(*args, "--max-tokens", "4", "--runs", "1", "--n-ctx", "256")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--runs", "0"], "runs must be >= 1"),
    (["--max-tokens", "0"], "max-tokens must be >= 1"),
    (["--draft-tokens", "0"], "draft_n_max must be >= 1"),
    (["--draft-p-min", "1.5"], "draft_p_min must be in [0, 1]"),
    (["--n-ubatch", "1024", "--n-batch", "512"], "n_ubatch (1024) must not exceed n_batch"),
    (["--draft-tokens", "x"], "expected an integer or 'auto'"),
    (["--algorithm", "medusa"], "invalid choice"),
    (["--json", "/nonexistent-dir/out.json"], "does not exist"),
])
def test_cli_bad_arguments(tiny_target, tiny_draft, args, needle):
    proc = _cli("--model", tiny_target, "--draft-model", tiny_draft, *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
