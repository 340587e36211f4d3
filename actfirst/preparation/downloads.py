"""Fetching a benchmark's data (``python -m actfirst.data``) through the libraries made for each kind of source,
checked, and unpacked into place.

A benchmark package declares its data as a :class:`BenchmarkData` (``actfirst/envs/<name>/data.py``): the
:class:`Source` list, each one or more remote files and how they become files (an archive extracted, a gzip file
decompressed, parts concatenated, a file kept as is), where the data goes by default, and what to set in a config
afterwards. A remote file is one of

- :class:`HubFile`: a file of a Hugging Face Hub dataset repo at a revision, fetched by huggingface_hub
  (``hf_hub_download``: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and hf_xet are honoured, an interrupted
  download resumes, the size is checked against the Hub's). The commit a source's revision resolves to is kept
  beside the data (``<dest>/.actfirst-data/<source>.pin``): every file of the source, in this run and in a resumed
  one, comes from that commit, which the source's marker records;
- :class:`DriveFile`: a Google Drive file, fetched by gdown (Drive's confirmation page for large files, resume);
- :class:`UrlFile`: any other URL (a GitHub release asset), fetched by pooch (its sha256 where declared).

Each library retries a dropped connection itself (:data:`RETRIES`), and each file is checked against the size and
sha256 its declaration pins where upstream fixes them (a mismatch deletes the file and names it).
:func:`plan_fetch` says, before anything is fetched, what the fetch writes at most at once on the destination's
filesystem (the downloads, plus what unpacking writes where that is known: concatenated parts, declared unpacked
sizes) against what is free there; :func:`fetch_data` refuses to start when it does not fit. Downloads go to
``<dest>/.actfirst-data/downloads``; an archive is extracted into a staging folder and moved into place file by file;
a source is marked done (``<dest>/.actfirst-data/<source>.done``) only after all of it is in place, so an
interrupted run repeats at most the step it was in. Progress bars are the libraries' and tqdm's.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Literal

from tqdm import tqdm

from actfirst.core.files import write_atomically

CHUNK = 1 << 20
STATE_DIR = ".actfirst-data"
"""Under a destination: finished-source markers, pinned commits, downloads in progress, archives being extracted."""
RETRIES = 3
"""Further attempts gdown and pooch make at a download that failed on the network (huggingface_hub makes its own)."""
GIB = 2**30


class DownloadError(RuntimeError):
    """A download or unpacking that could not finish (the network, a server's answer, a failed verification, the
    disk); the message says what was kept for the next run."""


@dataclasses.dataclass(frozen=True, slots=True)
class HubFile:
    """``filename`` of the Hugging Face Hub dataset repo ``repo`` at ``revision`` (a commit pins it; a branch is
    resolved to its commit once per source), saved as ``name``."""

    repo: str
    filename: str
    name: str
    revision: str = "main"
    size: int | None = None
    sha256: str | None = None

    @property
    def where(self) -> str:
        return f"hf://datasets/{self.repo}/{self.filename}@{self.revision}"


@dataclasses.dataclass(frozen=True, slots=True)
class UrlFile:
    """A file at ``url``, saved as ``name`` (fetched by pooch)."""

    url: str
    name: str
    size: int | None = None
    sha256: str | None = None

    @property
    def where(self) -> str:
        return self.url


@dataclasses.dataclass(frozen=True, slots=True)
class DriveFile(UrlFile):
    """A Google Drive file (``url``: ``https://drive.google.com/uc?id=<id>``, see :func:`drive_url`), fetched by
    gdown."""


Remote = HubFile | DriveFile | UrlFile


def drive_url(file_id: str) -> str:
    """The URL gdown fetches a Google Drive file by."""
    return f"https://drive.google.com/uc?id={file_id}"


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """What becomes one part of a benchmark's data: ``files`` and how they are placed under the destination.

    ``unpack``: ``zip`` or ``tar`` extract each file into the folder ``target``; ``copy`` puts each file into the
    folder ``target`` under its name; ``gzip`` decompresses the one file into the file ``target``; ``concat`` joins
    the files, in order, into the file ``target``. ``unpacked_size``: the bytes unpacking writes (zip, tar, gzip),
    where known."""

    name: str
    files: tuple[Remote, ...]
    unpack: Literal["zip", "tar", "gzip", "concat", "copy"]
    target: str = "."
    what: str = ""
    """One line for ``--list``."""
    unpacked_size: int | None = None

    def __post_init__(self) -> None:
        if not self.files:
            raise ValueError(f"source {self.name!r}: has no files")
        if self.unpack == "gzip" and len(self.files) != 1:
            raise ValueError(f"source {self.name!r}: unpack={self.unpack!r} takes one file")
        if len({f.name for f in self.files}) != len(self.files):
            raise ValueError(f"source {self.name!r}: two files of the same name")


class BenchmarkData:
    """A benchmark's data as ``python -m actfirst.data <benchmark>`` fetches it (a benchmark's ``data`` ClassVar).
    The base class fetches nothing; a benchmark package subclasses it."""

    sources: tuple[Source, ...] = ()
    note: str = ""
    """Printed before anything is fetched (e.g. where data comes from when there is nothing to fetch)."""

    def default_dest(self) -> Path:
        """Where the data goes without ``--dest``."""
        return Path("data")

    def finish(self, dest: Path) -> None:
        """Turn the fetched sources into what the benchmark reads (after every selected source is in place)."""

    def next_steps(self, dest: Path) -> list[str]:
        """Lines printed at the end: which config keys to set for data at ``dest``."""
        return []

    def hub_datasets(self) -> list[str]:
        """The Hugging Face Hub dataset repos the data comes from (a model card's ``datasets``)."""
        return sorted({f.repo for s in self.sources for f in s.files if isinstance(f, HubFile)})


@dataclasses.dataclass(slots=True)
class FetchPlan:
    """What :func:`fetch_data` will do: the sources to fetch and those in place, the bytes it writes at most at once
    on the destination's filesystem (of what is known before fetching), what is not known, and what is free."""

    dest: Path
    fetch: list[Source]
    present: list[str]
    peak_bytes: int
    unknown: list[str]
    free_bytes: int
    pins: dict[str, dict[str, str]]
    """Per source: the commit of each Hub repo (resolved now, or pinned by an earlier run)."""

    def lines(self) -> list[str]:
        """What the command says before fetching."""
        if not self.fetch:
            return []
        lines = [f"to fetch into {self.dest}: {', '.join(s.name for s in self.fetch)}; at most "
                 f"{self.peak_bytes / GIB:,.2f} GiB on its filesystem at once, {self.free_bytes / GIB:,.2f} GiB free"]
        if self.unknown:
            lines.append(f"not known before fetching, and not counted: {'; '.join(self.unknown)}")
        for source, repos in self.pins.items():
            lines += [f"{source}: {repo} at commit {commit}" for repo, commit in repos.items()]
        return lines

    def check_space(self) -> None:
        """Refuse a fetch whose known size does not fit the free space."""
        if self.fetch and self.peak_bytes > self.free_bytes:
            raise DownloadError(f"{self.dest}: fetching {', '.join(s.name for s in self.fetch)} writes up to "
                                f"{self.peak_bytes / GIB:,.2f} GiB at once, and its filesystem has "
                                f"{self.free_bytes / GIB:,.2f} GiB free; free space, fetch fewer sources (--only), "
                                f"or fetch elsewhere (--dest)")


@dataclasses.dataclass(slots=True)
class FetchReport:
    """What :func:`fetch_data` did: the sources fetched now and those already in place, and where."""

    dest: Path
    fetched: list[str] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)


