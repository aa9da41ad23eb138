"""A seeded, deterministic corpus of malformed GGUF targets and drafts, made from valid fixtures.

Families (each case is one file plus what the CLI must say about it):
- truncations at structural boundaries (header counts, every key/value, every tensor entry, the
  data section and each tensor's data), always refused;
- single bit flips in the key/value section and in the tensor entries; a flip can leave the file
  valid (a float in a rope setting, a letter of an unused key), so these may load, and then they
  must run without a crash;
- every metadata key the validators read, with each wrong type, out-of-range values and removed;
- huge counts (keys, tensors, array lengths, string lengths), duplicates, bad tensor entries;
- semantic mutations written through the gguf writer: bad d2t, shapes that contradict the
  metadata, unsupported or aborting target configurations.

The byte-level families work on a small independent parser of the file (`Layout`), not on the
reader under test.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional, Sequence

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q",
        F64: "d"}


@dataclass(frozen=True)
class Case:
    """One malformed file: `fields` are substrings of which the one stderr line must contain at
    least one (None: the file may still be valid and load)."""

    name: str
    role: str  # "target" | "draft"
    data: bytes
    fields: Optional[tuple[str, ...]]

    @property
    def may_load(self) -> bool:
        return self.fields is None


# ---- an independent little GGUF parser/builder ---------------------------------------------------

@dataclass
class KV:
    key: str
    raw: bytes  # the whole entry: key string, type, value
    start: int  # absolute offset in the source file
    value_start: int


@dataclass
class Info:
    name: str
    dims: list[int]
    gtype: int
    offset: int
    start: int
    type_pos: int


@dataclass
class Layout:
    raw: bytes
    version: int
    kvs: list[KV]
    infos: list[Info]
    header_end: int
    alignment: int
    data_start: int

    @property
    def data(self) -> bytes:
        return self.raw[self.data_start:]

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key)

    def boundaries(self) -> list[int]:
        """Every offset where a structural element starts or ends."""
        out = {4, 8, 16, 24, self.header_end, self.data_start, len(self.raw) - 1}
        for k in self.kvs:
            out |= {k.start, k.start + 8, k.value_start - 4, k.value_start, k.start + len(k.raw)}
        for t in self.infos:
            out |= {t.start, t.start + 8, t.type_pos - 8 * len(t.dims), t.type_pos, t.type_pos + 4}
            out |= {self.data_start + t.offset, self.data_start + t.offset + 1}
        return sorted(b for b in out if 0 < b < len(self.raw))


def _skip_value(raw: bytes, pos: int, vtype: int) -> int:
    if vtype == STR:
        (n,) = struct.unpack_from("<Q", raw, pos)
        return pos + 8 + n
    if vtype == ARR:
        item, n = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        if item == STR:
            for _ in range(n):
                pos = _skip_value(raw, pos, STR)
            return pos
        return pos + n * struct.calcsize("<" + _FMT[item])
    return pos + struct.calcsize("<" + _FMT[vtype])


def parse(raw: bytes) -> Layout:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    pos = 24
    kvs = []
    alignment = 32
    for _ in range(n_kv):
        start = pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        key = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (vtype,) = struct.unpack_from("<I", raw, pos)
        value_start = pos + 4
        pos = _skip_value(raw, value_start, vtype)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", raw, value_start)
        kvs.append(KV(key, raw[start:pos], start, value_start))
    infos = []
    for _ in range(n_tensors):
        start = pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (nd,) = struct.unpack_from("<I", raw, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", raw, pos + 4))
        pos += 4 + 8 * nd
        gtype, offset = struct.unpack_from("<IQ", raw, pos)
        infos.append(Info(name, dims, gtype, offset, start, pos))
        pos += 12
    data_start = -(-pos // alignment) * alignment
    return Layout(raw, version, kvs, infos, pos, alignment, data_start)


def enc_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype: int, value: Any, item: Optional[int] = None) -> bytes:
    if vtype == STR:
        return struct.pack("<I", STR) + enc_str(value)
    if vtype == ARR:
        body = b"".join(enc_str(v) if item == STR else struct.pack("<" + _FMT[item], v) for v in value)
        return struct.pack("<IIQ", ARR, item, len(value)) + body
    return struct.pack("<I", vtype) + struct.pack("<" + _FMT[vtype], value)


def enc_kv(key: str, vtype: int, value: Any, item: Optional[int] = None) -> bytes:
    return enc_str(key) + enc_value(vtype, value, item)


def enc_info(name: str, dims: Sequence[int], gtype: int, offset: int) -> bytes:
    return enc_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d & (2**64 - 1))
                                                                    for d in dims) + struct.pack("<IQ", gtype, offset)


def build(lay: Layout, *, kvs: Optional[Sequence[bytes]] = None, infos: Optional[Sequence[bytes]] = None,
          n_kv: Optional[int] = None, n_tensors: Optional[int] = None, alignment: Optional[int] = None,
          data: Optional[bytes] = None) -> bytes:
    """Reassemble a file from (possibly edited) pieces; the data section is re-aligned."""
    kvs = [k.raw for k in lay.kvs] if kvs is None else list(kvs)
    infos = [enc_info(t.name, t.dims, t.gtype, t.offset) for t in lay.infos] if infos is None else list(infos)
    head = b"GGUF" + struct.pack("<IQQ", lay.version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    align = alignment or lay.alignment
    pad = (-len(body)) % align
    return body + b"\0" * pad + (lay.data if data is None else data)


def replace_kv(lay: Layout, key: str, entry: Optional[bytes]) -> bytes:
    """The file with `key`'s entry replaced (None: removed; a new key is appended)."""
    out = [k.raw for k in lay.kvs if k.key != key]
    if entry is not None:
        idx = next((i for i, k in enumerate(lay.kvs) if k.key == key), len(out))
        out.insert(idx, entry)
    return build(lay, kvs=out)


