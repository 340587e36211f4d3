"""WebShop parsing and transition-check rules (Appendix B.5) on observations in WebShop's own text format.

WebShop cannot be installed here (its code and data are not on PyPI), so the pages below are written in the
format of its text environment (observation mode "text": elements joined by " [SEP] "; the "text_rich" mode's
click notifications "You have clicked ..." on their own lines).
"""

import builtins

import pytest

from actfirst.envs.checks import (is_search_results, normalize_webshop_observation, parse_webshop_action,
                                  webshop_action_valid, webshop_check)
from actfirst.envs.webshop_env import (EVAL_GOALS, TRAIN_GOALS, WebShopTextEnv, instruction_of, parse_score,
                                       strip_instruction, webshop_split)

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
                  ref_following_action="click[red]")
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
               ref_next_observation=SCORE, ref_action="click[buy now]", ref_following_action=None)
    assert check(**buy, next_clickables=[], ref_next_clickables=["back to search"]).passed
    assert not check(**{**buy, "next_observation": SCORE.replace("0.75", "0.5")}).passed


def search_check(**override):
    kwargs = dict(action="search[red cotton shirt]", has_search_bar=True, clickables=[],
                  next_observation=results("B07XYZ9876", "B09ABC1234"), ref_next_observation=results("B09ABC1234"),
                  next_clickables=RESULT_CLICKS, ref_next_clickables=["back to search", "next >", "b09abc1234"],
                  ref_action="search[red shirt cotton]", ref_following_action="click[B09ABC1234]")
    kwargs.update(override)
    return check(**kwargs)


def test_search_results_exception_at_the_current_turn():
    result = search_check()
    assert result.passed and result.reason == "search-results mismatch allowed"
    # The reference's next product is not clickable for the student: fail.
    assert not search_check(next_clickables=["back to search", "next >", "b07xyz9876"]).passed
    # The reference action was not a search: ordinary rules.
    assert not search_check(ref_action="click[next >]").passed
    # The student's action was not a search (but a valid click): ordinary rules.
    assert not search_check(action="click[next >]", clickables=RESULT_CLICKS).passed
    # The reference's following action is not a click on a product.
    assert not search_check(ref_following_action=None).passed
    # A non-results page never gets the exception.
    assert not search_check(next_observation=PRODUCT).passed


def test_search_results_exception_at_the_next_turn():
    page2 = dict(action="click[next >]", has_search_bar=False, clickables=RESULT_CLICKS,
                 next_observation=results("B01AAA0000", "B09ABC1234"), ref_next_observation=results("B09ABC1234"),
                 next_clickables=["back to search", "< prev", "b01aaa0000", "b09abc1234"],
                 ref_next_clickables=["back to search", "< prev", "b09abc1234"], ref_action="click[next >]",
                 ref_following_action="click[b09abc1234]")
    assert not check(**page2).passed  # without a preceding allowed search mismatch: ordinary rules
    assert check(**page2, after_search_mismatch=True).passed
    gone = {**page2, "next_clickables": ["back to search", "< prev", "b01aaa0000"]}
    assert not check(**gone, after_search_mismatch=True).passed  # reference product no longer clickable
    # The click on the product that follows must satisfy the ordinary rules, even after a mismatch.
    assert not check(next_observation=PRODUCT.replace("$12.99", "$13.99"), after_search_mismatch=True).passed


def test_splits_and_missing_install(monkeypatch):
    assert len(webshop_split("train")) == 4096 and webshop_split("eval")[0].goal_idx == 4096
    assert len(TRAIN_GOALS) + len(EVAL_GOALS) == 4196
    with pytest.raises(ValueError, match="split='test'"):
        webshop_split("test")
    real_import = builtins.__import__

    def no_webshop(name, *args, **kwargs):  # fault injection: WebShop absent even where it is installed
        if name.startswith("web_agent_site"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_webshop)
    with pytest.raises(ImportError, match="git clone https://github.com/princeton-nlp/WebShop"):
        WebShopTextEnv()
