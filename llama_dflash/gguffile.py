"""A GGUF header parser that fails cleanly: every problem is a `GGUFFileError` naming the field.

Why our own parser: llama.cpp aborts the process on some malformed files, `gguf.GGUFReader`
memory-maps the file (a file truncated while being read turns into SIGBUS) and reads every tensor
(seconds for a real model), and a hostile count (2^64-1 strings) must fail before anything is
allocated.  So: plain buffered reads of the header only, every count checked against the bytes
left in the file, and the structural rules llama.cpp's own loader applies (ggml/src/gguf.cpp):
known value and tensor types, no duplicate keys or tensor names, at most 4 dimensions, element
counts that fit in int64, rows a multiple of the type's block, tensor data packed in order at the
alignment (`general.alignment`, a power of two) and inside the file.  Reading one tensor's bytes
(`read_tensor_bytes`) seeks straight to it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Optional

import numpy as np

from .errors import GGUFFileError

__all__ = [
    "GGUFHeader",
    "TensorInfo",
    "KeyValue",
    "GGML_TYPES",
    "VALUE_TYPE_NAMES",
    "parse_header",
    "read_tensor_bytes",
    "MAX_DIMS",
    "MAX_NAME",
]

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name must be shorter
DEFAULT_ALIGNMENT = 32
INT64_MAX = 2**63 - 1
_U64 = struct.Struct("<Q")
#: numeric arrays longer than this are skipped, not decoded (scores, token types: never needed)
MAX_DECODED_ARRAY = 4096
#: string arrays whose items are only skipped (large, never needed)
SKIPPED_STRING_ARRAYS = frozenset({"tokenizer.ggml.merges"})

# GGUF metadata value types (the GGUF spec)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FORMATS = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f", BOOL: "?",
            UINT64: "Q", INT64: "q", FLOAT64: "d"}
VALUE_TYPE_NAMES = {UINT8: "uint8", INT8: "int8", UINT16: "uint16", INT16: "int16", UINT32: "uint32",
                    INT32: "int32", FLOAT32: "float32", BOOL: "bool", STRING: "string", ARRAY: "array",
                    UINT64: "uint64", INT64: "int64", FLOAT64: "float64"}

#: ggml tensor types a GGUF file may hold: id -> (name, elements per block, bytes per block).
#: Ids 4, 5, 31-33 and 36-38 were removed from ggml; they and anything >= 43 are refused.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry.  Strings are kept as bytes (token texts are compared as bytes);
    `value` is None for arrays that were only skipped (`count` still says how long)."""

    vtype: int
    value: Any
    item_type: Optional[int] = None  # arrays only
    count: int = 1

    @property
    def type_name(self) -> str:
        if self.vtype == ARRAY:
            return f"array of {VALUE_TYPE_NAMES.get(self.item_type or 0, '?')}"
        return VALUE_TYPE_NAMES[self.vtype]


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's header entry; `shape` in ggml order (ne[0] = row length), `offset` from the
    start of the data section."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def padded_shape(self) -> tuple[int, ...]:
        """The shape with trailing 1s up to 4 dimensions (how llama.cpp compares shapes)."""
        return tuple(self.shape) + (1,) * (MAX_DIMS - len(self.shape))


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    kv: dict[str, KeyValue]
    tensors: dict[str, TensorInfo]  # in file order
    alignment: int
    data_start: int  # absolute file offset of the data section
    file_size: int


