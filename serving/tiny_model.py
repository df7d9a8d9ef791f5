"""The project's own tiny Llama, for development, tests, the demo and the
benchmarks: vLLM serves it with `--load-format dummy` (random weights), so
only its config and tokenizer exist, written here byte for byte the same
every time. No model hub is needed.

The tokenizer is byte-level BPE with no merges: every UTF-8 byte is one
token (GPT-2's byte-to-unicode table), plus three special tokens. Token
counts are therefore easy to predict in tests: a prompt of N ASCII
characters is N tokens plus the chat template's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

MODEL_NAME = "tiny-llama"
# The same weights served as an embedding model (vLLM's pooling runner,
# `--runner pooling --convert embed`): 256-dimension vectors, one per input.
EMBEDDING_MODEL_NAME = "tiny-embed"
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
BOS, EOS, PAD = range(256, 259)
VOCAB_SIZE = 320  # 256 bytes + specials, padded to a multiple of 64

MAX_POSITIONS = 4096


@dataclass(frozen=True)
class Shape:
    """A Llama's size; every shape shares the byte-level tokenizer."""

    hidden: int
    layers: int
    intermediate: int
    heads: int  # head_dim hidden / heads = 64: vLLM's CPU attention kernel rejects 16
    kv_heads: int
    # The weights' type. bfloat16 unless the CPU computes it natively: where
    # it has no AVX-512 BF16 (or AMX), vLLM-CPU emulates bf16 and every step
    # is bound by that arithmetic, not by streaming the weights.
    dtype: str = "bfloat16"


TINY = Shape(hidden=256, layers=2, intermediate=512, heads=4, kv_heads=2)
# Memory-bound on a CPU core, as a GPU is: one decode step streams weights of
# hundreds of MB (bench/step_curve.py measured the step against the batch).
MEMORY_BOUND = {
    "mem-llama-60m": Shape(hidden=768, layers=8, intermediate=3072, heads=12, kv_heads=4),
    "mem-llama-120m": Shape(hidden=1024, layers=8, intermediate=4096, heads=16, kv_heads=4),
    "mem-llama-240m": Shape(hidden=1024, layers=16, intermediate=4096, heads=16, kv_heads=4),
}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<{{ message['role'] }}>{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def cpu_dtype() -> str:
    """bfloat16 where this CPU computes it natively (AVX-512 BF16 or AMX),
    else float32: emulated bf16 makes every step compute-bound."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "bfloat16"
    native = re.search(r"\b(avx512_bf16|amx_bf16)\b", flags)
    return "bfloat16" if native else "float32"


def model_config(shape: Shape = TINY) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads,
        "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": shape.dtype,
    }


def tokenizer_json() -> dict:
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    added = []
    for index, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + index
        added.append(
            {
                "id": 256 + index,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "pad_token": SPECIAL_TOKENS[2],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}


def tiny_model_write(*, directory: Path, shape: Shape = TINY) -> Path:
    """Write the model folder (idempotent; files only rewritten if changed)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": model_config(shape),
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(),
        "special_tokens_map.json": {
            "bos_token": SPECIAL_TOKENS[0],
            "eos_token": SPECIAL_TOKENS[1],
            "pad_token": SPECIAL_TOKENS[2],
        },
        "generation_config.json": generation_config(),
    }
    for name, content in files.items():
        text = json.dumps(content, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return directory
