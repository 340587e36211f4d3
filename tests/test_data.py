"""Benchmark data: ALFWorld's real games are never replaced by generated ones (the refusal, the data folder's
order), and ``python -m actfirst.data``'s downloads (resume, verification, unpacking) against a local HTTP server."""

import gzip
import hashlib
import io
import json
import logging
import re
import shutil
import socket
import sys
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from actfirst.core.config import TrainConfig
from actfirst.core.schema import load_config
from actfirst.core.user_input import ConfigError
from actfirst.data import main
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.alfworld.data import ALFWorldData, data_dir
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.envs.search.data import SearchData
from actfirst.envs.search.env import load_questions
from actfirst.envs.webshop.data import WebShopData
from actfirst.preparation.downloads import (
    BenchmarkData,
    Download,
    DownloadError,
    Progress,
    Source,
    fetch_data,
    fetch_file,
)

ROOT = Path(__file__).parents[1]
PAPER = ROOT / "configs" / "train" / "alfworld" / "qwen3-1.7b.yaml"
FETCH = "fetch them with: python -m actfirst.data alfworld"


def alfworld_tree(root: Path) -> Path:
    """ALFWorld's download layout with one (unplayable) game per split: json_2.1.1/<split>/<task>/<trial>/."""
    for split in ("train", "valid_seen", "valid_unseen"):
        trial = root / "json_2.1.1" / split / "pick_and_place_simple-Mug-None-Shelf-1" / f"trial_{split}"
        trial.mkdir(parents=True)
        (trial / "game.tw-pddl").write_text(json.dumps({"solvable": True}))
        (trial / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    return root


@pytest.fixture
def no_alfworld_data(tmp_path, monkeypatch):
    """Neither $ALFWORLD_DATA nor ~/.cache/alfworld (HOME is an empty folder)."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- ALFWorld: real games or a refusal -----------------------------------------------------------------------------


def test_the_paper_config_without_games_is_one_line_naming_where_and_how(no_alfworld_data, paths):
    with pytest.raises(ConfigError) as refused:
        load_config(TrainConfig, PAPER, paths)
    message = str(refused.value)
    folder = no_alfworld_data / ".cache" / "alfworld" / "json_2.1.1" / "train"
    assert message.startswith(f"env.games='real': no ALFWorld games at {folder} (no such folder; the data folder "
                              f"from ALFWorld's default ~/.cache/alfworld (no data_dir nor $ALFWORLD_DATA)); {FETCH}")
    assert "\n" not in message
    # The same through the benchmark's own default config, and through a split that lacks its games.
    with pytest.raises(ConfigError, match=re.escape(f"games='real': no ALFWorld games at {folder}")):
        get_benchmark("alfworld")
    tree = alfworld_tree(no_alfworld_data / ".cache" / "alfworld")
    shutil.rmtree(tree / "json_2.1.1" / "valid_unseen" / "pick_and_place_simple-Mug-None-Shelf-1")
    with pytest.raises(ConfigError, match=r"valid_unseen \(no game.tw-pddl in it; .*" + re.escape(FETCH)):
        load_config(TrainConfig, PAPER, paths)


def test_the_data_folder_is_the_config_key_then_the_variable_then_alfworlds_default(no_alfworld_data, tmp_path,
                                                                                    monkeypatch):
    default = alfworld_tree(no_alfworld_data / ".cache" / "alfworld")
    assert data_dir(None)[0] == default
    train = get_benchmark("alfworld", ALFWorldConfig(games="real")).tasks("train")
    assert [Path(t.game_file).parents[3] for t in train] == [default / "json_2.1.1"]
    # $ALFWORLD_DATA beats the default: set to an empty folder, it is refused (no falling back to the default).
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=re.escape(f"the data folder from $ALFWORLD_DATA='{tmp_path / 'empty'}'")):
        ALFWorldConfig(games="real")
    variable = alfworld_tree(tmp_path / "variable")
    monkeypatch.setenv("ALFWORLD_DATA", str(variable))
    train = get_benchmark("alfworld", ALFWorldConfig(games="real")).tasks("train")
    assert [Path(t.game_file).parents[3] for t in train] == [variable / "json_2.1.1"]
    # data_dir beats both, likewise without falling back.
    with pytest.raises(ConfigError, match=re.escape(f"the data folder from data_dir='{tmp_path / 'nothing'}'")):
        ALFWorldConfig(games="real", data_dir=str(tmp_path / "nothing"))
    key = alfworld_tree(tmp_path / "key")
    evaluation = get_benchmark("alfworld", ALFWorldConfig(games="real", data_dir=str(key))).tasks("eval")
    assert [Path(t.game_file).parts[-4] for t in evaluation] == ["valid_seen", "valid_unseen"]
    assert all(Path(t.game_file).is_relative_to(key) for t in evaluation)


def test_the_source_is_said_and_generated_games_read_no_data_dir(no_alfworld_data, paths, tmp_path):
    with pytest.raises(ConfigError, match=r"missing env\.games"):
        load_config(TrainConfig, PAPER, [*paths, "env={max_turns: 30}"])
    with pytest.raises(ConfigError, match=r"env\.games='toy': must be one of \['real', 'generated'\]"):
        load_config(TrainConfig, PAPER, [*paths, "env.games=toy"])
    with pytest.raises(ConfigError, match=r"env\.data_dir='/d': is read only with games: real"):
        load_config(TrainConfig, PAPER, [*paths, "env.games=generated", "env.data_dir=/d"])
    cfg = load_config(TrainConfig, PAPER, [*paths, "env.games=generated", f"env.generated_dir={tmp_path / 'g'}"])
    assert cfg.env.games == "generated" and not (tmp_path / "g").exists()  # nothing generated at load


# -- downloads ---------------------------------------------------------------------------------------------------


class LocalFileServer:
    """Python's http.server on 127.0.0.1, serving ``files`` (name -> bytes) with HTTP Range (206, 416), and
    recording each request's (name, Range header). Faults on request, one each: ``drop_after_fault_injection``
    (name -> bytes sent before the connection is cut), ``ignore_range_fault_injection`` (names answered whole, 200),
    ``html_fault_injection`` (names answered with an HTML page)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after_fault_injection: dict[str, int] = {}
        self.ignore_range_fault_injection: set[str] = set()
        self.html_fault_injection: set[str] = set()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/{name}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                name, wanted = self.path.lstrip("/"), self.headers.get("Range")
                server.requests.append((name, wanted))
                if name in server.html_fault_injection:
                    return self._send(200, b"<html>over quota</html>", {"Content-Type": "text/html"})
                if name not in server.files:
                    return self._send(404, b"", {})
                data, start = server.files[name], 0
                if wanted and name not in server.ignore_range_fault_injection:
                    start = int(wanted.removeprefix("bytes=").removesuffix("-"))
                    if start >= len(data):
                        return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                    return self._send(206, data[start:], headers, name)
                return self._send(200, data, {}, name)

            def _send(self, status: int, body: bytes, headers: dict[str, str], name: str = "") -> None:
                self.send_response(status)
                self.send_header("Content-Type", headers.pop("Content-Type", "application/octet-stream"))
                self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                cut = server.drop_after_fault_injection.pop(name, None)
                self.wfile.write(body if cut is None else body[:cut])
                self.wfile.flush()
                if cut is not None:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

        return Handler


@pytest.fixture
def server():
    srv = LocalFileServer()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def payload(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that differ from position to position (so that a misplaced resume shows)."""
    return b"".join(hashlib.sha256(f"{seed}-{i}".encode()).digest() for i in range(n // 32 + 1))[:n]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_interrupted_download_resumes_with_a_range_request(server, tmp_path, caplog):
    data = payload(300_000)
    server.files["big.bin"] = data
    server.drop_after_fault_injection["big.bin"] = 120_000
    download = Download(server.url("big.bin"), "big.bin", size=len(data), sha256=sha(data))
    target = tmp_path / "big.bin"
    with pytest.raises(DownloadError, match=r"bytes kept in .*big\.bin\.part: run the same command again to resume"):
        fetch_file(download, target)
    part = tmp_path / "big.bin.part"
    kept = part.stat().st_size
    assert 0 < kept < len(data) and not target.exists()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="actfirst"):
        assert fetch_file(download, target) == target
    assert target.read_bytes() == data and not part.exists()
    assert server.requests == [("big.bin", None), ("big.bin", f"bytes={kept}-")]
    assert f"big.bin: {len(data) / 2**20:,.1f} MiB of {len(data) / 2**20:,.1f} MiB (100%)" in caplog.text
    # A part file cut short by hand (a killed process) resumes the same way; a finished file is never fetched again.
    (tmp_path / "again.bin.part").write_bytes(data[:1000])
    fetch_file(download, tmp_path / "again.bin")
    assert (tmp_path / "again.bin").read_bytes() == data and server.requests[-1] == ("big.bin", "bytes=1000-")
    fetch_file(download, target)
    assert len(server.requests) == 3


def test_a_server_that_cannot_resume_and_a_complete_part_file(server, tmp_path):
    data = payload(50_000, seed=1)
    server.files["f.bin"] = data
    server.ignore_range_fault_injection.add("f.bin")
    (tmp_path / "f.bin.part").write_bytes(data[:7000])
    fetch_file(Download(server.url("f.bin"), "f.bin"), tmp_path / "f.bin")
    assert (tmp_path / "f.bin").read_bytes() == data  # started again from the first byte, not appended
    assert server.requests == [("f.bin", "bytes=7000-"), ("f.bin", None)]
    server.ignore_range_fault_injection.clear()
    (tmp_path / "g.bin.part").write_bytes(data)  # killed after the last byte, before the rename: 416, complete
    fetch_file(Download(server.url("f.bin"), "g.bin", sha256=sha(data)), tmp_path / "g.bin")
    assert (tmp_path / "g.bin").read_bytes() == data and server.requests[-1] == ("f.bin", f"bytes={len(data)}-")


def test_wrong_checksums_sizes_and_html_pages_are_refused(server, tmp_path):
    data = payload(10_000, seed=2)
    server.files["f.bin"] = data
    wrong = "0" * 64
    with pytest.raises(DownloadError, match=rf"f\.bin: sha256 {sha(data)}, not the expected {wrong}; deleted"):
        fetch_file(Download(server.url("f.bin"), "f.bin", sha256=wrong), tmp_path / "f.bin")
    assert not (tmp_path / "f.bin").exists() and not (tmp_path / "f.bin.part").exists()
    with pytest.raises(DownloadError, match=rf"the server's file has {len(data)} bytes, not the 999 expected"):
        fetch_file(Download(server.url("f.bin"), "f.bin", size=999), tmp_path / "f.bin")
    server.html_fault_injection.add("f.bin")
    with pytest.raises(DownloadError, match=r"the server sent an HTML page, not f\.bin"):
        fetch_file(Download(server.url("f.bin"), "f.bin"), tmp_path / "f.bin")
    with pytest.raises(DownloadError, match=r"missing\.bin: HTTP 404"):
        fetch_file(Download(server.url("missing.bin"), "missing.bin"), tmp_path / "m")
    assert not (tmp_path / "f.bin").exists()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buffer.getvalue()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_archives_are_extracted_into_place_and_a_done_source_is_not_fetched_again(server, tmp_path):
    server.files["json.zip"] = zip_bytes({"json_2.1.1/train/t1/traj_data.json": b"{}",
                                          "json_2.1.1/valid_seen/t2/traj_data.json": b"{}"})
    server.files["games.tar.gz"] = tar_bytes({"json_2.1.1/train/t1/game.tw-pddl": b"game"})
    server.files["corpus.jsonl.gz"] = gzip.compress(b'{"id": "0", "contents": "x"}\n' * 1000)
    server.files["part_aa"], server.files["part_ab"] = payload(5000, 3), payload(3000, 4)

    class Data(BenchmarkData):
        sources = (
            Source("json", (Download(server.url("json.zip"), "json.zip"),), "zip"),
            Source("games", (Download(server.url("games.tar.gz"), "games.tar.gz"),), "tar"),
            Source("corpus", (Download(server.url("corpus.jsonl.gz"), "corpus.jsonl.gz"),), "gzip",
                   target="corpus.jsonl"),
            Source("index", (Download(server.url("part_aa"), "part_aa"), Download(server.url("part_ab"), "part_ab")),
                   "concat", target="e5_Flat.index"),
        )

    dest = tmp_path / "data"
    report = fetch_data(Data(), dest)
    assert report.fetched == ["json", "games", "corpus", "index"] and report.present == []
    trial = dest / "json_2.1.1" / "train" / "t1"
    assert (trial / "traj_data.json").read_bytes() == b"{}" and (trial / "game.tw-pddl").read_bytes() == b"game"
    assert (dest / "json_2.1.1" / "valid_seen" / "t2" / "traj_data.json").is_file()
    assert (dest / "corpus.jsonl").read_bytes() == b'{"id": "0", "contents": "x"}\n' * 1000
    assert (dest / "e5_Flat.index").read_bytes() == payload(5000, 3) + payload(3000, 4)
    assert not list((dest / ".actfirst-data" / "downloads").iterdir())  # the archives are gone once placed
    requests = len(server.requests)
    report = fetch_data(Data(), dest, only=["json", "index"])
    assert report.present == ["json", "index"] and report.fetched == [] and len(server.requests) == requests
    # A broken archive is deleted and named; its source is not marked done.
    server.files["bad.zip"] = b"not a zip"

    class Broken(BenchmarkData):
        sources = (Source("bad", (Download(server.url("bad.zip"), "bad.zip"),), "zip"),)

    with pytest.raises(DownloadError, match=r"bad\.zip: not a readable zip archive .*deleted it"):
        fetch_data(Broken(), dest)
    assert not (dest / ".actfirst-data" / "bad.done").exists()


def test_progress_says_how_much_and_how_long(caplog):
    progress = Progress("x.zip", total=4 * 2**20, done=2**20, every_s=0.0)
    with caplog.at_level(logging.INFO, logger="actfirst"):
        progress.update(2**20)
    [line] = caplog.messages
    assert line.startswith("x.zip: 2.0 MiB of 4.0 MiB (50%), ") and re.search(r"MiB/s, ETA \d+:\d\d:\d\d$", line)
    assert Progress("x", total=None).line(0.0).startswith("x: 0.0 MiB, ")


# -- the benchmarks' sources and the command ------------------------------------------------------------------------


def test_alfworld_fetches_what_alfworlds_own_downloader_fetches():
    script = (Path(sys.executable).parent / "alfworld-download").read_text()
    theirs = dict(re.findall(r'^(\w+_URL) = "(\S+)"', script, re.M))
    ours = [d.url for s in ALFWorldData.sources for d in s.downloads]
    assert ours == [theirs["JSON_FILES_URL"], theirs["PDDL_FILES_URL"], theirs["TW_PDDL_FILES_URL"]]
    assert all(s.unpack == "zip" and s.target == "." for s in ALFWorldData.sources)  # into the data folder itself


def test_search_questions_become_the_files_its_config_reads(tmp_path):
    raw = tmp_path / "flashrag"
    raw.mkdir()
    rows = {"nq-train": ["who wrote hamlet"], "hotpotqa-train": ["which is older?"], "hotpotqa-dev": ["a"],
            "2wikimultihopqa-dev": ["b"], "musique-dev": ["c"], "bamboogle-test": ["d", "e"]}
    for name, questions in rows.items():
        (raw / f"{name}.jsonl").write_text("".join(json.dumps({"id": str(i), "question": q, "golden_answers": ["x"],
                                                               "metadata": {}}) + "\n"
                                                   for i, q in enumerate(questions)))
    SearchData().finish(tmp_path)
    train = load_questions([str(tmp_path / "train.jsonl")], "train_file")
    assert [(t.data_source, t.question) for t in train] == [("nq", "who wrote hamlet?"),
                                                            ("hotpotqa", "which is older?")]
    test = load_questions([str(tmp_path / "test.jsonl")], "test_files")
    assert [t.data_source for t in test] == ["hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "bamboogle"]


def test_the_command(server, tmp_path, capsys, monkeypatch):
    assert main(["scienceworld"]) == 0
    assert "ScienceWorld's data ships in its pip package" in capsys.readouterr().out
    assert main(["alfworld", "--list", "--dest", str(tmp_path / "a")]) == 0
    listed = capsys.readouterr().out
    assert "json_2.1.1_json.zip" in listed and f"destination: {tmp_path / 'a'}" in listed
    assert main(["search", "--only", "corpus", "wiki"]) == 2
    assert capsys.readouterr().err.strip() == ("python -m actfirst.data: error: --only=['wiki']: not sources of search "
                                               "(its sources: ['questions', 'corpus', 'index'])")
    # A fetch end to end, with webshop's data served locally: what to set afterwards, and a failure's one line.
    server.files["items_shuffle.json"] = b"[]"

    class LocalWebShop(WebShopData):
        sources = (Source("items_shuffle", (Download(server.url("items_shuffle.json"), "items_shuffle.json"),),
                          "copy"),)

    monkeypatch.setattr(BENCHMARKS["webshop"], "data", LocalWebShop())
    assert main(["webshop", "--dest", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "w" / "items_shuffle.json").read_bytes() == b"[]" and "fetched: items_shuffle" in out
    assert f"env.product_file={tmp_path / 'w' / 'items_shuffle.json'}" in out
    server.files.pop("items_shuffle.json")
    assert main(["webshop", "--dest", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m actfirst.data: failed: ") and "HTTP 404" in err[-1]