def edit_info(lay: Layout, which: str, **changes: Any) -> bytes:
    infos = []
    for t in lay.infos:
        if t.name == which:
            t = replace(t, **changes)
        infos.append(enc_info(t.name, t.dims, t.gtype, t.offset))
    return build(lay, infos=infos)


# ---- families ------------------------------------------------------------------------------------

TRUNCATED = ("truncated",)
STRUCTURE = ("truncated", "the key count", "the tensor count", "key '", "tensor '", "the name of",
             "general.alignment", "GGUF version", "magic")


def truncations(lay: Layout, role: str, n: int, rng: random.Random) -> list[Case]:
    bounds = lay.boundaries()
    picks = bounds if len(bounds) <= n else sorted(rng.sample(bounds, n))
    return [Case(f"{role}-trunc-{b}", role, lay.raw[:b], ("truncated", "magic")) for b in picks]


def bit_flips(lay: Layout, role: str, n: int, rng: random.Random) -> list[Case]:
    """Half in the key/value section, half in the tensor entries (the header only)."""
    kv_lo, kv_hi = 24, lay.infos[0].start
    ti_lo, ti_hi = lay.infos[0].start, lay.header_end
    cases = []
    for i in range(n):
        lo, hi = (kv_lo, kv_hi) if i % 2 == 0 else (ti_lo, ti_hi)
        pos, bit = rng.randrange(lo, hi), rng.randrange(8)
        data = bytearray(lay.raw)
        data[pos] ^= 1 << bit
        cases.append(Case(f"{role}-flip-{pos}-{bit}", role, bytes(data), None))
    return cases


