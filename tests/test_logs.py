"""ActFirst's logging (actfirst.core.logs): the console per rank, every rank's file, and a progress bar kept whole."""

import io
import logging
import sys

import pytest
from tqdm import tqdm

from actfirst.core.logs import current_log_dir, log_file, setup_logging

log = logging.getLogger("actfirst.test_logs")


@pytest.fixture(autouse=True)
def _console_only():
    yield
    setup_logging()  # closes a test's file handler; the console as every command sets it


def shown(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: ``\\r`` returns to the start of the line, later characters overwrite
    earlier ones."""
    lines, line, col = [], [], 0
    for ch in text:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            line[col:col + 1] = [ch]
            col += 1
    return lines + (["".join(line).rstrip()] if line else [])


def test_a_logged_line_does_not_break_the_progress_bar(monkeypatch):
    """stdout and stderr on one terminal, the bar on stderr (as the trainer's): each line stands on its own, the bar
    is drawn again below it (a plain stream handler would glue the line to the bar's ``\\r`` line)."""
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    setup_logging(rank=0)
    bar = tqdm(total=3, desc="updates", file=sys.stderr)
    log.info("update 1: loss 0.5")
    bar.update(1)
    log.warning("an episode failed")
    bar.close()
    lines = shown(terminal.getvalue())
    assert lines[:2] == ["update 1: loss 0.5", "an episode failed"], lines
    assert lines[2].startswith("updates:  33%") and "1/3" in lines[2], lines


def test_rank_0_shows_info_the_others_warnings_and_every_rank_has_its_file(tmp_path, capsys):
    logs = tmp_path / "run" / "logs"
    for rank in (0, 1):
        setup_logging(logs, rank=rank)
        assert (tmp_path / "run").exists() == (rank == 1)  # made at the first line, not before
        log.info(f"progress of rank {rank}")
        log.warning(f"trouble on rank {rank}")
        logging.getLogger("some_library").info("a library's chatter")
        logging.getLogger("some_library").warning("a library's warning")
        console = capsys.readouterr()
        assert console.out == ("progress of rank 0\n" if rank == 0 else "")
        assert console.err == f"trouble on rank {rank}\nWARNING some_library: a library's warning\n"
        text = log_file(logs, rank).read_text()
        assert f"INFO actfirst.test_logs: progress of rank {rank}\n" in text
        assert f"WARNING actfirst.test_logs: trouble on rank {rank}\n" in text
        assert "a library's warning" in text and "chatter" not in text
        assert current_log_dir() == logs
    assert sorted(p.name for p in logs.iterdir()) == ["actfirst_rank0.log", "actfirst_rank1.log"]


def test_setting_up_again_replaces_the_handlers(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    setup_logging(tmp_path)
    setup_logging()
    setup_logging()
    log.info("once")
    assert capsys.readouterr().out == "once\n" and current_log_dir() is None
    assert not log_file(tmp_path, 0).exists()
    monkeypatch.setenv("RANK", "3")  # torchrun's rank when none is given
    setup_logging(tmp_path)
    log.info("rank 3's progress")
    assert capsys.readouterr().out == "" and "rank 3's progress" in log_file(tmp_path, 3).read_text()
