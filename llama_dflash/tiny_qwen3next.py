"""A tiny random `qwen3next` GGUF for tests: a hybrid target without native partial rollback.

The layout follows what llama.cpp's qwen3next loader asks for: gated-delta-net (linear
attention) layers with the fused qkv/gate projections, gated full-attention layers with q/k
norms, and a mixture-of-experts FFN with a sigmoid-gated shared expert in every layer.  Every
`full_attention_interval`-th layer (1-based) is a full-attention layer, the others recurrent.
All tensors are F32; the tokenizer is the same tiny SPM vocabulary as `write_tiny_target`.
"""

from __future__ import annotations

import numpy as np

from .writer import add_tiny_tokenizer, tiny_vocab

__all__ = ["write_tiny_qwen3next", "recurrent_layers"]

#: Every this-many-th layer (1-based) is a full-attention layer.
FULL_ATTENTION_INTERVAL = 2


def recurrent_layers(n_layer: int, interval: int = FULL_ATTENTION_INTERVAL) -> list[int]:
    """Layer ids that are gated-delta-net layers for a given full-attention interval."""
    return [i for i in range(n_layer) if (i + 1) % interval != 0]


def write_tiny_qwen3next(
    path: str,
    *,
    n_embd: int = 64,
    n_layer: int = 4,
    seed: int = 0,
    context_length: int = 2048,
) -> str:
    """Write a random hybrid qwen3next model to `path` and return the path.

    Shapes (for n_embd = 64): attention layers with 4 query heads and 2 kv heads of n_embd/4;
    delta-net layers with 2 key heads and 4 value heads of state size n_embd/4 (d_inner =
    n_embd), a 4-wide causal convolution; 4 experts of width n_embd/2, 2 used per token, plus
    a shared expert of width n_embd/2.  n_embd must be a multiple of 8 and n_layer at least 2
    (layers 0, 2, ... are recurrent, 1, 3, ... full attention).
    """
    import gguf

    if n_embd <= 0 or n_embd % 8:
        raise ValueError(f"n_embd must be a positive multiple of 8, not {n_embd}")
    if n_layer < FULL_ATTENTION_INTERVAL:
        # without a full-attention layer the KV cache has no buffer and llama.cpp aborts
        raise ValueError(f"n_layer must be at least {FULL_ATTENTION_INTERVAL} (one attention layer), not {n_layer}")

    rng = np.random.default_rng(seed)
    n_vocab = len(tiny_vocab()[0])

    # full attention
    n_head, n_head_kv = 4, 2
    hd = n_embd // n_head
    # gated delta net: head_k_dim == head_v_dim == state size
    d_state = n_embd // 4
    n_k_heads = 2  # ssm.group_count
    n_v_heads = 4  # ssm.time_step_rank
    d_inner = d_state * n_v_heads
    d_conv = 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    # MoE
    n_expert, n_expert_used = 4, 2
    n_ff_exp = n_ff_shexp = n_embd // 2

    recurrent = set(recurrent_layers(n_layer))

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        """A [rows, cols] (numpy order; llama.cpp sees {cols, rows}) matrix with unit-ish gain."""
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    arch = "qwen3next"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-{arch}-{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_shared_feed_forward_length(n_ff_shexp)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)
    w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_tokenizer(w)  # the same tokenizer as write_tiny_target

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd, 4.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(n_embd))
        w.add_tensor(p + "post_attention_norm.weight", ones(n_embd))
        if i in recurrent:
            w.add_tensor(p + "attn_qkv.weight", mat(conv_dim, n_embd))
            w.add_tensor(p + "attn_gate.weight", mat(value_dim, n_embd))
            w.add_tensor(p + "ssm_conv1d.weight", mat(conv_dim, d_conv))
            w.add_tensor(p + "ssm_dt.bias", (rng.standard_normal(n_v_heads) * 0.5).astype(np.float32))
            # -exp(A_log): negative decay rates
            w.add_tensor(p + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, n_v_heads))).astype(np.float32))
            w.add_tensor(p + "ssm_ba.weight", mat(2 * n_v_heads, n_embd))
            w.add_tensor(p + "ssm_norm.weight", ones(d_state))
            w.add_tensor(p + "ssm_out.weight", mat(n_embd, value_dim))
        else:
            # the query projection carries the output gate: 2 * head_dim per head
            w.add_tensor(p + "attn_q.weight", mat(2 * n_head * hd, n_embd))
            w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
            w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
            w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
            w.add_tensor(p + "attn_q_norm.weight", ones(hd))
            w.add_tensor(p + "attn_k_norm.weight", ones(hd))
        w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
        w.add_tensor(p + "ffn_gate_exps.weight",
                     (rng.standard_normal((n_expert, n_ff_exp, n_embd)) / np.sqrt(n_embd)).astype(np.float32))
        w.add_tensor(p + "ffn_up_exps.weight",
                     (rng.standard_normal((n_expert, n_ff_exp, n_embd)) / np.sqrt(n_embd)).astype(np.float32))
        w.add_tensor(p + "ffn_down_exps.weight",
                     (rng.standard_normal((n_expert, n_embd, n_ff_exp)) / np.sqrt(n_ff_exp)).astype(np.float32))
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", mat(1, n_embd).reshape(n_embd))
        w.add_tensor(p + "ffn_gate_shexp.weight", mat(n_ff_shexp, n_embd))
        w.add_tensor(p + "ffn_up_shexp.weight", mat(n_ff_shexp, n_embd))
        w.add_tensor(p + "ffn_down_shexp.weight", mat(n_embd, n_ff_shexp))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
