"""The rigged direct path shared by the tiny targets and drafts of `llama_dflash.testing`.

A random model's drafts are never accepted, so a test of speculative decoding on one checks no
accepted row, no partial cut and no rollback.  These fixtures make acceptance partial by design:

* every target's residual stream starts from a token embedding built on a fixed coordinate layout
  (below) and its LM head maps the embedding of token t to a fixed successor `succ[t]` (a random
  permutation of the ordinary tokens), so a target whose layers did nothing would always continue
  t with succ[t];
* the layers are random, with their output scale (`drift`) chosen so that the context pulls the
  target away from succ[t] at some steps -- there a draft that follows the successor map is
  rejected, and the target's state (KV cells, recurrent states) must be rolled back exactly;
* drafts and MTP heads are built to follow the same map (`drafts.py`, the MTP layer in
  `targets.py`), so they are right exactly where the target did not drift.

Coordinate layout of an n_embd-wide embedding (exact zeros where a later layer relies on them):

  0            MASK marker: only the mask token has it (a draft's query for mask slots)
  1            TOKEN marker: every ordinary token has it (a draft's key for the anchor)
  2 .. 2+n_id  IDENTITY: a random unit direction per token, scaled (what the LM head reads)
  2+n_id ..    FEATURE: empty in embeddings; a draft's encoder writes target features there
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Layout", "Rig", "make_rig", "successor_map", "SPECIAL_TOKENS"]

MASK_C = 0
TOKEN_C = 1

#: tiny_vocab's specials: <unk>, <s>, </s>, <mask> (never a successor, no LM-head row)
SPECIAL_TOKENS = (0, 1, 2, 3)


@dataclass(frozen=True)
class Layout:
    """Which embedding coordinates carry what (see the module docstring)."""

    n_embd: int

    @property
    def n_id(self) -> int:
        return self.n_embd // 2 - 2

    @property
    def ident(self) -> slice:
        return slice(2, 2 + self.n_id)

    @property
    def feature(self) -> slice:
        return slice(2 + self.n_id, self.n_embd)

    @property
    def n_feature(self) -> int:
        return self.n_embd - 2 - self.n_id


@dataclass(frozen=True)
class Rig:
    """A target's rigged token embeddings and LM head, and the successor map they encode."""

    layout: Layout
    mask_token: int
    succ: np.ndarray  # [n_vocab] int: the direct path's next token (-1 for specials)
    directions: np.ndarray  # [n_vocab, n_id] unit identity directions (zero for specials)
    token_embd: np.ndarray  # [n_vocab, n_embd]
    output: np.ndarray  # [n_vocab, n_embd] (numpy layout: one row per vocabulary entry)


def successor_map(n_vocab: int, rng: np.random.Generator, specials=SPECIAL_TOKENS) -> np.ndarray:
    """A random cyclic permutation of the ordinary tokens (no fixed point, one long cycle):
    following it never repeats a token sooner than every ordinary token has been seen."""
    ordinary = np.array([t for t in range(n_vocab) if t not in specials])
    order = rng.permutation(ordinary)
    succ = np.full(n_vocab, -1, dtype=np.int64)
    succ[order] = np.roll(order, -1)
    return succ


def make_rig(n_vocab: int, n_embd: int, *, mask_token: int = 3, seed: int = 0, amp: float = 1.0,
             marker: float = 0.5, head_gain: float = 1.0) -> Rig:
    """Embeddings of norm ~amp*sqrt(n_embd) on the layout above and the LM head of the
    successor map: output row succ[t] is t's identity direction, times `head_gain`."""
    layout = Layout(n_embd)
    if layout.n_id < 8 or layout.n_feature < 8:
        raise ValueError(f"n_embd {n_embd} is too small for the rig's layout")
    rng = np.random.default_rng(seed)
    succ = successor_map(n_vocab, rng)
    directions = rng.standard_normal((n_vocab, layout.n_id))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    directions[list(SPECIAL_TOKENS)] = 0.0
    scale = amp * np.sqrt(n_embd)
    embd = np.zeros((n_vocab, n_embd), dtype=np.float32)
    embd[:, layout.ident] = directions * scale
    embd[:, TOKEN_C] = marker * scale
    for t in SPECIAL_TOKENS:  # specials: the marker only (never the mask's coordinate)
        embd[t, TOKEN_C] = marker * scale
    embd[mask_token] = 0.0
    embd[mask_token, MASK_C] = scale
    output = np.zeros((n_vocab, n_embd), dtype=np.float32)
    ordinary = succ >= 0
    output[succ[ordinary], layout.ident] = directions[ordinary] * head_gain
    return Rig(layout, mask_token, succ, directions.astype(np.float32), embd, output)
