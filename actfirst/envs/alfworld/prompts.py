"""ALFWorld's prompt templates: B.1's (full response, next-action prediction, inverse dynamics) and the UOPD
paper's (003 E.1)."""

from actfirst.envs.base import Transition
from actfirst.rollout.prompts import HISTORY, NO_HISTORY, REFERENCE, Mode, RecentStepsPrompts

_HEAD = ("You are an expert agent operating in the ALFRED Embodied Environment. "
         "Your task is to: {task_description}\n")
_ADMISSIBLE = "Your admissible actions of the current situation are: [{admissible_actions}].\n"
_FULL = ("\nNow it’s your turn to take an action.\n"
         "You should first reason step-by-step about the current situation. This reasoning process MUST be "
         "enclosed within <think> </think> tags.\n"
         "Once you’ve finished your reasoning, you should choose an admissible action for current step and "
         "present it within <action> </action> tags.")
_NAP = ("\nNow it’s your turn to take an action.\n"
        "You should choose an admissible action for current step and present it within <action> </action> tags.")
_ID = (REFERENCE.format(terminal="state")
       + "The reference next observation is the direct result of exactly one action. Do not insert an "
         "intermediate or preparatory action.\n" + _ADMISSIBLE
       + "\nNow it’s your turn to take one action for the current step. Predict the MISSING CURRENT ACTION that "
         "leads to the reference next observation.\n"
         "You should choose one admissible action and present it within <action> </action> tags.")

TEMPLATES = {
    Mode.FULL_RESPONSE: (_HEAD, HISTORY, NO_HISTORY, _ADMISSIBLE + _FULL),
    Mode.NEXT_ACTION: (_HEAD, HISTORY, NO_HISTORY, _ADMISSIBLE + _NAP),
    Mode.INVERSE_DYNAMICS: (_HEAD, HISTORY, NO_HISTORY, _ID),
}
"""(head, with-history block, no-history block, tail) per mode; ``{admissible_actions}`` from ``prompt_fields``."""


# 003 E.1, word for word ("it's" with the straight apostrophe, as 003 prints it); the line breaks the paper's text lost
# are restored as in the GiGPO/verl-agent templates its teacher was trained with.
_E1_ASK = ("Your admissible actions of the current situation are: [{admissible_actions}].\n"
           "\nNow it's your turn to take an action.\n"
           "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
           "within <think> </think> tags.\n"
           "Once you've finished your reasoning, you should choose an admissible action for current step and present "
           "it within <action> </action> tags.")
E1_FIRST = ("You are an expert agent operating in the ALFRED Embodied Environment.\n"
            "Your current observation is: {current_observation}\n" + _E1_ASK)
"""E.1's first-step template: without the task, which the first observation already contains."""
E1_LATER = ("You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
            "{task_description}\n" + HISTORY + _E1_ASK)
"""E.1's template of every later step."""


def e1_fields(current: Transition) -> dict[str, str]:
    """E.1's ``{admissible_actions}``: the admissible commands except help (the environment's admissible list leaves
    it out), each in single quotes, one per line (verl-agent's separator, a line break and a space)."""
    return {"admissible_actions": "\n ".join(f"'{a}'" for a in current.admissible)}


UOPD_PROMPTS = RecentStepsPrompts(first=E1_FIRST, later=E1_LATER, first_steps=1, fields=e1_fields)
"""003 E.1: the first template for the first step, then the second with the min(2, steps taken) latest steps."""
