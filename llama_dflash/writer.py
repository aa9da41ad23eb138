"""Write GGUF files with the `gguf` package: DFlash/DSpark drafts and tiny llama targets.

`write_draft` is the one place that knows the draft file contract (keys and tensor names); the
random-draft generator, the test fixtures and the trainer's export all go through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

__all__ = [
    "DraftShape",
    "random_draft_weights",
    "write_draft",
    "write_random_draft",
    "write_tiny_target",
    "add_tiny_tokenizer",
    "copy_tokenizer_fields",
    "copy_fields",
    "evenly_spread_layers",
    "WEIGHT_TYPES",
    "tensor_payload",
]

#: weight types a draft can be written in (`--quantize`); all have CPU matmul kernels in ggml
WEIGHT_TYPES = ("f32", "f16", "q8_0", "q4_0")


@dataclass
class DraftShape:
    """Hyper-parameters of a draft; n_embd must equal the target's."""

    n_embd: int
    n_layer: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 0  # 0: 2 * n_embd
    block_size: int = 16
    target_layers: Sequence[int] = ()
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    context_length: int = 8192
    causal: bool = False
    # DSpark
    markov_rank: int = 0  # > 0 adds the Markov head
    confidence_head: bool = False
    sample_from_anchor: bool = True
    extra_keys: Mapping[str, object] = field(default_factory=dict)
    head_size: int = 0  # 0: n_embd // n_head (written as key/value length)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def ff(self) -> int:
        return self.n_ff or 2 * self.n_embd


