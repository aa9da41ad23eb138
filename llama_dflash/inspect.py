"""Read GGUF metadata of targets and drafts with the `gguf` package and check that a pair fits.

Everything here runs before a file is handed to llama.cpp: several incompatibilities make
llama.cpp abort the whole process (GGML_ASSERT), so they must be caught in Python first.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .errors import GGUFFileError, IncompatibleModelError, UnsupportedTargetError

__all__ = [
    "GGUFInfo",
    "DraftInfo",
    "read_gguf",
    "read_draft",
    "validate_target",
    "validate_pair",
    "LAYER_INPUT_ARCHS",
    "RS_ROLLBACK_ARCHS",
]

#: Target architectures whose llama.cpp graph exposes per-layer inputs (the DFlash features).
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp",
        "gemma3n", "gemma4", "gpt-oss", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer",
        "nanbeige", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
        "deepseek4", "hunyuan_vl", "hunyuan-dense", "hunyuan-moe",
    }
)

#: Recurrent/hybrid architectures that honour `n_rs_seq` (native snapshot rollback).
RS_ROLLBACK_ARCHS = frozenset(
    {
        "qwen35", "qwen35moe", "qwen4exp", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe",
        "deepseek4", "glm5_next", "kimi_k3", "bailingmoe3",
    }
)

_DRAFT_REQUIRED_KEYS = (
    "dflash.context_length",
    "dflash.embedding_length",
    "dflash.block_count",
    "dflash.feed_forward_length",
    "dflash.attention.head_count",
    "dflash.attention.layer_norm_rms_epsilon",
)

MAX_BLOCK_SIZE = 256


@dataclass(frozen=True)
class GGUFInfo:
    """The metadata of one GGUF file that speculative decoding cares about."""

    path: str
    architecture: str
    name: str
    file_type: str
    n_layer: int
    n_embd: int
    n_ctx_train: int
    tokenizer_model: str
    tokens: tuple[str, ...]
    tensor_names: frozenset[str]
    tensor_types: dict[str, int]
    metadata: dict[str, Any] = field(repr=False)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def basename(self) -> str:
        return os.path.basename(self.path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


@dataclass(frozen=True)
class DraftInfo:
    """A validated DFlash/DSpark draft: what the engine needs to drive it."""

    gguf: GGUFInfo
    algorithm: str  # "dflash" | "dspark"
    target_layers: tuple[int, ...]
    block_size: int
    mask_token_id: int
    causal_attention: bool
    sample_from_anchor: bool
    has_confidence_head: bool
    has_token_embd: bool
    has_output: bool
    reduced_vocab: Optional[int]  # rows of d2t, None for full-vocabulary drafts
    is_dflash2: bool

    @property
    def path(self) -> str:
        return self.gguf.path

    @property
    def anchor_first(self) -> bool:
        """DSpark with sample_from_anchor reads slots 0..n-1 of `[last, MASK x (n-1)]`."""
        return self.algorithm == "dspark" and self.sample_from_anchor

    @property
    def max_draft_tokens(self) -> int:
        """The most draft tokens one block can yield."""
        return self.block_size if self.anchor_first else self.block_size - 1


# GGUF value type ids (gguf spec)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Sequential little-endian reads over a memory-mapped GGUF header."""

    def __init__(self, buf: "mmap.mmap", path: str):
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFFileError(self.path, "is truncated (header ends early)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFileError(self.path, "is truncated (string runs past the end)")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.take("<Q")
        self.pos += n

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if vtype == _ARRAY:
            item_type = self.take("<I")
            n = self.take("<Q")
            if item_type == _STRING:
                if keep:
                    return [self.string() for _ in range(n)]
                for _ in range(n):
                    self.skip_string()
                return None
            fmt = _SCALAR_FORMATS.get(item_type)
            if fmt is None:
                raise GGUFFileError(self.path, f"has an array of unknown GGUF type {item_type}")
            size = struct.calcsize(fmt)
            if not keep or n > 4096:  # large numeric arrays (scores, token types) are not needed
                self.pos += size * n
                return None
            values = list(struct.unpack_from(f"<{n}{fmt[1:]}", self.buf, self.pos))
            self.pos += size * n
            return values
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise GGUFFileError(self.path, f"has a value of unknown GGUF type {vtype}")
        return self.take(fmt)


def _parse_header(path: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Metadata keys and tensor types of a GGUF file, without touching tensor data."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take("<I")  # magic, checked by the caller
        version = cur.take("<I")
        if version not in (2, 3):
            raise GGUFFileError(path, f"has GGUF version {version}, expected 2 or 3")
        n_tensors = cur.take("<Q")
        n_kv = cur.take("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.take("<I")
            meta[key] = cur.value(vtype, keep=key != "tokenizer.ggml.merges")
        tensors: dict[str, int] = {}
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.take("<I")
            cur.pos += 8 * n_dims
            tensors[name] = cur.take("<I")
            cur.take("<Q")
        return meta, tensors


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF file's metadata; raises GGUFFileError if it is missing or not GGUF."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise GGUFFileError(path, "no such file")
    if os.path.isdir(path):
        raise GGUFFileError(path, "is a directory, expected a .gguf file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise GGUFFileError(path, f"cannot be read ({exc.strerror})") from exc
    if magic != b"GGUF":
        raise GGUFFileError(path, f"is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        meta, tensor_types = _parse_header(path)
    except GGUFFileError:
        raise
    except (ValueError, OSError, struct.error, MemoryError) as exc:
        raise GGUFFileError(path, f"is not a readable GGUF file ({exc})") from exc
    arch = str(meta.get("general.architecture") or "")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=str(meta.get("general.name") or os.path.basename(path)),
        file_type=_file_type_name(meta.get("general.file_type"), tensor_types),
        n_layer=int(meta.get(f"{arch}.block_count") or 0),
        n_embd=int(meta.get(f"{arch}.embedding_length") or 0),
        n_ctx_train=int(meta.get(f"{arch}.context_length") or 0),
        tokenizer_model=str(meta.get("tokenizer.ggml.model") or ""),
        tokens=tuple(meta.get("tokenizer.ggml.tokens") or ()),
        tensor_names=frozenset(tensor_types),
        tensor_types=tensor_types,
        metadata=meta,
    )


def _file_type_name(file_type: Any, tensor_types: dict[str, int]) -> str:
    """A quantization label: general.file_type when present, else the most common tensor type."""
    try:
        from gguf import GGMLQuantizationType, LlamaFileType

        if file_type is not None:
            name = LlamaFileType(int(file_type)).name
            return name.replace("MOSTLY_", "")
        if tensor_types:
            counts: dict[int, int] = {}
            for t in tensor_types.values():
                counts[t] = counts.get(t, 0) + 1
            return GGMLQuantizationType(max(counts, key=counts.__getitem__)).name
    except (ValueError, ImportError):
        pass
    return "unknown"


def validate_target(target: GGUFInfo) -> None:
    """The target must be an architecture with layer-input extraction."""
    if not target.architecture:
        raise IncompatibleModelError(target.path, "general.architecture", None, "a model architecture")
    if target.architecture == "dflash":
        raise IncompatibleModelError(
            target.path, "general.architecture", "dflash", "a target model (this file is a DFlash draft)"
        )
    if target.architecture not in LAYER_INPUT_ARCHS:
        raise UnsupportedTargetError(
            target.path,
            "general.architecture",
            target.architecture,
            "an architecture whose llama.cpp graph exposes layer inputs "
            f"({', '.join(sorted(LAYER_INPUT_ARCHS))})",
        )
    if target.n_layer <= 0 or target.n_embd <= 0:
        raise IncompatibleModelError(
            target.path, f"{target.architecture}.block_count/embedding_length",
            (target.n_layer, target.n_embd), "positive integers",
        )


def read_draft(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a file and check that it is a DFlash draft at all (architecture and required keys)."""
    info = read_gguf(path)
    if info.architecture != "dflash":
        raise IncompatibleModelError(
            info.path, "general.architecture", info.architecture or None, "'dflash' (a DFlash/DSpark draft)"
        )
    for key in _DRAFT_REQUIRED_KEYS:
        if info.get(key) is None:
            raise IncompatibleModelError(info.path, key, None, "present (required by the dflash architecture)")
    return info


def _detect_algorithm(draft: GGUFInfo) -> str:
    return "dspark" if "markov_w1.weight" in draft.tensor_names else "dflash"


def validate_pair(target: GGUFInfo, draft: GGUFInfo, algorithm: str = "auto") -> DraftInfo:
    """Check that `draft` can drive `target`; returns what the engine needs to know about the draft."""
    validate_target(target)
    if draft.architecture != "dflash":
        raise IncompatibleModelError(
            draft.path, "general.architecture", draft.architecture or None, "'dflash' (a DFlash/DSpark draft)"
        )
    for key in _DRAFT_REQUIRED_KEYS:
        if draft.get(key) is None:
            raise IncompatibleModelError(draft.path, key, None, "present (required by the dflash architecture)")

    layers = draft.get("dflash.target_layers")
    if not isinstance(layers, list) or not layers:
        raise IncompatibleModelError(
            draft.path, "dflash.target_layers", layers, "a non-empty array of target layer ids"
        )
    for lid in layers:
        if not isinstance(lid, int) or lid < 0 or lid > target.n_layer:
            raise IncompatibleModelError(
                draft.path, "dflash.target_layers", layers,
                f"layer ids within 0..{target.n_layer} (the target {target.basename} has {target.n_layer} layers)",
            )

    if draft.n_embd != target.n_embd:
        raise IncompatibleModelError(
            draft.path, "dflash.embedding_length", draft.n_embd,
            f"{target.n_embd} (the embedding length of the target {target.basename})",
        )

    _check_attention_shape(draft)
    _check_vocab(target, draft)

    mask = draft.get("tokenizer.ggml.mask_token_id")
    if mask is None:
        raise IncompatibleModelError(draft.path, "tokenizer.ggml.mask_token_id", None, "a mask token id")
    if not 0 <= int(mask) < draft.n_vocab:
        raise IncompatibleModelError(
            draft.path, "tokenizer.ggml.mask_token_id", mask, f"a token id in 0..{draft.n_vocab - 1}"
        )

    detected = _detect_algorithm(draft)
    if algorithm not in ("auto", "dflash", "dspark"):
        raise ValueError(f"algorithm must be 'auto', 'dflash' or 'dspark', not {algorithm!r}")
    if algorithm != "auto" and algorithm != detected:
        what = "has a Markov head (markov_w1.weight)" if detected == "dspark" else "has no Markov head"
        raise IncompatibleModelError(
            draft.path, "algorithm", algorithm, f"'{detected}' (the draft {what})"
        )

    block = draft.get("dflash.block_size")
    if block is None:
        if detected == "dspark":
            raise IncompatibleModelError(draft.path, "dflash.block_size", None, "present (required for DSpark)")
        block = 16
    block = int(block)
    if not 2 <= block <= MAX_BLOCK_SIZE:
        raise IncompatibleModelError(draft.path, "dflash.block_size", block, f"an integer in 2..{MAX_BLOCK_SIZE}")

    d2t_rows: Optional[int] = None
    if "d2t" in draft.tensor_names:
        d2t_rows = _check_d2t(target, draft)

    has_conf_key = draft.get("dflash.has_confidence_head")
    return DraftInfo(
        gguf=draft,
        algorithm=detected,
        target_layers=tuple(int(x) for x in layers),
        block_size=block,
        mask_token_id=int(mask),
        causal_attention=bool(draft.get("dflash.attention.causal", False)),
        sample_from_anchor=bool(draft.get("dflash.sample_from_anchor", True)),
        has_confidence_head=(
            bool(has_conf_key) if has_conf_key is not None else "conf_proj.weight" in draft.tensor_names
        ),
        has_token_embd="token_embd.weight" in draft.tensor_names,
        has_output="output.weight" in draft.tensor_names,
        reduced_vocab=d2t_rows,
        is_dflash2="selector_hidden.weight" in draft.tensor_names,
    )


def _check_d2t(target: GGUFInfo, draft: GGUFInfo) -> int:
    """A reduced-vocabulary draft: d2t (int64, one target id per head row) and a head of as many rows.

    llama.cpp asserts (aborts) when d2t's length differs from the head's rows, and scatters logits
    to the d2t ids without a range check.  Returns the number of draft-vocabulary rows.
    """
    from gguf import GGUFReader

    reader = GGUFReader(draft.path, "r")
    tensors = {t.name: t for t in reader.tensors}
    d2t = tensors["d2t"]
    shape = [int(x) for x in d2t.shape.tolist()]
    if d2t.data.dtype != np.int64 or len(shape) != 1:
        raise IncompatibleModelError(draft.path, "tensor d2t", f"{d2t.data.dtype} {shape}",
                                     "a 1-D int64 tensor (draft row -> target token id)")
    rows = shape[0]
    ids = np.asarray(d2t.data)
    if rows < 1 or rows > target.n_vocab or ids.min() < 0 or ids.max() >= target.n_vocab:
        raise IncompatibleModelError(draft.path, "tensor d2t", f"{rows} ids in {ids.min()}..{ids.max()}",
                                     f"at most {target.n_vocab} target token ids in 0..{target.n_vocab - 1}")
    if len(np.unique(ids)) != rows:
        raise IncompatibleModelError(draft.path, "tensor d2t", "repeated target ids", "distinct target token ids")
    head = tensors.get("output.weight")
    if head is None and not ("token_embd.weight" in tensors and rows == target.n_vocab):
        raise IncompatibleModelError(
            draft.path, "tensor output.weight", None,
            f"the draft's own LM head over its {rows} d2t rows (a reduced-vocabulary draft cannot use the target's)",
        )
    for name in ("output.weight", "markov_w2.weight"):
        t = tensors.get(name)
        if t is not None and int(t.shape.tolist()[-1]) != rows:
            raise IncompatibleModelError(draft.path, f"tensor {name} rows", int(t.shape.tolist()[-1]),
                                         f"{rows} (the length of d2t)")
    return rows


def _check_attention_shape(draft: GGUFInfo) -> None:
    """Head counts llama.cpp would otherwise assert on while building the draft graph."""
    n_head = draft.get("dflash.attention.head_count")
    n_kv = draft.get("dflash.attention.head_count_kv", n_head)
    if not isinstance(n_head, int) or n_head <= 0:
        raise IncompatibleModelError(draft.path, "dflash.attention.head_count", n_head, "a positive integer")
    if not isinstance(n_kv, int) or n_kv <= 0 or n_head % n_kv:
        raise IncompatibleModelError(
            draft.path, "dflash.attention.head_count_kv", n_kv, f"a positive divisor of head_count ({n_head})"
        )
    key_len = draft.get("dflash.attention.key_length")
    if key_len is None and draft.n_embd % n_head:
        raise IncompatibleModelError(
            draft.path, "dflash.attention.head_count", n_head, f"a divisor of embedding_length ({draft.n_embd})"
        )


def _check_vocab(target: GGUFInfo, draft: GGUFInfo) -> None:
    if not draft.tokens:
        raise IncompatibleModelError(draft.path, "tokenizer.ggml.tokens", None, "the target's vocabulary")
    if draft.n_vocab != target.n_vocab:
        raise IncompatibleModelError(
            draft.path, "tokenizer.ggml.tokens (vocabulary size)", draft.n_vocab,
            f"{target.n_vocab} (the vocabulary size of the target {target.basename})",
        )
    if draft.tokens != target.tokens:
        i = next(i for i, (a, b) in enumerate(zip(draft.tokens, target.tokens)) if a != b)
        raise IncompatibleModelError(
            draft.path, f"tokenizer.ggml.tokens[{i}]", draft.tokens[i],
            f"{target.tokens[i]!r} (token {i} of the target {target.basename})",
        )
