"""Self-distillation data: the target answers prompts, then its layer inputs are extracted through
llama.cpp exactly as the engine does it, and cached (float16 memmap + token ids) in a workdir.

Layout of `<workdir>/data/`: `meta.json` (what the cache was made from), `seqs.jsonl` (one line per
sequence: tokens, prompt length, row offset), `features.f16` (rows x n_layers*n_embd float16) and,
for caches made by the mix pipeline, `greedy.i32` (rows int32: the target's argmax next token
after each row, -1 where unknown; see `FeatureCache.greedy_next`) and, once computed
(soft_labels.py), `soft_ids.i32` + `soft_logp.f16` (rows x K: the target's top-K next tokens and
their log-probabilities; `FeatureCache.soft`).
Appending is resumable: an interrupted run continues after the last complete sequence.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["FeatureCache", "build_cache", "extract_features", "Sequence_", "GREEDY_FILE", "SOFT_IDS_FILE",
           "SOFT_LOGP_FILE", "SOFT_META_FILE", "soft_rows_written"]

#: per-row greedy choices of the target (int32, -1: unknown, use the cached next token)
GREEDY_FILE = "greedy.i32"
#: per-row top-K next tokens of the target (int32 ids, -1: none) and their log-probabilities (float16)
SOFT_IDS_FILE = "soft_ids.i32"
SOFT_LOGP_FILE = "soft_logp.f16"
SOFT_META_FILE = "soft.json"  # {"top_k": K}


def soft_rows_written(root: str) -> tuple[int, int]:
    """(K, rows) of the soft-label files in `root`: complete rows in both files; (0, 0) without them."""
    mpath = os.path.join(root, SOFT_META_FILE)
    ipath, lpath = os.path.join(root, SOFT_IDS_FILE), os.path.join(root, SOFT_LOGP_FILE)
    if not all(os.path.isfile(p) for p in (mpath, ipath, lpath)):
        return 0, 0
    with open(mpath, encoding="utf-8") as f:
        k = int(json.load(f)["top_k"])
    return k, min(os.path.getsize(ipath) // (4 * k), os.path.getsize(lpath) // (2 * k))


@dataclass
class Sequence_:
    tokens: np.ndarray  # int32 [L]
    prompt_len: int
    offset: int  # first row in features.f16
    prompt_sha: str = ""
    key: str = ""  # job key (dataset.py)
    source: str = ""  # prompt source, e.g. "stdlib:json"
    split: str = "train"  # "train" or "eval" (held-out sources)
    kind: str = "chat"  # "chat", "raw" or "seed"
    temperature: float = 0.0


class FeatureCache:
    """Read side of a features cache."""

    def __init__(self, root: str):
        self.root = root
        with open(os.path.join(root, "meta.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        self.width = int(self.meta["width"])
        self.seqs: list[Sequence_] = []
        path = os.path.join(root, "seqs.jsonl")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        o = json.loads(line)
                        self.seqs.append(Sequence_(np.asarray(o["tokens"], dtype=np.int64), o["prompt_len"], o["offset"],
                                                   o.get("prompt_sha", ""), o.get("key", ""), o.get("source", ""),
                                                   o.get("split", "train"), o.get("kind", "chat"),
                                                   float(o.get("temperature", 0.0))))
        self.n_rows = sum(len(s.tokens) for s in self.seqs)
        self.device_features = None  # to_device(): the rows as one float16 tensor on a GPU
        fpath = os.path.join(root, "features.f16")
        if self.n_rows:
            self.features = np.memmap(fpath, dtype=np.float16, mode="r", shape=(self.n_rows, self.width))
        else:
            self.features = np.zeros((0, self.width), dtype=np.float16)
        self.greedy = self._read_greedy()
        self.soft = self._read_soft()

    def _read_greedy(self) -> Optional[np.ndarray]:
        """greedy.i32 as int32 [n_rows] (rows it does not reach are -1), or None without the file."""
        gpath = os.path.join(self.root, GREEDY_FILE)
        if not os.path.isfile(gpath):
            return None
        g = np.fromfile(gpath, dtype=np.int32, count=min(self.n_rows, os.path.getsize(gpath) // 4))
        if len(g) < self.n_rows:
            g = np.concatenate([g, np.full(self.n_rows - len(g), -1, dtype=np.int32)])
        return g

    def _read_soft(self) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(ids int32 [n_rows, K], logp float16 [n_rows, K]) memmaps, or None unless every row has them."""
        k, written = soft_rows_written(self.root)
        if not self.n_rows or written < self.n_rows:
            return None
        return (np.memmap(os.path.join(self.root, SOFT_IDS_FILE), dtype=np.int32, mode="r", shape=(self.n_rows, k)),
                np.memmap(os.path.join(self.root, SOFT_LOGP_FILE), dtype=np.float16, mode="r", shape=(self.n_rows, k)))

    def to_device(self, device, max_fraction: float = 0.5) -> bool:
        """Copy every feature row to `device` once (float16), so training batches are gathered
        there instead of copied row by row on the host; on a GPU the host copy, not the draft, is
        what limits the step rate. Skipped (False) on the CPU or when the rows would take more than
        `max_fraction` of the device's free memory."""
        import torch

        device = torch.device(device)
        if device.type != "cuda" or not self.n_rows:
            return False
        free, _ = torch.cuda.mem_get_info(device)
        if self.n_rows * self.width * 2 > max_fraction * free:
            return False
        self.device_features = torch.empty((self.n_rows, self.width), dtype=torch.float16, device=device)
        step = 1 << 18
        for a in range(0, self.n_rows, step):  # a writable host copy of each chunk (the memmap is read-only)
            self.device_features[a:a + step] = torch.from_numpy(np.array(self.features[a:a + step]))
        return True

    def truncate(self, n: int) -> None:
        """Use only the first n sequences (the file is left as it is)."""
        self.seqs = self.seqs[:n]
        self.n_rows = sum(len(s.tokens) for s in self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        s = self.seqs[i]
        return s.tokens, np.asarray(self.features[s.offset : s.offset + len(s.tokens)]), s.prompt_len

    def greedy_next(self, i: int) -> np.ndarray:
        """int64 [L-1]: the target's greedy choice after each row of sequence i but the last — what
        greedy verification accepts there. The cached next token where the choice is unknown (caches
        without greedy.i32, and greedy sequences, where the two are the same token)."""
        s = self.seqs[i]
        nxt = s.tokens[1:].astype(np.int64)
        if self.greedy is None:
            return nxt
        g = self.greedy[s.offset:s.offset + len(s.tokens) - 1].astype(np.int64)
        return np.where(g >= 0, g, nxt)

    @property
    def n_answer_tokens(self) -> int:
        return sum(len(s.tokens) - s.prompt_len for s in self.seqs)

    def ids(self, split: str = "train", greedy_only: bool = False) -> list[int]:
        """Indices of the sequences of a split (optionally only the greedy ones)."""
        return [i for i, s in enumerate(self.seqs) if s.split == split and (not greedy_only or s.temperature == 0)]


def extract_features(target, tokens: Sequence[int]) -> np.ndarray:
    """Layer inputs for every position of `tokens`, decoded in n_batch chunks from position 0
    (the engine's prefill path): [len(tokens), n_layers*n_embd] float32."""
    target.clear()
    step = target.ctx.n_batch
    out = []
    for start in range(0, len(tokens), step):
        chunk = list(tokens[start : start + step])
        target.decode(chunk, start, logits="none")
        out.append(target.layer_features())
    return np.concatenate(out, axis=0)


def _prompt_sha(p: str) -> str:
    return hashlib.sha256(p.encode("utf-8")).hexdigest()[:12]


def _fingerprint(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def build_cache(
    root: str,
    model_path: str,
    prompts: Sequence[str],
    *,
    target_layers: Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    n_threads: Optional[int] = None,
    n_ctx: int = 1024,
    progress: bool = True,
    wrap: Callable[[str], str] = lambda p: p,
    n_gpu_layers: int = -1,
) -> FeatureCache:
    """Generate answers with the target and cache their features; resumes an interrupted run.
    n_gpu_layers: target layers offloaded to a GPU backend (-1 all, 0 none)."""
    from .._llama import Model, set_verbose
    from ..config import TargetConfig
    from ..engine import OrdinaryDecoding
    from ..inspect import read_gguf
    from ..sampling import SamplingParams
    from ..target import TargetContext

    set_verbose(False)
    info = read_gguf(model_path)
    width = len(target_layers) * info.n_embd
    meta = dict(
        model=os.path.basename(model_path), target_layers=[int(x) for x in target_layers],
        max_new_tokens=int(max_new_tokens), temperature=float(temperature), seed=int(seed),
        prompts=_fingerprint({"p": list(prompts)}), width=width, n_embd=info.n_embd,
    )
    os.makedirs(root, exist_ok=True)
    mpath = os.path.join(root, "meta.json")
    if os.path.isfile(mpath):
        with open(mpath, encoding="utf-8") as f:
            old = json.load(f)
        keys = [k for k in meta if k != "prompts"]  # fewer or more prompts of the same list resume fine
        if any(old.get(k) != meta[k] for k in keys):
            raise ValueError(
                f"the features cache in {root} was made with other settings "
                f"({', '.join(k for k in keys if old.get(k) != meta[k])} differ); use another --workdir"
            )
    else:
        with open(mpath, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)

    cache = FeatureCache(root)
    for k, sq in enumerate(cache.seqs[: len(prompts)]):
        if sq.prompt_sha and sq.prompt_sha != _prompt_sha(prompts[k]):
            raise ValueError(f"the features cache in {root} holds other prompts (sequence {k}); use another --workdir")
    done = len(cache)
    fpath = os.path.join(root, "features.f16")
    # drop a partially written tail
    if os.path.isfile(fpath):
        with open(fpath, "r+b") as f:
            f.truncate(cache.n_rows * width * 2)
    if done >= len(prompts):
        cache.truncate(len(prompts))
        return cache

    cfg = TargetConfig(model=model_path, n_ctx=n_ctx, n_threads=n_threads, seed=seed, n_gpu_layers=n_gpu_layers)
    model = Model(model_path, n_gpu_layers=cfg.n_gpu_layers, repack=cfg.repack)
    gen = OrdinaryDecoding(cfg, model=model)
    tgt = TargetContext(model, cfg, extract_layers=target_layers)
    sampling = SamplingParams(temperature=temperature, seed=seed)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), initial=done, desc="data", unit="seq", dynamic_ncols=True)
    offset = cache.n_rows
    try:
        with open(fpath, "ab") as ff, open(os.path.join(root, "seqs.jsonl"), "a", encoding="utf-8") as fs:
            for i in range(done, len(prompts)):
                ptoks = model.tokenize(wrap(prompts[i]))
                ptoks = ptoks[: max(1, n_ctx - max_new_tokens - 1)]
                ans = gen.generate(ptoks, max_new_tokens, sampling).tokens
                toks = list(ptoks) + list(ans)
                feats = extract_features(tgt, toks).astype(np.float16)
                ff.write(feats.tobytes())
                ff.flush()
                fs.write(json.dumps({"tokens": [int(t) for t in toks], "prompt_len": len(ptoks), "offset": offset,
                                     "prompt_sha": _prompt_sha(prompts[i])}) + "\n")
                fs.flush()
                offset += len(toks)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(rows=offset)
    finally:
        if bar is not None:
            bar.close()
        tgt.close()
        gen.close()
        model.close()
    return FeatureCache(root)
