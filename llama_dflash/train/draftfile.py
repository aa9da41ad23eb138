"""Rewrite an existing draft GGUF without retraining: a reduced output vocabulary (the draft's own
LM head over chosen target tokens + `d2t`) and another weight type (f16 / q8_0 / q4_0).

Why: a draft without `output.weight` runs the target's full head (n_vocab x n_embd) for every block
row through ctx_other; for small targets that head is most of the draft's cost. The head rows of a
reduced draft are sliced from the same matrix, so on the kept tokens its logits are unchanged.
Needs numpy and gguf only (no torch).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..writer import copy_fields, tensor_payload

__all__ = ["dequantize_tensor", "load_target_head", "read_draft_tensors", "reduce_head", "rewrite_draft"]


def _dequantized(reader) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.data.dtype == np.int64 or t.name == "d2t":
            out[t.name] = np.array(t.data, dtype=np.int64).reshape(-1)
            continue
        arr = dequantize(t.data, t.tensor_type)
        ne = [int(x) for x in t.shape]  # ggml order: ne[0] is the row length
        out[t.name] = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(list(reversed(ne))))
    return out


def dequantize_tensor(t) -> np.ndarray:
    """One GGUFReader tensor as a writable float32 array: [rows, row length] for matrices, flat
    for vectors."""
    from gguf.quants import dequantize

    arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    arr = arr.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else arr.reshape(-1)
    return arr.copy() if not arr.flags.writeable or not arr.flags.c_contiguous else arr


def load_target_head(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(token_embd [n_vocab, n_embd], output head [n_vocab, n_embd]) of a target, dequantized to
    float32. A target without `output.weight` ties the head to token_embd (the same array)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(path, "r").tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: no token_embd.weight tensor")
    emb = dequantize_tensor(tensors["token_embd.weight"])
    head = dequantize_tensor(tensors["output.weight"]) if "output.weight" in tensors else emb
    return emb, head


def read_draft_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a draft GGUF as float32 [rows, cols] (numpy layout), `d2t` as int64."""
    from gguf import GGUFReader

    return _dequantized(GGUFReader(path, "r"))


def reduce_head(tensors: Mapping[str, np.ndarray], keep: Sequence[int], target_path: str) -> dict[str, np.ndarray]:
    """A copy of `tensors` whose LM head covers only the target ids `keep` (distinct), with `d2t`.

    The head rows come from the draft's own `output.weight` (full or already reduced) or, for a
    draft that shares the target's head, from the target file (`output.weight` or tied
    `token_embd`). DSpark's `markov_w2` (one row per draft-vocabulary token) is sliced the same way.
    """
    keep = np.asarray(keep, dtype=np.int64)
    if keep.ndim != 1 or len(keep) == 0:
        raise ValueError("the reduced vocabulary needs at least one token")
    if len(np.unique(keep)) != len(keep):
        raise ValueError("the reduced vocabulary has repeated token ids")
    out = dict(tensors)
    old_d2t = tensors.get("d2t")
    if old_d2t is not None:
        where = {int(t): i for i, t in enumerate(old_d2t)}
        missing = [int(t) for t in keep if int(t) not in where]
        if missing:
            raise ValueError(f"{len(missing)} of the requested tokens are not in the draft's reduced vocabulary "
                             f"({len(old_d2t)} tokens)")
        rows = np.asarray([where[int(t)] for t in keep], dtype=np.int64)
    else:
        rows = keep
    if "output.weight" in tensors:
        head = tensors["output.weight"]
    else:
        head = load_target_head(target_path)[1]
    if rows.max() >= head.shape[0]:
        raise ValueError(f"token id {int(keep.max())} is outside the vocabulary ({head.shape[0]} tokens)")
    out["output.weight"] = np.ascontiguousarray(head[rows])
    if "markov_w2.weight" in tensors:
        out["markov_w2.weight"] = np.ascontiguousarray(tensors["markov_w2.weight"][rows])
    out["d2t"] = keep.copy()
    return out


def rewrite_draft(src: str, dst: str, tensors: Mapping[str, np.ndarray], *, weight_type: str = "f32") -> str:
    """Write `tensors` to `dst` with every metadata key of the draft `src` (its architecture:
    `dflash`, or `eagle3` / `llama` for the autoregressive drafts)."""
    import os

    import gguf

    from ..inspect import read_gguf

    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError(f"the output must be another file than the input ({dst})")
    w = gguf.GGUFWriter(dst, read_gguf(src).architecture or "dflash")
    copy_fields(w, src, lambda name: name not in ("general.architecture", "general.file_type", "general.alignment"))
    for name, arr in tensors.items():
        if name == "d2t":
            continue
        data, raw = tensor_payload(arr, weight_type)
        w.add_tensor(name, data, raw_dtype=raw)
    if "d2t" in tensors:
        w.add_tensor("d2t", np.ascontiguousarray(tensors["d2t"], dtype=np.int64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
