"""Search's config section (``env:`` of a Search run; ``actfirst/envs/search/search.yaml``)."""

from __future__ import annotations

import dataclasses

from actfirst.core.schema import check


@dataclasses.dataclass(kw_only=True, slots=True)
class SearchConfig:
    """Search (UOPD, Appendix D.1): Search-R1's questions, its retrieval server, top-3 passages, 8-turn limit."""

    retrieval_url: str = "http://127.0.0.1:8000/retrieve"
    """A server of Search-R1's retrieval protocol (``POST /retrieve``): Search-R1's e5 + FAISS server over its 2018
    Wikipedia for the paper's setting, or ``python -m actfirst.envs.search.server`` on a small corpus."""
    topk: int = 3
    """Passages per search (D.1: 3)."""
    max_turns: int = 8
    """Model outputs per episode (D.1: 8); evaluation adds one forced-answer turn after it (D.5)."""
    train_file: str = "data/search/train.jsonl"
    """Training questions, JSONL of ``{"question", "golden_answers", "data_source"}`` (D.1: NQ + HotpotQA train)."""
    test_files: list[str] = dataclasses.field(default_factory=lambda: ["data/search/test.jsonl"])
    """Evaluation questions, same format; each question's ``data_source`` is its task type (per-dataset EM)."""
    timeout_s: float = 60.0
    """A retrieval request without an answer for this long fails the episode."""

    def __post_init__(self) -> None:
        check(self.retrieval_url.startswith(("http://", "https://")), "retrieval_url", self.retrieval_url,
               "must be an http(s) URL of a retrieval server (POST /retrieve)")
        check(self.topk >= 1, "topk", self.topk, "must be >= 1")
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        check(bool(self.train_file.strip()), "train_file", self.train_file, "must name a JSONL file")
        check(bool(self.test_files), "test_files", self.test_files, "must name at least one JSONL file")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0")
