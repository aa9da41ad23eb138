"""Read GGUF metadata of targets and drafts and check that a pair fits, before llama.cpp sees them.

Several incompatibilities make llama.cpp abort the whole process (GGML_ASSERT), so everything it
would assert on is checked here first.  The file structure is checked by `gguffile` (plain reads,
counts bounded by the file's size); every value is read through a typed getter, so a wrong type,
a missing key or an out-of-range value is an `IncompatibleModelError` naming the file, the field,
the value found and what was expected, never a TypeError or a traceback.

Entry points: `check_gguf_file` (any model llama.cpp will load), `check_target_file` (a model to
decode, ordinarily or with drafters that read only tokens: n-gram types, lookup -- any architecture
llama.cpp runs), `validate_target_file` (a DFlash target: its graph must expose layer inputs),
`read_draft` + `validate_pair` (a draft against its target), `validate_files` (both).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .errors import GGUFFileError, IncompatibleModelError, UnsupportedTargetError
from .gguffile import ARRAY, BOOL, FLOAT32, FLOAT64, GGML_TYPES, STRING, GGUFHeader, KeyValue, TensorInfo, \
    parse_header, printable, read_tensor_bytes

__all__ = [
    "GGUFInfo",
    "DraftInfo",
    "read_gguf",
    "read_draft",
    "check_gguf_file",
    "check_gguf",
    "check_target",
    "check_target_file",
    "validate_target",
    "validate_target_file",
    "validate_pair",
    "detect_algorithm",
    "validate_files",
    "target_layer_limit",
    "get_int",
    "get_bool",
    "get_float",
    "get_str",
    "get_int_list",
    "get_per_layer",
    "LAYER_INPUT_ARCHS",
    "FINAL_INPUT_ARCHS",
    "RS_ROLLBACK_ARCHS",
]

#: Target architectures whose llama.cpp graph exposes per-layer inputs (the DFlash features):
#: the model builders in src/models/*.cpp that fill `t_layer_inp` (lfm2moe, nemotron_h_moe and
#: hunyuan-dense reuse the graph of lfm2, nemotron_h and hunyuan_vl).  gemma3n and hunyuan-moe
#: have their own graphs without it: llama.cpp asserts "layer input tensor is null".
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp",
        "gemma4", "gpt-oss", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer",
        "nanbeige", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
        "deepseek4", "hunyuan_vl", "hunyuan-dense",
    }
)

#: Architectures whose graph also exposes the input of the final norm: layer id == n_layer.
FINAL_INPUT_ARCHS = frozenset({"deepseek4", "mimo2", "nemotron_h", "nemotron_h_moe"})

#: Recurrent/hybrid architectures that honour `n_rs_seq` (native snapshot rollback).
RS_ROLLBACK_ARCHS = frozenset(
    {
        "qwen35", "qwen35moe", "qwen4exp", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe",
        "deepseek4", "glm5_next", "kimi_k3", "bailingmoe3",
    }
)

MAX_BLOCK_SIZE = 256
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp asserts block_count <= it
_INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})  # uint8 .. int32, uint64, int64
_U32_MAX = 2**32 - 1
_REQUIRED = object()


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
    tokens: tuple[str, ...] = field(repr=False)
    tensor_names: frozenset[str] = field(repr=False)
    tensor_types: dict[str, int] = field(repr=False)
    metadata: dict[str, Any] = field(repr=False)
    header: Optional[GGUFHeader] = field(default=None, repr=False, compare=False)
    token_bytes: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def basename(self) -> str:
        return os.path.basename(self.path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> Optional[TensorInfo]:
        return self.header.tensors.get(name) if self.header is not None else None


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
    def kind(self) -> str:
        """The speculative type this draft drafts as: "draft-dflash" or "draft-dspark"."""
        return "draft-dspark" if self.algorithm == "dspark" else "draft-dflash"

    @property
    def anchor_first(self) -> bool:
        """DSpark with sample_from_anchor reads slots 0..n-1 of `[last, MASK x (n-1)]`."""
        return self.algorithm == "dspark" and self.sample_from_anchor

    @property
    def max_draft_tokens(self) -> int:
        """The most draft tokens one block can yield."""
        return self.block_size if self.anchor_first else self.block_size - 1


# ---- reading -------------------------------------------------------------------------------------

def _plain(entry: KeyValue) -> Any:
    """A metadata value as plain Python (strings decoded for display; large arrays None)."""
    if entry.vtype == STRING:
        return entry.value.decode("utf-8", errors="replace")
    if entry.vtype == ARRAY:
        if entry.value is None:
            return None
        if entry.item_type == STRING:
            return [v.decode("utf-8", errors="replace") for v in entry.value]
        return entry.value.tolist()
    return entry.value


def _lenient_int(meta: dict[str, Any], key: str) -> int:
    v = meta.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF file's header; GGUFFileError if it is missing, not GGUF or malformed.

    Only the structure is checked here; values are checked by the validators' typed getters."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise GGUFFileError(path, "no such file")
    if os.path.isdir(path):
        raise GGUFFileError(path, "is a directory, expected a .gguf file")
    header = parse_header(path)
    tok = header.kv.get("tokenizer.ggml.tokens")
    token_bytes: tuple[bytes, ...] = ()
    if tok is not None and tok.vtype == ARRAY and tok.item_type == STRING and tok.value is not None:
        token_bytes = tuple(tok.value)
    tokens = tuple(b.decode("utf-8", errors="replace") for b in token_bytes)
    meta = {k: list(tokens) if k == "tokenizer.ggml.tokens" and token_bytes else _plain(v)
            for k, v in header.kv.items()}
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    tokenizer_model = meta.get("tokenizer.ggml.model")
    tensor_types = {name: t.ggml_type for name, t in header.tensors.items()}
    name = meta.get("general.name")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=name if isinstance(name, str) and name else os.path.basename(path),
        file_type=_file_type_name(meta.get("general.file_type"), tensor_types),
        n_layer=_lenient_int(meta, f"{arch}.block_count"),
        n_embd=_lenient_int(meta, f"{arch}.embedding_length"),
        n_ctx_train=_lenient_int(meta, f"{arch}.context_length"),
        tokenizer_model=tokenizer_model if isinstance(tokenizer_model, str) else "",
        tokens=tokens,
        tensor_names=frozenset(tensor_types),
        tensor_types=tensor_types,
        metadata=meta,
        header=header,
        token_bytes=token_bytes,
    )


_FILE_TYPES = {0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
               17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
               23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
               30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


def _file_type_name(file_type: Any, tensor_types: dict[str, int]) -> str:
    """A quantization label: general.file_type when present, else the most common tensor type."""
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        return _FILE_TYPES.get(file_type, "unknown")
    if tensor_types:
        counts: dict[int, int] = {}
        for t in tensor_types.values():
            counts[t] = counts.get(t, 0) + 1
        return GGML_TYPES[max(counts, key=counts.__getitem__)][0]
    return "unknown"


# ---- typed getters -------------------------------------------------------------------------------

class _Found(str):
    """A description of a found value, shown without quotes in error messages."""

    def __repr__(self) -> str:
        return str(self)


def _describe(entry: KeyValue) -> _Found:
    if entry.vtype == STRING:
        return _Found(f"{entry.value.decode('utf-8', errors='replace')[:60]!r} (a string)")
    if entry.vtype == ARRAY:
        return _Found(f"an {entry.type_name} of {entry.count}")
    return _Found(f"{entry.value!r} ({entry.type_name})")


def _entry(info: GGUFInfo, key: str) -> Optional[KeyValue]:
    return info.header.kv.get(key) if info.header is not None else None


def get_int(info: GGUFInfo, key: str, default: Any = _REQUIRED, *, lo: int = 0, hi: int = _U32_MAX) -> int:
    """An integer key within lo..hi; IncompatibleModelError naming file and key otherwise."""
    e = _entry(info, key)
    if e is None:
        if default is _REQUIRED:
            raise IncompatibleModelError(info.path, key, None, f"an integer in {lo}..{hi} (required)")
        return default
    if e.vtype not in _INT_TYPES:
        raise IncompatibleModelError(info.path, key, _describe(e), f"an integer in {lo}..{hi}")
    if not lo <= e.value <= hi:
        raise IncompatibleModelError(info.path, key, e.value, f"an integer in {lo}..{hi}")
    return int(e.value)


def get_bool(info: GGUFInfo, key: str, default: bool) -> bool:
    e = _entry(info, key)
    if e is None:
        return default
    if e.vtype != BOOL:
        raise IncompatibleModelError(info.path, key, _describe(e), "a bool")
    return bool(e.value)


def get_float(info: GGUFInfo, key: str, default: Any = _REQUIRED, *, lo: float = 0.0) -> float:
    """A finite float >= lo."""
    e = _entry(info, key)
    if e is None:
        if default is _REQUIRED:
            raise IncompatibleModelError(info.path, key, None, f"a finite float >= {lo} (required)")
        return default
    if e.vtype not in (FLOAT32, FLOAT64):
        raise IncompatibleModelError(info.path, key, _describe(e), f"a finite float >= {lo}")
    v = float(e.value)
    if not math.isfinite(v) or v < lo:
        raise IncompatibleModelError(info.path, key, v, f"a finite float >= {lo}")
    return v


def get_str(info: GGUFInfo, key: str, default: Any = _REQUIRED) -> str:
    e = _entry(info, key)
    if e is None:
        if default is _REQUIRED:
            raise IncompatibleModelError(info.path, key, None, "a string (required)")
        return default
    if e.vtype != STRING:
        raise IncompatibleModelError(info.path, key, _describe(e), "a string")
    return e.value.decode("utf-8", errors="replace")


def get_int_list(info: GGUFInfo, key: str, *, lo: int, hi: int, max_len: int = 4096) -> list[int]:
    """A required, non-empty array of integers within lo..hi."""
    e = _entry(info, key)
    want = f"a non-empty array of integers in {lo}..{hi}"
    if e is None:
        raise IncompatibleModelError(info.path, key, None, want + " (required)")
    if e.vtype != ARRAY or e.item_type not in _INT_TYPES or e.value is None or not 1 <= e.count <= max_len:
        raise IncompatibleModelError(info.path, key, _describe(e), want)
    values = [int(x) for x in e.value.tolist()]
    bad = [v for v in values if not lo <= v <= hi]
    if bad:
        raise IncompatibleModelError(info.path, key, values, want)
    return values


def get_per_layer(info: GGUFInfo, key: str, n_layer: int, default: Any = _REQUIRED, *,
                  lo: int = 0, hi: int = _U32_MAX) -> list[int]:
    """A per-layer integer: one value for every layer, or an array of n_layer values (llama.cpp's
    get_key_or_arr)."""
    e = _entry(info, key)
    if e is not None and e.vtype == ARRAY:
        if e.item_type not in _INT_TYPES or e.value is None or e.count != n_layer:
            raise IncompatibleModelError(info.path, key, _describe(e),
                                         f"an integer in {lo}..{hi} or an array of {n_layer} of them")
        values = [int(x) for x in e.value.tolist()]
        if any(not lo <= v <= hi for v in values):
            raise IncompatibleModelError(info.path, key, values, f"integers in {lo}..{hi}")
        return values
    return [get_int(info, key, default, lo=lo, hi=hi)] * n_layer


def _token_list(info: GGUFInfo) -> tuple[bytes, ...]:
    e = _entry(info, "tokenizer.ggml.tokens")
    if e is None:
        raise IncompatibleModelError(info.path, "tokenizer.ggml.tokens", None, "an array of token texts (required)")
    if e.vtype != ARRAY or e.item_type != STRING or e.count < 1:
        raise IncompatibleModelError(info.path, "tokenizer.ggml.tokens", _describe(e),
                                     "a non-empty array of strings")
    return info.token_bytes


def _check_tokens_distinct(info: GGUFInfo) -> None:
    """llama.cpp asserts that every token text is distinct (an empty one becomes "[EMPTY_i]")."""
    seen: dict[bytes, int] = {}
    for i, t in enumerate(info.token_bytes):
        t = t or f"[EMPTY_{i}]".encode()
        j = seen.setdefault(t, i)
        if j != i:
            raise IncompatibleModelError(
                info.path, f"tokenizer.ggml.tokens[{i}]", info.tokens[i],
                f"distinct token texts (token {j} is the same; llama.cpp aborts on a repeated token)")


def _check_shape(info: GGUFInfo, name: str, expected: Sequence[int], why: str, *, required: bool = True) -> bool:
    """The tensor's shape (ggml order, padded to 4 dims) must equal `expected`; False if absent."""
    t = info.tensor(name)
    if t is None:
        if required:
            raise IncompatibleModelError(info.path, f"tensor {name}", None, f"present with shape {list(expected)}")
        return False
    want = tuple(int(x) for x in expected) + (1,) * (4 - len(expected))
    if t.padded_shape() != want:
        raise IncompatibleModelError(info.path, f"tensor {name} shape", list(t.shape),
                                     f"{list(expected)} ({why})")
    return True


