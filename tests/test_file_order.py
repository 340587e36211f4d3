"""The order the test files run in (tests/file_order.py, applied by tests/conftest.py): the longest first by
tests/file_durations.json, so that pytest-xdist's workers end together; and the recorder that measures them."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

from file_order import FILE_DURATIONS, FileDurationRecorder, file_of, order_longest_first, recorded_seconds

ROOT = Path(__file__).resolve().parents[1]


def test_the_recorded_files_exist_longest_first_and_cover_the_suite():
    seconds = recorded_seconds()
    missing = [f for f in seconds if not (ROOT / f).is_file()]
    assert not missing, f"{FILE_DURATIONS} names files that are gone (record it again): {missing}"
    assert list(seconds.values()) == sorted(seconds.values(), reverse=True)
    suite = [p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")]
    unrecorded = sorted(set(suite) - set(seconds))
    assert len(unrecorded) <= 0.1 * len(suite), f"not in {FILE_DURATIONS.name} (record it again): {unrecorded}"


def test_items_go_longest_file_first_each_file_in_its_order(tmp_path):
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    files = [f"tests/f{i}.py" for i in range(6)]
    seconds = {f: rng.uniform(0, 100) for f in files[:4]}  # the last two files unrecorded
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"seconds": seconds}))
    items = [SimpleNamespace(nodeid=f"{f}::test_{k}[{rng.random()}]") for f in files for k in range(rng.randint(1, 4))]
    ordered = list(items)
    order_longest_first(ordered, recorded_seconds(path))

    runs = [file_of(it.nodeid) for i, it in enumerate(ordered) if i == 0 or file_of(ordered[i - 1].nodeid) !=
            file_of(it.nodeid)]
    assert runs == sorted(files[:4], key=lambda f: -seconds[f]) + files[4:]  # the unrecorded after, as collected
    for f in files:
        assert [it for it in ordered if file_of(it.nodeid) == f] == [it for it in items if file_of(it.nodeid) == f]
    assert recorded_seconds(tmp_path / "absent.json") == {}  # no record: collection order


def test_the_recorder_sums_each_files_phases_longest_first(tmp_path):
    path = tmp_path / "out" / "durations.json"
    path.parent.mkdir()
    recorder = FileDurationRecorder(path)
    reports = [("tests/a.py::t1", 1.25), ("tests/b.py::t1", 4.0), ("tests/a.py::t1", 0.5), ("tests/a.py::t2", 3.0),
               ("tests/c/d.py::t[x::1]", 0.04)]
    for nodeid, duration in reports:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.pytest_sessionfinish(None)
    written = json.loads(path.read_text())
    assert written["seconds"] == {"tests/a.py": 4.8, "tests/b.py": 4.0, "tests/c/d.py": 0.0}
    assert list(written["seconds"]) == ["tests/a.py", "tests/b.py", "tests/c/d.py"]
    assert written["total_s"] == 8.8
    assert [p.name for p in path.parent.iterdir()] == ["durations.json"]  # written whole: no temporary file left
