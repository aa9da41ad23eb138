"""Files for the exit-safety tests: tiny targets, random drafts and LoRA adapters."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from llama_dflash.tiny_qwen3next import write_tiny_qwen3next
from llama_dflash.writer import write_random_draft, write_tiny_target

TARGETS = ("llama", "qwen3next")


def write_lora(path: str, target_path: str, *, layers: Sequence[str] = ("attn_output", "ffn_up"),
               rank: int = 4, seed: int = 0) -> str:
    """A LoRA adapter GGUF for a target: a random low-rank update of every 2-D tensor
    ``blk.N.<name>.weight`` of the target whose <name> is in `layers`.

    llama.cpp wants general.type "adapter", adapter.type "lora", the target's architecture, and
    per weight W (ggml shape {n_in, n_out}) a pair ``W.lora_a`` {n_in, rank}, ``W.lora_b`` {rank, n_out}.
    """
    import gguf

    reader = gguf.GGUFReader(target_path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    n = 0
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in layers or len(t.shape) != 2:
            continue
        n_in, n_out = (int(x) for x in t.shape)  # ggml order
        w.add_tensor(t.name + ".lora_a", (rng.standard_normal((rank, n_in)) * 0.1).astype(np.float32))
        w.add_tensor(t.name + ".lora_b", (rng.standard_normal((n_out, rank)) * 0.1).astype(np.float32))
        n += 1
    if not n:
        raise ValueError(f"{target_path} has no 2-D tensor among {layers}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_fixtures(directory: str) -> str:
    """<target>.gguf, <target>.draft.gguf and <target>.lora.gguf for every name in TARGETS."""
    for name in TARGETS:
        target = os.path.join(directory, f"{name}.gguf")
        if name == "llama":
            write_tiny_target(target, seed=1)
        else:
            write_tiny_qwen3next(target, seed=1)
        write_random_draft(os.path.join(directory, f"{name}.draft.gguf"), target, block_size=8, seed=2)
        write_lora(os.path.join(directory, f"{name}.lora.gguf"), target)
    return directory
