"""A client of Search-R1's retrieval-server protocol (``search_r1/search/retrieval_server.py``).

``POST <retrieval_url>`` with ``{"queries": [...], "topk": k, "return_scores": true}`` answers
``{"result": [[{"document": {"id": ..., "contents": "\\"Title\\"\\ntext"}, "score": ...}, ...], ...]}``: one list of
passages per query, best first. The UOPD setting (D.1) serves Search-R1's e5-base-v2 + flat FAISS index over its 2018
Wikipedia; ``python -m actfirst.envs.search.server`` serves a BM25 index of a small corpus in the same protocol.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence


class RetrievalError(RuntimeError):
    """The retrieval server could not be reached or did not answer in its protocol; the message names
    ``retrieval_url``."""


def retrieve(url: str, queries: Sequence[str], topk: int, timeout_s: float) -> list[list[str]]:
    """The ``contents`` of the top ``topk`` passages for each query, best first (one request for all queries)."""
    body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300]
        raise RetrievalError(f"retrieval_url={url!r}: the server answered HTTP {e.code} {e.reason} "
                             f"({detail})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RetrievalError(f"retrieval_url={url!r}: cannot reach the retrieval server ({reason}); start one "
                             f"(python -m actfirst.envs.search.server --corpus ...) or point retrieval_url at "
                             f"yours") from None
    return _contents(url, raw, len(queries))


def _contents(url: str, raw: bytes, num_queries: int) -> list[list[str]]:
    """The passages' ``contents`` of a server answer; anything off-protocol is a :class:`RetrievalError`."""
    try:
        result = json.loads(raw)["result"]
        if not isinstance(result, list) or len(result) != num_queries:
            raise TypeError(f"{num_queries} lists of passages expected")
        return [[str(hit["document"]["contents"]) for hit in hits] for hits in result]
    except (ValueError, KeyError, TypeError) as e:
        raise RetrievalError(f"retrieval_url={url!r}: not an answer of Search-R1's retrieval protocol "
                             f"({type(e).__name__}: {e}; got {raw[:200]!r})") from None
