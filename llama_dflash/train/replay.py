"""Held-out acceptance of drafts by replaying greedy speculative decoding on the target's own answers.

At greedy decoding the text is the target's greedy answer whatever the draft proposes, and each
proposal is a function of the verified prefix only (the draft's cache holds what the verified
rows put there). So the target's answers and layer inputs are made once per prompt (llama.cpp:
ordinary greedy decoding, then one prefill that reads the layer inputs), and every draft and every
number of draft tokens replays the C++ driver's loop on them: the draft, run by llama.cpp, proposes
k tokens after the last verified one; they are accepted up to the first that differs from the
answer; the answer's next token is the target's. No target verification is run again, which on a
busy 2-core CPU is most of the cost of `llama-speculative-simple` -- the drafts are compared on
identical target features.

Differences from the driver: the features come from one prefill instead of the verify batches
(the quantized matmuls' rounding can differ by batch shape, so a near tie can flip), and the last
proposal of an answer is cut at the answer's end instead of at the driver's token budget.
tests/train/test_replay.py checks equal steps with the driver on a tiny target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["Answer", "greedy_answers", "replay_acceptance"]


@dataclass
class Answer:
    tokens: list[int]  # prompt + greedy answer
    prompt_len: int
    features: np.ndarray  # [len(tokens), n_layers * n_embd] float32, layers as asked


def greedy_answers(target: str, prompts: Sequence[str], *, n_predict: int, layers: Sequence[int],
                   n_threads: Optional[int] = None, n_ctx: int = 2048) -> list[Answer]:
    """The target's greedy answer to each prompt text (tokenized with special tokens parsed, as the
    driver does) and the inputs of `layers` at every position."""
    from .._llama import Model, set_verbose
    from ..config import TargetConfig
    from ..engine import OrdinaryDecoding
    from ..target import TargetContext
    from .data import extract_features

    set_verbose(False)
    cfg = TargetConfig(model=target, n_ctx=n_ctx, n_threads=n_threads)
    out = []
    with OrdinaryDecoding(cfg) as o:
        answers = []
        for p in prompts:
            toks = o.tokenize(p)
            answers.append((toks, o.generate(toks, n_predict).tokens))
    m = Model(target, n_gpu_layers=0)
    tc = TargetContext(m, cfg, extract_layers=list(layers))
    try:
        for toks, ans in answers:
            seq = list(toks) + list(ans)
            out.append(Answer(seq, len(toks), np.array(extract_features(tc, seq), dtype=np.float32)))
    finally:
        tc.close()
        m.close()
    return out


def _columns(feature_layers: Sequence[int], draft_layers: Sequence[int], n_embd: int) -> np.ndarray:
    idx = [list(feature_layers).index(x) for x in draft_layers]
    return np.concatenate([np.arange(i * n_embd, (i + 1) * n_embd) for i in idx])


def replay_acceptance(target: str, draft: str, answers: Sequence[Answer], *, n_max: int, feature_layers: Sequence[int],
                      n_threads: Optional[int] = None) -> dict:
    """Acceptance of `draft` (eagle3, dflash or dspark GGUF, or a classic draft model) at n_max draft
    tokens replayed on `answers` (their features hold `feature_layers`, a superset of the draft's)."""
    from ..inspect import read_gguf

    info = read_gguf(draft)
    arch = info.architecture
    n_ctx = max(64, max(len(a.tokens) for a in answers) + n_max + 8)
    steps: list[tuple[int, int]] = []
    if arch not in ("eagle3", "dflash"):  # a classic draft: it reads tokens only
        from .llamacpp_ref import SimpleReference

        with SimpleReference(draft, n_ctx=n_ctx, n_threads=n_threads) as ref:
            for a in answers:
                ref.reset()
                steps += _loop(a, n_max, lambda n_past, k, a=a: ref.propose(a.tokens, n_past, k))
        return _summary(steps, n_max, len(answers))
    layers = [int(x) for x in info.get(f"{arch}.target_layers") or []]
    missing = [x for x in layers if x not in feature_layers]
    if missing:
        raise ValueError(f"{draft} reads target layers {missing} the answers' features do not hold")
    cols = _columns(feature_layers, layers, read_gguf(target).n_embd)
    if arch == "eagle3":
        from .llamacpp_ref import Eagle3Reference

        with Eagle3Reference(target, draft, n_ctx=n_ctx, n_threads=n_threads) as ref:
            for a in answers:
                ref.reset()
                f = np.ascontiguousarray(a.features[:, cols])
                steps += _loop(a, n_max, lambda n_past, k: ref.propose(f, a.tokens, n_past, k))
    elif arch == "dflash":
        from ..config import SpecConfig, TargetConfig
        from ..engine import LlamaDFlashDecoding

        eng = LlamaDFlashDecoding(TargetConfig(model=target, n_ctx=n_ctx, n_threads=n_threads),
                                  SpecConfig(draft_model=draft, draft_n_max=n_max))
        try:
            prop = eng._dflash
            for a in answers:
                prop.clear()
                f = np.ascontiguousarray(a.features[:, cols])
                state = {"injected": 0}

                def propose(n_past: int, k: int, f=f, a=a, state=state) -> list[int]:
                    if n_past > state["injected"]:
                        prop.inject(f[state["injected"]:n_past], state["injected"])
                        state["injected"] = n_past
                    return list(prop.propose(int(a.tokens[n_past]), n_past, k))

                steps += _loop(a, n_max, propose)
        finally:
            eng.close()
    return _summary(steps, n_max, len(answers))


def _loop(a: Answer, n_max: int, propose) -> list[tuple[int, int]]:
    """The driver's greedy loop on a known answer: (accepted, proposed) per verification step."""
    steps = []
    seq = a.tokens
    n_past = a.prompt_len - 1  # the last prompt token is the first id_last
    while n_past + 1 < len(seq):
        k = min(n_max, len(seq) - 1 - n_past)
        drafts = propose(n_past, k)[:k]
        acc = 0
        while acc < len(drafts) and drafts[acc] == seq[n_past + 1 + acc]:
            acc += 1
        steps.append((acc, len(drafts)))
        n_past += acc + 1
    return steps


def _summary(steps: list[tuple[int, int]], n_max: int, n_prompts: int) -> dict:
    n_pos = max([d for _, d in steps], default=0)
    proposed = [sum(1 for _, d in steps if d > i) for i in range(n_pos)]
    hits = [sum(1 for a, d in steps if d > i and a > i) for i in range(n_pos)]
    n = len(steps)
    acc = sum(a for a, _ in steps)
    drafted = sum(d for _, d in steps)
    return {"n_max": n_max, "prompts": n_prompts, "steps": n, "drafted": drafted, "accepted": acc,
            "acceptance_per_position": [round(h / p, 4) if p else 0.0 for h, p in zip(hits, proposed)],
            "accepted_per_step": round(acc / n, 4) if n else 0.0, "tau": round(1.0 + acc / n, 4) if n else 0.0,
            "acceptance_rate": round(acc / drafted, 4) if drafted else 0.0, "steps_list": steps}
