"""``actfirst.core.files``: atomic writes, and values JSON can hold."""

import json
import math
import os
import random

from actfirst.core.files import json_safe, write_atomically


def test_json_safe_turns_every_nan_and_infinity_into_null_at_any_depth():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    bad = [math.nan, math.inf, -math.inf]

    def value(depth):
        kind = rng.randrange(6 if depth < 4 else 3)
        if kind == 0:
            return rng.choice(bad)
        if kind == 1:
            return rng.uniform(-1e6, 1e6)
        if kind == 2:
            return rng.choice([0, 7, "x", None, True])
        if kind == 3:
            return {f"k{i}": value(depth + 1) for i in range(rng.randrange(4))}
        return (list if kind == 4 else tuple)(value(depth + 1) for _ in range(rng.randrange(4)))

    def expected(v):  # json's own reading: NaN, Infinity and -Infinity as null, tuples as lists
        return json.loads(json.dumps(v), parse_constant=lambda _: None)

    for _ in range(200):
        v = value(0)
        safe = json_safe(v)
        assert safe == expected(v)
        assert json.loads(json.dumps(safe, allow_nan=False)) == safe  # strict JSON, read back as written
    assert json_safe({"a": [1.5, math.nan, {"b": (math.inf,)}]}) == {"a": [1.5, None, {"b": [None]}]}


def test_write_atomically_leaves_no_temporary_file(tmp_path):
    path = write_atomically(tmp_path / "out.json", "one")
    write_atomically(path, "two")
    assert path.read_text() == "two" and os.listdir(tmp_path) == ["out.json"]