def _is_index_table(name: str) -> bool:
    """Integer tables llama.cpp reads with get_rows: d2t, DeepSeek-V4's token -> expert hash."""
    return name == "d2t" or name.endswith(".ffn_gate_tid2eid.weight")


def _check_float_weights(info: GGUFInfo) -> None:
    """Weights must be float or quantized: ggml aborts on integer types in matmuls and norms."""
    for name, t in info.header.tensors.items():
        if _is_index_table(name):
            continue
        if GGML_TYPES[t.ggml_type][0] in ("I8", "I16", "I32", "I64", "F64"):
            raise IncompatibleModelError(info.path, f"tensor {printable(name)} type", t.type_name,
                                         "a float or quantized type (F32, F16, BF16, Q*)")
        if len(t.shape) == 1 and t.type_name != "F32":
            # llama.cpp's converters always write them as F32; ggml's CPU kernels multiply F32
            # activations only by F32 vectors and abort otherwise
            raise IncompatibleModelError(info.path, f"tensor {printable(name)} type", t.type_name,
                                         "F32 (a 1-D weight such as a norm)")


# ---- any model -----------------------------------------------------------------------------------

def _layer_counts(info: GGUFInfo) -> tuple[int, int]:
    """block_count and nextn_predict_layers as llama.cpp asserts them: 1..512 and <= block_count."""
    arch = info.architecture
    n_layer = get_int(info, f"{arch}.block_count", lo=1, hi=MAX_LAYERS)
    nextn = get_int(info, f"{arch}.nextn_predict_layers", 0, lo=0, hi=n_layer)
    return n_layer, nextn