def plan_fetch(data: BenchmarkData, dest: Path | None = None, only: Iterable[str] | None = None) -> FetchPlan:
    """What fetching ``data``'s sources (``only``: those named) into ``dest`` (None: its default place) takes; asks
    the Hub for the commit and the sizes of Hub files (not offline). Raises :class:`DownloadError`."""
    dest = Path(dest) if dest is not None else data.default_dest()
    state = dest / STATE_DIR
    chosen = [s for s in data.sources if only is None or s.name in set(only)]
    todo = [s for s in chosen if not (state / f"{s.name}.done").is_file()]
    pins = {s.name: _pin(s, state) for s in todo if any(isinstance(f, HubFile) for f in s.files)}
    placed = peak = 0
    unknown = []
    for source in todo:
        pending = [not (state / "downloads" / f.name).is_file() for f in source.files]
        sizes = [_size(f, pins.get(source.name, {})) if todo_file else (state / "downloads" / f.name).stat().st_size
                 for f, todo_file in zip(source.files, pending, strict=True)]
        unknown += [f"{f.name} ({source.name})" for f, size in zip(source.files, sizes, strict=True) if size is None]
        downloads = sum(size or 0 for size, todo_file in zip(sizes, pending, strict=True) if todo_file)
        whole = None if None in sizes else sum(sizes)
        out = {"copy": whole, "concat": whole}.get(source.unpack, source.unpacked_size)
        if out is None and source.unpack != "copy":
            unknown.append(f"what unpacking {source.name} writes")
        peak = max(peak, placed + downloads + (out or 0) * (source.unpack != "copy"))
        placed += out if out is not None else downloads * (source.unpack == "copy")
    free = shutil.disk_usage(_existing(dest)).free
    return FetchPlan(dest, todo, [s.name for s in chosen if s not in todo], peak, unknown, free, pins)