def evenly_spread_layers(n_target_layers: int, n: int = 3) -> list[int]:
    """Target layer ids (inputs of layer id) spread over the depth, DFlash style: skip layer 0."""
    n = max(1, min(n, n_target_layers))
    if n == 1:
        return [n_target_layers // 2]
    lo, hi = 1, n_target_layers - 1
    return sorted({int(round(lo + (hi - lo) * i / (n - 1))) for i in range(n)})


def random_draft_weights(
    shape: DraftShape, n_vocab: int, *, seed: int = 0, with_embeddings: bool = False, scale: float = 0.05,
    n_vocab_draft: Optional[int] = None,
) -> dict[str, np.ndarray]:
    """Random weights in numpy layout (rows = output features) for every draft tensor.

    n_vocab_draft (reduced-vocabulary drafts, see `d2t`): rows of the draft's own LM head
    (`output.weight`, always written then) and of `markov_w2`; token_embd keeps n_vocab rows.
    """
    rng = np.random.default_rng(seed)
    n_head_rows = n_vocab if n_vocab_draft is None else int(n_vocab_draft)
    e, hd = shape.n_embd, shape.head_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w: dict[str, np.ndarray] = {
        "fc.weight": mat(e, len(shape.target_layers) * e),
        "enc.output_norm.weight": ones(e),
        "output_norm.weight": ones(e),
    }
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = ones(e)
        w[p + "attn_q.weight"] = mat(shape.n_head * hd, e)
        w[p + "attn_k.weight"] = mat(shape.n_head_kv * hd, e)
        w[p + "attn_v.weight"] = mat(shape.n_head_kv * hd, e)
        w[p + "attn_output.weight"] = mat(e, shape.n_head * hd)
        w[p + "attn_q_norm.weight"] = ones(hd)
        w[p + "attn_k_norm.weight"] = ones(hd)
        w[p + "ffn_norm.weight"] = ones(e)
        w[p + "ffn_gate.weight"] = mat(shape.ff, e)
        w[p + "ffn_up.weight"] = mat(shape.ff, e)
        w[p + "ffn_down.weight"] = mat(e, shape.ff)
    if with_embeddings:
        w["token_embd.weight"] = mat(n_vocab, e) * 20
    if with_embeddings or n_vocab_draft is not None:
        # llama.cpp falls back to token_embd as the head only for full-vocabulary drafts
        w["output.weight"] = mat(n_head_rows, e) * 20
    if shape.markov_rank > 0:
        # ggml shapes: markov_w1 {rank, n_vocab}, markov_w2 {rank, n_vocab_draft}
        w["markov_w1.weight"] = mat(n_vocab, shape.markov_rank)
        w["markov_w2.weight"] = mat(n_head_rows, shape.markov_rank)
        if shape.confidence_head:
            w["conf_proj.weight"] = mat(1, e + shape.markov_rank) * 20  # confidences spread over (0, 1)
            w["conf_proj.bias"] = np.zeros(1, dtype=np.float32)
    return w


def copy_fields(writer, source_path: str, include) -> int:
    """Copy every key of a GGUF file for which `include(name)` is true, with its exact type;
    returns the vocab size (length of `tokenizer.ggml.tokens`, 0 if absent or not copied)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(source_path, "r")
    n_vocab = 0
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or not include(name):
            continue
        types = list(fld.types)
        if types[0] == GGUFValueType.ARRAY and len(types) < 2:
            continue  # an empty array (gguf-py records no item type): nothing to copy
        if types[0] == GGUFValueType.ARRAY:
            sub = types[1]
            if sub == GGUFValueType.STRING:
                value = [bytes(fld.parts[i]) for i in fld.data]
            else:
                value = [fld.parts[i][0].item() for i in fld.data]
            writer.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        elif types[0] == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(fld.parts[fld.data[0]]), GGUFValueType.STRING)
        else:
            writer.add_key_value(name, fld.parts[fld.data[0]][0].item(), types[0])
    del reader
    return n_vocab


def copy_tokenizer_fields(writer, source_path: str, *, skip: Sequence[str] = ()) -> int:
    """Copy every `tokenizer.*` key of a GGUF file, with its exact type; returns the vocab size."""
    return copy_fields(writer, source_path, lambda name: name.startswith("tokenizer.") and name not in skip)


def tensor_payload(arr: np.ndarray, weight_type: str = "f32"):
    """(data, raw_dtype) to hand to GGUFWriter.add_tensor for a draft tensor in `weight_type`.

    Only matrices are converted (norm vectors, biases and `d2t` keep their type); a matrix whose
    rows are not a multiple of the 32-value quantization block falls back to f16, and tiny
    matrices (the confidence projection) stay f32.
    """
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight type must be one of {', '.join(WEIGHT_TYPES)}, not {weight_type!r}")
    if arr.dtype == np.int64:
        return np.ascontiguousarray(arr), None
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if weight_type == "f32" or arr.ndim != 2 or arr.shape[0] < 2:
        return arr, None
    if weight_type == "f16" or arr.shape[1] % 32:
        return arr.astype(np.float16), None
    qtype = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[weight_type]
    return quantize(arr, qtype), qtype


def write_draft(
    path: str,
    shape: DraftShape,
    weights: Mapping[str, np.ndarray],
    *,
    tokenizer_from: str,
    mask_token_id: int,
    name: str = "dflash-draft",
    d2t: Optional[np.ndarray] = None,
    weight_type: str = "f32",
) -> str:
    """Write a draft GGUF that llama.cpp loads as architecture `dflash`; matrices in
    `weight_type` (see `tensor_payload`)."""
    import gguf

    if not shape.target_layers:
        raise ValueError("a draft needs at least one target layer id")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "dflash")
    w.add_name(name)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_array("dflash.target_layers", [int(x) for x in shape.target_layers])
    w.add_uint32("dflash.block_size", shape.block_size)
    if shape.causal:
        w.add_bool("dflash.attention.causal", True)
    if shape.markov_rank > 0:
        w.add_bool("dflash.sample_from_anchor", shape.sample_from_anchor)
        w.add_bool("dflash.has_confidence_head", shape.confidence_head)
    for key, value in shape.extra_keys.items():
        if isinstance(value, (list, tuple)):
            if value and all(isinstance(v, bool) for v in value):
                w.add_array(key, [bool(v) for v in value])
            else:
                w.add_array(key, [int(v) for v in value])
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, str(value))
    copy_tokenizer_fields(w, tokenizer_from, skip=("tokenizer.ggml.mask_token_id",))
    w.add_mask_token_id(int(mask_token_id))
    for tname, arr in weights.items():
        data, raw = tensor_payload(arr, weight_type)
        w.add_tensor(tname, data, raw_dtype=raw)
    if d2t is not None:
        w.add_tensor("d2t", np.ascontiguousarray(d2t, dtype=np.int64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_random_draft(
    path: str,
    target_path: str,
    *,
    n_layer: int = 1,
    block_size: int = 16,
    target_layers: Optional[Sequence[int]] = None,
    mask_token_id: Optional[int] = None,
    seed: int = 0,
    with_embeddings: bool = False,
    markov_rank: int = 0,
    confidence_head: bool = False,
    sample_from_anchor: bool = True,
    draft_vocab: int = 0,
) -> str:
    """A draft with random weights for a target: drafts nonsense, but exercises every code path.

    markov_rank > 0 makes a DSpark draft (confidence_head adds conf_proj). draft_vocab > 0 makes a
    reduced-vocabulary draft: its own LM head over `draft_vocab` target tokens (sorted, random)
    and the int64 tensor `d2t` mapping each head row to its target token id.
    """
    from .inspect import read_gguf

    target = read_gguf(target_path)
    n_head = _pick_heads(target.n_embd)
    shape = DraftShape(
        n_embd=target.n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=_pick_kv_heads(n_head),
        block_size=block_size,
        target_layers=list(target_layers) if target_layers is not None else evenly_spread_layers(target.n_layer),
        markov_rank=markov_rank,
        confidence_head=confidence_head,
        sample_from_anchor=sample_from_anchor,
    )
    mask = mask_token_id if mask_token_id is not None else _default_mask(target)
    d2t = None
    if draft_vocab:
        if not 0 < draft_vocab <= target.n_vocab:
            raise ValueError(f"draft_vocab must be in 1..{target.n_vocab}, not {draft_vocab}")
        rng = np.random.default_rng(seed + 7919)
        d2t = np.sort(rng.choice(target.n_vocab, size=draft_vocab, replace=False)).astype(np.int64)
    weights = random_draft_weights(shape, target.n_vocab, seed=seed, with_embeddings=with_embeddings,
                                   n_vocab_draft=None if d2t is None else len(d2t))
    return write_draft(path, shape, weights, tokenizer_from=target_path, mask_token_id=mask,
                       name=f"random-dflash-{target.name}", d2t=d2t)


def _pick_heads(n_embd: int) -> int:
    for h in (9, 8, 6, 4, 3, 2):
        if n_embd % h == 0 and (n_embd // h) % 2 == 0 and n_embd // h >= 8:
            return h
    return 1


def _pick_kv_heads(n_head: int) -> int:
    """The largest proper divisor of n_head (grouped-query attention needs n_head % n_kv == 0)."""
    return next((k for k in range(n_head // 2, 0, -1) if n_head % k == 0), 1)


def _default_mask(target) -> int:
    """A mask token for a draft: the target's own mask/pad/unk token, else the last vocab entry."""
    for key in ("tokenizer.ggml.mask_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"):
        v = target.get(key)
        if isinstance(v, int) and 0 <= v < target.n_vocab:
            return v
    return target.n_vocab - 1


# ---- tiny targets for tests ---------------------------------------------------------------------

def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: specials, 256 byte tokens, and word pieces for lowercase letters."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>", "<mask>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{i:02X}>" for i in range(256)]
    types += [TokenType.BYTE] * 256
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["\u2581" + c for c in letters] + letters + ["\u2581the", "\u2581and", "\u2581is", "\u2581of"]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 260 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def add_tiny_tokenizer(w) -> int:
    """Write the tiny SPM tokenizer (`tiny_vocab`) into GGUFWriter `w`; returns the vocab size."""
    tokens, scores, types = tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    return len(tokens)