class _Reader:
    """Sequential little-endian reads with plain `read()` calls (no mmap), growing a buffer
    from the start of the file; every length is checked against the file's size first."""

    def __init__(self, fh: BinaryIO, path: str, size: int):
        self.fh, self.path, self.size = fh, path, size
        self.buf = b""
        self.pos = 0
        self.what = "the header"  # what is being read, for error messages

    def left(self) -> int:
        return self.size - self.pos

    def _need(self, n: int) -> None:
        if n > self.left():
            raise GGUFFileError(
                self.path, f"{self.what} is truncated: needs {n} bytes at offset {self.pos}, "
                f"expected a complete GGUF file ({self.size} bytes in all)", field=self.what)
        end = self.pos + n
        if end > len(self.buf):
            want = min(self.size, max(end, 2 * len(self.buf), 1 << 16)) - len(self.buf)
            chunk = self.fh.read(want)
            self.buf += chunk
            if end > len(self.buf):  # the file shrank while being read
                raise GGUFFileError(
                    self.path, f"{self.what} is truncated: the file ended at byte {len(self.buf)} while "
                    "being read, expected it not to change", field=self.what)

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        self._need(size)
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw(self, n: int) -> bytes:
        self._need(n)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def string(self) -> bytes:
        return self.raw(self.take("Q"))

    def strings(self, n: int, keep: bool) -> Optional[list[bytes]]:
        """n strings (the hot path: a vocabulary of 10^5 tokens), kept or only skipped."""
        out: Optional[list[bytes]] = [] if keep else None
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        for _ in range(n):
            if pos + 8 > len(buf):
                self.pos = pos
                self._need(8)
                buf = self.buf
            (length,) = unpack(buf, pos)
            pos += 8
            if pos + length > len(buf):
                self.pos = pos
                self._need(length)
                buf = self.buf
            if out is not None:
                out.append(buf[pos:pos + length])
            pos += length
        self.pos = pos
        return out

    def array(self, fmt: str, n: int) -> np.ndarray:
        size = struct.calcsize("<" + fmt)
        self._need(n * size)
        out = np.frombuffer(self.buf, dtype=np.dtype("<" + fmt), count=n, offset=self.pos).copy()
        self.pos += n * size
        return out

    def skip(self, n: int) -> None:
        self._need(n)
        self.pos += n


def printable(name: str, limit: int = 80) -> str:
    """A name from the file, safe on one line of an error message (escaped, shortened)."""
    short = name if len(name) <= limit else name[:limit] + "..."
    return short if short.isprintable() else repr(short)[1:-1]


def _fail(path: str, field: str, found: Any, expected: str) -> GGUFFileError:
    return GGUFFileError(path, f"{field} is {found}, expected {expected}", field=field)


def _read_value(r: _Reader, key: str, vtype: int) -> KeyValue:
    if vtype == STRING:
        return KeyValue(STRING, r.string())
    if vtype in _FORMATS:
        return KeyValue(vtype, r.take(_FORMATS[vtype]))
    if vtype != ARRAY:
        raise _fail(r.path, f"the type of key '{key}'", vtype, "a GGUF value type (0..12)")
    item = r.take("I")
    n = r.take("Q")
    if item == STRING:
        if n > r.left() // 8:  # every string has at least its 8-byte length
            raise _fail(r.path, f"the length of array '{key}'", n,
                        f"at most {r.left() // 8} strings (the bytes left in the file)")
        return KeyValue(ARRAY, r.strings(n, keep=key not in SKIPPED_STRING_ARRAYS), STRING, n)
    fmt = _FORMATS.get(item)
    if fmt is None:
        raise _fail(r.path, f"the item type of array '{key}'", item,
                    "a GGUF scalar or string type (nested arrays are not allowed)")
    size = struct.calcsize("<" + fmt)
    if n > r.left() // size:
        raise _fail(r.path, f"the length of array '{key}'", n,
                    f"at most {r.left() // size} items of {size} bytes (the bytes left in the file)")
    if n > MAX_DECODED_ARRAY:
        r.skip(n * size)
        return KeyValue(ARRAY, None, item, n)
    return KeyValue(ARRAY, r.array(fmt, n), item, n)


def _read_kv(r: _Reader, n_kv: int) -> dict[str, KeyValue]:
    kv: dict[str, KeyValue] = {}
    for i in range(n_kv):
        r.what = f"the name of key #{i}"
        raw = r.string()
        key = raw.decode("utf-8", errors="replace")
        shown = printable(key)
        if not raw:
            raise _fail(r.path, f"the name of key #{i}", "empty", "a non-empty key name")
        if key in kv:
            raise _fail(r.path, f"key '{shown}'", "present twice", "each key at most once")
        r.what = f"the value of key '{shown}'"
        kv[key] = _read_value(r, shown, r.take("I"))
    return kv


def _alignment(path: str, kv: dict[str, KeyValue]) -> int:
    entry = kv.get("general.alignment")
    if entry is None:
        return DEFAULT_ALIGNMENT
    if entry.vtype != UINT32:
        raise _fail(path, "general.alignment", f"a {entry.type_name}", "a uint32")
    a = int(entry.value)
    if a <= 0 or a & (a - 1):
        raise _fail(path, "general.alignment", a, "a power of two")
    return a


