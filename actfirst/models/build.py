"""Small Qwen3-architecture models built from a config and saved as ordinary Hugging Face directories (the command
line: ``python -m actfirst.models.factory``).

No weights can be downloaded here, so tests, the CPU demo and the CPU benchmark use models made by
:func:`build_model` (config, ``model.safetensors``, tokenizer files, chat template); ``python -m
actfirst.models.factory`` builds one from the command line.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from actfirst.core.config import ModelConfig
from actfirst.envs.benchmarks import BENCHMARKS
from actfirst.models.tokenizers import QWEN3_PADDED_VOCAB, build_qwen3_tokenizer, train_env_bpe_tokenizer


def environment_corpus() -> list[str]:
    """Environment text of every registered benchmark (``Benchmark.environment_text``: what its simulator's package
    ships and the prompt lines every request carries), in name order.

    Used to train the small ``env-bpe`` tokenizer; it needs no download.
    """
    texts = [text for name in sorted(BENCHMARKS) for text in BENCHMARKS[name].environment_text()]
    return texts * 4  # repeat so that frequent scaffolding merges rank high


@functools.lru_cache(maxsize=4)
def _tokenizer(kind: str, env_bpe_vocab_size: int) -> PreTrainedTokenizerFast:
    if kind == "qwen3":
        return build_qwen3_tokenizer()
    return train_env_bpe_tokenizer(environment_corpus(), vocab_size=env_bpe_vocab_size)


def build_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerFast:
    """The tokenizer ``cfg`` names (built once per process and kind)."""
    return _tokenizer(cfg.tokenizer, cfg.env_bpe_vocab_size)


def qwen3_config(cfg: ModelConfig, vocab_size: int) -> Qwen3Config:
    """A Qwen3Config of the sizes in ``cfg``."""
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )


def build_model(cfg: ModelConfig, out: str | Path, tokenizer: PreTrainedTokenizerFast | None = None) -> Path:
    """Build a randomly initialized Qwen3-architecture model and save it, with its tokenizer, to ``out``.

    ``tokenizer``: use this one (e.g. one trained on a task's own text, shared by a teacher and its student)
    instead of the one ``cfg.tokenizer`` names."""
    tok = tokenizer if tokenizer is not None else build_tokenizer(cfg)
    # Qwen3 pads its embedding to 151,936 rows; the small tokenizer pads to a multiple of 64.
    vocab_size = QWEN3_PADDED_VOCAB if tokenizer is None and cfg.tokenizer == "qwen3" else -(-len(tok) // 64) * 64
    hf_cfg = qwen3_config(cfg, vocab_size)
    hf_cfg.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    hf_cfg.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    hf_cfg.bos_token_id = None
    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(hf_cfg).eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "actfirst_model.json").write_text(json.dumps({"model_config": _plain(cfg)}, indent=2))
    return out


def _plain(cfg: ModelConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__slots__}
