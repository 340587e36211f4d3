"""Model factory and the two offline tokenizers."""

import json

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from actfirst.models.tokenizers import build_qwen3_tokenizer


def test_qwen3_tokenizer_has_qwen3_ids():
    tok = build_qwen3_tokenizer()
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151643, 151644, 151645, 151667, 151668]
    assert len(tok) == 151669  # 151,643 BPE ranks + 26 Qwen3 added tokens; <action> is plain text, as in Qwen3
    assert "<action>" not in tok.get_vocab() and len(tok("<action>")["input_ids"]) > 1
    # Qwen's pre-tokenizer splits digits one by one.
    assert tok.tokenize(" 2024") == ["Ġ", "2", "0", "2", "4"]


def test_model_dir_roundtrip_and_chat_template(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = [{"role": "user", "content": "go to <think>hmm</think> <action>open fridge 1</action>"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    text = tok.decode(ids, skip_special_tokens=True)
    # The reasoning and action delimiters survive decoding with special tokens skipped.
    assert "<think>hmm</think>" in text and "<action>open fridge 1</action>" in text
    assert tok.decode(ids).startswith("<|im_start|>user\n") and tok.decode(ids).endswith("<|im_start|>assistant\n")
    for t in ("<think>", "</think>", "<action>", "</action>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    meta = json.loads((tiny_model_dir / "actfirst_model.json").read_text())
    assert meta["model_config"]["hidden_size"] == model.config.hidden_size == 64
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits
    assert out.shape == (1, len(ids), model.config.vocab_size) and torch.isfinite(out).all()


def test_qwen3_sized_model_builds(tmp_path):
    from actfirst.core.config import ModelConfig
    from actfirst.models.build import build_model

    cfg = ModelConfig(tokenizer="qwen3", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64)
    path = build_model(cfg, tmp_path / "q")
    model = Qwen3ForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == 151936
    assert AutoTokenizer.from_pretrained(path)("Hello world")["input_ids"] == [9707, 1879]
