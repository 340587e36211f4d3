"""A local BM25 retrieval server in Search-R1's protocol (tests, the CPU): one command::

    python -m actfirst.envs.search.server --corpus corpus.jsonl [--port 8000] [--host 127.0.0.1] [--topk 3]

The corpus is JSONL as Search-R1's corpora are: one ``{"id": ..., "contents": "\\"Title\\"\\ntext"}`` per line.
``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": bool}`` answers ``{"result": [...]}``: per
query the top k as ``{"document": {...}, "score": s}`` (``return_scores``) or the documents alone, as Search-R1's
``search_r1/search/retrieval_server.py`` does. BM25 is ``bm25s`` over the whole ``contents`` (title and text),
English stop words removed. The UOPD setting uses Search-R1's own e5 + FAISS server instead (docs/search.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from actfirst.core.user_input import ConfigError, command


def load_corpus(path: str, key: str = "--corpus") -> list[dict]:
    """The passages of a JSONL corpus; a missing, empty or malformed file is a ``ConfigError`` naming ``key``, the
    path and the line."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}={path!r}: no such file")
    docs = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{key}={path!r}: line {number} is not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
            raise ConfigError(f"{key}={path!r}: line {number} is not a passage "
                              f'({{"id": ..., "contents": "<title>\\n<text>"}} expected)')
        docs.append(doc)
    if not docs:
        raise ConfigError(f"{key}={path!r}: holds no passages")
    return docs


class BM25Index:
    """``bm25s`` over the passages' ``contents``; ``search`` is safe from several threads."""

    def __init__(self, docs: list[dict]):
        import bm25s

        self._bm25s = bm25s
        self.docs = docs
        self._index = bm25s.BM25()
        self._index.index(bm25s.tokenize([d["contents"] for d in docs], stopwords="en", show_progress=False),
                          show_progress=False)
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict, float]]]:
        """The top ``topk`` (at most the corpus) passages of each query with their scores, best first."""
        k = min(topk, len(self.docs))
        tokens = self._bm25s.tokenize(queries, stopwords="en", show_progress=False)
        with self._lock:
            ids, scores = self._index.retrieve(tokens, k=k, show_progress=False)
        return [[(self.docs[int(i)], float(s)) for i, s in zip(row_ids, row_scores, strict=True)]
                for row_ids, row_scores in zip(ids, scores, strict=True)]


def _parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a request body; a ``ValueError`` says what is wrong."""
    request = json.loads(body)
    queries = request.get("queries") if isinstance(request, dict) else None
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    topk = request.get("topk") or default_topk
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f'"topk"={topk!r}: must be an integer >= 1')
    return queries, topk, bool(request.get("return_scores", False))


def make_server(index: BM25Index, host: str, port: int, topk: int) -> ThreadingHTTPServer:
    """A server of ``index`` on ``host:port`` (port 0: a free one, see ``server.server_address``); not started."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/retrieve":
                return self._reply(404, {"error": f"no endpoint {self.path}; POST /retrieve"})
            try:
                queries, k, scores = _parse_request(self.rfile.read(int(self.headers.get("Content-Length", 0))),
                                                    topk)
            except ValueError as e:
                return self._reply(400, {"error": str(e)})
            hits = index.search(queries, k) if queries else []
            result = [[{"document": d, "score": s} if scores else d for d, s in row] for row in hits]
            self._reply(200, {"result": result})

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:  # one line per request is noise at training rates
            pass

    return ThreadingHTTPServer((host, port), Handler)


@command
def main(argv: list[str] | None = None) -> int:
    """Serve ``--corpus`` until interrupted; a bad corpus is refused (one line, exit status 2) before serving."""
    parser = argparse.ArgumentParser(prog="python -m actfirst.envs.search.server", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True, help='JSONL, one {"id": ..., "contents": ...} per line')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request names none")
    args = parser.parse_args(argv)
    if args.topk < 1:
        parser.error(f"--topk={args.topk}: must be >= 1")
    index = BM25Index(load_corpus(args.corpus))
    server = make_server(index, args.host, args.port, args.topk)
    host, port = server.server_address[:2]
    print(f"search_server: {len(index.docs)} passages, POST http://{host}:{port}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
