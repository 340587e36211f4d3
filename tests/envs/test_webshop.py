"""WebShop parsing, transition-check rules (Appendix B.5) and oracle solutions (C.2), on pages and goals in WebShop's
own formats, with or without WebShop installed (the real simulator's tests: test_webshop_server.py).

The pages below are written in the format of its text environment (observation mode "text": elements joined by
" [SEP] "; the "text_rich" mode's click notifications "You have clicked ..." on their own lines) and the goals in the
format of its goal list.
"""

import json
import re
from pathlib import Path

import pytest

from actfirst.core.user_input import ConfigError
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.webshop import install
from actfirst.envs.webshop.checks import (
    is_search_results,
    normalize_webshop_observation,
    parse_webshop_action,
    webshop_action_valid,
    webshop_check,
    webshop_reference_product,
)
from actfirst.envs.webshop.config import WebShopConfig
from actfirst.envs.webshop.env import (
    WebShopGoal,
    WebShopTextEnv,
    instruction_of,
    oracle_actions,
    oracle_option_clicks,
    oracle_query,
    parse_score,
    strip_instruction,
    webshop_split,
)
from actfirst.envs.webshop.server import catalog_path
from actfirst.preparation.reference_cache import load_references, transition_config

POOLS = Path(__file__).resolve().parents[2] / "actfirst" / "envs" / "webshop"

INSTRUCTION = "WebShop [SEP] Instruction: [SEP] i need a red cotton shirt, and price lower than 40.00 dollars"
HOME = f"{INSTRUCTION} [SEP] Search"


def results(*asins, total=50):
    items = " [SEP] ".join(f"{a} [SEP] Shirt {a} [SEP] $12.99" for a in asins)
    return f"{INSTRUCTION} [SEP] Back to Search [SEP] Page 1 (Total results: {total}) [SEP] Next > [SEP] {items}"


PRODUCT = (f"{INSTRUCTION} [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] red [SEP] blue [SEP] "
           "Red Cotton Shirt [SEP] Price: $12.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] "
           "Reviews [SEP] Buy Now")
SCORE = ("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk interface.) "
         "[SEP] Purchased [SEP] asin [SEP] B09ABC1234 [SEP] options [SEP] {'color': 'red'} [SEP] Reward [SEP] "
         "Your score (min 0.0, max 1.0) [SEP] 0.75 [SEP] Reward Details [SEP] None")
RESULT_CLICKS = ["back to search", "next >", "b09abc1234", "b07xyz9876"]


def test_parse_actions():
    assert parse_webshop_action("search[red cotton shirt]") == ("search", "red cotton shirt")
    assert parse_webshop_action("  click[Buy Now] ") == ("click", "Buy Now")
    assert parse_webshop_action("CLICK[next >]") == ("click", "next >")
    assert parse_webshop_action("buy the shirt") is None
    assert parse_webshop_action("search red shirt") is None


def test_action_validity():
    assert webshop_action_valid("search[red shirt]", has_search_bar=True, clickables=[])
    assert not webshop_action_valid("search[ ]", has_search_bar=True, clickables=[])  # empty query
    assert not webshop_action_valid("search[red shirt]", has_search_bar=False, clickables=RESULT_CLICKS)
    assert webshop_action_valid("click[B09ABC1234]", has_search_bar=False, clickables=RESULT_CLICKS)  # lowercased
    assert not webshop_action_valid("click[b00nothere]", has_search_bar=False, clickables=RESULT_CLICKS)
    assert not webshop_action_valid("go somewhere", has_search_bar=True, clickables=RESULT_CLICKS)


def test_observation_normalization_removes_click_notifications_and_keeps_instruction():
    rich = "You have clicked red.\nYou have clicked b09abc1234.\n" + PRODUCT.replace(" [SEP] ", "\n")
    assert normalize_webshop_observation(rich) == normalize_webshop_observation(PRODUCT.replace(" [SEP] ", "\n"))
    assert "instruction:" in normalize_webshop_observation(PRODUCT)
    assert is_search_results(results("B09ABC1234")) and not is_search_results(PRODUCT)


