"""Every incompatibility is a Python exception naming file, field, found and expected value,
raised before llama.cpp sees the file; via the CLI it is one line on stderr and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
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


# ---- regression tests: issue 13 item 7, issue 12 items 3 and 5 ----------------------------------

from fuzz.gguf_mutations import rewrite  # noqa: E402
from llama_dflash.inspect import check_gguf_file, read_draft, validate_files, validate_target_file  # noqa: E402

U64, F32T, BOOLT = GGUFValueType.UINT64, GGUFValueType.FLOAT32, GGUFValueType.BOOL


def _rw(src, tmp_path, name, **kw):
    dst = str(tmp_path / f"{name}.gguf")
    rewrite(src, dst, **kw)
    return dst


@pytest.mark.parametrize("key,value", [
    ("dflash.block_size", ([16, 16], ARR, U32)),          # was a TypeError traceback
    ("tokenizer.ggml.mask_token_id", ("3", STR)),          # was "invalid literal for int()"
    ("dflash.embedding_length", ("64x", STR)),             # was a ValueError while reading
    ("dflash.has_confidence_head", ("false", STR)),        # was silently True
    ("dflash.attention.causal", (1, U32)),                 # was silently True
    ("dflash.block_count", (2**40, U64)),                  # llama.cpp asserts <= 512
    ("dflash.attention.layer_norm_rms_epsilon", (float("nan"), F32T)),
])
def test_wrong_value_types_name_file_and_field(tiny_target, tiny_draft, tmp_path, key, value):
    path = _rw(tiny_draft, tmp_path, "typed", set_keys={key: value})
    with pytest.raises(IncompatibleModelError) as exc:
        validate_pair(read_gguf(tiny_target), read_gguf(path))
    assert exc.value.path == path and key in exc.value.field and "expected" in str(exc.value)


def _patch_u64(src: str, dst: str, key: str, after_type: int, value: int) -> str:
    """Overwrite the 8 bytes at `after_type` bytes past key's value type (an array's count)."""
    import struct as _struct

    from fuzz.gguf_mutations import parse

    raw = bytearray(open(src, "rb").read())
    kv = parse(bytes(raw)).kv(key)
    _struct.pack_into("<Q", raw, kv.value_start + after_type, value)
    with open(dst, "wb") as fh:
        fh.write(raw)
    return dst


@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.scores"])
def test_huge_array_count_fails_at_once_naming_the_array(tiny_target, tmp_path, key):
    path = _patch_u64(tiny_target, str(tmp_path / "huge.gguf"), key, 4, 2**64 - 1)
    with pytest.raises(GGUFFileError, match=f"the length of array '{key}' is 18446744073709551615"):
        read_gguf(path)


def test_header_is_read_without_mmap(tiny_target, tiny_draft, monkeypatch):
    """A file truncated while mapped turns into SIGBUS; plain reads turn it into an error."""
    import mmap

    def no_mmap(*a, **k):
        raise AssertionError("mmap used")

    monkeypatch.setattr(mmap, "mmap", no_mmap)
    validate_pair(read_gguf(tiny_target), read_gguf(tiny_draft))


def test_file_shrinking_while_read_is_an_error(tiny_target, tmp_path, monkeypatch):
    """The file's size is taken when it is opened; a file cut shorter afterwards (simulated: the
    size reported is the original one) ends in an error at the first read past its new end."""
    import llama_dflash.gguffile as gf

    raw = open(tiny_target, "rb").read()
    path = tmp_path / "shrunk.gguf"
    path.write_bytes(raw[:300])

    class Original:
        st_size = len(raw)

    monkeypatch.setattr(gf.os, "fstat", lambda fd: Original())
    with pytest.raises(GGUFFileError, match="ended at byte 300 while being read"):
        read_gguf(str(path))


def test_d2t_is_read_from_its_own_bytes(tiny_dir, tiny_target, monkeypatch):
    """Not through gguf.GGUFReader (every tensor of the file: ~3 s on SmolLM2)."""
    import gguf

    path = write_random_draft(str(tiny_dir / "own_bytes_d2t.gguf"), tiny_target, seed=4, draft_vocab=32)

    def no_reader(*a, **k):
        raise AssertionError("GGUFReader used")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    assert validate_pair(read_gguf(tiny_target), read_gguf(path)).reduced_vocab == 32


@pytest.mark.parametrize("tensor,cut,field", [
    ("fc.weight", lambda a: a[:, :-64], "tensor fc.weight shape"),
    ("blk.0.attn_k.weight", lambda a: a[:-8], "tensor blk.0.attn_k.weight shape"),
    ("blk.0.ffn_up.weight", lambda a: a[:-1], "tensor blk.0.ffn_up.weight shape"),
    ("blk.0.attn_q_norm.weight", lambda a: a[:-1], "tensor blk.0.attn_q_norm.weight shape"),
])
def test_draft_shapes_checked_against_metadata(tiny_target, tiny_draft, tmp_path, tensor, cut, field):
    from gguf import GGUFReader

    t = next(x for x in GGUFReader(tiny_draft, "r").tensors if x.name == tensor)
    arr = np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
    path = _rw(tiny_draft, tmp_path, "shape", tensors={tensor: cut(arr)})
    with pytest.raises(IncompatibleModelError) as exc:
        validate_pair(read_gguf(tiny_target), read_gguf(path))
    assert exc.value.field == field


def test_markov_head_shapes(tiny_dir, tiny_target, tmp_path):
    from gguf import GGUFReader

    dspark = write_random_draft(str(tiny_dir / "shape_dspark.gguf"), tiny_target, seed=5, markov_rank=8,
                                confidence_head=True)
    w1 = next(x for x in GGUFReader(dspark, "r").tensors if x.name == "conf_proj.weight")
    path = _rw(dspark, tmp_path, "conf", tensors={"conf_proj.weight": np.array(w1.data).reshape(1, -1)[:, :-2]})
    with pytest.raises(IncompatibleModelError, match="tensor conf_proj.weight shape"):
        validate_pair(read_gguf(tiny_target), read_gguf(path))


def test_target_shapes_checked_before_loading(tiny_target, tmp_path):
    from gguf import GGUFReader

    t = next(x for x in GGUFReader(tiny_target, "r").tensors if x.name == "output.weight")
    path = _rw(tiny_target, tmp_path, "out_rows", tensors={"output.weight": np.array(t.data).reshape(316, 64)[:-4]})
    with pytest.raises(IncompatibleModelError, match="tensor output.weight shape"):
        validate_target_file(path)


@pytest.mark.parametrize("arch", ["gemma3n", "hunyuan-moe"])
def test_archs_without_layer_inputs_refused(tiny_target, tmp_path, arch):
    path = _rw(tiny_target, tmp_path, arch, arch=arch)
    with pytest.raises(UnsupportedTargetError, match=f"general.architecture is '{arch}'"):
        validate_target_file(path)


def _layers_draft(tiny_target, tmp_path, layers, name="layers"):
    return write_random_draft(str(tmp_path / f"{name}.gguf"), tiny_target, seed=6, target_layers=layers)


def test_layer_id_equal_to_block_count_refused_on_llama(tiny_target, tmp_path):
    draft = _layers_draft(tiny_target, tmp_path, [1, 2, 4])
    with pytest.raises(IncompatibleModelError, match=r"dflash.target_layers is \[1, 2, 4\], expected layer ids "
                                                     r"within 0..3"):
        validate_files(tiny_target, draft)


@pytest.mark.parametrize("arch", ["nemotron_h", "mimo2", "deepseek4", "nemotron_h_moe"])
def test_layer_id_equal_to_block_count_allowed_where_the_final_input_exists(tiny_target, tmp_path, arch):
    target = _rw(tiny_target, tmp_path, arch, arch=arch)
    info = validate_pair(validate_target_file(target), read_draft(_layers_draft(tiny_target, tmp_path, [1, 2, 4])))
    assert info.target_layers == (1, 2, 4)


def test_layer_ids_bounded_by_mtp_layers(tiny_target, tmp_path):
    target = _rw(tiny_target, tmp_path, "nextn", set_keys={"llama.nextn_predict_layers": (1, U32)})
    with pytest.raises(IncompatibleModelError, match="within 0..2 .*1 of them MTP layers"):
        validate_files(target, _layers_draft(tiny_target, tmp_path, [1, 2, 3]))
    validate_files(target, _layers_draft(tiny_target, tmp_path, [0, 1, 2], "ok"))


def test_qwen4exp_with_hyper_connections_refused(tiny_target, tmp_path):
    target = _rw(tiny_target, tmp_path, "q4", arch="qwen4exp",
                 set_keys={"qwen4exp.hyper_connection.count": (4, U32)})
    with pytest.raises(UnsupportedTargetError, match="qwen4exp.hyper_connection.count is 4"):
        validate_target_file(target)


def test_full_vocab_d2t_without_token_embd_accepted(tiny_dir, tiny_target, tmp_path):
    """A DSpark export over the whole vocabulary: d2t a permutation, no token_embd, no output:
    llama.cpp uses the target's embeddings and head through ctx_other."""
    dspark = write_random_draft(str(tiny_dir / "full_d2t_src.gguf"), tiny_target, seed=7, markov_rank=8)
    perm = np.random.default_rng(0).permutation(316).astype(np.int64)
    path = _rw(dspark, tmp_path, "full_d2t", tensors={"d2t": perm})
    info = validate_pair(read_gguf(tiny_target), read_gguf(path))
    assert info.reduced_vocab == 316 and not info.has_token_embd and not info.has_output
    # and llama.cpp runs it: same greedy tokens as ordinary decoding
    from llama_dflash import OrdinaryDecoding

    cfg = TargetConfig(tiny_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as plain:
        prompt = plain.tokenize("the quick brown fox")
        ref = plain.generate(prompt, 12, ignore_eos=True).tokens
    with LlamaDFlashDecoding(cfg, SpecConfig(path, draft_n_max=4)) as eng:
        res = eng.generate(prompt, 12, ignore_eos=True)
    assert res.tokens == ref and res.stats.drafted > 0


def test_missing_feed_forward_length_is_checked_like_llama_cpp(tiny_target, tiny_draft, tmp_path):
    """llama.cpp reads the key as optional (n_ff 0), then the ffn tensors cannot match."""
    path = _rw(tiny_draft, tmp_path, "no_ff", drop_keys=["dflash.feed_forward_length"])
    with pytest.raises(IncompatibleModelError) as exc:
        validate_pair(read_gguf(tiny_target), read_gguf(path))
    assert exc.value.field == "tensor blk.0.ffn_gate.weight shape" and "feed_forward_length 0" in str(exc.value)


def test_token_texts_compared_as_bytes(tiny_target, tiny_draft, tmp_path):
    """Two different invalid UTF-8 texts decode to the same replacement character."""
    from llama_dflash.writer import tiny_vocab

    def with_token(src, name, text):
        tokens = [t.encode() for t in tiny_vocab()[0]]
        tokens[300] = text
        return _rw(src, tmp_path, name, set_keys={"tokenizer.ggml.tokens": (tokens, ARR, STR)})

    target, draft = with_token(tiny_target, "t_ff", b"\xff"), with_token(tiny_draft, "d_fe", b"\xfe")
    with pytest.raises(IncompatibleModelError, match=r"tokenizer.ggml.tokens\[300\] is b'\\xfe'"):
        validate_pair(read_gguf(target), read_gguf(draft))


def test_check_gguf_file_for_any_model(tiny_target, tmp_path):
    """Usable without a draft and for architectures that cannot be DFlash targets."""
    assert check_gguf_file(_rw(tiny_target, tmp_path, "gemma3", arch="gemma3")).architecture == "gemma3"
    dup = [t.encode() for t in __import__("llama_dflash.writer", fromlist=["tiny_vocab"]).tiny_vocab()[0]]
    dup[5] = dup[4]
    with pytest.raises(IncompatibleModelError, match=r"tokenizer.ggml.tokens\[5\]"):
        check_gguf_file(_rw(tiny_target, tmp_path, "dup", set_keys={"tokenizer.ggml.tokens": (dup, ARR, STR)}))


def _bench(model, draft, *extra):
    return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "bench", "--model", model, "--draft-model", draft,
                           "--max-tokens", "2", "--runs", "1", "--warmup-tokens", "0", "--n-ctx", "64",
                           "--prompt", "a b", *extra], capture_output=True, text=True, timeout=180)


