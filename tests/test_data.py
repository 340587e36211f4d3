"""Benchmark data: ALFWorld's real games are never replaced by generated ones (the refusal, the data folder's
order), and ``python -m actfirst.data``'s downloads through the libraries that make them (huggingface_hub, gdown,
pooch) against a local HTTP server that answers as the Hub, Google Drive's plain URLs and a release server do:
resume, retries, pinned commits and sizes, the disk space said and checked, unpacking. The Hub's endpoint, token
and offline mode are read by huggingface_hub when it is imported, so the Hub tests run the command (or a snippet)
in a process of its own with those variables."""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
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
from actfirst.envs.alfworld.data import LOGIC, LOGIC_FILES, ALFWorldData, data_dir
from actfirst.envs.benchmarks import BENCHMARKS, get_benchmark
from actfirst.envs.search.data import FLASHRAG, QUESTION_FILES, SearchData
from actfirst.envs.search.env import load_questions
from actfirst.envs.webshop.data import WebShopData
from actfirst.preparation.downloads import (
    BenchmarkData,
    DownloadError,
    DriveFile,
    Source,
    UrlFile,
    fetch_data,
    fetch_file,
    plan_fetch,
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
    """Python's http.server on 127.0.0.1, recording each request as (method, path, Range, Authorization).

    Plain files (``files``: name -> bytes, at ``/<name>``) with HTTP Range (206). Hub dataset repos (``repos``: repo
    -> {commit: {filename: bytes}}, ``main``: repo -> the commit ``main`` names) at ``/datasets/<repo>/resolve/
    <revision>/<filename>``, HEAD and GET, with the headers huggingface_hub reads (X-Repo-Commit, ETag, the size).
    Faults on request, one each: ``drop_after_fault_injection`` (path -> bytes sent before the connection is cut),
    ``fail_fault_injection`` (path -> how many GETs answer 500 first)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.main: dict[str, str] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.drop_after_fault_injection: dict[str, int] = {}
        self.fail_fault_injection: dict[str, int] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def url(self, name: str) -> str:
        return f"{self.endpoint}/{name}"

    def lookup(self, path: str) -> tuple[bytes | None, dict[str, str]]:
        """The bytes at ``path`` (None: nothing there) and the headers that describe them."""
        if not path.startswith("/datasets/"):
            return self.files.get(path.lstrip("/")), {}
        repo, _, rest = path.removeprefix("/datasets/").partition("/resolve/")
        revision, _, filename = rest.partition("/")
        commit = self.main.get(repo) if revision == "main" else revision
        data = self.repos.get(repo, {}).get(commit, {}).get(filename)
        if data is None:
            return None, {"X-Error-Code": "EntryNotFound"}
        return data, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path, wanted = self.path.split("?")[0], self.headers.get("Range")
                server.requests.append((self.command, path, wanted, self.headers.get("Authorization")))
                data, headers = server.lookup(path)
                if body and server.fail_fault_injection.get(path, 0) > 0:
                    server.fail_fault_injection[path] -= 1
                    return self._send(500, b"", {}, body)
                if data is None:
                    return self._send(404, b"", headers, body)
                start = int(wanted.removeprefix("bytes=").split("-")[0]) if wanted and body else 0
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self._send(206 if start else 200, data[start:], headers, body)

            def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if not body:
                    return
                cut = server.drop_after_fault_injection.pop(self.path.split("?")[0], None)
                self.wfile.write(data if cut is None else data[:cut])
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


def gets(server: LocalFileServer, path: str) -> list[str | None]:
    """The Range header of every GET of ``path``."""
    return [r[2] for r in server.requests if r[0] == "GET" and r[1] == path]


def test_a_release_asset_through_pooch_checked_against_its_size_and_sha256(server, tmp_path):
    data = payload(300_000)
    server.files["a.zip"] = data
    ok = UrlFile(server.url("a.zip"), "a.zip", size=len(data), sha256=sha(data))
    assert fetch_file(ok, tmp_path / "a.zip").read_bytes() == data
    fetch_file(ok, tmp_path / "a.zip")  # in place: not fetched again
    assert gets(server, "/a.zip") == [None]
    with pytest.raises(DownloadError, match=rf"b\.zip: {len(data)} bytes, not the 999 declared for .*; deleted it"):
        fetch_file(UrlFile(server.url("a.zip"), "b.zip", size=999), tmp_path / "b.zip")
    with pytest.raises(DownloadError, match=r"c\.zip: .*[Hh]ash"):
        fetch_file(UrlFile(server.url("a.zip"), "c.zip", sha256="0" * 64), tmp_path / "c.zip")
    with pytest.raises(DownloadError, match=r"missing\.zip: 404"):
        fetch_file(UrlFile(server.url("missing.zip"), "missing.zip"), tmp_path / "m.zip")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zip"]  # nothing half-written or refused kept
    # a server that fails twice, then answers: retried
    server.fail_fault_injection["/a.zip"] = 2
    before = len(gets(server, "/a.zip"))
    assert fetch_file(UrlFile(server.url("a.zip"), "d.zip", sha256=sha(data)), tmp_path / "d.zip").read_bytes() == data
    assert len(gets(server, "/a.zip")) == before + 3


def test_a_drive_file_through_gdown_resumes_a_cut_download(server, tmp_path):
    data = payload(3_000_000, seed=1)
    server.files["items.json"] = data
    server.drop_after_fault_injection["/items.json"] = 2_000_000  # past gdown's first 512 KiB chunks
    target = tmp_path / "downloads" / "items.json"
    assert fetch_file(DriveFile(server.url("items.json"), "items.json", sha256=sha(data)), target).read_bytes() == data
    ranges = gets(server, "/items.json")
    assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes=")  # resumed, not again
    assert [p.name for p in target.parent.iterdir()] == ["items.json"]


def hub_command(server: LocalFileServer, args: list[str], env: dict[str, str] | None = None,
                code: str | None = None) -> subprocess.CompletedProcess:
    """``python -m actfirst.data ARGS`` (or ``python -c CODE``) with the local server as the Hub."""
    env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_local_test",
           "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "actfirst.data", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def flashrag_files(tag: str) -> dict[str, bytes]:
    """The FlashRAG files Search's questions come from, one question each (naming ``tag``)."""
    return {f"{ds}/{split}.jsonl": json.dumps({"id": "0", "question": f"{tag} {ds} {split}", "golden_answers": ["x"],
                                                "metadata": {}}).encode() + b"\n"
            for pairs in QUESTION_FILES.values() for ds, split in pairs}


def test_search_questions_through_huggingface_hub_at_one_pinned_commit(server, tmp_path):
    first, second = "1" * 40, "2" * 40
    server.repos[FLASHRAG] = {first: flashrag_files("old"), second: flashrag_files("new")}
    server.main[FLASHRAG] = first
    dest = tmp_path / "search"
    proc = hub_command(server, ["search", "--only", "questions", "--dest", str(dest)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"questions: {FLASHRAG} at commit {first}" in proc.stdout and "at most " in proc.stdout
    assert [q["question"] for q in map(json.loads, (dest / "test.jsonl").read_text().splitlines())][0] == \
        "old hotpotqa dev"
    state = dest / ".actfirst-data"
    assert json.loads((state / "questions.pin").read_text()) == {FLASHRAG: first}
    assert json.loads((state / "questions.done").read_text())["commits"] == {FLASHRAG: first}
    hub = [r for r in server.requests if r[1].startswith("/datasets/")]
    assert {r[3] for r in hub} == {"Bearer hf_local_test"}  # HF_TOKEN
    assert {r[1].split("/")[5] for r in hub if r[0] == "GET"} == {first}
    # main moves on; a fetch that resumes (a file lost, the source not done) still takes the pinned commit
    server.main[FLASHRAG] = second
    (state / "questions.done").unlink()
    (dest / "test.jsonl").unlink()
    (dest / "flashrag" / "bamboogle-test.jsonl").unlink()
    server.requests.clear()
    assert hub_command(server, ["search", "--only", "questions", "--dest", str(dest)]).returncode == 0
    assert {r[1].split("/")[5] for r in server.requests if r[0] == "GET" and r[1].startswith("/datasets/")} == \
        {first}, server.requests
    assert "old bamboogle test" in (dest / "test.jsonl").read_text()


def test_a_hub_download_cut_short_resumes_and_offline_is_one_line(server, tmp_path):
    commit = "3" * 40
    files = flashrag_files("q")
    files["nq/train.jsonl"] = payload(24 * 2**20, seed=2)  # not JSON: only its bytes are checked here
    server.repos[FLASHRAG] = {commit: files}
    server.main[FLASHRAG] = commit
    path = f"/datasets/{FLASHRAG}/resolve/{commit}/nq/train.jsonl"
    server.drop_after_fault_injection[path] = 15 * 2**20  # past huggingface_hub's first 10 MiB chunk
    code = ("import sys; from pathlib import Path; from actfirst.envs.search.data import SearchData; "
            "from actfirst.preparation.downloads import fetch_file; "
            "source = SearchData.sources[0]; "
            "print(fetch_file(source.files[0], Path(sys.argv[-1]), commit='" + commit + "').stat().st_size)")
    target = tmp_path / "nq-train.jsonl"
    proc = hub_command(server, [], code=code.replace("sys.argv[-1]", repr(str(target))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert target.read_bytes() == files["nq/train.jsonl"]
    ranges = gets(server, path)
    assert ranges[0] is None and any(r is not None and r.startswith("bytes=") for r in ranges[1:]), ranges
    # offline with nothing fetched: one line, exit status 1
    proc = hub_command(server, ["search", "--only", "questions", "--dest", str(tmp_path / "offline")],
                       env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m actfirst.data: failed: hf://datasets/RUC-NLPIR/FlashRAG_datasets/")
    assert "not fetched yet and HF_HUB_OFFLINE is set" in last


def test_the_disk_space_is_said_before_and_checked(tmp_path):
    """Nothing is fetched: the sizes are declared (an unroutable URL would fail if anything were asked)."""

    class Huge(BenchmarkData):
        sources = (Source("parts", (UrlFile("http://192.0.2.1/a", "a", size=2**50),
                                    UrlFile("http://192.0.2.1/b", "b", size=2**50)), "concat", target="joined"),)

    plan = plan_fetch(Huge(), tmp_path / "d")
    assert plan.peak_bytes == 4 * 2**50  # the parts and what they are joined into, at once
    assert plan.lines()[0].startswith(f"to fetch into {tmp_path / 'd'}: parts; at most 4,194,304.00 GiB on its "
                                      f"filesystem at once, ")
    with pytest.raises(DownloadError, match=r"writes up to 4,194,304\.00 GiB at once, and its filesystem has "):
        fetch_data(Huge(), tmp_path / "d")
    # Search's index, as declared: twice its 60 GiB while the parts are joined
    index = [s for s in SearchData.sources if s.name == "index"][0]
    parts = sum(f.size for f in index.files)
    assert parts == 21_015_324 * 768 * 4 + 45  # a flat FAISS index of wiki-18's passages, header included

    class IndexOnly(BenchmarkData):
        sources = (Source(index.name, tuple(UrlFile(f"http://192.0.2.1/{f.name}", f.name, size=f.size)
                                             for f in index.files), "concat", target=index.target),)

    assert plan_fetch(IndexOnly(), tmp_path / "s").peak_bytes == 2 * parts


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
            Source("json", (UrlFile(server.url("json.zip"), "json.zip"),), "zip"),
            Source("games", (UrlFile(server.url("games.tar.gz"), "games.tar.gz"),), "tar"),
            Source("corpus", (UrlFile(server.url("corpus.jsonl.gz"), "corpus.jsonl.gz"),), "gzip",
                   target="corpus.jsonl"),
            Source("index", (UrlFile(server.url("part_aa"), "part_aa", size=5000),
                             UrlFile(server.url("part_ab"), "part_ab", size=3000)), "concat", target="e5_Flat.index"),
        )

    dest = tmp_path / "data"
    plan = plan_fetch(Data(), dest)
    assert plan.peak_bytes == 2 * 8000 and "json.zip (json)" in plan.unknown
    report = fetch_data(Data(), dest, plan=plan)
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
        sources = (Source("bad", (UrlFile(server.url("bad.zip"), "bad.zip"),), "zip"),)

    with pytest.raises(DownloadError, match=r"bad\.zip: not a readable zip archive .*deleted it"):
        fetch_data(Broken(), dest)
    assert not (dest / ".actfirst-data" / "bad.done").exists()


# -- the benchmarks' sources and the command ------------------------------------------------------------------------


def test_alfworld_fetches_what_alfworlds_own_downloader_fetches_and_its_logic_files(tmp_path):
    import importlib.resources

    script = (Path(sys.executable).parent / "alfworld-download").read_text()
    theirs = dict(re.findall(r'^(\w+_URL) = "(\S+)"', script, re.M))
    ours = [f.url for s in ALFWorldData.sources for f in s.files]
    assert ours == [theirs["JSON_FILES_URL"], theirs["PDDL_FILES_URL"], theirs["TW_PDDL_FILES_URL"]]
    assert all(s.unpack == "zip" and s.target == "." for s in ALFWorldData.sources)  # into the data folder itself
    assert all(f.size for s in ALFWorldData.sources for f in s.files)  # release assets: fixed sizes
    ALFWorldData().finish(tmp_path)
    packaged = importlib.resources.files("alfworld").joinpath("data")
    for name in LOGIC_FILES:
        assert (tmp_path / LOGIC / name).read_text() == packaged.joinpath(name).read_text()


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
    assert SearchData().hub_datasets() == sorted([FLASHRAG, "PeterJinGo/wiki-18-corpus",
                                                  "PeterJinGo/wiki-18-e5-index"])


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
        sources = (Source("items_shuffle", (DriveFile(server.url("items_shuffle.json"), "items_shuffle.json"),),
                          "copy"),)

    monkeypatch.setattr(BENCHMARKS["webshop"], "data", LocalWebShop())
    assert main(["webshop", "--dest", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "w" / "items_shuffle.json").read_bytes() == b"[]" and "fetched: items_shuffle" in out
    assert f"to fetch into {tmp_path / 'w'}: items_shuffle; at most " in out
    assert f"env.product_file={tmp_path / 'w' / 'items_shuffle.json'}" in out
    server.files.pop("items_shuffle.json")
    assert main(["webshop", "--dest", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m actfirst.data: failed: ") and "items_shuffle.json" in err[-1]
