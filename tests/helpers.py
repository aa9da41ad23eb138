"""Test helpers: rewrite a GGUF with some keys changed or dropped (to make broken drafts)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np


def rewrite_gguf(
    src: str,
    dst: str,
    *,
    drop_keys: Iterable[str] = (),
    set_keys: Mapping[str, Any] = {},
    drop_tensors: Iterable[str] = (),
    arch: str | None = None,
) -> str:
    """Copy src to dst, dropping/overriding metadata keys. Values in set_keys: (value, GGUFValueType[, sub])."""
    import gguf
    from gguf import GGUFReader, GGUFValueType

    drop_keys, drop_tensors = set(drop_keys), set(drop_tensors)
    r = GGUFReader(src, "r")
    old_arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    new_arch = arch or old_arch
    w = gguf.GGUFWriter(dst, new_arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys or name in set_keys:
            continue
        out_name = name.replace(f"{old_arch}.", f"{new_arch}.", 1) if name.startswith(f"{old_arch}.") else name
        t = list(f.types)
        if t[0] == GGUFValueType.ARRAY:
            if t[1] == GGUFValueType.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(out_name, val, GGUFValueType.ARRAY, sub_type=t[1])
        elif t[0] == GGUFValueType.STRING:
            w.add_key_value(out_name, bytes(f.parts[f.data[0]]), GGUFValueType.STRING)
        else:
            w.add_key_value(out_name, f.parts[f.data[0]][0].item(), t[0])
    for name, spec in set_keys.items():
        value, vtype, *sub = spec
        w.add_key_value(name, value, vtype, sub_type=sub[0] if sub else None)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w.add_tensor(t.name, data.reshape(shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