#: wrong-typed or out-of-range replacements, by the kind of value a key holds
def _variants(kind: str, n_vocab: int) -> list[tuple[str, Optional[bytes]]]:
    """(label, encoded type+value) pairs; None removes the key."""
    common = [("string", enc_value(STR, "12")), ("array", enc_value(ARR, [1, 2], I32)), ("missing", None)]
    if kind == "count":  # a positive uint32 count
        return common + [("float", enc_value(F32, 2.5)), ("bool", enc_value(BOOL, True)), ("zero", enc_value(U32, 0)),
                         ("negative", enc_value(I32, -1)), ("huge", enc_value(U64, 2**64 - 1))]
    if kind == "opt_count":  # optional: removal may be fine, so not generated
        return [v for v in _variants("count", n_vocab) if v[0] != "missing"]
    if kind == "token_id":
        return common + [("float", enc_value(F32, 1.0)), ("negative", enc_value(I32, -1)),
                         ("vocab", enc_value(U32, n_vocab)), ("huge", enc_value(U64, 2**63))]
    if kind == "bool":
        return [("string", enc_value(STR, "true")), ("uint8", enc_value(U8, 1)), ("array", enc_value(ARR, [1], U8))]
    if kind == "float":
        return common + [("int", enc_value(U32, 1)), ("nan", enc_value(F32, float("nan"))),
                         ("inf", enc_value(F32, float("inf"))), ("negative", enc_value(F32, -1.0))]
    if kind == "arch":
        return [("int", enc_value(U32, 7)), ("array", enc_value(ARR, ["llama"], STR)), ("empty", enc_value(STR, "")),
                ("unknown", enc_value(STR, "no-such-arch")), ("missing", None)]
    if kind == "layers":
        return [("scalar", enc_value(U32, 1)), ("strings", enc_value(ARR, ["1"], STR)), ("empty", enc_value(ARR, [], I32)),
                ("floats", enc_value(ARR, [1.0], F32)), ("beyond", enc_value(ARR, [1, 99], I32)),
                ("negative", enc_value(ARR, [-1, 2], I32)), ("missing", None)]
    if kind == "opt_string":
        return [("int", enc_value(U32, 1)), ("array", enc_value(ARR, ["x"], STR)), ("bool", enc_value(BOOL, True))]
    if kind == "tokens":
        return [("scalar", enc_value(STR, "a")), ("ints", enc_value(ARR, [1, 2], I32)), ("empty", enc_value(ARR, [], STR)),
                ("missing", None)]
    raise ValueError(kind)


DRAFT_KEYS = {
    "general.architecture": "arch",
    "dflash.context_length": "count",
    "dflash.embedding_length": "count",
    "dflash.block_count": "count",
    "dflash.feed_forward_length": "count",
    "dflash.attention.head_count": "count",
    "dflash.attention.head_count_kv": "opt_count",
    "dflash.attention.key_length": "opt_count",
    "dflash.attention.value_length": "opt_count",
    "dflash.attention.layer_norm_rms_epsilon": "float",
    "dflash.target_layers": "layers",
    "dflash.block_size": "opt_count",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.ggml.mask_token_id": "token_id",
    "dflash.attention.causal": "bool",
    "dflash.sample_from_anchor": "bool",
    "dflash.has_confidence_head": "bool",
    "dflash.nextn_predict_layers": "opt_count",
    "dflash.hyper_connection.count": "opt_count",
}
TARGET_KEYS = {
    "general.architecture": "arch",
    "llama.block_count": "count",
    "llama.embedding_length": "count",
    "llama.nextn_predict_layers": "opt_count",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.chat_template": "opt_string",
}
#: values that are valid after all (not refused): left out of the corpus
_VALID = {("dflash.nextn_predict_layers", "zero"), ("dflash.hyper_connection.count", "zero"),
          ("llama.nextn_predict_layers", "zero"), ("dflash.block_size", "missing")}
#: what a refusal of (key, label) names when it is not the key itself
_NAMED_AS = {
    "feed_forward_length": ("ffn_gate", "feed_forward_length"),
    "head_count_kv": ("head_count_kv", "attn_k"),
    "key_length": ("key_length", "attn_q"),
    "value_length": ("value_length", "attn_v"),
    "tokenizer.ggml.tokens": ("tokenizer.ggml.tokens", "token_embd"),
    "llama.embedding_length": ("llama.embedding_length", "token_embd", "dflash.embedding_length"),
    "general.architecture": ("general.architecture",),
    "llama.block_count": ("llama.block_count",),
    "dflash.block_count": ("dflash.block_count", "blk."),
}