def fetch_data(data: BenchmarkData, dest: Path | None = None, only: Iterable[str] | None = None,
               plan: FetchPlan | None = None) -> FetchReport:
    """Fetch ``data``'s sources (``only``: those named) into ``dest`` (None: ``data.default_dest()``), each unless
    its marker says it is in place, then ``data.finish``; ``plan``: :func:`plan_fetch`'s (made here when None),
    refused when the destination has less space free than it needs. Raises :class:`DownloadError`."""
    plan = plan if plan is not None else plan_fetch(data, dest, only)
    plan.check_space()
    state = plan.dest / STATE_DIR
    report = FetchReport(plan.dest, present=list(plan.present))
    for source in plan.fetch:
        pins = plan.pins.get(source.name, {})
        files = [fetch_file(f, state / "downloads" / f.name, commit=pins.get(f.repo) if isinstance(f, HubFile)
                            else None) for f in source.files]
        place(source, files, plan.dest)
        write_atomically(state / f"{source.name}.done",
                         json.dumps({"target": source.target, "files": [f.where for f in source.files],
                                     "commits": pins}))
        for file in files:
            file.unlink(missing_ok=True)  # placed archives and parts (a copied file has moved)
        for repo in pins:  # huggingface_hub's records of the files moved out
            shutil.rmtree(_hub_dir(state, repo), ignore_errors=True)
        report.fetched.append(source.name)
    data.finish(plan.dest)
    return report


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (what ``disk_usage`` can ask about before ``path`` exists)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


# -- one file ------------------------------------------------------------------------------------------------------


def fetch_file(remote: Remote, path: Path, *, commit: str | None = None) -> Path:
    """``remote`` at ``path``: kept if already there, else fetched by its library (a Hub file at ``commit``, else
    at its revision; each library retries a dropped connection on its own, the Hub's and Drive's resuming), checked
    against its declared size and sha256, and moved to ``path`` once whole. Raises :class:`DownloadError`."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    got = _fetch(remote, path, commit)
    _verify(remote, got)
    if got != path:
        os.replace(got, path)
    return path


def _failed(remote: Remote, error: BaseException) -> DownloadError:
    """A download that failed on the network after its library's retries."""
    return DownloadError(f"{remote.where}: {type(error).__name__}: {' '.join(str(error).split())[:300]} (after "
                         f"{RETRIES} retries); what was received is kept: run the same command again to resume")


