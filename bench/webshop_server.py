"""What the node's WebShop server costs per catalog size: its start (load) time, its memory, the catalog's and
index's disk, and a worker's start once the server runs.

    python bench/webshop_server.py --products 1000 10000 100000 [--out bench/webshop_server.json]

Per size: a catalog generated in WebShop's formats (``actfirst.envs.webshop.catalog``, seed 0) and its index built
by WebShop's converter and indexer (``actfirst.envs.webshop.index``), in a temporary folder; then
``python -m actfirst.envs.webshop.server --check`` in its own process (load the catalog, goals and search engine as
the server does, one reset): its wall and CPU seconds, its resident and peak memory (the JVM runs inside it). Then
the server itself, and the seconds two worker processes take to start against it (spawn, import, connect). Needs
WebShop installed (``scripts/setup_webshop.sh``). Generated products are not WebShop's: the JSON bytes per product
are in the report, to scale by.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from actfirst.core.user_input import check_writable_file, command, positive_int
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.webshop.catalog import ATTRIBUTES_FILE, GOALS_FILE, PRODUCTS_FILE, write_catalog
from actfirst.envs.webshop.client import server_pid, socket_path
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.workers import EnvPool


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(products: int, work: Path) -> dict:
    """One catalog size's figures (see the module docstring)."""
    files = write_catalog(work / "data", products)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "actfirst.envs.webshop.index", "--product-file", str(files[PRODUCTS_FILE]),
                    "--attribute-file", str(files[ATTRIBUTES_FILE]), "--goal-file", str(files[GOALS_FILE]),
                    "--out", str(work / "index")], check=True, capture_output=True)
    index_s = time.perf_counter() - started
    config = WebShopConfig(product_file=str(files[PRODUCTS_FILE]), attribute_file=str(files[ATTRIBUTES_FILE]),
                           goal_file=str(files[GOALS_FILE]), search_index=str(work / "index"), server_idle_exit_s=10)
    overrides = [f"{k}={json.dumps(getattr(config, k))}" for k in ("product_file", "attribute_file", "goal_file",
                                                                    "search_index")]
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "actfirst.envs.webshop.server", "--check", *overrides], check=True,
                         capture_output=True, text=True).stdout
    wall = time.perf_counter() - started
    line = next(x for x in out.splitlines() if x.startswith("webshop_server:"))
    load_s, cpu_s, rss, peak = (float(x) for x in re.search(
        r"loaded in ([\d.]+) s \(([\d.]+) s CPU\), (\d+) MiB resident \(peak (\d+) MiB\)", line).groups())
    started = time.perf_counter()
    spec = get_benchmark("webshop", config).env_spec()  # starts the server and waits for it
    server_s = time.perf_counter() - started
    started = time.perf_counter()
    with EnvPool(spec, size=2):
        workers_s = time.perf_counter() - started
    os.kill(server_pid(socket_path(config)), 15)
    return {"products": products, "catalog_json_mib": round(files[PRODUCTS_FILE].stat().st_size / 2**20, 1),
            "json_bytes_per_product": round(files[PRODUCTS_FILE].stat().st_size / products),
            "index_mib": round(_du(work / "index") / 2**20, 1), "index_build_s": round(index_s, 1),
            "process_wall_s": round(wall, 1), "load_s": load_s, "load_cpu_s": cpu_s, "rss_mib": rss,
            "peak_rss_mib": peak,
            "server_start_s": round(server_s, 1), "two_workers_start_s": round(workers_s, 1),
            "loadavg": open("/proc/loadavg").read().split()[:3]}


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=positive_int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--out", default="bench/webshop_server.json")
    args = parser.parse_args(argv)
    check_writable_file(args.out, "--out")
    rows = []
    for products in args.products:
        with tempfile.TemporaryDirectory() as work:
            rows.append(measure(products, Path(work)))
        print(json.dumps(rows[-1]), flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
