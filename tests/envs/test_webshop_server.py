"""The real WebShop simulator behind the node's WebShop server: its protocol, episodes through worker processes, the
goals every rank sees, the reward against WebShop's own ``get_reward``, a killed server started again, an index of
another catalog refused. Each test module builds its own small catalog (``catalog.py``, WebShop's formats) and its
index with WebShop's own converter and indexer (about half a minute); where WebShop is not installed every test
skips with one line naming the setup script (CI has no GitHub to install it from).
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.webshop.catalog import ATTRIBUTES_FILE, GOALS_FILE, PRODUCTS_FILE, write_catalog
from actfirst.envs.webshop.client import ServerFailed, ensure_server, server_pid, socket_path
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.env import BUY, WebShopTask, oracle_actions
from actfirst.envs.webshop.install import SETUP_SCRIPT, find_install
from actfirst.envs.workers import EnvError, EnvPool

pytestmark = pytest.mark.skipif(find_install() is None,
                                reason=f"WebShop is not installed (bash {SETUP_SCRIPT} --catalog generated)")
PRODUCTS = 200


@pytest.fixture(scope="module")
def catalog() -> Iterator[WebShopConfig]:
    """A 200-product catalog generated for this module and its index, as a config (the server exits 30 s after the
    module's last connection). In a folder of its own: a concurrent pytest session prunes old basetemp folders."""
    with tempfile.TemporaryDirectory(prefix="actfirst-webshop-test-") as folder:
        yield _catalog(Path(folder))


def _catalog(root: Path) -> WebShopConfig:
    files = write_catalog(root / "data", PRODUCTS, seed=3)
    subprocess.run([sys.executable, "-m", "actfirst.envs.webshop.index", "--product-file", str(files[PRODUCTS_FILE]),
                    "--attribute-file", str(files[ATTRIBUTES_FILE]), "--goal-file", str(files[GOALS_FILE]),
                    "--out", str(root / "index")], check=True, capture_output=True)
    return WebShopConfig(product_file=str(files[PRODUCTS_FILE]), attribute_file=str(files[ATTRIBUTES_FILE]),
                         goal_file=str(files[GOALS_FILE]), search_index=str(root / "index"), server_idle_exit_s=30)


def request(sock: socket.socket, **message) -> dict:
    sock.sendall(json.dumps(message).encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the connection"
        reply += chunk
    return json.loads(reply)


def test_server_protocol(catalog):
    """One JSON line per request, answered in order; a bad request is answered with an error and the connection
    stays usable; the episode's state belongs to the connection."""
    with ensure_server(catalog) as sock, ensure_server(catalog) as other:
        info = request(sock, op="info")
        assert info["products"] == PRODUCTS and info["goals"] > 100 and info["pid"] == server_pid(socket_path(catalog))
        first = request(sock, op="reset", goal=0)
        assert first["available"] == {"has_search_bar": True, "clickables": ["search"]}
        goal = request(sock, op="goal", goal=0)
        assert goal["instruction"] in first["observation"]
        page = request(sock, op="step", action=oracle_actions_of(goal)[0])
        assert page["done"] is False and "Page 1 (Total results:" in page["observation"]
        assert goal["asin"].lower() in page["available"]["clickables"]
        request(other, op="reset", goal=5)  # another connection's episode leaves this one where it is
        back = request(sock, op="step", action=f"click[{goal['asin'].lower()}]")
        assert "Buy Now" in back["observation"] and "buy now" in back["available"]["clickables"]
        assert "IndexError: goal 100000 is outside" in request(sock, op="reset", goal=100000)["error"]
        assert "op='jump'" in request(sock, op="jump")["error"]
        assert request(sock, op="info")["products"] == PRODUCTS


def oracle_actions_of(goal: dict) -> list[str]:
    from actfirst.envs.webshop.env import WebShopGoal

    return oracle_actions(WebShopGoal(goal["instruction"], goal["asin"], tuple(goal["options"]), goal["price_upper"],
                                      {k: tuple(v) for k, v in goal["product_options"].items()}))


def test_episodes_through_workers_and_the_check_on_real_pages(catalog):
    """The oracle's solutions (C.2) played by worker processes: valid actions, a purchase scored 100; a replay
    passes B.5's check against the first, turn by turn; an episode of two ranks' pools sees the same goals."""
    benchmark = get_benchmark("webshop", catalog)

    async def play():
        with EnvPool(benchmark.env_spec(), size=2) as rank0, EnvPool(benchmark.env_spec(), size=1) as rank1:
            tasks = [WebShopTask(i) for i in range(6)]
            goals = [[await w.acall("goal", t) for t in tasks] for w in rank0.workers + rank1.workers]
            played = []
            for task in tasks:
                for _, actions in await benchmark.candidates(rank0.workers[0], task):
                    played.append((task, actions, await replay_on(rank0.workers[1], task, actions),
                                   await replay_on(rank1.workers[0], task, actions)))
            return goals, played

    from actfirst.envs.base import Reference

    goals, played = asyncio.run(play())
    assert goals[0] == goals[1] == goals[2] and len({g.instruction for g in goals[0]}) == 6
    assert len(played) >= 4  # the oracle's search lists its product for most goals
    for task, actions, first, second in played:
        assert first[-1].done and first[-1].score == 100.0 and first[-1].won
        assert all(t.valid for t in first[1:]) and first == second
        reference = Reference(str(task.goal_idx), actions, first, "oracle")
        result = None
        for t, action in enumerate(actions):
            result = benchmark.check(reference, t, action=action, current=second[t], next=second[t + 1],
                                     previous=result)
            assert result.passed, (t, result.reason)


async def replay_on(worker, task, actions):
    transitions = [await worker.areset(task)]
    for action in actions:
        transitions.append(await worker.astep(action))
    return transitions


def test_reward_is_webshops_get_reward(catalog):
    """A purchase with one option other than the goal's: the episode's score is WebShop's own get_reward x 100,
    computed by a separate process that builds WebShop's SimServer as WebShop does (seed 233)."""
    benchmark = get_benchmark("webshop", catalog)

    async def buy():
        with EnvPool(benchmark.env_spec(), size=1) as pool:
            worker = pool.workers[0]
            for index in range(40):
                task = WebShopTask(index)
                goal = await worker.acall("goal", task)
                other = [(n, v) for n, values in goal.product_options.items() for v in values if v not in goal.options]
                candidates = await benchmark.candidates(worker, task)
                if not (other and candidates and goal.options):
                    continue
                actions = candidates[0][1][:-1] + [f"click[{other[0][1]}]", BUY]
                score = (await replay_on(worker, task, actions))[-1].score
                if score < 100:  # an option value too unlike the goal's for WebShop's fuzzy match
                    return index, goal.asin, score, dict(other[:1])
        raise AssertionError("no purchase of another option value scored below 100")

    index, asin, score, options = asyncio.run(buy())
    install = find_install()
    script = f"""
import json, random, site, sys
site.addsitedir({str(install.deps)!r})
from actfirst.envs.webshop.index import set_catalog
from pathlib import Path
set_catalog(Path({catalog.product_file!r}), Path({catalog.attribute_file!r}), Path({catalog.goal_file!r}))
from pyserini.search.lucene import LuceneSearcher
from web_agent_site.envs import web_agent_text_env
from web_agent_site.engine.goal import get_reward
web_agent_text_env.init_search_engine = lambda num_products: LuceneSearcher({str(catalog.search_index) + "/indexes"!r})
random.seed(233)
server = web_agent_text_env.SimServer("x", {catalog.product_file!r}, human_goals=True)
goal = server.goals[{index}]
assert goal["asin"] == {asin!r}
reward = get_reward(server.product_item_dict[goal["asin"]], goal, price=server.product_prices[goal["asin"]],
                    options=json.loads(sys.argv[1]))
print("REWARD", reward)
"""
    chosen = dict(options)
    page_options = _chosen_options(catalog, index, chosen)
    run = subprocess.run([sys.executable, "-c", script, json.dumps(page_options)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    reward = float(run.stdout.split("REWARD")[-1])
    assert 0 < score < 100
    assert score == pytest.approx(100 * reward, abs=1e-9)


def _chosen_options(catalog: WebShopConfig, index: int, chosen: dict) -> dict:
    """The options of the purchase as WebShop's session holds them: the goal's values, one replaced."""
    with ensure_server(catalog) as sock:
        goal = request(sock, op="goal", goal=index)
    options = {}
    for value in goal["options"]:
        name = next(n for n, values in goal["product_options"].items() if value.lower() in values and n not in options)
        options[name] = value.lower()
    options.update(chosen)
    return options


def test_a_killed_server_is_started_again(catalog):
    """SIGKILL to the server mid-episode: the step fails (the episode is lost), the next reset on the same worker
    starts a new server, which builds the same goals."""
    benchmark = get_benchmark("webshop", catalog)

    async def play():
        with EnvPool(benchmark.env_spec(), size=1) as pool:
            worker = pool.workers[0]
            before = await worker.acall("goal", WebShopTask(7))
            await worker.areset(WebShopTask(7))
            pid = server_pid(socket_path(catalog))
            os.kill(pid, signal.SIGKILL)
            while server_pid(socket_path(catalog)) == pid:
                time.sleep(0.05)
            with pytest.raises(EnvError, match="ServerLost: the WebShop server"):
                await worker.astep("search[anything]")
            first = await worker.areset(WebShopTask(7))
            after = await worker.acall("goal", WebShopTask(7))
            return pid, server_pid(socket_path(catalog)), before, after, first

    old, new, before, after, first = asyncio.run(play())
    assert new is not None and new != old
    assert before == after and before.instruction in first.observation


def test_an_index_of_another_catalog_is_refused(catalog, tmp_path):
    """Same size, other products: the server refuses to start, and says which key and what to rebuild."""
    files = write_catalog(tmp_path, PRODUCTS, seed=4)
    other = WebShopConfig(product_file=str(files[PRODUCTS_FILE]), attribute_file=str(files[ATTRIBUTES_FILE]),
                          goal_file=str(files[GOALS_FILE]), search_index=catalog.search_index, server_idle_exit_s=5)
    with pytest.raises(ServerFailed, match=r"search_index=.*was not built from product_file=.*no document for product"):
        ensure_server(other)


def test_a_stopped_server_leaves_no_socket(catalog):
    """SIGTERM (or the idle timeout) ends the server with its socket and pid file removed: the next start is clean."""
    path = socket_path(catalog)
    ensure_server(catalog).close()
    pid = server_pid(path)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while server_pid(path) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_pid(path) is None
    assert not path.exists() and not path.with_suffix(".pid").exists()
