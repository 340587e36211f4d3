"""ALFWorld's prompt templates (Appendix B.1): full response, next-action prediction, inverse dynamics."""

from actfirst.prompts import HISTORY, NO_HISTORY, REFERENCE, Mode

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