def write_tiny_target(
    path: str,
    *,
    arch: str = "llama",
    n_embd: int = 64,
    n_layer: int = 4,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 2048,
    seed: int = 0,
    scale: float = 0.2,
    tied_embeddings: bool = False,
    conv_layers: Sequence[int] = (),
    conv_l_cache: int = 3,
) -> str:
    """A random model with an SPM tokenizer, small enough for unit tests.

    arch "llama" (attention only) or "lfm2" (hybrid: the layers in `conv_layers` are recurrent
    short-convolution layers, the others attention layers with q/k norms; default: every other
    layer from layer 0 is a conv layer).  Any other name gets llama-layout tensors under that
    architecture name: enough for tests that a target is refused before llama.cpp loads it.
    """
    hybrid = arch == "lfm2"
    if hybrid and not conv_layers:
        conv_layers = tuple(range(0, n_layer, 2))
    conv = set(conv_layers) if hybrid else set()
    import gguf

    rng = np.random.default_rng(seed)
    n_vocab = len(tiny_vocab()[0])
    hd = n_embd // n_head

    def mat(rows: int, cols: int, s: float = scale) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * s / np.sqrt(cols) * 4).astype(np.float32)

    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-{arch}-{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([0 if i in conv else n_head_kv for i in range(n_layer)] if hybrid else n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    if hybrid:
        w.add_shortconv_l_cache(conv_l_cache)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_tokenizer(w)
    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, n_embd))).astype(np.float32))
    # lfm2 names its final norm token_embd_norm
    w.add_tensor("token_embd_norm.weight" if hybrid else "output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if not tied_embeddings:
        w.add_tensor("output.weight", mat(n_vocab, n_embd, 1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if i in conv:
            w.add_tensor(p + "shortconv.conv.weight", mat(n_embd, conv_l_cache, 1.0))
            w.add_tensor(p + "shortconv.in_proj.weight", mat(3 * n_embd, n_embd))
            w.add_tensor(p + "shortconv.out_proj.weight", mat(n_embd, n_embd))
        else:
            w.add_tensor(p + "attn_q.weight", mat(n_head * hd, n_embd))
            w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
            w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
            w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
            if hybrid:
                w.add_tensor(p + "attn_q_norm.weight", np.ones(hd, dtype=np.float32))
                w.add_tensor(p + "attn_k_norm.weight", np.ones(hd, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