def _fetch(remote: Remote, path: Path, commit: str | None) -> Path:
    if isinstance(remote, HubFile):
        return _fetch_hub(remote, path, commit)
    if isinstance(remote, DriveFile):
        return _fetch_drive(remote, path)
    return _fetch_url(remote, path)


def _fetch_hub(remote: HubFile, path: Path, commit: str | None) -> Path:
    """``hf_hub_download`` into a folder of the source's state (its own resume and size check)."""
    import httpx2
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError

    local_dir = _hub_dir(path.parent.parent, remote.repo)
    try:
        return Path(hf_hub_download(remote.repo, remote.filename, repo_type="dataset",
                                    revision=commit or remote.revision, local_dir=local_dir))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        raise DownloadError(f"{remote.where}: not fetched yet and {why} (endpoint {constants.ENDPOINT})") from None
    except RemoteEntryNotFoundError:
        raise DownloadError(f"{remote.where}: the Hub has no such file at {commit or remote.revision}") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"{remote.where}: {' '.join(str(e).split())[:300]}") from None
    except (httpx2.HTTPError, OSError) as e:
        raise _failed(remote, e) from None


def _hub_dir(state: Path, repo: str) -> Path:
    """Where ``hf_hub_download`` puts a Hub repo's files (and its records of them) under a destination's state."""
    return state / "hub" / repo.replace("/", "--")


def _fetch_drive(remote: DriveFile, path: Path) -> Path:
    """gdown: Drive's confirmation page, a resumed ``<name>*.part`` file, its own retries."""
    import gdown
    from gdown.exceptions import FileURLRetrievalError

    try:
        gdown.download(url=remote.url, output=str(path), quiet=False, resume=True, retries=RETRIES)
    except FileURLRetrievalError as e:  # a quota or permission page instead of the file
        raise DownloadError(f"{remote.url}: Google Drive gave no file ({' '.join(str(e).split())[:300]})") from None
    except (gdown.exceptions.DownloadError, OSError) as e:
        raise _failed(remote, e) from None
    return path


def _fetch_url(remote: UrlFile, path: Path) -> Path:
    """pooch: its own retries and sha256 check, the file moved into place once whole."""
    import pooch
    import requests

    fetcher = pooch.create(path=path.parent, base_url="", registry={remote.name: _pooch_hash(remote)},
                           urls={remote.name: remote.url}, retry_if_failed=RETRIES)
    try:
        return Path(fetcher.fetch(remote.name, downloader=pooch.HTTPDownloader(progressbar=True, timeout=60)))
    except ValueError as e:  # pooch's hash mismatch: it has deleted the file
        raise DownloadError(f"{remote.name}: {' '.join(str(e).split())[:300]}") from None
    except requests.HTTPError as e:
        raise DownloadError(f"{remote.url}: {e}") from None
    except (requests.RequestException, OSError) as e:
        raise _failed(remote, e) from None


def _pooch_hash(remote: UrlFile) -> str | None:
    return f"sha256:{remote.sha256}" if remote.sha256 else None


