"""WebShop's data as ``python -m actfirst.data webshop`` fetches it: the files WebShop's ``./setup.sh -d all`` and
``-d small`` download (its Google Drive ids, through gdown), into WebShop's own ``data`` folder when WebShop is
installed.

The files (``env.product_file``, ``env.attribute_file``, ``env.goal_file``) may also be named by path. WebShop's
search index is built by WebShop's own scripts from the same catalog: ``scripts/setup_webshop.sh`` fetches the files
with this and builds the index.
"""

from __future__ import annotations

from pathlib import Path

from actfirst.preparation.downloads import BenchmarkData, DriveFile, Source, drive_url


def _drive(name: str, file_id: str, what: str) -> Source:
    return Source(name.removesuffix(".json"), (DriveFile(drive_url(file_id), name),), "copy", what=what)


def webshop_data_dir() -> Path | None:
    """WebShop's own ``data`` folder (None: WebShop is not installed)."""
    from actfirst.envs.webshop.install import find_install

    install = find_install()
    return None if install is None else install.data_dir


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
            lines.append("WebShop is not installed: bash scripts/setup_webshop.sh --catalog preview|full installs it, "
                         "fetches these files into its data folder and builds their search index "
                         "(docs/environments.md#webshop)")
        if own is None or dest.resolve() != own.resolve():
            lines.append(f"set env.product_file={dest / 'items_shuffle.json'} "
                         f"env.attribute_file={dest / 'items_ins_v2.json'} "
                         f"env.goal_file={dest / 'items_human_ins.json'} "
                         "(the preview: items_shuffle_1000.json, items_ins_v2_1000.json)")
        if own is not None:
            lines.append("build the catalog's search index: bash scripts/setup_webshop.sh --catalog preview|full")
        return lines
