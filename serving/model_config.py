"""What roofline attribution needs from a model's Hugging Face config.json:
how many bytes of weights one decode step reads (once, for the whole batch)
and how many bytes of KV cache one token of context occupies."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def roofline_bytes(config: dict) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) of a decoder-only transformer
    described by `config` (Llama-style field names)."""
    dtype = DTYPE_BYTES.get(str(config.get("torch_dtype", "bfloat16")), 2)
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate = int(config.get("intermediate_size", 4 * hidden))
    vocab = int(config["vocab_size"])

    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    attention += heads * head_dim * hidden  # output projection
    mlp = 3 * hidden * intermediate  # gate, up, down
    per_layer = attention + mlp + 2 * hidden  # plus the two norms
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    parameters = layers * per_layer + embeddings + hidden
    kv_per_token = 2 * layers * kv_heads * head_dim * dtype
    return parameters * dtype, kv_per_token


# What a token computed (a decoding sequence's one token a step, or a prompt
# token in prefill) costs, as a share of one whole read of the weights: its
# 2 FLOPs a parameter at the GPU's matrix rate against the weights streamed
# at its memory bandwidth. Measured on an H200 with bench/device_steps.py
# (docs/benchmarks.md, "GPU step time"): 2.0e-3 from the decode fit's
# per-sequence term, 5.2e-3 from the prefill's slope; the spec sheets give
# 3.4e-3 (H100 SXM: 3.35 TB/s, 989 dense bf16 TFLOP/s) and 4.9e-3 (H200).
COMPUTE_PER_TOKEN = 3.5e-3
