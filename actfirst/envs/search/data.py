"""Search's data as ``python -m actfirst.data search`` fetches it through huggingface_hub (UOPD D.1, in Search-R1's
setting), into ``data/search`` by default, where ``actfirst/envs/search/search.yaml`` reads the questions:

- the questions: FlashRAG's JSONL files on Hugging Face (``RUC-NLPIR/FlashRAG_datasets``), the ones Search-R1's
  ``qa_search_train_merge.py`` (NQ + HotpotQA train: 169,615) and ``qa_search_test_merge.py`` (HotpotQA,
  2WikiMultiHopQA, MuSiQue dev, Bamboogle test: 22,523) read, written as ``train.jsonl`` and ``test.jsonl`` of
  ``{"question", "golden_answers", "data_source"}``;
- the corpus: Search-R1's 2018 Wikipedia (``PeterJinGo/wiki-18-corpus``), ``wiki-18.jsonl``;
- the index: Search-R1's e5 flat FAISS index (``PeterJinGo/wiki-18-e5-index``, two parts), ``e5_Flat.index``.
"""

from __future__ import annotations

import json
from pathlib import Path

from actfirst.core.files import write_atomically
from actfirst.preparation.downloads import BenchmarkData, HubFile, Source

FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"
CORPUS = "PeterJinGo/wiki-18-corpus"
INDEX = "PeterJinGo/wiki-18-e5-index"
REVISION = "main"
"""The revision the Hub repos are fetched at: no commit of theirs could be read from where this was written (no
network to the Hub), so ``main``, resolved to its commit on the first fetch and pinned from then on
(``<dest>/.actfirst-data/<source>.pin``; the command prints it). The sizes below fix the large files."""
QUESTION_FILES = {
    "train.jsonl": [("nq", "train"), ("hotpotqa", "train")],
    "test.jsonl": [("hotpotqa", "dev"), ("2wikimultihopqa", "dev"), ("musique", "dev"), ("bamboogle", "test")],
}
"""Each question file we write -> the FlashRAG (dataset, split) files it holds, in order (the dataset is each
question's ``data_source``); the test splits are those Search-R1's script takes (test, else dev)."""
RAW = "flashrag"


class SearchData(BenchmarkData):
    """Search-R1's questions, corpus and e5 index."""

    sources = (
        Source("questions", tuple(HubFile(FLASHRAG, f"{ds}/{split}.jsonl", f"{ds}-{split}.jsonl", REVISION)
                                  for pairs in QUESTION_FILES.values() for ds, split in pairs), "copy", target=RAW,
               what="NQ + HotpotQA train, HotpotQA/2Wiki/MuSiQue dev, Bamboogle test -> train.jsonl, test.jsonl"),
        Source("corpus", (HubFile(CORPUS, "wiki-18.jsonl.gz", "wiki-18.jsonl.gz", REVISION, size=5_123_307_260),),
               "gzip", target="wiki-18.jsonl", what="Search-R1's 2018 Wikipedia passages (the retrieval corpus)"),
        Source("index", (HubFile(INDEX, "part_aa", "part_aa", REVISION, size=42_949_672_960),
                         HubFile(INDEX, "part_ab", "part_ab", REVISION, size=21_609_402_413)), "concat",
               target="e5_Flat.index",
               what="Search-R1's e5-base-v2 flat FAISS index of the corpus (only for its e5 server): two parts, "
                    "joined (twice its 60 GiB on disk while joining)"),
    )
    """The sizes: the two index parts add up to a flat FAISS index of 21,015,324 passages x 768 float32 plus its
    45-byte header (64,559,075,373 bytes); the parts' split and the corpus archive's size as third-party download
    scripts record them (not fetched from here)."""

    def default_dest(self) -> Path:
        """``data/search``: where ``actfirst/envs/search/search.yaml`` reads the questions."""
        return Path("data") / "search"

    def finish(self, dest: Path) -> None:
        """``train.jsonl`` and ``test.jsonl`` from the FlashRAG files, once they are all there (kept if written)."""
        for out, pairs in QUESTION_FILES.items():
            inputs = [dest / RAW / f"{ds}-{split}.jsonl" for ds, split in pairs]
            if (dest / out).is_file() or not all(f.is_file() for f in inputs):
                continue
            rows = []
            for (ds, _), file in zip(pairs, inputs, strict=False):
                with file.open() as f:
                    for line in filter(str.strip, f):
                        row = json.loads(line)
                        rows.append(json.dumps({"question": row["question"], "golden_answers": row["golden_answers"],
                                                "data_source": ds}))
            write_atomically(dest / out, "\n".join(rows) + "\n")

    def next_steps(self, dest: Path) -> list[str]:
        lines = [f"Search's data is in {dest}"]
        if dest.resolve() != self.default_dest().resolve():
            lines.append(f"set env.train_file={dest / 'train.jsonl'} env.test_files=[{dest / 'test.jsonl'}]")
        lines += [f"retrieval (env.retrieval_url): Search-R1's e5 server with --index_path {dest / 'e5_Flat.index'} "
                  f"--corpus_path {dest / 'wiki-18.jsonl'} (docs/search.md), or the BM25 stand-in: python -m "
                  f"actfirst.envs.search.server --corpus {dest / 'wiki-18.jsonl'}"]
        return lines