def check_gguf_file(path: str | os.PathLike[str]) -> GGUFInfo:
    """Checks for any model handed to llama.cpp (with or without a draft): the structure, and
    the generic values llama.cpp asserts on while loading (block count, MTP layers, token texts)."""
    info = read_gguf(path)
    check_gguf(info)
    return info


def check_gguf(info: GGUFInfo) -> None:
    """`check_gguf_file` on a file already read."""
    arch = get_str(info, "general.architecture")
    if arch in ("", "clip"):
        raise IncompatibleModelError(info.path, "general.architecture", arch or None, "a language model architecture")
    _layer_counts(info)
    if _entry(info, "tokenizer.ggml.tokens") is not None:
        _token_list(info)
        _check_tokens_distinct(info)
    _check_float_weights(info)


# ---- targets -------------------------------------------------------------------------------------

def check_target(target: GGUFInfo) -> None:
    """A model to decode by itself: any architecture llama.cpp loads, but not a draft file (a
    DFlash draft has no embeddings or head of its own without its target's context)."""
    arch = get_str(target, "general.architecture", "")
    if not arch:
        raise IncompatibleModelError(target.path, "general.architecture", None, "a model architecture")
    if arch == "dflash":
        raise IncompatibleModelError(
            target.path, "general.architecture", "dflash", "a target model (this file is a DFlash draft)"
        )