def test_instruction_block_and_score_page():
    assert instruction_of(HOME) == "i need a red cotton shirt, and price lower than 40.00 dollars"
    assert strip_instruction(PRODUCT).startswith("Back to Search [SEP] < Prev")
    assert strip_instruction("Back to Search") == "Back to Search"
    assert parse_score(SCORE) == 75.0 and parse_score(PRODUCT) is None


def check(**override):
    kwargs = dict(action="click[b09abc1234]", has_search_bar=False, clickables=RESULT_CLICKS, done=False,
                  ref_done=False, next_observation=PRODUCT, ref_next_observation=PRODUCT,
                  next_clickables=["back to search", "< prev", "red", "blue", "buy now"],
                  ref_next_clickables=["buy now", "blue", "red", "< prev", "back to search"],
                  next_has_search_bar=False, ref_next_has_search_bar=False, ref_action="click[b09abc1234]",
                  ref_product=None)
    kwargs.update(override)
    return webshop_check(**kwargs)


def test_ordinary_rules_both_ways():
    assert check().passed  # available actions compared sorted
    assert check(action="click[b07xyz9876]", ref_action="click[b09abc1234]").passed  # the action need not match
    assert check(action="click[nothere]").reason == "invalid action"
    assert check(done=True).reason == "termination mismatch"
    other = PRODUCT.replace("Red Cotton Shirt", "Blue Linen Shirt")
    assert check(next_observation=other).reason == "observation mismatch"
    assert check(next_clickables=["back to search", "buy now"]).reason == "available actions mismatch"
    assert check(next_has_search_bar=True).reason == "available actions mismatch"
    notified = "You have clicked b09abc1234.\n" + PRODUCT
    assert check(next_observation=notified).passed  # click notifications ignored
    assert check(next_observation=PRODUCT.upper().replace("[SEP]", "[SEP]  ")).passed  # case, whitespace


def test_terminal_transitions_compare_observations_only():
    buy = dict(action="click[buy now]", clickables=["buy now"], done=True, ref_done=True, next_observation=SCORE,
               ref_next_observation=SCORE, ref_action="click[buy now]")
    assert check(**buy, next_clickables=[], ref_next_clickables=["back to search"]).passed
    assert not check(**{**buy, "next_observation": SCORE.replace("0.75", "0.5")}).passed


def test_reference_product_is_the_product_of_the_click_right_after_the_search():
    actions = ["search[red shirt]", "click[B09ABC1234]", "click[red]", "click[buy now]"]
    assert webshop_reference_product(actions, 0) == "b09abc1234"
    assert webshop_reference_product(actions, 1) is None  # not a search
    assert webshop_reference_product(["search[red shirt]"], 0) is None  # nothing follows
    # A page button names no product (B.5: "the product identifier in the reference's immediately following click").
    for button in ("Next >", "< Prev", "Back to Search"):
        assert webshop_reference_product(["search[red shirt]", f"click[{button}]", "click[b09abc1234]"], 0) is None
    assert webshop_reference_product(["search[red shirt]", "search[shirt]", "click[b09abc1234]"], 0) is None


def search_check(**override):
    kwargs = dict(action="search[red cotton shirt]", has_search_bar=True, clickables=[],
                  next_observation=results("B07XYZ9876", "B09ABC1234"), ref_next_observation=results("B09ABC1234"),
                  next_clickables=RESULT_CLICKS, ref_next_clickables=["back to search", "next >", "b09abc1234"],
                  ref_action="search[red shirt cotton]", ref_product="b09abc1234")
    kwargs.update(override)
    return check(**kwargs)


