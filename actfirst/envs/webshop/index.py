"""WebShop's search index for a catalog, built by WebShop's own scripts, and the check that an index belongs to the
catalog it serves::

    python -m actfirst.envs.webshop.index --product-file F --attribute-file F --goal-file F --out DIR

runs WebShop's converter (``search_engine/convert_product_file_format.py``, unmodified) on ``--product-file`` and
then its ``run_indexing.sh`` (pyserini's Lucene indexer), both in ``DIR``, which gets what ``setup.sh`` makes in
``search_engine/``: ``resources*/`` and ``indexes``, ``indexes_100``, ``indexes_1k``, ``indexes_100k`` (the first N
products of the file; ``env.num_products`` picks one). The converter reads the catalog from WebShop's module
globals (``DEFAULT_FILE_PATH``; its README says to edit ``utils.py`` for the full catalog): they are set here
instead, together with the attribute and goal files its loader reads. Runs in the venv's interpreter with WebShop's
dependencies (``install.activate``).
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

from actfirst.core.user_input import ConfigError, check_exists, check_writable_dir, command

RESOURCES = ("resources", "resources_100", "resources_1k", "resources_100k")
"""The converter's output folders (``setup.sh`` makes them before it runs the converter)."""
INDEXES = {None: "indexes", 100: "indexes_100", 1000: "indexes_1k", 100000: "indexes_100k"}
"""The index of ``num_products`` products, as WebShop's ``init_search_engine`` picks it."""


def set_catalog(product_file: Path, attribute_file: Path, goal_file: Path) -> None:
    """Point WebShop's module globals at a catalog: where ``load_products`` reads the attributes and the human
    goals, and the product file the converter reads (WebShop reads these from its modules only)."""
    from web_agent_site import utils
    from web_agent_site.engine import engine

    utils.DEFAULT_FILE_PATH = str(product_file)
    engine.DEFAULT_ATTR_PATH = str(attribute_file)
    engine.HUMAN_ATTR_PATH = str(goal_file)


def index_mismatch(searcher, products: list[dict]) -> str | None:
    """Why ``searcher``'s index was not built from ``products`` (WebShop's loaded catalog), or None: the numbers of
    documents and products differ, or a product (first, middle, last) has no document."""
    if searcher.num_docs != len(products):
        return f"it holds {searcher.num_docs} products, the catalog {len(products)}"
    for product in (products[0], products[len(products) // 2], products[-1]) if products else ():
        if searcher.doc(product["asin"]) is None:
            return f"it has no document for product {product['asin']} of the catalog"
    return None


def build_index(root: Path, out: Path, *, product_file: Path, attribute_file: Path, goal_file: Path) -> None:
    """WebShop's converter and ``run_indexing.sh`` (from the source ``root``) on ``product_file``, in ``out``."""
    for name in RESOURCES:
        (out / name).mkdir(parents=True, exist_ok=True)
    set_catalog(product_file, attribute_file, goal_file)
    here = Path.cwd()
    os.chdir(out)  # the converter writes ./resources*/documents.jsonl
    try:
        runpy.run_path(str(root / "search_engine" / "convert_product_file_format.py"), run_name="__main__")
    finally:
        os.chdir(here)
    with tempfile.TemporaryDirectory() as bin_dir:  # run_indexing.sh calls `python`: this interpreter
        os.symlink(sys.executable, Path(bin_dir) / "python")
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        subprocess.run(["bash", str(root / "search_engine" / "run_indexing.sh")], cwd=out, env=env, check=True)


@command
def main(argv: list[str] | None = None) -> int:
    from actfirst.envs.webshop.install import activate, require_install

    parser = argparse.ArgumentParser(prog="python -m actfirst.envs.webshop.index", description=__doc__.split("\n")[0])
    for flag in ("--product-file", "--attribute-file", "--goal-file", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    for flag in ("product_file", "attribute_file", "goal_file"):
        check_exists(getattr(args, flag), f"--{flag.replace('_', '-')}", "file")
    check_writable_dir(args.out, "--out")
    install = require_install()
    activate(install)
    try:
        build_index(install.root, Path(args.out).absolute(), product_file=Path(args.product_file).absolute(),
                    attribute_file=Path(args.attribute_file).absolute(), goal_file=Path(args.goal_file).absolute())
    except subprocess.CalledProcessError as e:
        raise ConfigError(f"--out={args.out!r}: WebShop's run_indexing.sh failed (exit status {e.returncode}; "
                          "above)") from None
    print(f"index: {Path(args.out) / INDEXES[None]} built from {args.product_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
