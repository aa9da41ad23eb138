"""Recurrent/hybrid targets: native n_rs_seq rollback and checkpoint/restore/replay.

The target is a tiny random lfm2 (short-convolution recurrent layers interleaved with attention
layers), an architecture whose recurrent layers honour n_rs_seq, so both strategies run on it:
"native" by default and "checkpoint" when forced.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.proposer import ScriptedProposer
from llama_dflash.rewind import CheckpointRewinder, NativeRewinder
from llama_dflash.writer import write_random_draft, write_tiny_target
from spec_common import check_every_accepted_length, script_from_reference

N_TOKENS = 64
MODES = ("native", "checkpoint")


@pytest.fixture(scope="module")
def hybrid_target(tiny_dir):
    return write_tiny_target(str(tiny_dir / "lfm2.gguf"), arch="lfm2", n_layer=4, seed=11)


@pytest.fixture(scope="module")
def hybrid_draft(tiny_dir, hybrid_target):
    return write_random_draft(str(tiny_dir / "lfm2_draft.gguf"), hybrid_target, block_size=9, seed=12)


@pytest.fixture()
def hybrid_config(hybrid_target):
    return TargetConfig(hybrid_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


@pytest.fixture(scope="module")
def hybrid_reference(hybrid_target):
    cfg = TargetConfig(hybrid_target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with OrdinaryDecoding(cfg) as o:
        prompt = o.tokenize(PROMPT_TEXT)
        res = o.generate(prompt, N_TOKENS, ignore_eos=True)
    assert len(set(res.tokens)) > 5, "the fixture should not be degenerate"
    return prompt, res.tokens


def _engine(config, draft, mode, n_max=8, **kw):
    return LlamaDFlashDecoding(config, SpecConfig(draft, draft_n_max=n_max, rollback=mode, **kw))


def test_auto_picks_native_for_lfm2(hybrid_config, hybrid_draft, tiny_config, tiny_draft):
    with _engine(hybrid_config, hybrid_draft, "auto") as eng:
        assert isinstance(eng.rewinder, NativeRewinder)
        assert eng.rewinder.depth >= 8
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        assert eng.rewinder.mode == "kv"  # attention-only: cells are cut directly


def test_forcing_on_attention_target_is_a_clear_error(tiny_config, tiny_draft):
    with pytest.raises(ValueError, match="recurrent or hybrid"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, rollback="checkpoint"))
    with pytest.raises(ValueError, match="rollback must be one of"):
        SpecConfig(tiny_draft, rollback="sometimes")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_greedy_output_matches_ordinary(hybrid_config, hybrid_draft, hybrid_reference, mode, n_draft):
    prompt, ref = hybrid_reference
    with _engine(hybrid_config, hybrid_draft, mode, n_max=n_draft) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        again = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert res.tokens == ref
    assert again.tokens == ref
    assert res.stats.rollback_mode == mode


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend_sampling", (True, False))
def test_every_accepted_length(hybrid_config, hybrid_draft, hybrid_reference, mode, backend_sampling):
    prompt, ref = hybrid_reference
    with _engine(hybrid_config, hybrid_draft, mode, backend_sampling=backend_sampling) as eng:
        res = check_every_accepted_length(eng, prompt, ref, 8)
        s = res.stats
        assert s.rollbacks > 0
        if mode == "native":
            assert s.native_rollbacks == s.rollbacks and s.checkpoint_captures == 0
        else:
            assert s.native_rollbacks == 0
            assert s.checkpoint_restores == s.rollbacks
            assert s.checkpoint_captures == s.verification_steps  # every step drafted 8 tokens
            assert s.replayed_tokens > 0 and s.checkpoint_bytes > 0
            assert s.checkpoint_capture_seconds > 0 and s.checkpoint_restore_seconds > 0


@pytest.mark.parametrize("mode", MODES)
def test_stream_closed_mid_step_then_next_request_correct(hybrid_config, hybrid_draft, hybrid_reference, mode):
    """A consumer that stops inside a step leaves the caches at the tokens it took."""
    prompt, ref = hybrid_reference
    with _engine(hybrid_config, hybrid_draft, mode) as eng:
        # every draft fully right: each step yields 9 tokens; stop after 3 of the second step
        eng.use_proposer(ScriptedProposer(eng._dflash, script_from_reference(prompt, ref, lambda i, n: n)))
        stream = eng.stream(prompt, N_TOKENS, ignore_eos=True)
        got = [next(stream) for _ in range(12)]
        stream.close()
        assert got == ref[:12]
        # the cache holds the prompt and the tokens taken, minus the last (the next id_last)
        assert eng.target.pos_max() == len(prompt) + 12 - 2
        assert eng.target.pos_max() == eng._dflash.pos_max()
        eng.use_proposer(eng._dflash)
        assert eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens == ref


@pytest.mark.parametrize("mode", MODES)
def test_p_min_one_drafts_nothing(hybrid_config, hybrid_draft, hybrid_reference, mode):
    prompt, ref = hybrid_reference
    with _engine(hybrid_config, hybrid_draft, mode, draft_p_min=1.0) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert res.tokens == ref
    assert res.stats.verified == 0 and res.stats.checkpoint_captures == 0


def test_checkpoint_memory_does_not_grow(hybrid_config, hybrid_draft, hybrid_reference):
    prompt, ref = hybrid_reference
    with _engine(hybrid_config, hybrid_draft, "checkpoint", n_max=4) as eng:
        held = []
        for _ in range(20):
            res = eng.generate(prompt, 16, ignore_eos=True)
            assert res.tokens == ref[:16]
            held.append(eng.rewinder.bytes_held)
        assert isinstance(eng.rewinder, CheckpointRewinder)
        assert held[0] > 0 and len(set(held)) == 1, held


def test_auto_controller_on_hybrid(hybrid_config, hybrid_draft, hybrid_reference):
    prompt, ref = hybrid_reference
    for mode in MODES:
        with _engine(hybrid_config, hybrid_draft, mode, n_max="auto") as eng:
            assert eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens == ref


@pytest.mark.parametrize("mode", MODES)
def test_dspark_draft_on_hybrid_target(tiny_dir, hybrid_target, hybrid_config, hybrid_reference, mode):
    prompt, ref = hybrid_reference
    draft = write_random_draft(str(tiny_dir / "lfm2_dspark.gguf"), hybrid_target, block_size=9,
                               markov_rank=8, confidence_head=True, seed=13)
    with _engine(hybrid_config, draft, mode, n_max=6) as eng:
        assert eng.algorithm == "dspark"
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert res.tokens == ref
    assert res.stats.rollbacks > 0
    assert (res.stats.native_rollbacks if mode == "native" else res.stats.checkpoint_restores) == res.stats.rollbacks


@pytest.mark.parametrize("mode", MODES)
def test_bench_reports_rollback_counters(tmp_path, hybrid_target, hybrid_draft, mode):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", hybrid_target, "--draft-model", hybrid_draft,
         "--max-tokens", "24", "--runs", "2", "--warmup-tokens", "4", "--draft-tokens", "4", "--n-ctx", "256",
         "--n-batch", "64", "--n-ubatch", "64", "--ignore-eos", "--raw-prompt", "--prompt", "the and is",
         "--rollback", mode, "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "output tokens match : True" in proc.stdout
    s = json.loads(out.read_text())["speculative"]["stats"]
    assert s["rollback_mode"] == mode and s["rollbacks"] > 0
    assert f"draft rollbacks     : {s['rollbacks']} (native: {s['native_rollbacks']})" in proc.stdout
    if mode == "native":
        assert s["native_rollbacks"] == s["rollbacks"] and s["checkpoint_captures"] == 0
    else:
        assert s["checkpoint_restores"] == s["rollbacks"] and s["checkpoint_captures"] >= s["rollbacks"]
        assert s["checkpoint_bytes"] > 0 and s["checkpoint_seconds"] > 0
        assert "  checkpoint          : " in proc.stdout