def test_search_results_exception_at_the_search():
    result = search_check()
    assert result.passed and result.reason == "search-results mismatch allowed"
    # The reference product is not clickable for the student: fail, even with other products and "next >" there.
    assert not search_check(next_clickables=["back to search", "next >", "b07xyz9876"]).passed
    # The reference action was not a search: ordinary rules.
    assert not search_check(ref_action="click[next >]").passed
    # The student's action was not a search (but a valid click): ordinary rules.
    assert not search_check(action="click[next >]", clickables=RESULT_CLICKS).passed
    # No reference product (the reference's next click is a page button, or nothing follows).
    assert not search_check(ref_product=None).passed
    # A non-results page never gets the exception.
    assert not search_check(next_observation=PRODUCT).passed


def test_search_results_exception_at_the_next_turn():
    # The student's page still differs from the reference's; the product click that follows meets ordinary rules.
    student_page = ["back to search", "next >", "b07xyz9876", "b09abc1234"]
    follow = dict(action="click[b09abc1234]", clickables=student_page, ref_action="click[b09abc1234]",
                  ref_product="b09abc1234", after_search_mismatch=True)
    assert check(**follow).passed
    # The reference product must remain clickable on the student's page.
    gone = check(**{**follow, "clickables": ["back to search", "next >", "b07xyz9876"], "action": "click[next >]"})
    assert gone.reason == "reference product not clickable"
    # Another transition fails as usual: another product's page, or a results page where the reference has the
    # product's page (the exception holds at the search's turn only).
    other_product = PRODUCT.replace("Red Cotton", "Blue Linen")
    assert check(**follow, next_observation=other_product).reason == "observation mismatch"
    page2 = check(**{**follow, "action": "click[next >]"}, next_observation=results("B01AAA0000"),
                  next_clickables=["back to search", "< prev", "b01aaa0000", "b09abc1234"])
    assert page2.reason == "observation mismatch"


# -- Oracle solutions (C.2), built from hand-made goals in the format of WebShop's goal list ---------------------

GOAL = WebShopGoal(
    instruction="i need a men's red cotton shirt in x-large, and price lower than 40.00 dollars", asin="B09ABC1234",
    options=("Red/Black", "X-Large"), price_upper=40.0,
    product_options={"color": ("blue", "red | black"), "size": ("large", "x-large")})


def test_oracle_query_is_the_instruction_without_its_price_clause():
    assert oracle_query(GOAL.instruction) == "i need a men's red cotton shirt in x-large"
    assert oracle_query("Find a [blue] mug") == "find a blue mug"  # brackets would end the search action early
    assert oracle_query("a mug, and price lower than 100.00 dollars, please") == (
        "a mug, and price lower than 100.00 dollars, please")  # only WebShop's own trailing clause goes


def test_oracle_actions_search_click_the_product_choose_options_and_buy():
    assert oracle_actions(GOAL) == ["search[i need a men's red cotton shirt in x-large]", "click[b09abc1234]",
                                    "click[red | black]", "click[x-large]", "click[buy now]"]
    assert oracle_actions(GOAL, result_page=3)[1:4] == ["click[next >]", "click[next >]", "click[b09abc1234]"]
    for page in (0, 6):
        with pytest.raises(ValueError, match=f"result_page={page}"):
            oracle_actions(GOAL, result_page=page)
    plain = WebShopGoal(instruction="a mug", asin="B01MUG0000", options=(), price_upper=1e6, product_options={})
    assert oracle_actions(plain) == ["search[a mug]", "click[b01mug0000]", "click[buy now]"]


def test_oracle_options_are_the_products_own_values_one_per_name():
    # Options the product does not offer are left out; a second value of an already chosen name too.
    goal = WebShopGoal(instruction="x", asin="B0", options=("large", "Purple", "x-large", "red | black"),
                       price_upper=1e6, product_options=GOAL.product_options)
    assert oracle_option_clicks(goal) == ["click[large]", "click[red | black]"]


def test_catalog_is_a_named_file(tmp_path):
    assert WebShopConfig().product_file == "items_shuffle.json"  # C.1: the full catalog, not WebShop's preview
    assert WebShopConfig().attribute_file == "items_ins_v2.json" and WebShopConfig().num_products is None
    (tmp_path / "items_shuffle.json").write_text("[]")
    assert catalog_path(tmp_path, "items_shuffle.json", "product_file") == tmp_path / "items_shuffle.json"
    elsewhere = tmp_path / "mine.json"
    elsewhere.write_text("[]")
    assert catalog_path(tmp_path / "data", str(elsewhere), "product_file") == elsewhere  # a path is taken as is
    with pytest.raises(ConfigError, match=r"attribute_file='items_ins_v2.json': no such file"):
        catalog_path(tmp_path, "items_ins_v2.json", "attribute_file")
    with pytest.raises(ConfigError, match=r"num_products=500: must be null"):
        WebShopConfig(num_products=500)
    with pytest.raises(ConfigError, match=r"product_file=' ': must name a file"):
        WebShopConfig(product_file=" ")


def test_a_reference_cache_records_its_catalog(tmp_path):
    """The catalog shapes the goal list and every page: a cache built on another one is refused."""
    config = WebShopConfig(product_file="items_shuffle_1000.json", attribute_file="items_ins_v2_1000.json",
                           num_products=1000)
    cache = tmp_path / "webshop.jsonl"
    cache.write_text("")
    meta = {"benchmark": "webshop", "config": transition_config(config), "coverage": 1.0}
    (tmp_path / "webshop.jsonl.meta.json").write_text(json.dumps(meta))
    assert meta["config"]["product_file"] == "items_shuffle_1000.json"
    assert load_references(cache, benchmark=get_benchmark("webshop", config)) == {}
    with pytest.raises(ConfigError, match=r"built under another webshop config \(4 key\(s\) differ, e.g. "
                                          r"attribute_file: cache 'items_ins_v2_1000.json', run 'items_ins_v2.json'"):
        load_references(cache, benchmark=get_benchmark("webshop"))


def test_splits_and_missing_install(monkeypatch):
    assert len(webshop_split("train")) == 4096 and webshop_split("eval")[0].goal_idx == 4096
    assert len(webshop_split("eval")) == 100
    with pytest.raises(ValueError, match="split='test'"):
        webshop_split("test")
    monkeypatch.setattr(install, "find_install", lambda: None)  # fault injection: WebShop absent where it is not
    with pytest.raises(ImportError, match="bash scripts/setup_webshop.sh --catalog preview"):
        WebShopTextEnv()


def test_003_goal_pools_are_selected_by_file(tmp_path):
    """D.1: the pools of the shipped files (6,410 training goals, 128 test goals disjoint from them) reach the
    splits; a pool file's errors and an overlap name the key, the file and the line."""
    config = WebShopConfig(product_file="items_shuffle_1000.json", attribute_file="items_ins_v2_1000.json",
                           num_products=1000, train_goals=str(POOLS / "003-train.txt"),
                           eval_goals=str(POOLS / "003-test-128.txt"))
    train, test = webshop_split("train", config), webshop_split("eval", config)
    assert len(train) == 6410 and (train[0].goal_idx, train[-1].goal_idx) == (500, 6909)
    assert [t.goal_idx for t in test] == list(range(128))
    bench = get_benchmark("webshop", config)
    assert bench.tasks("train") == train and bench.tasks("eval") == test
    pool = tmp_path / "pool.txt"
    for text, message in [("# nothing\n", "holds no goal index"), ("3\nseven\n", "line 2 ('seven')"),
                          ("9-4\n", "line 1 ('9-4') is an empty range"), ("1-3\n2\n", "goal 2 is listed twice")]:
        pool.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            WebShopConfig(train_goals=str(pool))
        assert "train_goals=" in str(e.value)
        print(e.value)
    with pytest.raises(ConfigError, match="no such file"):
        WebShopConfig(eval_goals=str(tmp_path / "missing.txt"))
    pool.write_text("4100-4110\n")  # inside C.1's evaluation goals
    with pytest.raises(ConfigError, match=r"eval_goals=None: shares 11 goals with train_goals"):
        WebShopConfig(train_goals=str(pool))