def key_mutations(lay: Layout, role: str, keys: dict[str, str], n_vocab: int) -> list[Case]:
    cases = []
    for key, kind in keys.items():
        named = next((v for k, v in _NAMED_AS.items() if key.endswith(k)), (key,))
        for label, value in _variants(kind, n_vocab):
            if (key, label) in _VALID:
                continue
            entry = None if value is None else enc_str(key) + value
            cases.append(Case(f"{role}-key-{key}-{label}", role, replace_kv(lay, key, entry), named))
    return cases


def count_mutations(lay: Layout, role: str) -> list[Case]:
    """Huge counts and lengths: each must fail at once, without allocating."""
    tok = lay.kv("tokenizer.ggml.tokens")
    key_len = len("tokenizer.ggml.tokens")
    count_pos = tok.value_start + 4  # after the item type
    def patch(pos: int, fmt: str, value: int) -> bytes:
        data = bytearray(lay.raw)
        struct.pack_into("<" + fmt, data, pos, value)
        return bytes(data)
    first_string = count_pos + 8
    return [
        Case(f"{role}-count-kv-max", role, patch(16, "Q", 2**63 - 1), ("the key count",)),
        Case(f"{role}-count-kv-neg", role, patch(16, "Q", 2**64 - 1), ("the key count",)),
        Case(f"{role}-count-tensors-max", role, patch(8, "Q", 2**63 - 1), ("the tensor count",)),
        Case(f"{role}-count-tokens-max", role, patch(count_pos, "Q", 2**64 - 1), ("tokenizer.ggml.tokens",)),
        Case(f"{role}-count-tokens-plus1", role, patch(count_pos, "Q", int.from_bytes(
            lay.raw[count_pos:count_pos + 8], "little") + 1), STRUCTURE),
        Case(f"{role}-count-string-max", role, patch(first_string, "Q", 2**64 - 1), ("tokenizer.ggml.tokens",)),
        Case(f"{role}-count-keyname-max", role, patch(tok.start, "Q", 2**64 - 1), ("key #",)),
        Case(f"{role}-count-tensorname-max", role, patch(lay.infos[0].start, "Q", 2**64 - 1), ("tensor #0",)),
        Case(f"{role}-count-keyname-{key_len}+1", role, patch(tok.start, "Q", key_len + 1), STRUCTURE),
    ]


