"""The mixed data set: phases, held-out sources, resume after an interruption."""

import json
import os

import numpy as np

from llama_dflash.train.data import FeatureCache
from llama_dflash.train.dataset import MixConfig, build_mixed_cache, plan_prompts

TOPICS = ("bees", "cats", "rain", "ships", "maps", "tea", "chess", "sand")


def _cfg(tokens):
    return MixConfig(answer_tokens=tokens, max_new_chat=8, max_new_raw=6, max_new_seed=6, seed_samples=1,
                     sampled_every=2, eval_fraction=0.3, eval_seqs=4, n_seq=3, n_ctx_seq=256, topics=TOPICS,
                     builtin_prompts=20)


def _build(root, tiny_target, stdlib, tokens):
    return build_mixed_cache(root, tiny_target, _cfg(tokens), target_layers=[1, 3], wrap=lambda p: p,
                             n_threads=1, progress=False, stdlib_root=stdlib)


def test_plan_holds_out_whole_sources(fake_stdlib):
    seeds, train, held = plan_prompts(_cfg(100), fake_stdlib)
    assert all(p.kind == "seed" for p in seeds) and not any(p.kind == "seed" for p in train + held)
    assert {p.source for p in train + seeds}.isdisjoint({p.source for p in held})
    assert held and {p.kind for p in train} == {"chat", "raw"}
    assert len({(p.kind, p.text) for p in train}) == len(train)  # deduplicated


def test_mixed_cache_splits_and_resumes(tmp_path, tiny_target, fake_stdlib):
    stdlib = fake_stdlib
    root = str(tmp_path / "mix")
    c1 = _build(root, tiny_target, stdlib, 80)
    assert c1.n_rows == sum(len(s.tokens) for s in c1.seqs)
    tr, ev = c1.ids("train"), c1.ids("eval")
    assert tr and ev and len(ev) <= 4
    assert {c1.seqs[i].source for i in tr}.isdisjoint({c1.seqs[i].source for i in ev})
    assert all(c1.seqs[i].temperature == 0 for i in ev)  # held-out sequences are greedy
    assert any(c1.seqs[i].temperature > 0 for i in tr) and any(c1.seqs[i].kind == "raw" for i in tr)
    keys1 = [s.key for s in c1.seqs]
    assert len(set(keys1)) == len(keys1)

    # an interrupted write (a partial feature row) is dropped, then the run continues to a larger budget
    with open(os.path.join(root, "features.f16"), "ab") as f:
        f.write(b"\0" * 10)
    c2 = _build(root, tiny_target, stdlib, 200)
    keys2 = [s.key for s in c2.seqs]
    assert keys2[:len(keys1)] == keys1 and len(keys2) > len(keys1) and len(set(keys2)) == len(keys2)
    assert os.path.getsize(os.path.join(root, "features.f16")) == c2.n_rows * c2.width * 2
    toks, feats, _ = c2.get(len(c2) - 1)
    assert feats.shape == (len(toks), c2.width) and np.isfinite(feats.astype(np.float32)).all()
    # nothing left to do: the same call changes nothing
    c3 = _build(root, tiny_target, stdlib, 200)
    assert [s.key for s in c3.seqs] == keys2
    with open(os.path.join(root, "meta.json")) as f:
        assert json.load(f)["mix"] is True
    # `export --vocab-data` counts the training answers only, never the held-out ones
    from llama_dflash.train.vocab import counts_from_cache

    counts = counts_from_cache(1 << 16, str(tmp_path))
    assert counts.sum() == sum(len(s.tokens) - s.prompt_len for s in c3.seqs if s.split == "train")


def test_interleave_keeps_every_prefix_in_proportion_to_the_weights():
    import random

    from llama_dflash.train.dataset import interleave
    from llama_dflash.train.sources import Prompt

    ps = [Prompt(f"a{i}", "topic:x") for i in range(300)] + [Prompt(f"b{i}", "stdlib:y", "raw") for i in range(300)]
    out = interleave(ps, {"topic/chat": 3.0, "stdlib/raw": 1.0}, random.Random(0))
    assert sorted(p.text for p in out) == sorted(p.text for p in ps)  # a permutation
    for n in (8, 40, 200):
        share = sum(p.source == "topic:x" for p in out[:n]) / n
        assert abs(share - 0.75) <= 1.0 / n + 1e-9
    # a group with weight 0 is left out; unnamed groups weigh 1
    assert all(p.source == "stdlib:y" for p in interleave(ps, {"topic/chat": 0}, random.Random(0)))


def test_plan_gives_general_chat_its_share_of_the_first_prompts(fake_stdlib):
    """General chat is what users ask most: the first prompts (which a token budget keeps) hold
    topic chat in the default weight's share, not a trickle spread over the whole plan."""
    from llama_dflash.train.dataset import DEFAULT_WEIGHTS

    cfg = MixConfig(topics=TOPICS + tuple(f"topic {i}" for i in range(40)), builtin_prompts=2000, eval_fraction=0.1)
    _, train, _ = plan_prompts(cfg, fake_stdlib)
    head = train[:100]
    topic_chat = sum(p.source.startswith("topic:") and p.kind == "chat" for p in head)
    groups = {f"{p.source.split(':')[0]}/{p.kind}" for p in train}
    expect = DEFAULT_WEIGHTS["topic/chat"] / sum(DEFAULT_WEIGHTS.get(g, 1.0) for g in groups)
    assert topic_chat >= 100 * expect - 5
    assert any(p.source.startswith("code:") and p.kind == "raw" for p in head)
