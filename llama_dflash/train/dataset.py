"""A mixed self-distillation data set (sources.py) made with MultiGenerator, cached like data.py.

Two phases: (A) the target writes its own questions and tasks from topic seeds (sampled at T>0);
(B) it answers every prompt: stdlib raw completions and chat prompts, its own questions, raw
article openings, the built-in set, greedily, plus a sampled (T>0) answer for every
`sampled_every`-th prompt. Whole sources are held out (`split="eval"`, greedy only, at most
`eval_seqs` sequences) for evaluation. Generation stops once the training answers reach
`answer_tokens`. Every finished sequence is appended with its job key, so an interrupted run
resumes where it stopped (jobs already in the cache are skipped, phase A's questions are read
back from the cache).

Every answer row also records the target's greedy (argmax) choice (`greedy.i32`): a sampled
answer is trained on those, not on its sampled tokens, since greedy verification accepts the
argmax (in v4's data 32% of the sampled answers' tokens were not). `add_greedy_labels` fills
them in for a cache made before they were recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from . import DATA_BACKENDS
from .data import GREEDY_FILE, FeatureCache
from .multigen import Job, MultiGenerator
from .sources import (TOPICS, Prompt, builtin_source_prompts, code_task_prompts, dedupe, split_by_source,
                      stdlib_prompts, topic_chat_prompts, topic_seed_prompts)

__all__ = ["DATA_BACKENDS", "MixConfig", "DEFAULT_WEIGHTS", "plan_prompts", "interleave", "build_mixed_cache",
           "question_from_answer", "add_greedy_labels"]

#: prompts per round of each (source, kind) group. General chat is what users ask most and what a
#: draft trained mostly on code answers worst, so it gets the largest share (~40% of the answer tokens).
DEFAULT_WEIGHTS = {"topic/chat": 4.0, "stdlib/raw": 2.0, "stdlib/chat": 1.5, "topic/raw": 1.5, "code/raw": 1.0,
                   "code/chat": 0.5, "builtin/chat": 1.0}


@dataclass
class MixConfig:
    answer_tokens: int = 300_000  # stop once the training answers reach this many tokens
    max_new_chat: int = 192
    max_new_raw: int = 128
    max_new_seed: int = 48
    seed_samples: int = 1  # sampled questions per seed prompt
    sampled_every: int = 4  # every k-th training prompt also gets a T>0 answer (0: none)
    temperature: float = 0.8
    eval_fraction: float = 0.1  # share of sources held out
    eval_seqs: int = 48
    n_seq: int = 8
    n_ctx_seq: int = 512
    seed: int = 0
    topics: Sequence[str] = TOPICS
    builtin_prompts: int = 10_000  # how many of the built-in set to draw from
    weights: Optional[dict] = None  # "source/kind" -> prompts per round (DEFAULT_WEIGHTS; missing groups: 1)


def question_from_answer(text: str) -> Optional[str]:
    """The target's own question/task (a seed answer) as a new prompt, or None when unusable."""
    t = text.strip()
    quoted = re.findall(r'"([^"]{12,400})"', t)
    if quoted:  # 'A curious person might ask: "..."'
        t = quoted[0]
    t = t.strip().strip('"').strip()
    if t.lower().startswith(("question:", "task:")):
        t = t.split(":", 1)[1].strip()
    t = t.split("\n\n")[0].strip()
    if len(t) < 12 or len(t) > 400:
        return None
    return t


def _job_key(p: Prompt, temperature: float, seed: int) -> str:
    return hashlib.sha256(f"{p.key}\0{temperature}\0{seed}".encode()).hexdigest()[:16]


def interleave(prompts: Sequence[Prompt], weights: Optional[dict], rng: random.Random) -> list[Prompt]:
    """Shuffle within each (source, kind) group, then merge the groups so that any prefix holds them
    in proportion to their weights (group g's i-th prompt sits at (i + 0.5) / weight)."""
    w = DEFAULT_WEIGHTS if weights is None else weights
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(f"{p.source.split(':')[0]}/{p.kind}", []).append(p)
    placed = []
    for gi, name in enumerate(sorted(groups)):
        g = groups[name]
        rng.shuffle(g)
        wt = float(w.get(name, 1.0))
        if wt <= 0:
            continue
        placed.extend(((i + 0.5) / wt, gi, p) for i, p in enumerate(g))
    placed.sort(key=lambda x: (x[0], x[1]))
    return [p for _, _, p in placed]