def test_cli_chat_template_of_wrong_type(tiny_target, tiny_draft, tmp_path):
    """Was a TypeError traceback from the bench's chat wrapping."""
    target = _rw(tiny_target, tmp_path, "tmpl", set_keys={"tokenizer.chat_template": (7, U32)})
    proc = _bench(target, tiny_draft)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "tokenizer.chat_template" in proc.stderr


def test_cli_layer_id_equal_to_block_count_does_not_abort(tiny_target, tmp_path):
    """llama.cpp asserts "layer input tensor is null" (SIGABRT) on this pair."""
    proc = _bench(tiny_target, _layers_draft(tiny_target, tmp_path, [1, 2, 4]))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "dflash.target_layers" in proc.stderr


def test_cli_target_with_repeated_token_does_not_abort(tiny_target, tiny_draft, tmp_path):
    """llama.cpp's vocabulary loader asserts distinct token texts (SIGABRT); the bench used to load
    the target before any check."""
    from llama_dflash.writer import tiny_vocab

    tokens = [t.encode() for t in tiny_vocab()[0]]
    tokens[290] = tokens[291]
    target = _rw(tiny_target, tmp_path, "dup_target", set_keys={"tokenizer.ggml.tokens": (tokens, ARR, STR)})
    proc = _bench(target, tiny_draft)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "tokenizer.ggml.tokens[291]" in proc.stderr
