"""Which target tokens a reduced-vocabulary draft keeps: the ones the target actually emits.

Counts come from the trainer's data cache (the target's own answers), from the target's greedy
answers to prompts, or from text files; tokens never seen are ranked by id, which for BPE
vocabularies is the merge order (frequent pieces first). End-of-generation tokens are always kept.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

__all__ = ["count_tokens", "counts_from_cache", "counts_from_texts", "counts_from_generation",
           "end_tokens", "choose_vocab", "coverage"]


def count_tokens(n_vocab: int, token_lists: Iterable[Sequence[int]]) -> np.ndarray:
    counts = np.zeros(n_vocab, dtype=np.int64)
    for toks in token_lists:
        t = np.asarray(toks, dtype=np.int64)
        t = t[(t >= 0) & (t < n_vocab)]
        counts += np.bincount(t, minlength=n_vocab)
    return counts


def counts_from_cache(n_vocab: int, data_dir: str) -> np.ndarray:
    """Answer tokens of a trainer features cache (`<workdir>/data` or `<workdir>/mix`, or the
    workdir itself); held-out sequences (split "eval") are not counted."""
    path = os.path.join(data_dir, "seqs.jsonl")
    for sub in ("data", "mix"):
        if not os.path.isfile(path):
            path = os.path.join(data_dir, sub, "seqs.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no training data cache (seqs.jsonl) in {data_dir}")

    def answers():
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    o = json.loads(line)
                    if o.get("split", "train") != "eval":
                        yield o["tokens"][o["prompt_len"]:]

    return count_tokens(n_vocab, answers())


def counts_from_texts(model_path: str, paths: Sequence[str]) -> np.ndarray:
    """Tokens of text files, tokenized with the target's tokenizer."""
    from .._llama import Model, set_verbose

    set_verbose(False)
    model = Model(model_path, n_gpu_layers=0)
    try:
        lists = []
        for p in paths:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"vocabulary text not found: {p}")
            with open(p, encoding="utf-8", errors="replace") as f:
                lists.append(model.tokenize(f.read(), add_special=False, parse_special=False))
        return count_tokens(model.n_vocab, lists)
    finally:
        model.close()


def counts_from_generation(model_path: str, prompts: Sequence[str], *, max_new_tokens: int,
                           n_threads: Optional[int] = None, wrap: Callable[[str], str] = lambda p: p,
                           progress: bool = False) -> np.ndarray:
    """The target's greedy answers to `prompts` (what a draft must predict)."""
    from .._llama import Model, set_verbose
    from ..config import TargetConfig
    from ..engine import OrdinaryDecoding
    from ..sampling import SamplingParams

    set_verbose(False)
    cfg = TargetConfig(model=model_path, n_ctx=1024, n_threads=n_threads)
    model = Model(model_path, n_gpu_layers=cfg.n_gpu_layers, repack=cfg.repack)
    gen = OrdinaryDecoding(cfg, model=model)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="vocab", unit="prompt", dynamic_ncols=True)
    try:
        lists = []
        for p in prompts:
            toks = model.tokenize(wrap(p))[: 1024 - max_new_tokens - 1]
            lists.append(gen.generate(toks, max_new_tokens, SamplingParams(temperature=0.0)).tokens)
            if bar is not None:
                bar.update(1)
        return count_tokens(model.n_vocab, lists)
    finally:
        if bar is not None:
            bar.close()
        gen.close()
        model.close()


def end_tokens(info) -> list[int]:
    """EOS/EOT ids of a target (GGUFInfo): a draft must be able to propose the end."""
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = info.get(key)
        if isinstance(v, int) and 0 <= v < info.n_vocab and v not in ids:
            ids.append(v)
    return ids


def choose_vocab(counts: np.ndarray, n: int, always: Sequence[int] = ()) -> np.ndarray:
    """The n target ids to keep, sorted: `always` first, then by count (descending), ties by id."""
    n_vocab = len(counts)
    if not 0 < n <= n_vocab:
        raise ValueError(f"the reduced vocabulary size must be in 1..{n_vocab}, not {n}")
    if len(set(always)) > n:
        raise ValueError(f"the reduced vocabulary size {n} is smaller than the {len(set(always))} tokens it must keep")
    key = -np.asarray(counts, dtype=np.float64)
    key[list(always)] = -np.inf
    order = np.lexsort((np.arange(n_vocab), key))  # last key is primary
    return np.sort(order[:n]).astype(np.int64)


def coverage(counts: np.ndarray, keep: np.ndarray) -> float:
    """Share of the counted tokens that the kept set covers."""
    total = int(counts.sum())
    return float(counts[keep].sum()) / total if total else 1.0