def check_target_file(path: str | os.PathLike[str]) -> GGUFInfo:
    """`check_gguf_file` and `check_target`: the checks for a target of ordinary decoding and of
    drafters that read only tokens (the layer-input checks belong to `validate_target`)."""
    info = check_gguf_file(path)
    check_target(info)
    return info


def validate_target(target: GGUFInfo) -> None:
    """A target for a draft model that reads its layer inputs (DFlash, DSpark, DFlash2): an
    architecture with layer-input extraction whose inputs llama.cpp can hand over (n_embd wide),
    with the vocabulary and embedding shapes its loader expects."""
    check_target(target)
    arch = get_str(target, "general.architecture")
    if arch not in LAYER_INPUT_ARCHS:
        raise UnsupportedTargetError(
            target.path,
            "general.architecture",
            arch,
            "an architecture whose llama.cpp graph exposes layer inputs "
            f"({', '.join(sorted(LAYER_INPUT_ARCHS))})",
        )
    _layer_counts(target)
    n_embd = get_int(target, f"{arch}.embedding_length", lo=1, hi=1 << 20)
    if arch == "qwen4exp":
        # hyper-connections make every layer input hc * n_embd wide; llama.cpp asserts n_embd
        hc = get_int(target, "qwen4exp.hyper_connection.count", 1, lo=0)
        if hc > 1:
            raise UnsupportedTargetError(
                target.path, "qwen4exp.hyper_connection.count", hc,
                "1 for a draft that reads layer inputs: with hyper-connections each layer input is count x "
                "n_embd wide, and llama.cpp 0.3.36 hands over only n_embd-wide rows (its C++ driver aborts on "
                "such a pair; llama.cpp itself refuses a qwen4exp count <= 1, so no DFlash/DSpark draft can "
                "drive a Qwen3.8 target there).  Draft without layer inputs instead: --spec-type lookup, an "
                "n-gram type (ngram-mod, ngram-simple, ...) or auto without a draft model")
    n_vocab = len(_token_list(target))
    _check_tokens_distinct(target)
    _check_float_weights(target)
    _check_shape(target, "token_embd.weight", (n_embd, n_vocab), "embedding_length x vocabulary size")
    _check_shape(target, "output.weight", (n_embd, n_vocab), "embedding_length x vocabulary size", required=False)


