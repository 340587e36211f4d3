"""Fetching a benchmark's data (``python -m actfirst.data``): resumable downloads, checked and unpacked into place.

A benchmark package declares its data as a :class:`BenchmarkData` (``actfirst/envs/<name>/data.py``): the
:class:`Source` list (each one or more :class:`Download` and how they become files: an archive extracted, a gzip
file decompressed, parts concatenated, a file kept as is), where the data goes by default, and what to set in a
config afterwards. :func:`fetch_data` fetches every source that is not already in place::

    report = fetch_data(ALFWorldBenchmark.data, dest=None)   # None: the benchmark's default place

A download is written to ``<file>.part`` and resumed from its size with an HTTP ``Range`` request; it is renamed
into place only once complete and verified (the size the server or the source declares, the sha256 where known).
An archive is extracted into a staging folder and moved into place file by file; a source is marked done
(``<dest>/.actfirst-data/<source>.done``) only after all of it is in place, so an interrupted run repeats at most
the step it was in. Progress with an ETA is logged (INFO).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import http.client
import json
import logging
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Literal

from actfirst.core.files import write_atomically

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
STATE_DIR = ".actfirst-data"
"""Under a destination: finished-source markers, downloads in progress, archives being extracted."""
TIMEOUT_S = 60.0


class DownloadError(RuntimeError):
    """A download or unpacking that could not finish (the network, a server's answer, a failed verification); the
    message says what was kept for the next run."""


@dataclasses.dataclass(frozen=True, slots=True)
class Download:
    """One remote file: its URL, the name it is saved under, and what it must be (None: not known)."""

    url: str
    name: str
    size: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """What becomes one part of a benchmark's data: ``downloads`` and how they are placed under the destination.

    ``unpack``: ``zip`` or ``tar`` extract each download into the folder ``target``; ``copy`` puts each download
    into the folder ``target`` under its name; ``gzip`` decompresses the one download into the file ``target``;
    ``concat`` joins the downloads, in order, into the file ``target``."""

    name: str
    downloads: tuple[Download, ...]
    unpack: Literal["zip", "tar", "gzip", "concat", "copy"]
    target: str = "."
    what: str = ""
    """One line for ``--list``."""

    def __post_init__(self) -> None:
        if not self.downloads:
            raise ValueError(f"source {self.name!r}: has no downloads")
        if self.unpack == "gzip" and len(self.downloads) != 1:
            raise ValueError(f"source {self.name!r}: unpack={self.unpack!r} takes one download")


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


@dataclasses.dataclass(slots=True)
class FetchReport:
    """What :func:`fetch_data` did: the sources fetched now and those already in place, and where."""

    dest: Path
    fetched: list[str] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)


class Progress:
    """``<what>: 12.0 of 48.0 MiB (25%), 3.2 MiB/s, ETA 0:00:11`` logged, at most every ``every_s`` seconds
    (and once at the end); the rate and the ETA count only what this run moved (not a resumed file's start)."""

    def __init__(self, what: str, total: int | None, done: int = 0, *, unit: str = "B", every_s: float = 1.0):
        self.what, self.total, self.done, self.unit = what, total, done, unit
        self.every_s = every_s
        self._start_done, self._start = done, time.monotonic()
        self._shown = 0.0

    def update(self, n: int) -> None:
        """Count ``n`` more units; log the line when ``every_s`` has passed since the last one."""
        self.done += n
        now = time.monotonic()
        if now - self._shown >= self.every_s:
            self._shown = now
            logger.info(self.line(now))

    def close(self) -> None:
        """Log the final line."""
        logger.info(self.line(time.monotonic()))

    def line(self, now: float) -> str:
        """The progress line at time ``now`` (``time.monotonic``)."""
        elapsed = max(now - self._start, 1e-9)
        rate = (self.done - self._start_done) / elapsed
        text = f"{self.what}: {self._amount(self.done)}"
        if self.total:
            text += f" of {self._amount(self.total)} ({100 * self.done / self.total:.0f}%)"
        text += f", {self._amount(rate)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {_clock((self.total - self.done) / rate)}"
        return text

    def _amount(self, n: float) -> str:
        if self.unit != "B":
            return f"{n:,.0f} {self.unit}"
        return f"{n / 2**20:,.1f} MiB"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def fetch_file(download: Download, path: Path) -> Path:
    """``download`` at ``path``: kept if already there, else fetched into ``<path>.part`` (resumed from its size by
    an HTTP Range request), verified and renamed into place. A wrong sha256 deletes the part file; any other
    failure keeps it for the next call. Raises :class:`DownloadError`."""
    if path.is_file():
        return path
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    total = _receive(download, part, part.stat().st_size if part.exists() else 0)
    if total is None:  # the server cannot resume from there: from the start
        part.unlink()
        total = _receive(download, part, 0)
    _verify(download, part, total)
    os.replace(part, path)
    return path


def _receive(download: Download, part: Path, offset: int) -> int | None:
    """Append the rest of ``download`` from byte ``offset`` to ``part``; returns the file's full size (-1: not
    known), or None when the server cannot resume from ``offset`` (the caller starts again)."""
    if download.size is not None and offset == download.size:
        return download.size
    request = urllib.request.Request(download.url, headers={"User-Agent": "actfirst-data",
                                                            **({"Range": f"bytes={offset}-"} if offset else {})})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing past offset: complete if offset is the size, else start again
            size = e.headers.get("Content-Range", "").rpartition("/")[2]
            return offset if size == str(offset) else None
        raise DownloadError(f"{download.url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"{download.url}: {getattr(e, 'reason', e)}{_kept(part)}") from None
    with response:
        if offset and response.status != 206:
            logger.warning(f"{download.name}: the server does not resume; starting again")
            return None
        if response.headers.get_content_type() == "text/html" and not download.name.endswith(".html"):
            raise DownloadError(f"{download.url}: the server sent an HTML page, not {download.name} (a login, quota "
                                f"or confirmation page?)")
        total = _total(response, offset)
        if download.size is not None and total not in (-1, download.size):
            raise DownloadError(f"{download.url}: the server's file has {total} bytes, not the {download.size} "
                                f"expected of {download.name}")
        progress = Progress(download.name, total if total >= 0 else download.size, offset)
        try:
            with part.open("ab") as out:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    progress.update(len(chunk))
        except (OSError, http.client.HTTPException) as e:  # a dropped connection: IncompleteRead
            raise DownloadError(f"{download.url}: stopped at {part.stat().st_size} bytes ({e}){_kept(part)}") from None
        finally:
            progress.close()
    return total


def _total(response, offset: int) -> int:
    """The full size of the file a response carries (206: from Content-Range; else Content-Length; -1: not said)."""
    if response.status == 206:
        start, _, size = response.headers.get("Content-Range", "").removeprefix("bytes ").partition("/")
        if not start.startswith(f"{offset}-"):
            raise DownloadError(f"{response.url}: asked for bytes from {offset}, got Content-Range "
                                f"{response.headers.get('Content-Range')!r}")
        return int(size) if size.isdigit() else -1
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else -1


def _verify(download: Download, part: Path, total: int) -> None:
    """The complete file's size against what the server said and the source declares, and its sha256."""
    size = part.stat().st_size
    expected = download.size if download.size is not None else total if total >= 0 else None
    if expected is not None and size != expected:
        if size > expected:
            part.unlink()
            raise DownloadError(f"{download.name}: {size} bytes, more than the {expected} expected; deleted {part}, "
                                f"run again to fetch it anew")
        raise DownloadError(f"{download.name}: stopped at {size} of {expected} bytes{_kept(part)}")
    if download.sha256 is not None:
        digest = sha256_of(part)
        if digest != download.sha256:
            part.unlink()
            raise DownloadError(f"{download.name}: sha256 {digest}, not the expected {download.sha256}; deleted "
                                f"{part}, run again to fetch it anew")


def _kept(part: Path) -> str:
    done = part.stat().st_size if part.exists() else 0
    return f"; {done} bytes kept in {part}: run the same command again to resume" if done else ""


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def place(source: Source, files: list[Path], dest: Path) -> None:
    """Put ``source``'s downloaded ``files`` into place under ``dest`` as its ``unpack`` says; every file appears
    whole (written beside its place and renamed)."""
    target = dest / source.target
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.unpack == "copy":
        target.mkdir(parents=True, exist_ok=True)
        for file in files:
            os.replace(file, target / file.name)  # the downloads folder is under dest: one filesystem
    elif source.unpack in ("gzip", "concat"):
        inputs = files if source.unpack == "concat" else files[:1]
        progress = Progress(f"{source.unpack} -> {target.name}", sum(f.stat().st_size for f in inputs), every_s=5.0)
        with _tmp(target).open("wb") as out:
            for file in inputs:
                _copy_stream(file, out, progress, gunzip=source.unpack == "gzip")
        progress.close()
        os.replace(_tmp(target), target)
    else:
        for file in files:
            _extract(file, source.unpack, target, dest / STATE_DIR / f"{source.name}.unpacking")


def _copy_stream(file: Path, out: IO[bytes], progress: Progress, *, gunzip: bool) -> None:
    """Append ``file`` (decompressed with ``gunzip``) to ``out``, counting the bytes read from ``file``."""
    with file.open("rb") as raw:
        f = gzip.GzipFile(fileobj=raw) if gunzip else raw
        read = 0
        try:
            while chunk := f.read(CHUNK):
                out.write(chunk)
                progress.update(raw.tell() - read)
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
            progress = Progress(f"extracting {archive.name}", len(members), unit="files", every_s=5.0)
            for member in members:
                if kind == "zip":
                    opened.extract(member, staging)  # zipfile drops absolute and ".." parts of names
                else:
                    opened.extract(member, staging, filter="data")  # refuses links and paths out of staging
                progress.update(1)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        archive.unlink()
        raise DownloadError(f"{archive.name}: not a readable {kind} archive ({e}); deleted it, run again to fetch it "
                            f"anew") from None
    progress.close()
    for path in sorted(staging.rglob("*")):
        if path.is_file():
            out = target / path.relative_to(staging)
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, out)
    shutil.rmtree(staging)


def fetch_data(data: BenchmarkData, dest: Path | None = None, only: Iterable[str] | None = None) -> FetchReport:
    """Fetch ``data``'s sources (``only``: those named) into ``dest`` (None: ``data.default_dest()``), each
    unless its marker says it is in place, then ``data.finish``. Raises :class:`DownloadError`."""
    dest = Path(dest) if dest is not None else data.default_dest()
    chosen = [s for s in data.sources if only is None or s.name in set(only)]
    state = dest / STATE_DIR
    report = FetchReport(dest)
    for source in chosen:
        marker = state / f"{source.name}.done"
        if marker.is_file():
            report.present.append(source.name)
            continue
        files = [fetch_file(d, state / "downloads" / d.name) for d in source.downloads]
        place(source, files, dest)
        state.mkdir(parents=True, exist_ok=True)
        write_atomically(marker, json.dumps({"target": source.target, "urls": [d.url for d in source.downloads]}))
        for file in files:
            file.unlink(missing_ok=True)  # placed archives and parts (a copied file has moved)
        report.fetched.append(source.name)
    data.finish(dest)
    return report
