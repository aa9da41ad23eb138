"""Autoregressive drafts rigged against a `targets.write_target` fixture: a classic draft model
(draft-simple) and an EAGLE-3 head (draft-eagle3).

Both follow the fixture's successor map (`rig.py`), so they are right exactly where the target
did not drift, and both depend on more than the last token -- so that a draft whose cache or
features were fed wrongly drafts differently from llama.cpp's driver, and a parity test sees it:

* the classic draft is a small llama with the target's tokenizer and its own rigged embeddings
  and LM head (the same successor map: `make_rig` draws the map first from the same seed), and
  two random layers of its own `drift`: its context pulls it off the map at some steps, not
  where the target's does;
* the EAGLE-3 head borrows the target's token embeddings and LM head (ctx_other).  Its encoder
  `fc` writes a random projection of the target's three layer inputs onto the FEATURE
  coordinates; `attn_norm_2` keeps only those (norm_before_residual: the residual carries them
  forward, never a token's identity).  Both attention heads match a row's token identity against
  the cached rows' (query and key read the token half of the input), so each row attends to
  itself (and to earlier rows of the same token); head 1's value is the token's identity, which
  the LM head maps to its successor, head 2's a projection of the features onto the identity
  coordinates (`feature_gain`): where it outweighs the identity, the draft takes another token.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..writer import copy_tokenizer_fields, tiny_vocab
from .drafts import default_target_layers
from .rig import Layout, make_rig
from .targets import TargetFixture

__all__ = ["write_rigged_simple_draft", "write_rigged_eagle3", "eagle3_target_layers"]


def eagle3_target_layers(fx: TargetFixture) -> list[int]:
    """Three distinct layer ids below n_layer (EAGLE-3's low, middle and high)."""
    top = fx.n_layer - 1
    layers = sorted({0, max(1, top // 2), top})
    return layers if len(layers) == 3 else default_target_layers(fx)


def write_rigged_simple_draft(path: str, fx: TargetFixture, *, n_embd: int = 64, n_layer: int = 2,
                              drift: float = 0.35, seed: int = 7, context_length: int = 4096,
                              token_edits: Optional[dict[int, str]] = None, extra_tokens: int = 0,
                              bos_token_id: Optional[int] = None) -> str:
    """A tiny llama drafting along the fixture's successor map (see the module docstring), with
    the target's tokenizer -- or one changed for tests of llama.cpp's vocabulary rule:
    `token_edits` (id -> new text), `extra_tokens` appended, another `bos_token_id`."""
    import gguf

    tokens, scores, types = tiny_vocab()
    for i, text in (token_edits or {}).items():
        tokens[i] = text
    tokens += [f"<extra_{i}>" for i in range(extra_tokens)]
    scores += [0.0] * extra_tokens
    types += [int(gguf.TokenType.USER_DEFINED)] * extra_tokens
    rig = make_rig(len(tokens), n_embd, seed=fx.rig_seed, head_gain=1.0)
    if not extra_tokens and not np.array_equal(rig.succ, fx.rig.succ):
        raise AssertionError("the draft's successor map differs from the target's")
    rng = np.random.default_rng(seed)
    n_head, n_kv, n_ff = 4, 2, 128
    hd = n_embd // n_head

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"rigged-draft-simple-{fx.arch}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if token_edits or extra_tokens or bos_token_id is not None:
        _tiny_tokenizer(w, tokens, scores, types, bos_token_id)
    else:
        copy_tokenizer_fields(w, fx.path)
    tensors = {"token_embd.weight": rig.token_embd, "output_norm.weight": np.ones(n_embd, np.float32),
               "output.weight": rig.output}
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        tensors[p + "attn_q.weight"] = mat(n_head * hd, n_embd)
        tensors[p + "attn_k.weight"] = mat(n_kv * hd, n_embd)
        tensors[p + "attn_v.weight"] = mat(n_kv * hd, n_embd)
        tensors[p + "attn_output.weight"] = mat(n_embd, n_head * hd, drift * 4.0)
        tensors[p + "ffn_norm.weight"] = np.ones(n_embd, np.float32)
        tensors[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
        tensors[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        tensors[p + "ffn_down.weight"] = mat(n_embd, n_ff, drift * 4.0)
    _write(w, tensors)
    return path


def write_rigged_eagle3(path: str, fx: TargetFixture, *, target_layers: Optional[Sequence[int]] = None,
                        seed: int = 0, anchor_gain: float = 1.0, feature_gain: float = 2.5, match_gain: float = 2.0,
                        n_ff: int = 64, extra_keys: Optional[dict] = None,
                        tensors: Optional[dict[str, Optional[np.ndarray]]] = None) -> str:
    """An EAGLE-3 head for the fixture (see the module docstring).  `extra_keys` (name -> value:
    int, float, bool or list of ints) and `tensors` (name -> array, None to leave one out) change
    the file, for tests of what is refused."""
    import gguf

    e = fx.n_embd
    lay = Layout(e)
    layers = list(target_layers) if target_layers is not None else eagle3_target_layers(fx)
    rng = np.random.default_rng(seed)
    n_head, hd = 2, e // 2
    ident, feat = lay.ident, lay.feature
    idx = np.arange(e)
    w_: dict[str, np.ndarray] = {}
    fc = np.zeros((e, len(layers) * e), dtype=np.float32)
    fc[feat] = rng.standard_normal((lay.n_feature, len(layers) * e)) / np.sqrt(len(layers) * e)
    w_["fc.weight"] = fc
    w_["output_norm.weight"] = np.ones(e, np.float32)
    p = "blk.0."
    w_[p + "attn_norm.weight"] = np.ones(e, np.float32)
    norm2 = np.zeros(e, np.float32)
    norm2[feat] = 1.0  # the features alone: the residual never carries a token's identity
    w_[p + "attn_norm_2.weight"] = norm2
    # inputs: [token half (e) | feature half (e)]
    wq = np.zeros((n_head * hd, 2 * e), dtype=np.float32)
    for h in range(n_head):
        wq[h * hd + np.arange(lay.n_id), idx[ident]] = match_gain
    wk = wq.copy()
    wv = np.zeros((n_head * hd, 2 * e), dtype=np.float32)
    wv[np.arange(lay.n_id), idx[ident]] = 1.0  # head 1: the row's token identity
    wv[hd + np.arange(lay.n_feature), e + idx[feat]] = 1.0  # head 2: its features
    wo = np.zeros((e, n_head * hd), dtype=np.float32)
    wo[idx[ident], np.arange(lay.n_id)] = anchor_gain
    wo[ident, hd:hd + lay.n_feature] = rng.standard_normal((lay.n_id, lay.n_feature)) * feature_gain / np.sqrt(
        lay.n_feature)
    w_[p + "attn_q.weight"] = wq
    w_[p + "attn_k.weight"] = wk
    w_[p + "attn_v.weight"] = wv
    w_[p + "attn_output.weight"] = wo
    w_[p + "ffn_norm.weight"] = np.ones(e, np.float32)
    w_[p + "ffn_gate.weight"] = (rng.standard_normal((n_ff, e)) / np.sqrt(e)).astype(np.float32)
    w_[p + "ffn_up.weight"] = (rng.standard_normal((n_ff, e)) / np.sqrt(e)).astype(np.float32)
    w_[p + "ffn_down.weight"] = np.zeros((e, n_ff), np.float32)
    for name, arr in (tensors or {}).items():
        if arr is None:
            w_.pop(name, None)
        else:
            w_[name] = arr
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "eagle3")
    w.add_name(f"rigged-eagle3-{fx.arch}")
    keys: dict = {"eagle3.context_length": 4096, "eagle3.embedding_length": e, "eagle3.block_count": 1,
                  "eagle3.feed_forward_length": n_ff, "eagle3.attention.head_count": n_head,
                  "eagle3.attention.head_count_kv": n_head, "eagle3.attention.layer_norm_rms_epsilon": 1e-6,
                  "eagle3.rope.freq_base": 10000.0, "eagle3.target_layers": layers,
                  "eagle3.target_hidden_size": e, "eagle3.norm_before_residual": True}
    keys.update(extra_keys or {})
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_array(key, [int(v) for v in value])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    copy_tokenizer_fields(w, fx.path)
    _write(w, w_)
    return path


def _tiny_tokenizer(w, tokens: list[str], scores: list[float], types: list[int], bos_token_id: Optional[int]) -> None:
    """`writer.add_tiny_tokenizer`'s fields with these token lists (and BOS id)."""
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1 if bos_token_id is None else bos_token_id)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _write(w, tensors: dict[str, np.ndarray]) -> None:
    for name, arr in tensors.items():
        if arr.dtype == np.int64:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