def _verify(remote: Remote, path: Path) -> None:
    """The declared size and sha256 of a fetched file; a mismatch deletes it."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        path.unlink()
        raise DownloadError(f"{remote.name}: {size} bytes, not the {remote.size} declared for {remote.where}; "
                            f"deleted it, run again to fetch it anew")
    if remote.sha256 is not None:
        digest = sha256_of(path)
        if digest != remote.sha256:
            path.unlink()
            raise DownloadError(f"{remote.name}: sha256 {digest}, not the expected {remote.sha256}; deleted it, "
                                f"run again to fetch it anew")


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pin(source: Source, state: Path) -> dict[str, str]:
    """The commit of each Hub repo of ``source``: the one an earlier run pinned, else its revision resolved now
    (and pinned for the next runs); where the Hub cannot be asked (offline), the revision as declared."""
    path = state / f"{source.name}.pin"
    pinned = json.loads(path.read_text()) if path.is_file() else {}
    pins = {}
    for remote in source.files:
        if isinstance(remote, HubFile) and remote.repo not in pins:
            commit = pinned.get(remote.repo) or _metadata(remote, remote.revision)[0]
            if commit is not None:
                pinned[remote.repo] = commit
            pins[remote.repo] = commit or remote.revision
    if pinned:
        state.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(pinned))
    return pins


def _size(remote: Remote, pins: dict[str, str]) -> int | None:
    """A file's declared size, else (a Hub file) the Hub's at the pinned commit; None: not known."""
    if remote.size is not None or not isinstance(remote, HubFile):
        return remote.size
    return _metadata(remote, pins.get(remote.repo, remote.revision))[1]


def _metadata(remote: HubFile, revision: str) -> tuple[str | None, int | None]:
    """(commit, size) of a Hub file at ``revision``, (None, None) offline or unreachable; a missing repo, revision
    or file raises :class:`DownloadError`."""
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        meta = get_hf_file_metadata(hf_hub_url(remote.repo, remote.filename, repo_type="dataset", revision=revision))
    except (RepositoryNotFoundError, RevisionNotFoundError, RemoteEntryNotFoundError) as e:
        raise DownloadError(f"{remote.where}: {type(e).__name__} at revision {revision}") from None
    except (OfflineModeIsEnabled, httpx2.HTTPError, OSError):
        return None, None
    return meta.commit_hash, meta.size


# -- placing ------------------------------------------------------------------------------------------------------


def place(source: Source, files: list[Path], dest: Path) -> None:
    """Put ``source``'s fetched ``files`` into place under ``dest`` as its ``unpack`` says; every file appears
    whole (written beside its place and renamed)."""
    target = dest / source.target
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.unpack == "copy":
        target.mkdir(parents=True, exist_ok=True)
        for file in files:
            os.replace(file, target / file.name)  # the downloads folder is under dest: one filesystem
    elif source.unpack in ("gzip", "concat"):
        inputs = files if source.unpack == "concat" else files[:1]
        with tqdm(total=sum(f.stat().st_size for f in inputs), unit="B", unit_scale=True,
                  desc=f"{source.unpack} -> {target.name}") as bar, _tmp(target).open("wb") as out:
            for file in inputs:
                _copy_stream(file, out, bar, gunzip=source.unpack == "gzip")
        os.replace(_tmp(target), target)
    else:
        for file in files:
            _extract(file, source.unpack, target, dest / STATE_DIR / f"{source.name}.unpacking")


def _copy_stream(file: Path, out: IO[bytes], bar: tqdm, *, gunzip: bool) -> None:
    """Append ``file`` (decompressed with ``gunzip``) to ``out``, counting the bytes read from ``file``."""
    with file.open("rb") as raw:
        f = gzip.GzipFile(fileobj=raw) if gunzip else raw
        read = 0
        try:
            while chunk := f.read(CHUNK):
                out.write(chunk)
                bar.update(raw.tell() - read)
                read = raw.tell()
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            file.unlink()
            raise DownloadError(f"{file.name}: not a readable gzip file ({e}); deleted it, run again to fetch it "
                                f"anew") from None


def _tmp(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def _extract(archive: Path, kind: str, target: Path, staging: Path) -> None:
    """Extract ``archive`` into ``staging``, then move its files into ``target`` (replacing files of the same
    name, keeping others: several archives may fill one folder)."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive) as opened:
            members = opened.infolist() if kind == "zip" else opened.getmembers()
            for member in tqdm(members, desc=f"extracting {archive.name}", unit="files"):
                if kind == "zip":
                    opened.extract(member, staging)  # zipfile drops absolute and ".." parts of names
                else:
                    opened.extract(member, staging, filter="data")  # refuses links and paths out of staging
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        archive.unlink()
        raise DownloadError(f"{archive.name}: not a readable {kind} archive ({e}); deleted it, run again to fetch it "
                            f"anew") from None
    for path in sorted(staging.rglob("*")):
        if path.is_file():
            out = target / path.relative_to(staging)
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, out)
    shutil.rmtree(staging)
