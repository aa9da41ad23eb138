"""Hugging Face checkpoints of an EAGLE-3 head and of a small llama, written from GGUF fixtures, for
llama.cpp's own converter (`convert_hf_to_gguf.py`, tests/hf_converter.py).

The layouts are the ones the converter reads (vendor/llama.cpp/conversion/llama.py):

* EAGLE-3 (as published, e.g. `LlamaForCausalLMEagle3`): `config.json` with `draft_vocab_size`,
  one hidden layer and `eagle_aux_hidden_state_layer_ids`; tensors `fc.weight`, `midlayer.*`
  (`hidden_norm`, `input_layernorm`, `self_attn.{q,k,v,o}_proj`, `post_attention_layernorm`,
  `mlp.{gate,up,down}_proj`), `norm.weight`, `lm_head.weight` over the draft vocabulary and `d2t`
  (draft row -> target id, stored as the offset from the row) with `t2d`;
* a llama (`LlamaForCausalLM`): `model.embed_tokens`, `model.layers.N.*`, `model.norm`,
  `lm_head`, with the target's tokenizer (`llama_dflash.train.hf_target.write_target_dir`).

Query and key projections are stored in Hugging Face's rotate-half order: the converter permutes
them back to llama.cpp's, so a checkpoint written here converts to the GGUF it was written from.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np


def gguf_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, numpy layout (rows = output features)."""
    from gguf import GGUFReader

    return {t.name: np.array(t.data) for t in GGUFReader(path, "r").tensors}


def gguf_value(path: str, key: str):
    from gguf import GGUFReader

    return GGUFReader(path, "r").fields[key].contents()


def hf_order(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order -> Hugging Face's (the inverse of the converter's permute)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _save(out_dir: str, tensors: dict[str, np.ndarray], config: dict) -> str:
    import torch
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
              os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return out_dir


def write_target_dir_for(target_gguf: str, out_dir: str) -> str:
    """`write_target_dir` plus the target's depth and width, which the EAGLE-3 converter reads."""
    from llama_dflash.train.hf_target import write_target_dir

    write_target_dir(target_gguf, out_dir)
    arch = gguf_value(target_gguf, "general.architecture")
    path = os.path.join(out_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = int(gguf_value(target_gguf, f"{arch}.block_count"))
    cfg["hidden_size"] = int(gguf_value(target_gguf, f"{arch}.embedding_length"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return out_dir


def write_hf_eagle3(head_gguf: str, target_gguf: str, out_dir: str, *, keep: Optional[Sequence[int]] = None,
                    aux_layers: Optional[Sequence[int]] = None) -> str:
    """The EAGLE-3 head of `head_gguf` (a rigged one: no head of its own) in the Hugging Face layout.
    Its LM head becomes the target's rows of `keep` (default: every token), with d2t mapping them;
    `aux_layers` overrides the target layer ids written."""
    t = gguf_tensors(head_gguf)
    target = gguf_tensors(target_gguf)
    n_vocab, e = target["output.weight"].shape
    keep = np.arange(n_vocab) if keep is None else np.asarray(sorted(keep))
    n_head = int(gguf_value(head_gguf, "eagle3.attention.head_count"))
    n_kv = int(gguf_value(head_gguf, "eagle3.attention.head_count_kv"))
    layers = [int(x) for x in (aux_layers if aux_layers is not None else gguf_value(head_gguf, "eagle3.target_layers"))]
    p, m = "blk.0.", "midlayer."
    tensors = {
        "fc.weight": t["fc.weight"],
        m + "hidden_norm.weight": t[p + "attn_norm_2.weight"],
        m + "input_layernorm.weight": t[p + "attn_norm.weight"],
        m + "self_attn.q_proj.weight": hf_order(t[p + "attn_q.weight"], n_head),
        m + "self_attn.k_proj.weight": hf_order(t[p + "attn_k.weight"], n_kv),
        m + "self_attn.v_proj.weight": t[p + "attn_v.weight"],
        m + "self_attn.o_proj.weight": t[p + "attn_output.weight"],
        m + "post_attention_layernorm.weight": t[p + "ffn_norm.weight"],
        m + "mlp.gate_proj.weight": t[p + "ffn_gate.weight"],
        m + "mlp.up_proj.weight": t[p + "ffn_up.weight"],
        m + "mlp.down_proj.weight": t[p + "ffn_down.weight"],
        "norm.weight": t["output_norm.weight"],
        "lm_head.weight": target["output.weight"][keep],
        "d2t": (keep - np.arange(len(keep))).astype(np.int64),
        "t2d": np.isin(np.arange(n_vocab), keep),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": e,
        "intermediate_size": int(t[p + "ffn_gate.weight"].shape[0]), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "num_hidden_layers": 1,
        "rms_norm_eps": float(gguf_value(head_gguf, "eagle3.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf_value(head_gguf, "eagle3.rope.freq_base")),
        "max_position_embeddings": int(gguf_value(head_gguf, "eagle3.context_length")),
        "vocab_size": int(n_vocab), "draft_vocab_size": int(len(keep)), "tie_word_embeddings": False,
        "eagle_aux_hidden_state_layer_ids": layers,
        "norm_before_residual": bool(gguf_value(head_gguf, "eagle3.norm_before_residual")),
    }
    return _save(out_dir, tensors, config)


def write_hf_llama(draft_gguf: str, target_gguf: str, out_dir: str) -> str:
    """A llama GGUF (a rigged classic draft) in the Hugging Face layout, with the target's tokenizer."""
    from llama_dflash.train.hf_target import write_target_dir

    write_target_dir(target_gguf, out_dir)  # tokenizer.model (the config is replaced below)
    t = gguf_tensors(draft_gguf)
    n_layer = int(gguf_value(draft_gguf, "llama.block_count"))
    n_head = int(gguf_value(draft_gguf, "llama.attention.head_count"))
    n_kv = int(gguf_value(draft_gguf, "llama.attention.head_count_kv"))
    tensors = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
               "lm_head.weight": t["output.weight"]}
    for i in range(n_layer):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        tensors.update({
            h + "input_layernorm.weight": t[g + "attn_norm.weight"],
            h + "self_attn.q_proj.weight": hf_order(t[g + "attn_q.weight"], n_head),
            h + "self_attn.k_proj.weight": hf_order(t[g + "attn_k.weight"], n_kv),
            h + "self_attn.v_proj.weight": t[g + "attn_v.weight"],
            h + "self_attn.o_proj.weight": t[g + "attn_output.weight"],
            h + "post_attention_layernorm.weight": t[g + "ffn_norm.weight"],
            h + "mlp.gate_proj.weight": t[g + "ffn_gate.weight"],
            h + "mlp.up_proj.weight": t[g + "ffn_up.weight"],
            h + "mlp.down_proj.weight": t[g + "ffn_down.weight"],
        })
    e = int(t["token_embd.weight"].shape[1])
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": e,
        "intermediate_size": int(t["blk.0.ffn_gate.weight"].shape[0]), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "num_hidden_layers": n_layer,
        "rms_norm_eps": float(gguf_value(draft_gguf, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf_value(draft_gguf, "llama.rope.freq_base")),
        "max_position_embeddings": int(gguf_value(draft_gguf, "llama.context_length")),
        "vocab_size": int(t["token_embd.weight"].shape[0]), "tie_word_embeddings": False,
        "bos_token_id": int(gguf_value(target_gguf, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(gguf_value(target_gguf, "tokenizer.ggml.eos_token_id")),
    }
    return _save(out_dir, tensors, config)