def _read_tensor(r: _Reader, i: int, seen: dict[str, TensorInfo]) -> TensorInfo:
    r.what = f"the name of tensor #{i}"
    raw = r.string()
    name = raw.decode("utf-8", errors="replace")
    field = f"tensor '{printable(name)}'"
    if len(raw) >= MAX_NAME:
        raise _fail(r.path, f"the name of tensor #{i}", f"{len(raw)} bytes long", f"shorter than {MAX_NAME} bytes")
    if name in seen:
        raise _fail(r.path, field, "present twice", "each tensor name at most once")
    r.what = f"the shape of {field}"
    n_dims = r.take("I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _fail(r.path, f"{field} n_dims", n_dims, f"1..{MAX_DIMS}")
    shape = tuple(r.take("q") for _ in range(n_dims))
    n = 1
    for d in shape:
        if d <= 0:
            raise _fail(r.path, f"{field} shape", list(shape), "positive dimensions")
        if n > INT64_MAX // d:
            raise _fail(r.path, f"{field} shape", list(shape), "at most 2^63-1 elements")
        n *= d
    r.what = f"the type of {field}"
    gtype = r.take("I")
    if gtype not in GGML_TYPES:
        raise _fail(r.path, f"{field} type", gtype, "a ggml tensor type known to llama.cpp")
    tname, block, block_bytes = GGML_TYPES[gtype]
    if shape[0] % block:
        raise _fail(r.path, f"{field} row length", shape[0], f"a multiple of {block} (the block size of {tname})")
    r.what = f"the data offset of {field}"
    offset = r.take("Q")
    return TensorInfo(name, shape, gtype, offset, n // block * block_bytes)


def _check_layout(r: _Reader, tensors: dict[str, TensorInfo], alignment: int) -> int:
    """Tensor data packed in file order at the alignment, all of it inside the file."""
    data_start = -(-r.pos // alignment) * alignment if tensors else r.pos
    expected = 0
    for t in tensors.values():
        if t.offset != expected:
            raise _fail(r.path, f"tensor '{printable(t.name)}' data offset", t.offset,
                        f"{expected} (tensor data packed in order, aligned to {alignment} bytes)")
        end = data_start + t.offset + t.nbytes
        if end > r.size:
            raise _fail(r.path, f"tensor '{printable(t.name)}' data", f"{t.nbytes} bytes at file offset {data_start + t.offset}",
                        f"inside the file ({r.size} bytes; the file is truncated)")
        expected += -(-t.nbytes // alignment) * alignment
    return data_start


def parse_header(path: str) -> GGUFHeader:
    """Parse and structurally check a GGUF file's header; GGUFFileError on any problem."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise GGUFFileError(path, f"cannot be read ({exc.strerror})") from exc
    with fh:
        size = os.fstat(fh.fileno()).st_size
        r = _Reader(fh, path, size)
        r.what = "the magic number"
        magic = r.raw(4) if size >= 4 else fh.read(4)
        if magic != b"GGUF":
            raise GGUFFileError(path, f"is not a GGUF file (magic {magic!r}, expected b'GGUF')", field="magic")
        r.what = "the GGUF version"
        version = r.take("I")
        if version not in (2, 3):
            raise _fail(path, "the GGUF version", version, "2 or 3")
        r.what = "the tensor count"
        n_tensors = r.take("q")
        r.what = "the key count"
        n_kv = r.take("q")
        # a key takes at least 13 bytes (length, one name byte, type), a tensor entry at least 25
        for what, n, least in (("the key count", n_kv, 13), ("the tensor count", n_tensors, 25)):
            if not 0 <= n <= r.left() // least:
                raise _fail(path, what, n, f"0..{r.left() // least}, what the {r.left()} bytes left can hold "
                            "(the file is truncated or the count corrupt)")
        kv = _read_kv(r, n_kv)
        alignment = _alignment(path, kv)
        tensors: dict[str, TensorInfo] = {}
        for i in range(n_tensors):
            t = _read_tensor(r, i, tensors)
            tensors[t.name] = t
        data_start = _check_layout(r, tensors, alignment)
    return GGUFHeader(path, version, kv, tensors, alignment, data_start, size)


def read_tensor_bytes(header: GGUFHeader, name: str) -> bytes:
    """One tensor's data, read with a seek and a plain read (no mmap, nothing else touched)."""
    t = header.tensors[name]
    with open(header.path, "rb") as fh:
        fh.seek(header.data_start + t.offset)
        data = fh.read(t.nbytes)
    if len(data) != t.nbytes:
        raise GGUFFileError(header.path, f"tensor '{name}' data is truncated (the file changed while being read)",
                            field=f"tensor '{name}'")
    return data
