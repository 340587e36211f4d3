"""Preparation on every rank, without an engine: the journals a killed preparation resumes from
(``actfirst.core.journal``) and the command line's refusals. The rollouts on real engines and simulators:
tests/test_teacher_rollouts.py."""

import json

import pytest

from actfirst.core.journal import Journal, format_eta, journal_path, journal_paths, read_journals, remove_journals
from actfirst.prepare import main as prepare_main


def test_journals_of_every_rank_are_read_and_a_cut_line_is_skipped_then_cut_off(tmp_path):
    out = tmp_path / "sub" / "refs.jsonl"
    with Journal(out, 0) as zero, Journal(out, 2) as two:
        zero.append(json.dumps({"task": "a", "candidates": [["x"]]}))
        two.append(json.dumps({"task": "b", "candidates": []}))
        zero.append(json.dumps({"task": "c", "candidates": [["y", "z"]]}))
    (tmp_path / "sub" / "refs.jsonl.partial.x").write_text('{"task": "not a journal"}\n')
    with journal_path(out, 2).open("a") as f:
        f.write('{"task": "d", "candi')  # a write cut by a kill
    assert journal_paths(out) == [journal_path(out, 0), journal_path(out, 2)]
    assert {k: json.loads(v)["candidates"] for k, v in read_journals(out).items()} == {
        "a": [["x"]], "c": [["y", "z"]], "b": []}
    with Journal(out, 2) as two:  # the next append on that rank cuts the torn line off first
        two.append(json.dumps({"task": "d", "candidates": [["w"]]}))
    assert journal_path(out, 2).read_text().splitlines() == ['{"task": "b", "candidates": []}',
                                                             '{"task": "d", "candidates": [["w"]]}']
    with pytest.raises(ValueError, match="newline"), Journal(out, 1) as one:
        one.append('{"task": "e"}\n{"task": "f"}')
    remove_journals(out)
    assert journal_paths(out) == [] and read_journals(out) == {}


def test_format_eta():
    assert [format_eta(s) for s in (0, 12.4, 61, 3599, 3600, 3 * 86400 + 125)] == [
        "0s", "12s", "1m01s", "59m59s", "1h00m", "72h02m"]


def test_prepare_refuses_no_ranks(capsys):
    assert prepare_main(["--nproc-per-node", "0"]) == 2
    assert "--nproc-per-node=0: must be >= 1" in capsys.readouterr().err


def test_prepare_under_torchrun_without_a_stage_is_refused(monkeypatch, capsys):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "localhost"),
                        ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    assert prepare_main([]) == 2
    assert "starts its own ranks (--nproc-per-node); run it without torchrun" in capsys.readouterr().err
