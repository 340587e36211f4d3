"""The order the test files run in: the longest first, by the seconds ``tests/file_durations.json`` holds, so that
pytest-xdist's workers, each taking whole files in collection order (``scripts/test.sh``: ``--dist loadfile
--no-loadscope-reorder``), end together instead of starting the longest files last (xdist's own reordering puts the
files with the most tests first, and the whole-run files hold few). ``tests/conftest.py`` applies it and records the
seconds (``--record-file-durations PATH``)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from actfirst.core.files import write_atomically

FILE_DURATIONS = Path(__file__).with_name("file_durations.json")


def recorded_seconds(path: Path | None = None) -> dict[str, float]:
    """Seconds per test file (its path from the repository root), as recorded; none where the file is absent."""
    path = FILE_DURATIONS if path is None else path
    return json.loads(path.read_text())["seconds"] if path.exists() else {}


def file_of(nodeid: str) -> str:
    """The file part of a pytest node id (``tests/x.py::test_y[z]`` -> ``tests/x.py``)."""
    return nodeid.split("::")[0]


def order_longest_first(items: list[Any], seconds: dict[str, float]) -> None:
    """Sorts ``items`` in place: files with more recorded seconds first, a file not recorded after them; a file's
    own tests, and files of equal seconds, keep their collection order."""
    items.sort(key=lambda item: -seconds.get(file_of(item.nodeid), 0.0))


class FileDurationRecorder:
    """A pytest plugin: sums each file's report durations (setup, call, teardown) and writes them to ``path``,
    longest first, when the session ends (``write_atomically``)."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: Any) -> None:
        ranked = dict(sorted(((f, round(s, 1)) for f, s in self.seconds.items()), key=lambda kv: -kv[1]))
        write_atomically(self.path, json.dumps({"total_s": round(sum(ranked.values()), 1), "seconds": ranked},
                                               indent=1) + "\n")
