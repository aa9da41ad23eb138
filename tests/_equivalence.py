"""What the hardware promises about speculative output, as one assertion: `assert_same_tokens`.

Speculative decoding verifies k+1 rows in one batch where ordinary decoding decodes one row at a
time.  On the CPU (and wherever a run offloads no layer) llama.cpp gives a position the same logits
whatever the batch shape, with the settings these tests use, so the output must equal ordinary
decoding token for token, and `assert_same_tokens` asserts exactly that.

On a GPU it need not: CUDA chooses kernels by the number of rows (quantized mat-vec up to 8 rows,
then another kernel; flash-attention kernels by rows), so a verified row may differ from the
single-row decode by rounding, and at a near-tie the argmax may flip.  There, when the tokens
differ, the helper

1. decodes the candidate's own sequence (prompt + tokens) twice on the run's placement, as one
   batch and one token at a time, and takes the largest logit difference `delta`;
2. if `delta` is 0 (batch and single rows agree bit for bit on this device, e.g. flash attention
   on and shape-independent kernels), the hardware promises identity: it fails as on the CPU;
3. otherwise it reports the first divergence (a `DivergenceWarning`) and checks every token from
   there on against the single-row logits of its own prefix (end-of-generation tokens masked
   under `ignore_eos`) -- greedy: within `NOISE_MARGIN * delta` of the best logit (a near-tie the measured rounding can flip); sampled
   (`temperature` > 0): a token of probability >= `MIN_SAMPLED_P` at that temperature (the
   support; the distribution itself is tests/highlevel/test_distribution.py's chi-square test).

`DEVICE_LAYERS` is -1 where this build can offload to a GPU and 0 otherwise: tests of paths that
differ on a GPU take it as their n_gpu_layers, so they run everywhere and mean something there.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from llama_dflash._llama import BatchExt, Context, Model

__all__ = ["assert_same_tokens", "first_divergence", "offload_supported", "device_run", "DEVICE_LAYERS",
           "DivergenceWarning", "NOISE_MARGIN", "MIN_SAMPLED_P"]

#: a verification batch's rows may differ from single rows by a few times what one batch shows
NOISE_MARGIN = 4.0
MIN_SAMPLED_P = 1e-6
_FLASH = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
          "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED, True: ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
          False: ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class DivergenceWarning(UserWarning):
    """Speculative output left ordinary output at a near-tie on a device that does not promise
    identity (the check that replaced exact equality passed)."""


@functools.lru_cache(maxsize=1)
def offload_supported() -> bool:
    """Whether this llama-cpp-python build has a GPU backend with a device (llama.cpp's answer)."""
    from llama_dflash.bench.backend import backend_info

    info = backend_info()
    return bool(info.gpu_offload and info.gpus)


#: n_gpu_layers for the tests of paths that differ on a GPU: -1 (all) where offload works, else 0
DEVICE_LAYERS = -1 if offload_supported() else 0


def device_run(n_gpu_layers: int) -> bool:
    """Whether a run with `n_gpu_layers` puts layers on a GPU (where batch shape may change logits)."""
    return n_gpu_layers != 0 and offload_supported()


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """The first index where a and b differ (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _score(model_path: str, tokens: Sequence[int], n_gpu_layers: int, flash_attn: object,
           one_by_one: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """Logits of every position of `tokens` (one batch, or one decode per token) and the EOG ids."""
    with Model(model_path, n_gpu_layers=n_gpu_layers) as model:
        params = ll.llama_context_default_params()
        n = len(tokens)
        params.n_ctx = n + 16
        params.n_batch = params.n_ubatch = max(32, n)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = min(2, os.cpu_count() or 1)
        params.flash_attn_type = _FLASH[flash_attn]
        with Context(model, params) as ctx, BatchExt(ctx) as batch:
            rows = np.empty((n, model.n_vocab), dtype=np.float32)
            chunks = [[i] for i in range(n)] if one_by_one else [list(range(n))]
            for chunk in chunks:
                batch.clear()
                for i in chunk:
                    batch.add_token(int(tokens[i]), i, True)
                if batch.process() != 0:
                    raise RuntimeError(f"scoring {model_path}: decode failed")
                for j, i in enumerate(chunk):
                    ptr = ll.llama_get_logits_ith(ctx.ptr, j)
                    rows[i] = np.ctypeslib.as_array(ptr, shape=(model.n_vocab,))
            return rows, model.eog_tokens()


def measure_noise(batch: np.ndarray, single: np.ndarray) -> float:
    """The largest logit difference between batch rows and single rows (finite entries)."""
    ok = np.isfinite(batch) & np.isfinite(single)
    return float(np.max(np.abs(batch[ok] - single[ok]), initial=0.0))


def assert_same_tokens(got: Sequence[int], expected: Sequence[int], *, prompt: Sequence[int], config=None,
                       model: Optional[str] = None, n_gpu_layers: Optional[int] = None,
                       flash_attn: object = None, temperature: float = 0.0, ignore_eos: bool = True,
                       what: str = "speculative output") -> None:
    """`got` equals `expected` (ordinary decoding's tokens for `prompt`), or, on a GPU that does
    not promise it, differs only as the module docstring says.

    The run's placement comes from `config` (a TargetConfig) or `model` / `n_gpu_layers` /
    `flash_attn` (llama_cpp.Llama's arguments: n_gpu_layers 0 and flash_attn False by default).
    """
    got, expected = [int(t) for t in got], [int(t) for t in expected]
    if got == expected:
        return
    if config is not None:
        model = config.model
        n_gpu_layers = config.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
        flash_attn = config.flash_attn if flash_attn is None else flash_attn
    if model is None:
        raise TypeError("assert_same_tokens needs config= or model=")
    n_gpu_layers = 0 if n_gpu_layers is None else int(n_gpu_layers)
    flash_attn = False if flash_attn is None else flash_attn
    i = first_divergence(got, expected)
    assert i is not None
    tail = lambda seq: seq[i] if i < len(seq) else "(end)"  # noqa: E731
    where = (f"{what}: first divergence at token {i} (expected {tail(expected)}, got {tail(got)}; "
             f"{len(expected)} expected tokens, {len(got)} got)")
    if not device_run(n_gpu_layers):
        raise AssertionError(f"{where}: this run's backend promises exact identity\n"
                             f"expected {expected}\ngot      {got}")
    if i >= min(len(got), len(expected)):
        raise AssertionError(f"{where}: the same tokens up to a different length")
    seq = [int(t) for t in prompt] + got
    single, eog = _score(model, seq, n_gpu_layers, flash_attn, one_by_one=True)
    batch, _ = _score(model, seq, n_gpu_layers, flash_attn, one_by_one=False)
    delta = measure_noise(batch, single)
    if delta == 0.0:
        raise AssertionError(f"{where}: batch and single rows agree bit for bit on this device, "
                             "so exact identity is what it promises")
    tol = NOISE_MARGIN * delta
    warnings.warn(DivergenceWarning(f"{where}; batch and single rows differ by up to {delta:.3g} here: "
                                    f"checked as near-ties within {tol:.3g}" +
                                    (f" (sampled at T={temperature}: support)" if temperature > 0 else "")))
    bad = []
    for j in range(i, len(got)):
        row = single[len(prompt) - 1 + j].astype(np.float64)
        tok = got[j]
        if ignore_eos:  # end-of-generation tokens were masked: never a valid output
            row[list(eog)] = -np.inf
        if temperature > 0:
            z = row / temperature
            p = float(np.exp(z[tok] - np.max(z)) / np.sum(np.exp(z - np.max(z))))
            if not p >= MIN_SAMPLED_P:
                bad.append(f"token {j} ({tok}): probability {p:.3g} < {MIN_SAMPLED_P}")
        else:
            gap = float(np.max(row) - row[tok])
            if not gap <= tol:
                bad.append(f"token {j} ({tok}): {gap:.3g} below the best logit (tolerance {tol:.3g})")
    if bad:
        raise AssertionError(f"{where}; not explained by batch-shape rounding (delta {delta:.3g}):\n  "
                             + "\n  ".join(bad[:10]))
