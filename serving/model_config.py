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
