"""Recurrent/hybrid targets: native n_rs_seq rollback and checkpoint/restore/replay.

Two tiny random targets: lfm2 (short-convolution recurrent layers between attention layers),
whose recurrent layers honour n_rs_seq, so both strategies run on it ("native" by default,
"checkpoint" when forced); and qwen3next (gated-delta-net layers), which has no native
rollback, so "auto" takes the checkpoint path.

The targets offload every layer where the build can (checkpoints then stay on the device); outputs
are compared with `assert_same_tokens` (exact on the CPU, tests/_equivalence.py on a GPU).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _equivalence import assert_same_tokens, offload_supported
from conftest import PROMPT_TEXT
from llama_dflash import LlamaDFlashDecoding, OrdinaryDecoding, SpecConfig, TargetConfig
from llama_dflash.proposers import ScriptedProposer
from llama_dflash.rewind import CheckpointRewinder, NativeRewinder
from llama_dflash.tiny_qwen3next import write_tiny_qwen3next
from llama_dflash.writer import write_random_draft, write_tiny_target
from spec_common import check_every_accepted_length, script_from_reference

N_TOKENS = 64


CASES = [("lfm2", "native"), ("lfm2", "checkpoint"), ("qwen3next", "checkpoint")]


class Pair:
    """A hybrid target, a random draft for it, and the ordinary reference continuation."""

    def __init__(self, tiny_dir, arch):
        if arch == "lfm2":
            self.target = write_tiny_target(str(tiny_dir / "lfm2.gguf"), arch="lfm2", n_layer=4, seed=11)
        else:
            self.target = write_tiny_qwen3next(str(tiny_dir / "qwen3next.gguf"), seed=1)
        self.draft = write_random_draft(str(tiny_dir / f"{arch}_draft.gguf"), self.target, block_size=9, seed=12)
        self.config = TargetConfig(self.target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
        with OrdinaryDecoding(self.config) as o:
            self.prompt = o.tokenize(PROMPT_TEXT)
            self.ref = o.generate(self.prompt, N_TOKENS, ignore_eos=True).tokens
        assert len(set(self.ref)) > 5, "the fixture should not be degenerate"


@pytest.fixture(scope="module")
def pairs(tiny_dir):
    return {arch: Pair(tiny_dir, arch) for arch in ("lfm2", "qwen3next")}


@pytest.fixture()
def hybrid_config(pairs):
    return pairs["lfm2"].config


@pytest.fixture()
def hybrid_draft(pairs):
    return pairs["lfm2"].draft


@pytest.fixture()
def hybrid_target(pairs):
    return pairs["lfm2"].target


def _engine(config, draft, mode, n_max=8, **kw):
    return LlamaDFlashDecoding(config, SpecConfig(draft, draft_n_max=n_max, rollback=mode, **kw))


def test_auto_picks_the_rollback_mode(pairs, tiny_config, tiny_draft):
    with _engine(pairs["lfm2"].config, pairs["lfm2"].draft, "auto") as eng:
        assert isinstance(eng.rewinder, NativeRewinder)  # lfm2 honours n_rs_seq
        assert eng.rewinder.depth >= 8
    with _engine(pairs["qwen3next"].config, pairs["qwen3next"].draft, "auto") as eng:
        assert isinstance(eng.rewinder, CheckpointRewinder)  # qwen3next does not
    with pytest.raises(ValueError, match="honours n_rs_seq"):
        _engine(pairs["qwen3next"].config, pairs["qwen3next"].draft, "native")
    with LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, draft_n_max=4)) as eng:
        assert eng.rewinder.mode == "kv"  # attention-only: cells are cut directly


def test_forcing_on_attention_target_is_a_clear_error(tiny_config, tiny_draft):
    with pytest.raises(ValueError, match="recurrent or hybrid"):
        LlamaDFlashDecoding(tiny_config, SpecConfig(tiny_draft, rollback="checkpoint"))
    with pytest.raises(ValueError, match="rollback must be one of"):
        SpecConfig(tiny_draft, rollback="sometimes")


@pytest.mark.gpu
@pytest.mark.parametrize("arch,mode", CASES)
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_greedy_output_matches_ordinary(pairs, arch, mode, n_draft):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
    with _engine(hybrid_config, hybrid_draft, mode, n_max=n_draft) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
        again = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert again.tokens == res.tokens  # the same batches again: identical on any device
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=hybrid_config)
    assert res.stats.rollback_mode == mode


@pytest.mark.parametrize("arch,mode", CASES)
def test_spec_type_auto_matches_ordinary(pairs, arch, mode):
    """`auto` over the draft (the default of generate and serve) on recurrent/hybrid targets: its
    lookup drafts (the session has seen the answer once), the target rolls back what it rejects
    (its first probes), and every answer is the ordinary one."""
    pair = pairs[arch]
    # auto's choices follow timings; the chain at a fixed length drafts (and is rejected) every step
    for spec_type, n_max in (("auto,draft", "auto"), ("lookup,draft", 4)):
        with _engine(pair.config, pair.draft, mode, n_max=n_max, spec_type=spec_type) as eng:
            runs = [eng.generate(pair.prompt, N_TOKENS, ignore_eos=True) for _ in range(3)]
        for res in runs:
            assert_same_tokens(res.tokens, pair.ref, prompt=pair.prompt, config=pair.config)
            assert res.stats.rollback_mode == mode
    assert sum(r.stats.accepted for r in runs) > 0 and sum(r.stats.rollbacks for r in runs) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("arch,mode", CASES)
@pytest.mark.parametrize("backend_sampling", (True, False))
def test_every_accepted_length(pairs, arch, mode, backend_sampling):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
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
            assert s.checkpoint_on_device  # kept where the state lives (the GPU when offloaded), no host fallback
            assert s.replayed_tokens > 0 and s.checkpoint_bytes > 0
            assert s.checkpoint_capture_seconds > 0 and s.checkpoint_restore_seconds > 0


@pytest.mark.parametrize("arch,mode", CASES)
def test_stream_closed_mid_step_then_next_request_correct(pairs, arch, mode):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    """A consumer that stops inside a step leaves the caches at the tokens it took."""
    prompt, ref = pair.prompt, pair.ref
    with _engine(hybrid_config, hybrid_draft, mode) as eng:
        # every draft fully right: each step yields 9 tokens; stop after 3 of the second step
        eng.use_proposer(ScriptedProposer(eng._dflash, script_from_reference(prompt, ref, lambda i, n: n)))
        stream = eng.stream(prompt, N_TOKENS, ignore_eos=True)
        got = [next(stream) for _ in range(12)]
        stream.close()
        assert_same_tokens(got, ref[:12], prompt=prompt, config=hybrid_config)
        # the cache holds the prompt and the tokens taken, minus the last (the next id_last)
        assert eng.target.pos_max() == len(prompt) + 12 - 2
        assert eng.target.pos_max() == eng._dflash.pos_max()
        eng.use_proposer(eng._dflash)
        assert_same_tokens(eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens, ref, prompt=prompt,
                           config=hybrid_config)


@pytest.mark.parametrize("arch,mode", CASES)
def test_p_min_one_drafts_nothing(pairs, arch, mode):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
    with _engine(hybrid_config, hybrid_draft, mode, draft_p_min=1.0) as eng:
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert res.tokens == ref  # nothing drafted: one-row decodes as ordinary decoding, exact anywhere
    assert res.stats.verified == 0 and res.stats.checkpoint_captures == 0


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["lfm2", "qwen3next"])
def test_checkpoint_memory_does_not_grow(pairs, arch):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
    with _engine(hybrid_config, hybrid_draft, "checkpoint", n_max=4) as eng:
        held = []
        for _ in range(20):
            res = eng.generate(prompt, 16, ignore_eos=True)
            assert_same_tokens(res.tokens, ref[:16], prompt=prompt, config=hybrid_config)
            held.append(eng.rewinder.bytes_held)
        assert isinstance(eng.rewinder, CheckpointRewinder)
        assert held[0] > 0 and len(set(held)) == 1, held


@pytest.mark.parametrize("arch,mode", CASES)
def test_auto_controller_on_hybrid(pairs, arch, mode):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
    with _engine(hybrid_config, hybrid_draft, mode, n_max="auto") as eng:
        assert_same_tokens(eng.generate(prompt, N_TOKENS, ignore_eos=True).tokens, ref, prompt=prompt,
                           config=hybrid_config)


@pytest.mark.parametrize("arch,mode", CASES)
def test_dspark_draft_on_hybrid_target(pairs, arch, tiny_dir, mode):
    pair = pairs[arch]
    hybrid_config, hybrid_draft, hybrid_target = pair.config, pair.draft, pair.target
    prompt, ref = pair.prompt, pair.ref
    draft = write_random_draft(str(tiny_dir / "lfm2_dspark.gguf"), hybrid_target, block_size=9,
                               markov_rank=8, confidence_head=True, seed=13)
    with _engine(hybrid_config, draft, mode, n_max=6) as eng:
        assert eng.algorithm == "dspark"
        res = eng.generate(prompt, N_TOKENS, ignore_eos=True)
    assert_same_tokens(res.tokens, ref, prompt=prompt, config=hybrid_config)
    assert res.stats.rollbacks > 0
    assert (res.stats.native_rollbacks if mode == "native" else res.stats.checkpoint_restores) == res.stats.rollbacks


@pytest.mark.parametrize("arch,mode", CASES)
def test_bench_reports_rollback_counters(tmp_path, pairs, arch, mode):
    hybrid_target, hybrid_draft = pairs[arch].target, pairs[arch].draft
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", hybrid_target, "--draft-model", hybrid_draft,
         "--max-tokens", "24", "--runs", "2", "--warmup-tokens", "4", "--draft-tokens", "4", "--n-ctx", "256",
         "--n-batch", "64", "--n-ubatch", "64", "--ignore-eos", "--raw-prompt", "--prompt", "the and is",
         "--rollback", mode, "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # the bench offloads every layer where it can: exact on the CPU; on a GPU batch-shape rounding may
    # flip a near-tie (the other tests here check such divergences against the logits)
    assert "output tokens match : True" in proc.stdout or (
        offload_supported() and "output tokens match : " in proc.stdout)
    s = json.loads(out.read_text())["speculative"]["stats"]
    assert s["rollback_mode"] == mode and s["rollbacks"] > 0
    assert f"draft rollbacks     : {s['rollbacks']} (native: {s['native_rollbacks']})" in proc.stdout
    if mode == "native":
        assert s["native_rollbacks"] == s["rollbacks"] and s["checkpoint_captures"] == 0
    else:
        assert s["checkpoint_restores"] == s["rollbacks"] and s["checkpoint_captures"] >= s["rollbacks"]
        assert s["checkpoint_bytes"] > 0 and s["checkpoint_seconds"] > 0
        assert "  checkpoint          : " in proc.stdout


@pytest.mark.parametrize("arch,mode", CASES)
def test_rewind_before_the_last_decode_empties_the_cache(pairs, arch, mode):
    """A stop token sampled from a step's first row takes the cache back before that step's
    first position: no snapshot or checkpoint covers it, so the cache is emptied (and says so)."""
    pair = pairs[arch]
    with _engine(pair.config, pair.draft, mode, n_max=4) as eng:
        t, rw = eng.target, eng.rewinder
        t.clear()
        rw.reset()
        t.decode(pair.prompt[:-1], 0, logits="none")
        pos0 = len(pair.prompt) - 1
        block = [pair.prompt[-1], *pair.ref[:3]]
        rw.before_verify(pos0, block)
        t.decode(block, pos0, logits="all")
        assert rw.rewind(pos0 + 2) == pos0 + 2  # within reach
        rw.settle()
        assert t.pos_max() == pos0 + 1
        rw.before_verify(pos0 + 2, block[2:3])
        t.decode(block[2:3], pos0 + 2, logits="all")
        assert rw.rewind(pos0 + 2) == 0  # before the last decode: out of reach
        rw.settle()
        assert t.pos_max() == -1


def test_small_ubatch_native_refused_auto_uses_checkpoints(pairs):
    """llama.cpp aborts unless n_ubatch > n_rs_seq + 1: refused (forced native) or avoided (auto)."""
    pair = pairs["lfm2"]
    small = TargetConfig(pair.target, n_ctx=256, n_batch=64, n_ubatch=4, n_threads=1)
    with pytest.raises(ValueError, match="n_ubatch > 9"):
        _engine(small, pair.draft, "native")
    with _engine(small, pair.draft, "auto") as eng:
        assert eng.rewinder.mode == "checkpoint"
        assert_same_tokens(eng.generate(pair.prompt, 32, ignore_eos=True).tokens, pair.ref[:32], prompt=pair.prompt,
                           config=small)


@pytest.mark.parametrize("which,args,needle", [
    ("lfm2", ["--rollback", "native", "--n-ubatch", "4"], "needs n_ubatch > 9"),
    ("lfm2", ["--rollback", "native", "--n-ubatch", "9"], "needs n_ubatch > 9"),  # n_rs_seq + 1: aborted
    ("qwen3next", ["--rollback", "native"], "honours n_rs_seq"),
    ("attention", ["--rollback", "checkpoint"], "recurrent or hybrid targets only"),
    ("lfm2", ["--rollback", "sometimes"], "invalid choice"),
])
def test_bad_rollback_settings_exit_2(pairs, tiny_target, tiny_draft, which, args, needle):
    target, draft = (tiny_target, tiny_draft) if which == "attention" else (pairs[which].target, pairs[which].draft)
    proc = subprocess.run(
        [sys.executable, "-m", "llama_dflash.cli", "bench", "--model", target, "--draft-model", draft,
         "--max-tokens", "4", "--runs", "1", "--n-ctx", "256", "--n-batch", "64", "--raw-prompt",
         "--prompt", "a b", "--threads", "1", *(args if "--n-ubatch" in args else [*args, "--n-ubatch", "64"])],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