def structure_mutations(lay: Layout, role: str) -> list[Case]:
    t0, t1, tl = lay.infos[0], lay.infos[1], lay.infos[-1]
    kvs = [k.raw for k in lay.kvs]
    dup_kv = build(lay, kvs=kvs + [lay.kvs[1].raw])
    infos = [enc_info(t.name, t.dims, t.gtype, t.offset) for t in lay.infos]
    dup_name = list(infos)
    dup_name[1] = enc_info(t0.name, t1.dims, t1.gtype, t1.offset)
    q = "'"
    return [
        Case(f"{role}-struct-magic", role, b"GGUX" + lay.raw[4:], ("magic",)),
        Case(f"{role}-struct-version-1", role, lay.raw[:4] + struct.pack("<I", 1) + lay.raw[8:], ("GGUF version",)),
        Case(f"{role}-struct-version-big", role, lay.raw[:4] + struct.pack("<I", 0x03000000) + lay.raw[8:],
             ("GGUF version",)),
        Case(f"{role}-struct-dup-key", role, dup_kv, (f"key {q}{lay.kvs[1].key}{q}",)),
        Case(f"{role}-struct-empty-key", role, build(lay, kvs=kvs + [enc_kv("", U32, 1)]), ("the name of key",)),
        Case(f"{role}-struct-bad-vtype", role, build(lay, kvs=kvs + [enc_str("x.y") + struct.pack("<I", 13)]),
             ("key 'x.y'",)),
        Case(f"{role}-struct-newline-key", role, build(lay, kvs=kvs + [enc_str("x\ny") + struct.pack("<I", 13)]),
             ("key 'x\\ny'",)),  # one stderr line still
        Case(f"{role}-struct-nested-array", role,
             build(lay, kvs=kvs + [enc_str("x.y") + struct.pack("<IIQ", ARR, ARR, 1)]), ("array 'x.y'",)),
        Case(f"{role}-struct-dup-tensor", role, build(lay, infos=dup_name), (f"tensor {q}{t0.name}{q}",)),
        Case(f"{role}-struct-ndims-5", role, edit_info(lay, t1.name, dims=t1.dims + [1, 1, 1, 1][:5 - len(t1.dims)]),
             (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-ndims-0", role, edit_info(lay, t1.name, dims=[]), (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-dim-zero", role, edit_info(lay, t1.name, dims=[0] + t1.dims[1:]),
             (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-dim-negative", role, edit_info(lay, t1.name, dims=[-5] + t1.dims[1:]),
             (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-dims-overflow", role, edit_info(lay, t1.name, dims=[2**32, 2**32, 4]),
             (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-type-removed", role, edit_info(lay, t1.name, gtype=4), (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-type-unknown", role, edit_info(lay, t1.name, gtype=99), (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-type-block", role, edit_info(lay, tl.name, gtype=12), (f"tensor {q}{tl.name}{q}",)),
        Case(f"{role}-struct-type-int", role, edit_info(lay, t0.name, gtype=26), (f"tensor {t0.name}",)),
        Case(f"{role}-struct-offset-misaligned", role, edit_info(lay, t1.name, offset=t1.offset + 4),
             (f"tensor {q}{t1.name}{q}",)),
        Case(f"{role}-struct-offset-beyond", role, edit_info(lay, tl.name, offset=2**40), (f"tensor {q}{tl.name}{q}",)),
        Case(f"{role}-struct-data-short", role, lay.raw[:-4], (f"tensor {q}{tl.name}{q}",)),
        Case(f"{role}-struct-align-zero", role, replace_kv(lay, "general.alignment", enc_kv("general.alignment", U32, 0)),
             ("general.alignment",)),
        Case(f"{role}-struct-align-three", role,
             replace_kv(lay, "general.alignment", enc_kv("general.alignment", U32, 3)), ("general.alignment",)),
        Case(f"{role}-struct-align-string", role,
             replace_kv(lay, "general.alignment", enc_kv("general.alignment", STR, "32")), ("general.alignment",)),
        Case(f"{role}-struct-align-64", role,
             replace_kv(lay, "general.alignment", enc_kv("general.alignment", U32, 64)), None),  # may stay valid
        Case(f"{role}-struct-long-name", role, edit_info(lay, t1.name, name="x" * 64), ("the name of tensor",)),
    ]


# ---- semantic mutations through the gguf writer --------------------------------------------------

def rewrite(src: str, dst: str, *, arch: Optional[str] = None, set_keys: Optional[dict] = None,
            drop_keys: Iterable[str] = (), tensors: Optional[dict[str, Optional[np.ndarray]]] = None,
            raw_types: Optional[dict[str, int]] = None) -> bytes:
    """Copy a GGUF with keys set/dropped and tensors replaced (None: dropped); returns the bytes."""
    import gguf
    from gguf import GGUFReader, GGUFValueType

    set_keys, tensors, raw_types = set_keys or {}, tensors or {}, raw_types or {}
    r = GGUFReader(src, "r")
    old_arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    new_arch = arch or old_arch
    w = gguf.GGUFWriter(dst, new_arch)
    for name, f in r.fields.items():
        out = name.replace(f"{old_arch}.", f"{new_arch}.", 1) if name.startswith(f"{old_arch}.") else name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys or out in set_keys:
            continue
        t = list(f.types)
        if t[0] == GGUFValueType.ARRAY:
            val = [bytes(f.parts[i]) for i in f.data] if t[1] == GGUFValueType.STRING else \
                [f.parts[i][0].item() for i in f.data]
            w.add_key_value(out, val, GGUFValueType.ARRAY, sub_type=t[1])
        elif t[0] == GGUFValueType.STRING:
            w.add_key_value(out, bytes(f.parts[f.data[0]]), GGUFValueType.STRING)
        else:
            w.add_key_value(out, f.parts[f.data[0]][0].item(), t[0])
    for name, (value, vtype, *sub) in set_keys.items():
        w.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
    done = set()
    for t in r.tensors:
        if t.name in tensors:
            done.add(t.name)
            if tensors[t.name] is None:
                continue
            w.add_tensor(t.name, tensors[t.name], raw_dtype=raw_types.get(t.name))
            continue
        data = np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    for name, arr in tensors.items():
        if name not in done and arr is not None:
            w.add_tensor(name, arr, raw_dtype=raw_types.get(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(dst, "rb") as fh:
        return fh.read()


def semantic_mutations(fixtures: dict[str, str], tmp: str) -> list[Case]:
    """fixtures: 'target', 'draft', 'd2t' (reduced vocab + own head), 'dspark' (Markov + confidence)."""
    from gguf import GGUFReader, GGUFValueType

    ARRT, I32T, U32T = GGUFValueType.ARRAY, GGUFValueType.INT32, GGUFValueType.UINT32
    tensors = {p: {t.name: t for t in GGUFReader(fixtures[p], "r").tensors} for p in ("target", "draft", "d2t", "dspark")}

    def arr(src: str, name: str) -> np.ndarray:
        t = tensors[src][name]
        return np.array(t.data).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))

    d2t = arr("d2t", "d2t")
    n_vocab = arr("target", "token_embd.weight").shape[0]
    fc = arr("draft", "fc.weight")
    specs: list[tuple[str, str, str, dict, tuple[str, ...]]] = [
        # (name, role, source fixture, rewrite kwargs, fields)
        ("d2t-out-of-vocab", "draft", "d2t", dict(tensors={"d2t": np.where(d2t == d2t[-1], n_vocab + 5, d2t)}),
         ("tensor d2t",)),
        ("d2t-negative", "draft", "d2t", dict(tensors={"d2t": np.where(d2t == d2t[0], -1, d2t)}), ("tensor d2t",)),
        ("d2t-repeated", "draft", "d2t", dict(tensors={"d2t": np.concatenate([d2t[:1], d2t[:-1]])}), ("tensor d2t",)),
        ("d2t-float", "draft", "d2t", dict(tensors={"d2t": d2t.astype(np.float32)}), ("tensor d2t",)),
        ("d2t-2d", "draft", "d2t", dict(tensors={"d2t": d2t.reshape(2, -1)}), ("tensor d2t",)),
        ("d2t-short", "draft", "d2t", dict(tensors={"d2t": d2t[:-1]}), ("output.weight", "d2t")),
        ("d2t-longer-than-vocab", "draft", "d2t", dict(tensors={"d2t": np.arange(n_vocab + 2, dtype=np.int64)}),
         ("tensor d2t",)),
        ("d2t-no-head", "draft", "d2t", dict(tensors={"output.weight": None}), ("output.weight",)),
        ("fc-width", "draft", "draft", dict(tensors={"fc.weight": fc[:, : fc.shape[1] - 64]}), ("fc.weight",)),
        ("fc-layers", "draft", "draft", dict(set_keys={"dflash.target_layers": ([1, 2], ARRT, I32T)}), ("fc.weight",)),
        ("attn-q-rows", "draft", "draft", dict(tensors={"blk.0.attn_q.weight": arr("draft", "blk.0.attn_q.weight")[:-8]}),
         ("attn_q",)),
        ("attn-heads", "draft", "draft", dict(set_keys={"dflash.attention.head_count": (4, U32T)}), ("attn_q", "attn_o")),
        ("ffn-length", "draft", "draft", dict(set_keys={"dflash.feed_forward_length": (96, U32T)}), ("ffn_gate",)),
        ("ffn-down", "draft", "draft", dict(tensors={"blk.0.ffn_down.weight": arr("draft", "blk.0.ffn_down.weight")[:, :-1]}),
         ("ffn_down",)),
        ("norm-length", "draft", "draft", dict(tensors={"output_norm.weight": np.ones(63, np.float32)}),
         ("output_norm",)),
        ("markov-w1", "draft", "dspark", dict(tensors={"markov_w1.weight": arr("dspark", "markov_w1.weight")[:-1]}),
         ("markov_w1",)),
        ("markov-w2", "draft", "dspark", dict(tensors={"markov_w2.weight": arr("dspark", "markov_w2.weight")[:, :-1]}),
         ("markov_w2",)),
        ("conf-proj", "draft", "dspark", dict(tensors={"conf_proj.weight": arr("dspark", "conf_proj.weight")[:, :-1]}),
         ("conf_proj",)),
        ("dspark-no-block", "draft", "dspark", dict(drop_keys=["dflash.block_size"]), ("dflash.block_size",)),
        ("layer-eq-n-layer", "draft", "draft", dict(set_keys={"dflash.target_layers": ([1, 2, 4], ARRT, I32T)}),
         ("dflash.target_layers",)),
        ("target-nextn", "target", "target", dict(set_keys={"llama.nextn_predict_layers": (2, U32T)}),
         ("dflash.target_layers",)),
        ("target-gemma3n", "target", "target", dict(arch="gemma3n"), ("general.architecture",)),
        ("target-hunyuan-moe", "target", "target", dict(arch="hunyuan-moe"), ("general.architecture",)),
        ("target-qwen4exp-hc", "target", "target",
         dict(arch="qwen4exp", set_keys={"qwen4exp.hyper_connection.count": (4, U32T)}),
         ("qwen4exp.hyper_connection.count",)),
        ("target-embd-rows", "target", "target",
         dict(tensors={"token_embd.weight": arr("target", "token_embd.weight")[:-1]}), ("token_embd",)),
        ("target-output-rows", "target", "target",
         dict(tensors={"output.weight": arr("target", "output.weight")[:-1]}), ("output.weight",)),
        ("target-dup-token", "target", "target", dict(set_keys={"tokenizer.ggml.tokens": (
            [b"<unk>", b"<unk>"] + [bytes(p) for p in _tokens(fixtures["target"])[2:]], ARRT, GGUFValueType.STRING)}),
         ("tokenizer.ggml.tokens[1]",)),
        ("target-int-weight", "target", "target", dict(
            tensors={"blk.0.attn_q.weight": arr("target", "blk.0.attn_q.weight").astype(np.int32)}), ("attn_q",)),
        ("target-int-norm", "target", "target", dict(tensors={"output_norm.weight": np.ones(64, np.int32)}),
         ("output_norm",)),
    ]
    cases = []
    for name, role, src, kw, fields in specs:
        dst = os.path.join(tmp, f"sem-{name}.gguf")
        cases.append(Case(f"{role}-sem-{name}", role, rewrite(fixtures[src], dst, **kw), fields))
    return cases


def _tokens(path: str) -> list[bytes]:
    from gguf import GGUFReader

    f = GGUFReader(path, "r").fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]) for i in f.data]


def corpus(fixtures: dict[str, str], tmp: str, *, seed: int = 1234, n_trunc: int = 40, n_flips: int = 24) -> list[Case]:
    """The whole corpus, deterministic for a seed."""
    rng = random.Random(seed)
    cases: list[Case] = []
    n_vocab = len(_tokens(fixtures["target"]))
    for role, key in (("target", "target"), ("draft", "draft"), ("draft", "d2t")):
        with open(fixtures[key], "rb") as fh:
            lay = parse(fh.read())
        tag = role if key != "d2t" else "d2t"
        cases += [replace(c, name=c.name.replace(role, tag, 1)) for c in truncations(lay, role, n_trunc, rng)]
        cases += [replace(c, name=c.name.replace(role, tag, 1)) for c in bit_flips(lay, role, n_flips, rng)]
        if key == "d2t":
            continue
        cases += key_mutations(lay, role, DRAFT_KEYS if role == "draft" else TARGET_KEYS, n_vocab)
        cases += count_mutations(lay, role)
        cases += structure_mutations(lay, role)
    cases += semantic_mutations(fixtures, tmp)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases
