"""Search (UOPD, D.1, D.5, E.3): the verbatim prompt and episode layout, output parsing, the real BM25 server in
Search-R1's protocol on a loopback port, the turn limit in training and evaluation, exact match, and the errors."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actfirst.core.config import ConfigError, RolloutConfig, SchedulerConfig, ThinkingBudgetConfig, TrainConfig
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.search.config import SearchConfig
from actfirst.envs.search.env import SearchTextEnv
from actfirst.envs.search.retrieval import RetrievalError
from actfirst.envs.search.server import load_corpus
from actfirst.envs.search.text import (
    FORCED_ANSWER,
    INVALID_ACTION,
    SEARCH_PROMPT,
    SEARCH_RESPONSES,
    exact_match,
    last_answer,
    normalize_answer,
    parse_output,
)

PAPER = next((Path(__file__).parents[3] / "shared" / "papers").glob("003_*.txt"), None)
PASSAGES = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, designed by Gustave Eiffel."),
    ("Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832."),
    ("Dijon", "Dijon is a city in eastern France, the capital of the Cote-d'Or department."),
    ("Statue of Liberty", "The Statue of Liberty stands on Liberty Island in New York Harbor."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge volume."),
    ("Marie Curie", "Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity."),
    ("Python (language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications built across northern China."),
    ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
    ("Tokyo", "Tokyo is the capital of Japan and its most populous city."),
    ("Moon", "The Moon is Earth's only natural satellite."),
]
QUESTIONS = [
    {"question": "where was the designer of the eiffel tower born", "golden_answers": ["Dijon"],
     "data_source": "hotpotqa"},
    {"question": "What is the capital of Japan?", "golden_answers": ["Tokyo", "Tokyo, Japan"], "data_source": "nq"},
    {"question": "Who created Python?", "golden_answers": "Guido van Rossum", "data_source": "bamboogle"},
]


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """The real BM25 server, started by its one command on a free loopback port, over the dozen passages above
    (Search-R1's corpus format). In its own process: bm25s imports numba, and with llvmlite loaded vLLM 0.32 cannot
    start another engine in this process (its Triton kernel scan trips over llvmlite's ``ffi.lib``)."""
    corpus = write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl",
                         [{"id": str(i), "contents": f'"{t}"\n{x}'} for i, (t, x) in enumerate(PASSAGES)])
    proc = subprocess.Popen([sys.executable, "-m", "actfirst.envs.search.server", "--corpus", corpus, "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "search_server: 12 passages, POST http://127.0.0.1:<port>/retrieve"
    assert "POST http://" in line, f"the server did not start: {line!r} (exit status {proc.poll()})"
    yield line.rsplit("POST ", 1)[1].strip()
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def config(tmp_path, server_url):
    data = write_jsonl(tmp_path / "test.jsonl", QUESTIONS)
    return SearchConfig(retrieval_url=server_url, train_file=data, test_files=[data], max_turns=8)


def test_prompt_is_e3_verbatim_with_search_r1_newline():
    if PAPER is not None:
        paper = " ".join(PAPER.read_text().split())
        assert SEARCH_PROMPT.removesuffix("Question: {question}\n") + "Question: {question}" in paper
        assert INVALID_ACTION in paper and FORCED_ANSWER in paper
    assert SEARCH_PROMPT.endswith("For example, <answer> Beijing </answer>. Question: {question}\n")


def test_parsing_cuts_after_the_first_complete_field():
    out = parse_output("<think>hm</think> <search> eiffel designer </search> trailing <answer>x</answer>")
    assert (out.kind, out.content, out.text) == ("search", "eiffel designer",
                                                 "<think>hm</think> <search> eiffel designer </search>")
    out = parse_output("<search> unclosed <answer> Dijon </answer> more")
    assert (out.kind, out.content, out.text) == ("answer", "Dijon", "<search> unclosed <answer> Dijon </answer>")
    out = parse_output("<think>no action</think> <search> never closed")
    assert (out.kind, out.content, out.text) == (None, "", "<think>no action</think> <search> never closed")
    assert SEARCH_RESPONSES.stop == ("</search>", "</answer>")
    assert SEARCH_RESPONSES.early_stop_text("<think> long") == ""
    assert SEARCH_RESPONSES.extract_action("a <answer>b</answer> c", truncated=False) == "a <answer>b</answer>"


def test_episode_layout_search_reply_and_training_limit(config):
    env = SearchTextEnv(config)
    task = get_benchmark("search", config).tasks("eval")[0]
    first = env.reset(task)
    prompt = SEARCH_PROMPT.format(question="where was the designer of the eiffel tower born?")
    assert first.observation == prompt and not first.finished
    out1 = "<think>who designed it</think>\n<search> Gustave Eiffel French civil engineer born </search>"
    nxt = env.step(out1 + " junk after the tag")
    reply = nxt.observation.removeprefix(prompt + out1)
    assert reply.startswith("\n\n<information>Doc 1: (Title: \"Gustave Eiffel\") Gustave Eiffel was a French civil "
                            "engineer born in Dijon in 1832.\nDoc 2: ") and reply.endswith("</information>\n\n")
    assert reply.count("Doc ") == 3 and "Doc 3: (Title: " in reply and nxt.valid and not nxt.finished
    bad = env.step("I think the answer is Dijon.")
    assert bad.observation == nxt.observation + "I think the answer is Dijon." + f"\n{INVALID_ACTION}\n"
    assert not bad.valid and bad.turn == 2
    for _ in range(5):
        last = env.step("<search> Dijon </search>")
    assert last.turn == 7 and not last.finished
    last = env.step("<search> Dijon </search>")
    assert (last.turn, last.truncated, last.done, last.score, last.won) == (8, True, False, 0.0, False)


def test_answer_ends_the_episode_with_exact_match(config):
    env = SearchTextEnv(config)
    tasks = get_benchmark("search", config).tasks("eval")
    env.reset(tasks[1])
    end = env.step("<think>known</think> <answer> the TOKYO. </answer> extra")
    assert (end.done, end.won, end.score, end.turn) == (True, True, 100.0, 1)
    assert end.observation.endswith("<answer> the TOKYO. </answer>")
    env.reset(tasks[2])
    assert env.step("<answer>Rossum</answer>").score == 0.0
    assert [get_benchmark("search", config).task_type(t) for t in tasks] == ["hotpotqa", "nq", "bamboogle"]
    assert [t.key for t in tasks] == ["hotpotqa/0", "nq/0", "bamboogle/0"]


def test_normalization_and_exact_match_by_hand():
    assert normalize_answer("  The  Eiffel-Tower, a tower! ") == "eiffeltower tower"
    assert exact_match("An Apple", ["apple"]) and exact_match("tokyo japan", ["Kyoto", "Tokyo, Japan"])
    assert not exact_match("Tokyo Tower", ["Tokyo"]) and not exact_match("theory", ["ory"])
    assert last_answer(["<answer> first </answer>", "x <answer>second</answer>"]) == "second"
    assert last_answer(["<search> q </search>"]) is None


def test_evaluation_forces_one_more_answer_turn(config):
    env = SearchTextEnv(config)
    env.reset(get_benchmark("search", config).tasks("eval")[0])
    for _ in range(8):
        last = env.step("no tags")
    assert last.truncated
    forced = env.force_answer()
    assert forced.observation == last.observation + FORCED_ANSWER + "\n" and not forced.finished
    assert last.observation.endswith("\n")  # so the instruction starts a new line
    end = env.step("<answer> Dijon </answer>")
    assert (end.turn, end.done, end.won) == (9, True, True)
    with pytest.raises(RuntimeError, match="only once"):
        env.force_answer()


def test_bad_retrieval_url_is_named(config):
    env = SearchTextEnv(SearchConfig(retrieval_url="http://127.0.0.1:9/retrieve", test_files=config.test_files,
                                     timeout_s=5))
    env.reset(get_benchmark("search", config).tasks("eval")[0])
    with pytest.raises(RetrievalError, match=r"retrieval_url='http://127.0.0.1:9/retrieve': cannot reach"):
        env.step("<search> x </search>")
    wrong_path = SearchTextEnv(SearchConfig(retrieval_url=config.retrieval_url.replace("retrieve", "nope"),
                                            test_files=config.test_files))
    wrong_path.reset(get_benchmark("search", config).tasks("eval")[0])
    with pytest.raises(RetrievalError, match=r"retrieval_url='.*/nope': the server answered HTTP 404"):
        wrong_path.step("<search> x </search>")


def test_malformed_corpus_refused_by_the_server_command(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"T\\"\\ntext"}\n{"id": "1", "text": "no contents"}\n')
    run = subprocess.run([sys.executable, "-m", "actfirst.envs.search.server", "--corpus", str(bad), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert f"--corpus='{bad}': line 2 is not a passage" in run.stderr
    with pytest.raises(ConfigError, match=r"--corpus='missing.jsonl': no such file"):
        load_corpus("missing.jsonl")


def test_fast_action_strategies_refused_up_front(tmp_path):
    (tmp_path / "m").mkdir()
    base = Path(__file__).parents[2] / "configs" / "train" / "search" / "opd-qwen2.5-1.5b.yaml"
    from actfirst.core.schema import load_config

    paths = [f"student.model={tmp_path / 'm'}", f"teacher={tmp_path / 'm'}"]
    cfg = load_config(TrainConfig, base, paths)
    assert cfg.rollout.strategy == "vanilla" and cfg.references is None and cfg.seed == 42
    assert (cfg.num_updates, cfg.rollout.batch_tasks, cfg.batch_samples) == (300, 64, 64)  # Sec. 5.1, D.4
    assert (cfg.evaluation.temperature, cfg.evaluation.seeds, cfg.env.max_turns) == (0.0, [42], 8)  # D.5
    for strategy in ("actfirst", "no_id", "no_nap", "ref_prefix_50", "ref_prefix_100", "b2f"):
        with pytest.raises(ConfigError, match=f"rollout.strategy='{strategy}': .*benchmark 'search'"):
            load_config(TrainConfig, base, paths + [f"rollout.strategy={strategy}"])


def test_tiny_model_evaluation_episode(config, engine, tiny_model_dir):
    """One end-to-end evaluation on the real engine: the random tiny model writes no tags, so every turn is invalid
    and the episode gets the forced-answer turn: 3 turns at max_turns=2, stop strings passed to the engine."""
    from actfirst.evaluation.evaluate import evaluate

    engine.reconfigure(SchedulerConfig(b_max=4))
    benchmark = get_benchmark("search", SearchConfig(retrieval_url=config.retrieval_url, max_turns=2,
                                                     test_files=config.test_files, train_file=config.train_file))
    budget = ThinkingBudgetConfig(first_stage=8, total=8, second_stage=1, eval_first_stage=8, eval_total=8,
                                  fast_action_tokens=8)
    rollout = RolloutConfig(strategy="vanilla", max_prompt_tokens=1500, temperature=0.0, budget=budget)
    report = asyncio.run(evaluate(engine, AutoTokenizer.from_pretrained(tiny_model_dir), benchmark,
                                  benchmark.tasks("eval")[:2], seeds=[42], rollout=rollout, max_in_flight=2,
                                  progress=False))
    assert [(r.turns, r.failure, r.success) for r in report.episodes] == [(3, None, False)] * 2
