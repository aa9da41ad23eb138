"""The tiny random qwen3next fixture: a hybrid target (gated delta net + full attention, MoE)
that llama.cpp loads on CPU, with no native partial rollback but a usable partial-state
checkpoint (in host memory and kept on the device; the model offloads where the build can)."""

from __future__ import annotations

import ctypes
import os

import llama_cpp.llama_cpp as ll
import numpy as np
import pytest

from _equivalence import DEVICE_LAYERS
from llama_dflash._llama import Model
from llama_dflash.config import TargetConfig
from llama_dflash.engine import OrdinaryDecoding
from llama_dflash.inspect import read_gguf, validate_target
from llama_dflash.target import TargetContext
from llama_dflash.tiny_qwen3next import recurrent_layers, write_tiny_qwen3next

N_EMBD = 64
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
ON_DEVICE = 2  # LLAMA_STATE_SEQ_FLAGS_ON_DEVICE
TOKENS = [1, 279, 293, 290, 276, 306, 294, 288]  # "<s>" + word pieces


@pytest.fixture(scope="module")
def q3n_path(tmp_path_factory):
    return write_tiny_qwen3next(str(tmp_path_factory.mktemp("q3n") / "qwen3next.gguf"), n_embd=N_EMBD)


@pytest.fixture(scope="module")
def q3n_config(q3n_path):
    return TargetConfig(q3n_path, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_gpu_layers=DEVICE_LAYERS)


@pytest.fixture(scope="module")
def q3n_model(q3n_path):
    m = Model(q3n_path, n_gpu_layers=DEVICE_LAYERS, repack=None)
    yield m
    m.close()


@pytest.fixture()
def q3n_target(q3n_model, q3n_config):
    t = TargetContext(q3n_model, q3n_config, extract_layers=(1, 2))
    yield t
    t.close()


def _rows(t: TargetContext, n: int) -> np.ndarray:
    return np.stack([t.logits_row(i).copy() for i in range(n)])


def test_metadata_and_validation(q3n_path):
    info = read_gguf(q3n_path)
    assert info.architecture == "qwen3next"
    assert info.n_embd == N_EMBD and info.n_layer == 4
    validate_target(info)
    assert os.path.getsize(q3n_path) < 5 * 1024 * 1024
    assert recurrent_layers(4) == [0, 2]


def test_loads_decodes_and_extracts(q3n_model, q3n_target):
    assert ll.llama_model_is_hybrid(q3n_model.ptr)
    t = q3n_target
    t.decode(TOKENS, 0, logits="all")
    logits = _rows(t, len(TOKENS))
    assert logits.shape == (len(TOKENS), q3n_model.n_vocab)
    assert np.isfinite(logits).all()
    assert not np.allclose(logits, logits[0])
    assert len(set(logits.argmax(axis=1).tolist())) > 1
    feats = t.layer_features()
    assert feats.shape == (len(TOKENS), 2 * N_EMBD)
    assert np.isfinite(feats).all()
    assert feats.std() > 0


def test_greedy_ordinary_decoding_deterministic(q3n_config):
    with OrdinaryDecoding(q3n_config) as o:
        prompt = o.tokenize("the quick brown fox")
        a = o.generate(prompt, 24, ignore_eos=True).tokens
        b = o.generate(prompt, 24, ignore_eos=True).tokens
    assert len(a) == 24
    assert a == b
    assert len(set(a)) > 1


def test_no_native_partial_rollback(q3n_target):
    t = q3n_target
    t.decode(TOKENS, 0, logits="last")
    assert t.pos_max() == len(TOKENS) - 1
    assert t.seq_rm(5) is False
    assert t.seq_rm(0) is True  # a full clear works
    assert t.pos_max() == -1
    t.decode(TOKENS[:3], 0, logits="last")
    assert t.pos_max() == 2


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [PARTIAL_ONLY, PARTIAL_ONLY | ON_DEVICE], ids=["host", "on_device"])
def test_partial_state_checkpoint_restores(q3n_target, flags):
    """A checkpoint taken with `flags` (ON_DEVICE: kept in the device's buffers, the host buffer holds
    only a header; a later get with the flag would invalidate it) restores the recurrent state:
    host snapshots before, after the detour and after the restore say so byte for byte."""
    t = q3n_target
    ctx = t.ctx.ptr

    def host_state() -> bytes:
        n = ll.llama_state_seq_get_size_ext(ctx, 0, PARTIAL_ONLY)
        out = (ctypes.c_uint8 * n)()
        assert ll.llama_state_seq_get_data_ext(ctx, out, n, 0, PARTIAL_ONLY) == n
        return bytes(out)

    # reference: positions 0..4, then TOKENS[5] at position 5
    t.decode(TOKENS[:5], 0, logits="none")
    t.decode([TOKENS[5]], 5, logits="last")
    ref = t.logits_row(0).copy()
    t.clear()

    t.decode(TOKENS[:5], 0, logits="none")
    size = ll.llama_state_seq_get_size_ext(ctx, 0, flags)
    assert size > 0
    buf = (ctypes.c_uint8 * size)()
    assert ll.llama_state_seq_get_data_ext(ctx, buf, size, 0, flags) == size
    before = host_state()
    t.decode([7, 8, 9], 5, logits="last")  # the detour: three other tokens at 5..7
    assert t.pos_max() == 7
    assert host_state() != before  # the detour did change the recurrent state
    assert ll.llama_state_seq_set_data_ext(ctx, buf, size, 0, flags) == size
    assert host_state() == before
    assert t.seq_rm(5) is True  # only attention KV beyond position 4 is left to cut
    assert t.pos_max() == 4
    t.decode([TOKENS[5]], 5, logits="last")
    got = t.logits_row(0).copy()
    assert np.isfinite(got).all()
    assert np.allclose(got, ref, atol=1e-4)
