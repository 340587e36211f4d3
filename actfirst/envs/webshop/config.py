"""WebShop's config section (``env:`` of a WebShop run; its default file: ``webshop.yaml`` beside this module)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from actfirst.core.schema import check, paths_checked
from actfirst.envs.webshop.goals import goal_pool


@dataclasses.dataclass(kw_only=True, slots=True)
class WebShopConfig:
    """WebShop as Appendix C.1 sets it up (goals 0-4095 train, 4096-4195 evaluation; 15-turn limit), or 003's D.1
    (the 1,000-product catalog, goal pools by file)."""

    EVALUATION_ONLY: ClassVar[tuple[str, ...]] = ("server_start_timeout_s", "server_idle_exit_s")
    """Keys a reference cache does not record: they shape no transition (the server's limits)."""

    max_turns: int = 15
    product_file: str = "items_shuffle.json"
    """WebShop's product catalog: a file in WebShop's ``data`` folder, or a path. C.1 uses "the full product
    catalog": ``items_shuffle.json`` (about 1.18M products; ``./setup.sh -d all``). WebShop's own default,
    ``items_shuffle_1000.json``, is its 1,000-product preview. WebShop's search index must be built from the same
    file."""
    attribute_file: str = "items_ins_v2.json"
    """The product attributes that go with ``product_file`` (``items_ins_v2_1000.json`` with the preview); WebShop's
    reward matches the goal's attributes against them."""
    goal_file: str = "items_human_ins.json"
    """WebShop's human goals (instructions by product), a file in its ``data`` folder or a path; its goal list is
    built from the instructions of the catalog's products."""
    num_products: int | None = None
    """Use only the first N products of ``product_file`` (None: all of them, as C.1 does). WebShop has search
    indexes for 100, 1000 and 100000 only."""
    search_index: str | None = None
    """The folder of the search indexes built from ``product_file`` (``indexes``, ``indexes_1k``, ...; one per
    ``num_products``), a name in WebShop's ``search_engine`` folder or a path: ``scripts/setup_webshop.sh --catalog
    X`` builds ``search_engine/<X>`` (``preview``, ``full``, ``generated-<N>``). None: the ``search_engine`` folder
    itself, where WebShop's own ``setup.sh`` builds them. An index of another catalog is refused at start."""
    server_start_timeout_s: float = 3600.0
    """How long the node's WebShop server may take to load the catalog, goals and search engine (measured per
    catalog size: docs/environments.md#webshop)."""
    server_idle_exit_s: float = 900.0
    """The server exits after this long without a connected worker (the next run, or the next stage of this one,
    starts it again)."""

    train_goals: str | None = None
    """The training goal pool: a file of goal indices (``actfirst.envs.webshop.goals``), or None for C.1's goals
    0-4095. 003's pool of 6,410 instructions (D.1, with the 1,000-product catalog):
    ``actfirst/envs/webshop/003-train.txt``."""
    eval_goals: str | None = None
    """The evaluation goal pool, disjoint from ``train_goals``: a file, or None for C.1's goals 4096-4195. 003's 128
    test instructions (D.1): ``actfirst/envs/webshop/003-test-128.txt``."""

    def __post_init__(self) -> None:
        check(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        for key in ("product_file", "attribute_file", "goal_file"):
            check(bool(getattr(self, key).strip()), key, getattr(self, key), "must name a file")
        check(self.num_products in (None, 100, 1000, 100000), "num_products", self.num_products,
               "must be null (all of product_file) or one of WebShop's index sizes 100, 1000, 100000")
        check(self.search_index is None or bool(self.search_index.strip()), "search_index", self.search_index,
              "must name a folder, or be null")
        for key in ("server_start_timeout_s", "server_idle_exit_s"):
            check(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        if paths_checked():
            train = set(goal_pool("train", self.train_goals, "train_goals"))
            shared = sorted(train.intersection(goal_pool("eval", self.eval_goals, "eval_goals")))
            check(not shared, "eval_goals", self.eval_goals, f"shares {len(shared)} goals with train_goals "
                  f"(first: {shared[:3]}); evaluation goals must be disjoint from the training pool")