def validate_target_file(path: str | os.PathLike[str]) -> GGUFInfo:
    """Structure and target semantics of a file meant as a DFlash target; returns its info."""
    info = read_gguf(path)
    validate_target(info)
    return info


def target_layer_limit(target: GGUFInfo) -> int:
    """The largest valid target layer id: llama.cpp extracts inputs of layers 0..n_layer-1, where
    n_layer excludes MTP (nextn) layers, and also n_layer itself on a few architectures."""
    n_layer, nextn = _layer_counts(target)
    usable = n_layer - nextn
    return usable if target.architecture in FINAL_INPUT_ARCHS else usable - 1


# ---- drafts --------------------------------------------------------------------------------------

_DRAFT_REQUIRED_KEYS = (
    "dflash.context_length",
    "dflash.embedding_length",
    "dflash.block_count",
    "dflash.attention.head_count",
    "dflash.attention.layer_norm_rms_epsilon",
)


def read_draft(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a file and check that it is a DFlash draft at all (architecture and required keys)."""
    info = read_gguf(path)
    _check_draft_keys(info)
    return info


def _check_draft_keys(draft: GGUFInfo) -> None:
    arch = get_str(draft, "general.architecture", "")
    if arch != "dflash":
        raise IncompatibleModelError(
            draft.path, "general.architecture", arch or None, "'dflash' (a DFlash/DSpark draft)"
        )
    for key in _DRAFT_REQUIRED_KEYS:
        if _entry(draft, key) is None:
            raise IncompatibleModelError(draft.path, key, None, "present (required by the dflash architecture)")


def detect_algorithm(draft: GGUFInfo) -> str:
    """The algorithm of a draft file: dspark when it carries a Markov head, else dflash (as llama.cpp detects it)."""
    return "dspark" if "markov_w1.weight" in draft.tensor_names else "dflash"


def validate_pair(target: GGUFInfo, draft: GGUFInfo, algorithm: str = "auto") -> DraftInfo:
    """Check that `draft` can drive `target`; returns what the engine needs to know about the draft."""
    validate_target(target)
    _check_draft_keys(draft)
    if algorithm not in ("auto", "dflash", "dspark", "dflash2"):
        raise ValueError(f"algorithm must be 'auto', 'dflash', 'dspark' or 'dflash2', not {algorithm!r}")
    if algorithm == "dflash2":  # a DFlash draft with a selector lattice: checked here, then as DFlash
        if "selector_hidden.weight" not in draft.tensor_names:
            raise IncompatibleModelError(draft.path, "algorithm", algorithm,
                                         "'dflash' or 'auto' (the draft has no DFlash2 selector, "
                                         "selector_hidden.weight)")
        algorithm = "dflash"

    limit = target_layer_limit(target)
    layers = get_int_list(draft, "dflash.target_layers", lo=0, hi=_U32_MAX)
    if any(lid > limit for lid in layers):
        n_layer, nextn = _layer_counts(target)
        raise IncompatibleModelError(
            draft.path, "dflash.target_layers", layers,
            f"layer ids within 0..{limit} (the target {target.basename} has {n_layer} layers"
            + (f", {nextn} of them MTP layers" if nextn else "")
            + ("" if target.architecture in FINAL_INPUT_ARCHS else "; only deepseek4, mimo2 and nemotron_h expose "
               "the input of the final norm as id n_layer") + ")")

    n_embd = get_int(draft, "dflash.embedding_length", lo=1, hi=1 << 20)
    if n_embd != target.n_embd:
        raise IncompatibleModelError(
            draft.path, "dflash.embedding_length", n_embd,
            f"{target.n_embd} (the embedding length of the target {target.basename})",
        )
    get_int(draft, "dflash.context_length", lo=1, hi=_U32_MAX)
    get_float(draft, "dflash.attention.layer_norm_rms_epsilon", lo=0.0)
    n_layer, _ = _layer_counts(draft)
    hc = get_int(draft, "dflash.hyper_connection.count", 0)
    if hc > 0:
        raise IncompatibleModelError(draft.path, "dflash.hyper_connection.count", hc,
                                     "0 (DeepSeek-V4 backbone drafts are not supported)")

    _check_vocab(target, draft)
    n_vocab = draft.n_vocab
    mask = get_int(draft, "tokenizer.ggml.mask_token_id", lo=0, hi=n_vocab - 1)

    detected = detect_algorithm(draft)
    if algorithm != "auto" and algorithm != detected:
        what = "has a Markov head (markov_w1.weight)" if detected == "dspark" else "has no Markov head"
        raise IncompatibleModelError(
            draft.path, "algorithm", algorithm, f"'{detected}' (the draft {what})"
        )
    block = get_int(draft, "dflash.block_size", _REQUIRED if detected == "dspark" else 16, lo=2, hi=MAX_BLOCK_SIZE)

    d2t_rows: Optional[int] = None
    if "d2t" in draft.tensor_names:
        d2t_rows = _check_d2t(target, draft)
    _check_draft_shapes(draft, n_embd, n_layer, len(layers), n_vocab, d2t_rows)

    has_conf_key = get_bool(draft, "dflash.has_confidence_head", "conf_proj.weight" in draft.tensor_names)
    return DraftInfo(
        gguf=draft,
        algorithm=detected,
        target_layers=tuple(layers),
        block_size=block,
        mask_token_id=mask,
        causal_attention=get_bool(draft, "dflash.attention.causal", False),
        sample_from_anchor=get_bool(draft, "dflash.sample_from_anchor", True),
        has_confidence_head=has_conf_key,
        has_token_embd="token_embd.weight" in draft.tensor_names,
        has_output="output.weight" in draft.tensor_names,
        reduced_vocab=d2t_rows,
        is_dflash2="selector_hidden.weight" in draft.tensor_names,
    )


def validate_files(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str],
                   algorithm: str = "auto") -> tuple[GGUFInfo, DraftInfo]:
    """Both files, fully checked, before either reaches llama.cpp."""
    target = validate_target_file(target_path)
    return target, validate_pair(target, read_draft(draft_path), algorithm)


def _check_draft_shapes(draft: GGUFInfo, n_embd: int, n_layer: int, n_ids: int, n_vocab: int,
                        d2t_rows: Optional[int]) -> None:
    """Every tensor llama.cpp's dflash loader creates, against the metadata (ggml shape order)."""
    n_head = get_per_layer(draft, "dflash.attention.head_count", n_layer, lo=1, hi=1 << 16)
    n_kv = get_per_layer(draft, "dflash.attention.head_count_kv", n_layer, 0, lo=1, hi=1 << 16)
    n_kv = [k or h for k, h in zip(n_kv, n_head)]  # default: head_count
    n_ff = get_per_layer(draft, "dflash.feed_forward_length", n_layer, 0, lo=0, hi=1 << 24)
    key_len = get_int(draft, "dflash.attention.key_length", 0, lo=1, hi=1 << 16)
    val_len = get_int(draft, "dflash.attention.value_length", 0, lo=1, hi=1 << 16)
    if not key_len and n_embd % n_head[0]:
        raise IncompatibleModelError(
            draft.path, "dflash.attention.head_count", n_head[0], f"a divisor of embedding_length ({n_embd})")
    hk = key_len or n_embd // n_head[0]
    hv = val_len or n_embd // n_head[0]
    _check_float_weights(draft)
    _check_shape(draft, "fc.weight", (n_ids * n_embd, n_embd),
                 f"len(dflash.target_layers) * embedding_length = {n_ids} * {n_embd} wide")
    for name in ("enc.output_norm.weight", "output_norm.weight"):
        _check_shape(draft, name, (n_embd,), "embedding_length")
    for i in range(n_layer):
        if n_head[i] % n_kv[i]:
            raise IncompatibleModelError(draft.path, "dflash.attention.head_count_kv", n_kv[i],
                                         f"a positive divisor of head_count ({n_head[i]})")
        p = f"blk.{i}."
        heads = f"head_count {n_head[i]}, head_count_kv {n_kv[i]}, key_length {hk}, value_length {hv}"
        _check_shape(draft, p + "attn_norm.weight", (n_embd,), "embedding_length")
        _check_shape(draft, p + "attn_q.weight", (n_embd, hk * n_head[i]), heads)
        _check_shape(draft, p + "attn_k.weight", (n_embd, hk * n_kv[i]), heads)
        _check_shape(draft, p + "attn_v.weight", (n_embd, hv * n_kv[i]), heads, required=False)
        _check_shape(draft, p + "attn_output.weight", (hk * n_head[i], n_embd), heads)
        _check_shape(draft, p + "attn_q_norm.weight", (hk,), "key_length")
        _check_shape(draft, p + "attn_k_norm.weight", (hk,), "key_length")
        _check_shape(draft, p + "ffn_norm.weight", (n_embd,), "embedding_length")
        ff = f"dflash.feed_forward_length {n_ff[i]}"
        _check_shape(draft, p + "ffn_gate.weight", (n_embd, n_ff[i]), ff)
        _check_shape(draft, p + "ffn_up.weight", (n_embd, n_ff[i]), ff)
        _check_shape(draft, p + "ffn_down.weight", (n_ff[i], n_embd), ff)
    rows = d2t_rows if d2t_rows is not None else n_vocab
    _check_shape(draft, "token_embd.weight", (n_embd, n_vocab), "embedding_length x vocabulary size", required=False)
    _check_shape(draft, "output.weight", (n_embd, rows), "embedding_length x draft vocabulary rows", required=False)
    w1 = draft.tensor("markov_w1.weight")
    if w1 is not None:
        rank = w1.shape[0]
        _check_shape(draft, "markov_w1.weight", (rank, n_vocab), "Markov rank x vocabulary size")
        _check_shape(draft, "markov_w2.weight", (rank, rows), "Markov rank x draft vocabulary rows")
        _check_shape(draft, "conf_proj.weight", (n_embd + rank, 1), "embedding_length + Markov rank", required=False)
        _check_shape(draft, "conf_proj.bias", (1,), "one confidence logit", required=False)


def _check_d2t(target: GGUFInfo, draft: GGUFInfo) -> int:
    """A reduced-vocabulary draft: d2t (int64, one target id per head row), read on its own.

    llama.cpp asserts (aborts) when d2t's length differs from the head's rows, and scatters logits
    to the d2t ids without a range check.  Without its own `output.weight` the draft uses the
    target's head (or its own token_embd) over the full vocabulary, so d2t must then cover it:
    a full-vocabulary export.  Returns the number of draft-vocabulary rows.
    """
    t = draft.tensor("d2t")
    assert t is not None and draft.header is not None
    if t.type_name != "I64" or len(t.shape) != 1:
        raise IncompatibleModelError(draft.path, "tensor d2t", f"{t.type_name} {list(t.shape)}",
                                     "a 1-D I64 tensor (draft row -> target token id)")
    rows = t.shape[0]
    if rows > target.n_vocab:
        raise IncompatibleModelError(draft.path, "tensor d2t length", rows,
                                     f"at most {target.n_vocab} (the target's vocabulary size)")
    ids = np.frombuffer(read_tensor_bytes(draft.header, "d2t"), dtype="<i8")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= target.n_vocab:
        raise IncompatibleModelError(draft.path, "tensor d2t", f"{rows} ids in {lo}..{hi}",
                                     f"target token ids in 0..{target.n_vocab - 1}")
    if len(np.unique(ids)) != rows:
        raise IncompatibleModelError(draft.path, "tensor d2t", "repeated target ids", "distinct target token ids")
    if "output.weight" not in draft.tensor_names and rows != target.n_vocab:
        raise IncompatibleModelError(
            draft.path, "tensor output.weight", None,
            f"the draft's own LM head over its {rows} d2t rows (without one the draft uses a "
            f"{target.n_vocab}-row head, so d2t would need {target.n_vocab} rows)",
        )
    return rows


def _check_vocab(target: GGUFInfo, draft: GGUFInfo) -> None:
    """Same vocabulary as the target: size and every token text, compared as bytes."""
    tokens = _token_list(draft)
    if len(tokens) != target.n_vocab:
        raise IncompatibleModelError(
            draft.path, "tokenizer.ggml.tokens (vocabulary size)", len(tokens),
            f"{target.n_vocab} (the vocabulary size of the target {target.basename})",
        )
    if tokens != target.token_bytes:
        i = next(i for i, (a, b) in enumerate(zip(tokens, target.token_bytes)) if a != b)
        raise IncompatibleModelError(
            draft.path, f"tokenizer.ggml.tokens[{i}]", _Found(repr(tokens[i])),
            f"{target.token_bytes[i]!r} (token {i} of the target {target.basename})",
        )
