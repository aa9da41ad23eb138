"""Grammar-constrained sampling (GBNF) for the high-level `Llama`, as a logits hook.

llama.cpp's grammar sampler marks the tokens the grammar forbids after the text so far with
-inf.  Speculative decoding needs no rollback of the grammar state: the loops sample verified
rows one at a time and every sample is an emitted token (the first mismatching sample included),
so the grammar only ever accepts tokens that stay.  The hook therefore (1) feeds the grammar
the tokens sampled since its last call, (2) lets llama.cpp mask the row.  Masking before the
penalties gives the same final logits as llama-cpp-python's order (penalties, then grammar): a
penalty keeps -inf at -inf and never changes which tokens are finite.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from .sampling import LogitsHook

__all__ = ["GrammarMask"]

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class GrammarMask:
    """A `SamplingParams.logits_hook` that applies a llama.cpp grammar; owns its sampler.

    `vocab` is a `llama_vocab *`; `grammar` a `llama_cpp.LlamaGrammar` (or anything with the
    GBNF text in `_grammar` and the root rule name in `_root`).  Call `close()` when done.
    """

    def __init__(self, vocab: int, grammar: object, n_vocab: int, inner: Optional[LogitsHook] = None):
        text = getattr(grammar, "_grammar", None)
        root = getattr(grammar, "_root", "root")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("grammar must be a llama_cpp.LlamaGrammar")
        self._sampler = ll.llama_sampler_init_grammar(vocab, text.encode("utf-8"), str(root).encode("utf-8"))
        if not self._sampler:
            raise ValueError("llama.cpp could not parse the grammar")
        self.inner = inner
        self.n_accepted = 0
        self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.intc)
        self._array = ll.llama_token_data_array(
            data=ctypes.cast(self._data.ctypes.data, ctypes.POINTER(ll.llama_token_data)),
            size=n_vocab, selected=-1, sorted=False)

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> np.ndarray:
        if self._sampler is None:
            raise RuntimeError("GrammarMask is closed")
        for tok in generated[self.n_accepted:]:
            ll.llama_sampler_accept(self._sampler, int(tok))
        self.n_accepted = len(generated)
        if self.inner is not None:
            logits = self.inner(generated, logits)
        d = self._data
        d["id"] = self._ids
        d["logit"] = logits
        d["p"] = 0.0
        self._array.size = d.shape[0]
        self._array.selected = -1
        self._array.sorted = False
        ll.llama_sampler_apply(self._sampler, ctypes.byref(self._array))
        out = np.empty(d.shape[0], dtype=np.float32)
        n = int(self._array.size)
        out.fill(-np.inf)
        out[d["id"][:n]] = d["logit"][:n]  # in id order whatever order llama.cpp left them in
        if not np.isfinite(out).any():
            raise ValueError("the grammar allows no token here")
        return out

    def close(self) -> None:
        sampler, self._sampler = getattr(self, "_sampler", None), None
        if sampler:
            ll.llama_sampler_free(sampler)

    def __del__(self) -> None:
        self.close()
