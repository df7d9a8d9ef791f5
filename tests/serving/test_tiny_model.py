"""The tiny Llama is written the same every time, with a head_dim vLLM's CPU
attention kernel accepts and a byte-level vocabulary."""

import json

from serving.tiny_model import BOS, EOS, tiny_model_write


def test_written_byte_for_byte_the_same(tmp_path):
    first = tiny_model_write(directory=tmp_path / "a")
    second = tiny_model_write(directory=tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_config_and_vocabulary(tmp_path):
    directory = tiny_model_write(directory=tmp_path)
    config = json.loads((directory / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] >= 64
    assert (config["bos_token_id"], config["eos_token_id"]) == (BOS, EOS)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values())[:256] == list(range(256))  # one token per byte
    assert max(vocab.values()) < config["vocab_size"]
    template = json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]
    assert "add_generation_prompt" in template
