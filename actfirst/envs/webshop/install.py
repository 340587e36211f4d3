"""Where WebShop is installed, and how the one process that runs it (the WebShop server) imports it.

``scripts/setup_webshop.sh`` installs WebShop's official source at :data:`PINNED_COMMIT` into
``<WEBSHOP_HOME>/WebShop`` (with ``data/`` and ``search_engine/`` as WebShop's ``setup.sh`` lays them out), WebShop's
dependencies into ``<WEBSHOP_HOME>/deps`` (``scripts/webshop-constraints.txt``, beside the venv, never in it), and one
line into the venv, ``actfirst-webshop.pth``, that makes the source importable: ``web_agent_site`` is found from
every process of the venv, while only the server adds the dependencies (:func:`activate`), so that WebShop's pins
(pandas, scikit-learn, an old gym, pyserini's jar) never reach the trainer's imports. The install's
``actfirst-webshop.json`` names the commit and the dependency folder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import site
from pathlib import Path

WEBSHOP_REPO = "https://github.com/princeton-nlp/WebShop"
PINNED_COMMIT = "64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd"
"""The newest commit of WebShop's default branch (master, 2024-09-05), the one ``setup_webshop.sh`` installs."""
MANIFEST = "actfirst-webshop.json"
SETUP_SCRIPT = "scripts/setup_webshop.sh"
INSTALL_HINT = (f"WebShop is not installed (no 'web_agent_site' package in this environment; PyPI has no usable "
                f"WebShop). Install it with: bash {SETUP_SCRIPT} --catalog preview|full|generated "
                "(the official source at a pinned commit, its dependencies, the spaCy model, the search index; "
                "docs/environments.md#webshop)")


@dataclasses.dataclass(frozen=True, slots=True)
class WebShopInstall:
    """One WebShop source tree and what the setup script recorded about it."""

    root: Path
    """The source: ``web_agent_site/``, ``search_engine/`` and ``data/``."""
    deps: Path | None
    """WebShop's dependency folder (None: a WebShop installed otherwise, its dependencies in the environment)."""
    commit: str | None

    @property
    def data_dir(self) -> Path:
        """WebShop's ``data`` folder, where its code reads the goals and catalog by default."""
        return self.root / "data"

    @property
    def search_engine_dir(self) -> Path:
        """WebShop's ``search_engine`` folder (its converter, its indexes)."""
        return self.root / "search_engine"


def find_install() -> WebShopInstall | None:
    """The WebShop this environment imports (None: none)."""
    spec = importlib.util.find_spec("web_agent_site")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parents[1]
    manifest = root / MANIFEST
    if not manifest.is_file():
        return WebShopInstall(root, None, None)
    record = json.loads(manifest.read_text())
    return WebShopInstall(root, Path(record["deps"]), record["commit"])


def require_install() -> WebShopInstall:
    """:func:`find_install`, or an ``ImportError`` that says how to install WebShop."""
    install = find_install()
    if install is None:
        raise ImportError(INSTALL_HINT)
    return install


def activate(install: WebShopInstall) -> None:
    """Make WebShop's dependencies importable in this process, after the venv's own packages (``site.addsitedir``:
    appended to ``sys.path``); only the processes that run WebShop's code call it."""
    if install.deps is not None:
        if not install.deps.is_dir():
            raise ImportError(f"WebShop's dependency folder {install.deps} (named in {install.root / MANIFEST}) is "
                              f"missing: rerun bash {SETUP_SCRIPT}")
        site.addsitedir(str(install.deps))
