"""WebShop's data as ``python -m actfirst.data webshop`` fetches it: the files WebShop's ``./setup.sh -d all`` and
``-d small`` download (its Google Drive ids, through gdown), into WebShop's own ``data`` folder when WebShop is
installed.

WebShop reads its goals (``items_human_ins.json``) only from its ``data`` folder; the catalog
(``env.product_file``, ``env.attribute_file``) may be named by path. WebShop's search index is built by WebShop's
own scripts from the same catalog (``search_engine/``), which this does not do.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from actfirst.preparation.downloads import BenchmarkData, DriveFile, Source, drive_url


def _drive(name: str, file_id: str, what: str) -> Source:
    return Source(name.removesuffix(".json"), (DriveFile(drive_url(file_id), name),), "copy", what=what)


def webshop_data_dir() -> Path | None:
    """WebShop's own ``data`` folder (beside its ``web_agent_site`` package; None: WebShop is not installed)."""
    spec = importlib.util.find_spec("web_agent_site")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parents[1] / "data"


class WebShopData(BenchmarkData):
    """The full catalog (C.1), its 1,000-product preview and the human goals."""

    sources = (
        _drive("items_shuffle.json", "1A2whVgOO0euk5O13n2iYDM0bQRkkRduB", "the full product catalog (C.1)"),
        _drive("items_ins_v2.json", "1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi", "the full catalog's attributes"),
        _drive("items_human_ins.json", "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O", "the human goals (instructions)"),
        _drive("items_shuffle_1000.json", "1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib", "the 1,000-product preview"),
        _drive("items_ins_v2_1000.json", "1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu", "the preview's attributes"),
    )

    def default_dest(self) -> Path:
        """WebShop's ``data`` folder when WebShop is installed, else ``data/webshop``."""
        return webshop_data_dir() or Path("data") / "webshop"

    def next_steps(self, dest: Path) -> list[str]:
        own = webshop_data_dir()
        lines = [f"WebShop's files are in {dest}"]
        if own is None:
            lines.append("WebShop is not installed: install it from source (docs/environments.md#webshop) and put "
                         "items_human_ins.json in its data folder (WebShop reads its goals only from there)")
        elif dest.resolve() != own.resolve():
            lines.append(f"WebShop reads items_human_ins.json only from {own}: copy it there")
        if own is None or dest.resolve() != own.resolve():
            lines.append(f"set env.product_file={dest / 'items_shuffle.json'} "
                         f"env.attribute_file={dest / 'items_ins_v2.json'}")
        lines.append("build WebShop's search index from the same catalog: cd <WebShop>/search_engine && python "
                     "convert_product_file_format.py && ./run_indexing.sh (WebShop's setup.sh steps)")
        return lines
