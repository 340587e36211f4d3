"""ScienceWorld's prompt templates (Appendix B.1): full response, next-action prediction, inverse dynamics."""

from actfirst.rollout.prompts import HISTORY, NO_HISTORY, REFERENCE, Mode

_HEAD = "Your ScienceWorld task is: {task_description}\n"
_AVAILABLE = ("Available action commands: [{action_templates}]\n"
              "Available objects you can interact with: [{objects}]\n")
_FULL = (_AVAILABLE
         + "\nNow it’s your turn to take an action. Combine an action command with appropriate object(s) to form a "
           "valid action.\n"
           "You should first reason step-by-step about the current situation. This reasoning process MUST be "
           "enclosed within <think> </think> tags.\n"
           "Once you’ve finished your reasoning, you should choose a valid action for the current step and present "
           "it within <action> </action> tags.")
_NAP = (_AVAILABLE
        + "\nNow it’s your turn to take an action. Combine an action command with appropriate object(s) to form a "
          "valid action.\n"
          "You should choose a valid action for the current step and present it within <action> </action> tags.")
_ID = (REFERENCE.format(terminal="state") + _AVAILABLE
       + "\nNow it’s your turn to take one action for the current step. Predict the MISSING CURRENT ACTION that "
         "leads to the reference next observation.\n"
         "Combine an action command with appropriate object(s), then present exactly one action within "
         "<action> </action> tags.")

TEMPLATES = {
    Mode.FULL_RESPONSE: (_HEAD, HISTORY, NO_HISTORY, _FULL),
    Mode.NEXT_ACTION: (_HEAD, HISTORY, NO_HISTORY, _NAP),
    Mode.INVERSE_DYNAMICS: (_HEAD, HISTORY, NO_HISTORY, _ID),
}
"""(head, with-history block, no-history block, tail) per mode; ``{action_templates}`` and ``{objects}`` from
``prompt_fields``."""
