"""Sampled answers train on the target's greedy choices: the generators record the argmax at every
answer row, the mix cache stores it (greedy.i32), an older cache gets it from a prefill, and the
batch labels follow the greedy path from each anchor."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from llama_dflash._llama import Model
from llama_dflash.train.data import GREEDY_FILE, FeatureCache
from llama_dflash.train.dataset import MixConfig, add_greedy_labels, build_mixed_cache
from llama_dflash.train.multigen import Job, MultiGenerator
from llama_dflash.train.trainer import make_batch

PROMPTS = ["the cat is on the mat", "a b c d", "the dog and the", "x y z", "one two three four five", "hello"]


@pytest.fixture(scope="module")
def tiny_model(tiny_target):
    m = Model(tiny_target)
    yield m
    m.close()


def _jobs(m):
    """Greedy and sampled (T=1.5) answers of the same prompts."""
    return [Job(m.tokenize(p), 12, temperature=t, seed=i, tag=(i, t)) for i, p in enumerate(PROMPTS) for t in (0.0, 1.5)]


def _prefill_choices(m, results):
    g = MultiGenerator(m, [], n_seq=1, n_ctx_seq=64, n_threads=1, kv_unified=False)
    try:
        return {r.job.tag: g.greedy_choices(list(r.job.tokens) + r.answer, len(r.job.tokens) - 1) for r in results}
    finally:
        g.close()


def test_multigen_records_the_argmax_of_every_answer_row(tiny_model):
    m = tiny_model
    g = MultiGenerator(m, [1, 3], n_seq=3, n_ctx_seq=64, n_threads=1, kv_unified=False)
    try:
        res = list(g.run(_jobs(m)))
    finally:
        g.close()
    ref = _prefill_choices(m, res)
    differs = 0
    for r in res:
        plen, n = len(r.job.tokens), len(r.job.tokens) + len(r.answer)
        assert r.greedy.shape == (n,) and r.greedy.dtype == np.int32
        assert (r.greedy[:plen - 1] == -1).all() and r.greedy[-1] == -1  # no logits there
        rows = r.greedy[plen - 1:-1]
        np.testing.assert_array_equal(rows, ref[r.job.tag][plen - 1:-1])  # what a prefill of the sequence says
        if r.job.temperature == 0:
            assert list(rows) == r.answer  # greedy answers: the argmax is the next token
        else:
            differs += int((rows != np.asarray(r.answer)).sum())
    assert differs > 0  # sampled answers do leave the greedy path (else this test checks nothing)


def test_torch_generator_records_the_same_choices(tiny_target, tiny_model):
    from llama_dflash.train.torchgen import TorchGenerator, TorchTarget

    m = tiny_model
    gen = TorchGenerator(TorchTarget(tiny_target), [1, 3], m.eog_tokens(), batch=5, n_ctx_seq=64)
    res = list(gen.run(_jobs(m)))
    ref = _prefill_choices(m, res)
    for r in res:
        plen = len(r.job.tokens)
        assert r.greedy.shape == (plen + len(r.answer),) and r.greedy[-1] == -1
        np.testing.assert_array_equal(r.greedy[plen - 1:-1], ref[r.job.tag][plen - 1:-1])


def _hand_cache(root, tokens, greedy=None, prompt_len=2):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "meta.json"), "w") as f:
        json.dump({"width": 4}, f)
    with open(os.path.join(root, "seqs.jsonl"), "w") as f:
        f.write(json.dumps({"tokens": tokens, "prompt_len": prompt_len, "offset": 0, "temperature": 0.8}) + "\n")
    np.zeros((len(tokens), 4), dtype=np.float16).tofile(os.path.join(root, "features.f16"))
    if greedy is not None:
        np.asarray(greedy, dtype=np.int32).tofile(os.path.join(root, GREEDY_FILE))
    return FeatureCache(root)


@pytest.mark.parametrize("anchor_first", [True, False])
def test_batch_labels_follow_the_greedy_path(tmp_path, anchor_first):
    toks = list(range(100, 112))  # a sampled answer: at row 5 greedy decoding would have chosen 7, not 106
    greedy = [-1] * 12
    greedy[5] = 7
    plain = _hand_cache(str(tmp_path / "old"), toks)  # a cache without greedy.i32: the cached tokens
    relabelled = _hand_cache(str(tmp_path / "new"), toks, greedy)
    assert list(relabelled.greedy_next(0)) == toks[1:6] + [7] + toks[7:]
    shift = 1 if anchor_first else 0
    for cache, expect in ((plain, "tokens"), (relabelled, "greedy")):
        _, _, btoks, anc, labels = make_batch(cache, [0] * 8, 5, 16, 3, np.random.default_rng(0),
                                              anchor_first=anchor_first)
        seen = set()
        for a, lab in zip(anc.numpy().ravel(), labels.numpy().reshape(-1, 5)):
            seen.add(int(a))
            want = []
            for j in range(5):
                p = a + j + shift
                if j < 1 - shift or p >= len(toks):
                    want.append(-100)
                elif expect == "greedy" and p == 6:
                    want.append(7)  # the greedy choice after row 5, not the sampled 106
                elif expect == "greedy" and p > 6 and a < 6:
                    want.append(-100)  # a greedy chain from this anchor never sees the sampled 106
                else:
                    want.append(toks[p])
            assert list(lab) == want, (a, list(lab))
        assert {4, 5, 6} <= seen  # the anchors around the sampled token were drawn


def _cfg(tokens):
    return MixConfig(answer_tokens=tokens, max_new_chat=8, max_new_raw=6, max_new_seed=6, seed_samples=1,
                     sampled_every=1, eval_fraction=0.3, eval_seqs=2, n_seq=3, n_ctx_seq=256,
                     topics=("bees", "cats", "rain", "ships"), builtin_prompts=10)


def test_mix_cache_records_greedy_choices_and_an_old_cache_gets_them(tmp_path, tiny_target, fake_stdlib):
    root = str(tmp_path / "mix")
    build = lambda n: build_mixed_cache(root, tiny_target, _cfg(n), target_layers=[1, 3],  # noqa: E731
                                        wrap=lambda p: p, n_threads=1, progress=False, stdlib_root=fake_stdlib)
    c = build(60)
    gpath = os.path.join(root, GREEDY_FILE)
    assert os.path.getsize(gpath) == c.n_rows * 4
    sampled = [i for i, s in enumerate(c.seqs) if s.temperature > 0]
    assert sampled and any(s.temperature == 0 for s in c.seqs)
    for i, s in enumerate(c.seqs):
        ans = slice(s.prompt_len - 1, len(s.tokens) - 1)
        if s.temperature == 0:
            assert (c.greedy_next(i)[ans] == s.tokens[1:][ans]).all()
    recorded = c.greedy.copy()

    # a cache made before greedy.i32: resuming pads its rows with -1 (unknown), new rows are recorded
    os.remove(gpath)
    n_old = c.n_rows
    c2 = build(120)
    assert c2.n_rows > n_old and os.path.getsize(gpath) == c2.n_rows * 4
    assert (c2.greedy[:n_old] == -1).all() and (c2.greedy[n_old:] >= 0).any()

    # --add-greedy-labels' prefill fills the sampled answers' rows with what generation recorded
    st = add_greedy_labels(root, tiny_target, n_threads=1, progress=False)
    assert st["sequences"] == sum(1 for s in c2.seqs[:len(c.seqs)] if s.temperature > 0) and st["changed"] > 0
    c3 = FeatureCache(root)
    rows = np.concatenate([np.arange(c.seqs[i].offset + c.seqs[i].prompt_len - 1,
                                     c.seqs[i].offset + len(c.seqs[i].tokens) - 1) for i in sampled])
    agree = float((c3.greedy[rows] == recorded[rows]).mean())
    assert agree >= 0.95, agree  # one KV buffer for all sequences vs one sequence: float-level near ties only
    assert add_greedy_labels(root, tiny_target, n_threads=1, progress=False)["sequences"] == 0  # nothing left


def test_cli_refuses_add_greedy_labels_without_mix_data(tiny_target, tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("hello\n")
    r = subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", tiny_target, "--output",
                        str(tmp_path / "d.gguf"), "--prompts", str(p), "--add-greedy-labels"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--add-greedy-labels" in r.stderr and "Traceback" not in r.stderr


def test_cli_adds_greedy_labels_to_an_older_cache(tiny_target, tmp_path):
    def train(*extra):
        return subprocess.run([sys.executable, "-m", "llama_dflash.cli", "train", "--model", tiny_target, "--output",
                               str(tmp_path / "d.gguf"), "--workdir", str(tmp_path / "w"), "--data-tokens", "120",
                               "--eval-seqs", "2", "--n-seq", "4", "--threads", "1", "--no-progress", "--data-only",
                               *extra], capture_output=True, text=True, timeout=300)

    r = train()
    assert r.returncode == 0, r.stderr
    root = str(tmp_path / "w" / "mix")
    recorded = FeatureCache(root).greedy.copy()
    os.remove(os.path.join(root, GREEDY_FILE))  # as made before greedy.i32 existed
    r = train("--reuse-data", "--add-greedy-labels")
    assert r.returncode == 0, r.stderr
    c = FeatureCache(root)
    sampled = [s for s in c.seqs if s.temperature > 0]
    assert sampled
    for s in sampled:
        rows = slice(s.offset + s.prompt_len - 1, s.offset + len(s.tokens) - 1)
        assert (c.greedy[rows] >= 0).all()
        assert float((c.greedy[rows] == recorded[rows]).mean()) >= 0.9
