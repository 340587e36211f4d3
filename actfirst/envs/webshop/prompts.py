"""WebShop's prompt templates (Appendix B.1): full response, next-action prediction, inverse dynamics."""

from actfirst.prompts import REFERENCE, Mode

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