def plan_prompts(cfg: MixConfig, stdlib_root: Optional[str] = None) -> tuple[list[Prompt], list[Prompt], list[Prompt]]:
    """(seed prompts, training prompts, held-out prompts) before phase A; deduplicated, whole
    sources held out, each list interleaved over its groups by `cfg.weights` so any prefix is mixed."""
    rng = random.Random(cfg.seed)
    allp = dedupe(stdlib_prompts(stdlib_root) + topic_seed_prompts(cfg.topics) + topic_chat_prompts(cfg.topics)
                  + code_task_prompts() + builtin_source_prompts(cfg.builtin_prompts, seed=cfg.seed))
    train, held = split_by_source(allp, cfg.eval_fraction, salt=str(cfg.seed))
    seeds = [p for p in train if p.kind == "seed"]
    held = [p for p in held if p.kind != "seed"]
    return (seeds, interleave([p for p in train if p.kind != "seed"], cfg.weights, rng),
            interleave(held, {}, rng))


def build_mixed_cache(root: str, model_path: str, cfg: MixConfig, *, target_layers: Sequence[int],
                      wrap: Callable[[str], str], n_threads: Optional[int] = None, progress: bool = True,
                      stdlib_root: Optional[str] = None, n_gpu_layers: int = -1, backend: str = "llama.cpp",
                      device: object = "cpu") -> FeatureCache:
    """backend "llama.cpp" answers cfg.n_seq sequences per decode with MultiGenerator; "torch" answers
    cfg.n_seq per batch with a PyTorch copy of the target on `device` (torchgen.py; llama.cpp then
    only tokenizes)."""
    from .._llama import Model, set_verbose
    from ..inspect import read_gguf

    set_verbose(False)
    info = read_gguf(model_path)
    width = len(target_layers) * info.n_embd
    meta = dict(model=os.path.basename(model_path), target_layers=[int(x) for x in target_layers], width=width,
                n_embd=info.n_embd, mix=True, seed=cfg.seed, eval_fraction=cfg.eval_fraction)
    os.makedirs(root, exist_ok=True)
    mpath = os.path.join(root, "meta.json")
    if os.path.isfile(mpath):
        with open(mpath, encoding="utf-8") as f:
            old = json.load(f)
        diff = [k for k in meta if old.get(k) != meta[k]]
        if diff:
            raise ValueError(f"the features cache in {root} was made with other settings ({', '.join(diff)} differ); "
                             "use another --workdir")
    else:
        with open(mpath, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
    cache = FeatureCache(root)
    fpath = os.path.join(root, "features.f16")
    if os.path.isfile(fpath):  # drop a partially written tail
        with open(fpath, "r+b") as f:
            f.truncate(cache.n_rows * width * 2)
    gpath = os.path.join(root, GREEDY_FILE)
    have = min(os.path.getsize(gpath) // 4, cache.n_rows) if os.path.isfile(gpath) else 0
    with open(gpath, "ab") as f:  # drop a partial tail; rows of a cache made before greedy.i32: -1 (unknown)
        f.truncate(have * 4)
        f.write(np.full(cache.n_rows - have, -1, dtype=np.int32).tobytes())
    done = {s.key for s in cache.seqs}
    train_tokens = sum(len(s.tokens) - s.prompt_len for s in cache.seqs if s.split == "train")
    eval_n = sum(1 for s in cache.seqs if s.split == "eval")

    if backend not in DATA_BACKENDS:
        raise ValueError(f"data backend must be one of {', '.join(DATA_BACKENDS)}, not {backend!r}")
    seeds, train_prompts, held = plan_prompts(cfg, stdlib_root)
    if backend == "torch":
        from .torchgen import TorchGenerator, TorchTarget

        target = TorchTarget(model_path, device)  # refuses unsupported architectures before any work
        model = Model(model_path, n_gpu_layers=0)
        gen = TorchGenerator(target, target_layers, model.eog_tokens(), batch=cfg.n_seq, n_ctx_seq=cfg.n_ctx_seq)
    else:
        model = Model(model_path, n_gpu_layers=n_gpu_layers)
        gen = MultiGenerator(model, target_layers, n_seq=cfg.n_seq, n_ctx_seq=cfg.n_ctx_seq, n_threads=n_threads)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.answer_tokens, initial=min(train_tokens, cfg.answer_tokens), desc="data", unit="tok",
                   dynamic_ncols=True)
    state = {"offset": cache.n_rows, "train_tokens": train_tokens}

    def job(p: Prompt, temperature: float, seed: int, split: str, max_new: int) -> Job:
        text = p.text if p.kind == "raw" else wrap(p.text)
        return Job(model.tokenize(text), max_new, temperature, seed,
                   tag=dict(key=_job_key(p, temperature, seed), source=p.source, kind=p.kind, split=split,
                            temperature=temperature, text=p.text))

    try:
        with open(fpath, "ab") as ff, open(gpath, "ab") as fg, \
                open(os.path.join(root, "seqs.jsonl"), "a", encoding="utf-8") as fs:
            def store(r) -> None:
                t = r.job.tag
                toks = list(r.job.tokens) + list(r.answer)
                ff.write(r.features.astype(np.float16).tobytes())
                ff.flush()
                greedy = r.greedy if r.greedy is not None else np.full(len(toks), -1, dtype=np.int32)
                fg.write(np.asarray(greedy, dtype=np.int32).tobytes())
                fg.flush()
                fs.write(json.dumps({"tokens": [int(x) for x in toks], "prompt_len": len(r.job.tokens),
                                     "offset": state["offset"], "key": t["key"], "source": t["source"],
                                     "kind": t["kind"], "split": t["split"], "temperature": t["temperature"]}) + "\n")
                fs.flush()
                state["offset"] += len(toks)
                if t["split"] == "train":
                    state["train_tokens"] += len(r.answer)
                    if bar is not None:
                        bar.update(len(r.answer))
                done.add(t["key"])

            # phase A: the target's own questions and tasks
            seed_jobs = [job(p, cfg.temperature, cfg.seed * 1000 + s, "train", cfg.max_new_seed)
                         for p in seeds for s in range(cfg.seed_samples)]
            for r in gen.run(j for j in seed_jobs if j.tag["key"] not in done):
                store(r)
            questions = []
            by_key = {j.tag["key"]: j for j in seed_jobs}
            for s in FeatureCache(root).seqs:
                j = by_key.get(s.key)
                if j is not None:
                    q = question_from_answer(model.detokenize([int(x) for x in s.tokens[s.prompt_len:]
                                                               if not model.is_eog(int(x))]))
                    if q:
                        questions.append(Prompt(q, j.tag["source"], "chat"))
            # the target's own questions join the topic chat group, in its share of every prefix
            merged = interleave(dedupe(train_prompts + questions), cfg.weights, random.Random(cfg.seed + 1))

            def phase_b():
                n_ev = eval_n
                for p in held:  # held-out greedy sequences first (small)
                    if n_ev >= cfg.eval_seqs:
                        break
                    j = job(p, 0.0, 0, "eval", cfg.max_new_raw if p.kind == "raw" else cfg.max_new_chat)
                    n_ev += 1
                    if j.tag["key"] not in done:
                        yield j
                for i, p in enumerate(merged):
                    if state["train_tokens"] >= cfg.answer_tokens:
                        return
                    max_new = cfg.max_new_raw if p.kind == "raw" else cfg.max_new_chat
                    temps = [0.0] + ([cfg.temperature] if cfg.sampled_every and i % cfg.sampled_every == 0 else [])
                    for t in temps:
                        j = job(p, t, cfg.seed + i if t > 0 else 0, "train", max_new)
                        if j.tag["key"] not in done:
                            yield j

            for r in gen.run(phase_b()):
                store(r)
    finally:
        if bar is not None:
            bar.close()
        gen.close()
        model.close()
    return FeatureCache(root)


def add_greedy_labels(root: str, model_path: str, *, n_threads: Optional[int] = None, n_gpu_layers: int = -1,
                      progress: bool = True) -> dict:
    """Fill greedy.i32 for the sampled answers of a cache made before it was recorded: the target's
    argmax after every answer row (one llama.cpp prefill per sampled sequence). Greedy sequences
    need nothing (their next token is the argmax). Returns {"sequences": relabelled, "rows": ...,
    "changed": answer rows whose sampled token is not the greedy choice}."""
    from .._llama import Model, set_verbose

    set_verbose(False)
    cache = FeatureCache(root)
    greedy = cache.greedy if cache.greedy is not None else np.full(cache.n_rows, -1, dtype=np.int32)
    todo = [s for s in cache.seqs if s.temperature > 0 and len(s.tokens) > s.prompt_len
            and (greedy[s.offset + s.prompt_len - 1:s.offset + len(s.tokens) - 1] < 0).any()]
    stats = {"sequences": len(todo), "rows": 0, "changed": 0}
    if todo:
        model = Model(model_path, n_gpu_layers=n_gpu_layers)
        gen = MultiGenerator(model, [], n_seq=1, n_ctx_seq=max(len(s.tokens) for s in todo) + 1, n_threads=n_threads)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="greedy labels", unit="seq", dynamic_ncols=True)
        try:
            for s in todo:
                first = max(0, s.prompt_len - 1)
                g = gen.greedy_choices(s.tokens, first)
                greedy[s.offset + first:s.offset + len(s.tokens) - 1] = g[first:-1]
                stats["rows"] += len(s.tokens) - 1 - first
                stats["changed"] += int((g[first:-1] != s.tokens[first + 1:]).sum())
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            gen.close()
            model.close()
        tmp = os.path.join(root, GREEDY_FILE + ".tmp")
        greedy.astype(np.int32).tofile(tmp)
        os.replace(tmp, os.path.join(root, GREEDY_FILE))
    return stats
