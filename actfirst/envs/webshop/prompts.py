"""WebShop's prompt templates: B.1's (full response, next-action prediction, inverse dynamics) and the UOPD paper's
(003 E.2)."""

from actfirst.envs.webshop.transition import WebShopTransition
from actfirst.rollout.prompts import REFERENCE, Mode, RecentStepsPrompts

_HEAD = ("You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
         "Your task is to: {task_description}.\n")
_FULL_HISTORY = ("Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
                 "{history_length} observations and the corresponding actions you took: {action_history}\n"
                 "You are now at step {current_step} and your current observation is: {current_observation}.\n")
_HISTORY = ("Prior to this step, you have already taken {step_count} step(s). Below are the recent "
            "{history_length} observations and the corresponding actions you took:\n{action_history}\n"
            "You are now at step {current_step} and your current observation is:\n{current_observation}\n")
_FULL_NO_HISTORY = "Your current observation is: {current_observation}.\n"
_NO_HISTORY = "Your current observation is:\n{current_observation}\n"
_ADMISSIBLE = "Your admissible actions of the current situation are:\n[\n{available_actions}\n].\n"
_FULL = ("\nNow it’s your turn to take one action for the current step.\n"
         "You should first reason step-by-step about the current situation, then think carefully which admissible "
         "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
         "tags.\n"
         "Once you’ve finished your reasoning, you should choose an admissible action for current step and present "
         "it within <action> </action> tags.")
_NAP = ("\nNow it’s your turn to take one action for the current step.\n"
        "You should choose an admissible action for current step and present it within <action> </action> tags.")
_ID = (REFERENCE.format(terminal="Score page")
       + "If the missing current action is search[…], reconstruct the query most likely to produce the reference "
         "next observation. Do not add price or budget terms to the query.\n" + _ADMISSIBLE
       + "\nNow it’s your turn to take one action for the current step. Predict the MISSING CURRENT ACTION that "
         "leads to the reference next observation.\n"
         "You should choose one admissible action and present it within <action> </action> tags.")

TEMPLATES = {
    Mode.FULL_RESPONSE: (_HEAD, _FULL_HISTORY, _FULL_NO_HISTORY, _ADMISSIBLE + _FULL),
    Mode.NEXT_ACTION: (_HEAD, _HISTORY, _NO_HISTORY, _ADMISSIBLE + _NAP),
    Mode.INVERSE_DYNAMICS: (_HEAD, _HISTORY, _NO_HISTORY, _ID),
}
"""(head, with-history block, no-history block, tail) per mode; ``{available_actions}`` from ``prompt_fields``."""



def available_actions(current: WebShopTransition) -> dict[str, str]:
    """The ``{available_actions}`` field: ``search[<your query>]`` where the page has a search bar, then
    ``click[<element>]`` per clickable element, each in single quotes, one per line."""
    actions = ["search[<your query>]"] if current.has_search_bar else []
    actions += [f"click[{c}]" for c in current.admissible]
    return {"available_actions": ",\n".join(f"'{a}'" for a in actions)}


def one_line(observation: str) -> str:
    """An observation flattened to one line (003 E.2): each line break, with the spaces around it, one space."""
    return " ".join(line.strip() for line in observation.strip().splitlines() if line.strip())


# 003 E.2, word for word ("it's" with the straight apostrophe, as 003 prints it); the line breaks the paper's text lost
# are restored as in the GiGPO/verl-agent templates its teacher was trained with (those of B.1's full response).
_E2_HEAD = ("You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
            "Your task is to: {task_description}.\n")
_E2_ASK = ("Your admissible actions of the current situation are:\n[\n{available_actions}\n].\n"
           "\nNow it's your turn to take one action for the current step.\n"
           "You should first reason step-by-step about the current situation, then think carefully which admissible "
           "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
           "tags.\n"
           "Once you've finished your reasoning, you should choose an admissible action for current step and present "
           "it within <action> </action> tags.")
E2_FIRST = _E2_HEAD + "Your current observation is: {current_observation}.\n" + _E2_ASK
"""E.2's first template (the first two steps)."""
E2_LATER = _E2_HEAD + _FULL_HISTORY + _E2_ASK
"""E.2's second template (from the third step on)."""

UOPD_PROMPTS = RecentStepsPrompts(first=E2_FIRST, later=E2_LATER, first_steps=2, fields=available_actions,
                                  observation=one_line)
"""003 E.2: the first template for two steps, then the second with the two latest steps, observations on one line."""
