"""Prompts (Appendix B.1) and history management (Appendix B.2).

Three generation modes per benchmark: the full response (think-then-act), next-action prediction (NAP, action
only) and reference-conditioned inverse dynamics (action only, with the reference next observation). A benchmark's
templates (``Benchmark.templates``, in its package's ``prompts``) are the paper's, word for word; the paper's text
lost its spaces and line breaks, which are restored in the layout of the GiGPO/verl-agent prompts the paper builds
on (one line per sentence group, a blank line before "Now it's your turn"). The paper's typographic characters are kept
as printed: ’ in "it’s", the en dash in "–[MISSING CURRENT ACTION]–>", the ellipsis in "search[…]".

History (B.2): the stored history is the executed observation–action pairs, never reasoning or unexecuted actions.
For each request the oldest pair is dropped until the chat-templated prompt fits its token budget; with no pair
left the no-history template is used. The task, the current observation, the admissible-action information and the
reference next observation are never shortened.

These are the ``actfirst`` prompt set (``rollout.prompts``, the default). The ``uopd`` set is the UOPD paper's
(003 Appendix E.1/E.2, a benchmark's ``Benchmark.uopd_prompts``): think-then-act only, a first template for the
first step(s) and a second after them showing the most recent steps (two, fewer only while fewer were taken), with
no B.2 fitting (:func:`recent_steps_prompt`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Literal

from actfirst.envs.base import Transition
from actfirst.envs.benchmarks import Benchmark


class PromptTooLong(ValueError):
    """Even the no-history prompt exceeds what the model can take for this request (``limit_tokens``: its
    max_model_len less the response's token budget). B.2 shortens nothing but the history: not the current
    observation, the admissible-action information or the reference next observation (nor the task instruction)."""


PromptSet = Literal["actfirst", "uopd"]
"""The prompt sets (``rollout.prompts``): ``actfirst``, 000's B.1 templates with B.2's history; ``uopd``, 003's E.1/E.2
templates with their two-step history (think-then-act only)."""


class Mode(enum.Enum):
    FULL_RESPONSE = "full_response"
    NEXT_ACTION = "next_action"
    INVERSE_DYNAMICS = "inverse_dynamics"


# -- Blocks the benchmarks' templates share ---------------------------------------------------------------------

HISTORY = ("Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
           "{history_length} observations and the corresponding actions you took: {action_history}\n"
           "You are now at step {current_step} and your current observation is: {current_observation}\n")
"""The with-history block of ALFWorld's and ScienceWorld's templates (verl-agent's)."""
NO_HISTORY = "Your current observation is: {current_observation}\n"
"""The no-history block of ALFWorld's and ScienceWorld's templates."""
REFERENCE = ("Complete the missing current action in this reference transition:\n"
             "Current observation –[MISSING CURRENT ACTION]–> reference next observation.\n"
             "The reference next observation is the environment state immediately after the missing current action. "
             "It may be a terminal {terminal}.\n"
             "Reference next observation:\n{{reference_next_observation}}\n")
"""The reference block opening every inverse-dynamics template (``terminal``: what the benchmark ends in)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One executed observation–action pair of the stored history h_t (B.2)."""

    observation: str
    action: str


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered request: chat-templated token ids, the user text, and how many history pairs it kept."""

    token_ids: list[int]
    text: str
    history_kept: int
    over_budget: bool = False
    """No history left and still over the B.2 budget: the no-history prompt went ahead as it is (B.2)."""


def unchanged(observation: str) -> str:
    """An observation as it is (a :class:`RecentStepsPrompts` that shows observations unchanged)."""
    return observation


@dataclasses.dataclass(frozen=True, slots=True)
class RecentStepsPrompts:
    """A benchmark's UOPD-paper prompts (003 Appendix E.1/E.2), think-then-act only: ``first`` for the first
    ``first_steps`` steps of an episode (no history), then ``later`` with the most recent ``min(window, steps taken)``
    executed steps in :func:`format_history`'s entries. The history is never fitted to a budget (B.2 is 000's)."""

    first: str
    later: str
    first_steps: int
    """Steps the first template serves (E.1 ALFWorld: 1; E.2 WebShop: 2)."""
    fields: Callable[[Transition], dict[str, str]]
    """The admissible-action fields of the templates, from the current transition."""
    observation: Callable[[str], str] = unchanged
    """How an observation is shown, the current one and the history's (E.2 WebShop: flattened to one line)."""
    window: int = 2
    """The most recent steps shown (E.1/E.2: 2)."""


def format_history(history: Sequence[Step], first_step: int) -> str:
    """verl-agent's memory format: ``[Observation k: '...', Action k: '...']`` per pair, k counted from 1."""
    return "\n".join(f"[Observation {first_step + i}: '{s.observation}', Action {first_step + i}: '{s.action}']"
                     for i, s in enumerate(history))


def render(benchmark: Benchmark, mode: Mode, *, task_description: str, history: Sequence[Step], step_count: int,
           current: Transition, reference_next_observation: str | None = None) -> str:
    """The user message for one request. ``history`` is the retained suffix of the stored history;
    ``step_count`` the number of steps taken so far (the full history length); ``reference_next_observation`` is
    shown as given (``Benchmark.reference_observation`` prepares it)."""
    if (mode is Mode.INVERSE_DYNAMICS) != (reference_next_observation is not None):
        raise ValueError(f"reference_next_observation={reference_next_observation!r}: required for inverse "
                         f"dynamics and only there (mode={mode.value})")
    if mode not in benchmark.templates:
        raise ValueError(f"mode={mode.value}: benchmark {benchmark.name!r} has no such prompt template (B.1)")
    head, with_history, no_history, tail = benchmark.templates[mode]
    fields = dict(task_description=task_description, current_observation=current.observation,
                  step_count=step_count, current_step=step_count + 1, history_length=len(history),
                  action_history=format_history(history, step_count - len(history) + 1),
                  reference_next_observation=reference_next_observation, **benchmark.prompt_fields(current))
    return (head + (with_history if history else no_history) + tail).format(**fields)


def build_prompt(tokenizer, benchmark: Benchmark, mode: Mode, *, task_description: str, history: Sequence[Step],
                 current: Transition, budget_tokens: int, limit_tokens: int | None = None,
                 reference_next_observation: str | None = None, prompts: PromptSet = "actfirst") -> Prompt:
    """Render the request with as much recent history as fits ``budget_tokens`` after the chat template (B.2).

    The stored ``history`` is not modified. B.2 removes the oldest pairs "until it fits or no history remains" and
    then uses the no-history template: a no-history prompt over the budget goes ahead as it is (``over_budget``).
    ``PromptTooLong`` is raised only when it exceeds ``limit_tokens`` (what the model can take for this request;
    None: no limit), since B.2 shortens nothing else.
    Action-only modes render with ``enable_thinking=False``: with a real Qwen3 chat template the generation prompt
    then holds an empty thinking block, so a fast action is an action without preceding reasoning (Eq. 6-7); our
    own template ignores the flag.
    A benchmark whose observation is the whole prompt (Search) goes to :func:`observation_prompt`, whatever
    ``prompts`` says (its one prompt is E.3's); ``prompts="uopd"`` goes to :func:`recent_steps_prompt`.
    Dropping the oldest pair one at a time until the prompt fits keeps the longest suffix that fits; since a
    shorter suffix never needs more tokens, that suffix is found by bisection (about log2(len(history)) + 1
    tokenizations instead of one per dropped pair).
    """
    if benchmark.prompt_is_observation:
        return observation_prompt(tokenizer, benchmark, mode, current, budget_tokens, limit_tokens)
    if prompts == "uopd":
        return recent_steps_prompt(tokenizer, benchmark, mode, task_description=task_description, history=history,
                                   current=current, budget_tokens=budget_tokens, limit_tokens=limit_tokens)

    def attempt(start: int) -> Prompt:
        text = render(benchmark, mode, task_description=task_description, history=history[start:],
                      step_count=len(history), current=current, reference_next_observation=reference_next_observation)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False,
                                            enable_thinking=mode is Mode.FULL_RESPONSE)
        return Prompt(list(ids), text, len(history) - start)

    best = attempt(0)
    if len(best.token_ids) <= budget_tokens:
        return best
    lo, hi, best = 0, len(history), attempt(len(history))  # invariant: start lo does not fit, start hi does
    if len(best.token_ids) > budget_tokens:
        if limit_tokens is not None and len(best.token_ids) > limit_tokens:
            raise PromptTooLong(
                f"the {benchmark.name} {mode.value} prompt without history needs {len(best.token_ids)} tokens, more "
                f"than the model takes with this request's response budget ({limit_tokens}); B.2 shortens only the "
                f"history (not the current observation, admissible actions or reference)")
        return dataclasses.replace(best, over_budget=True)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        prompt = attempt(mid)
        if len(prompt.token_ids) <= budget_tokens:
            hi, best = mid, prompt
        else:
            lo = mid
    return best


def observation_prompt(tokenizer, benchmark: Benchmark, mode: Mode, current: Transition, budget_tokens: int,
                       limit_tokens: int | None) -> Prompt:
    """The prompt of a benchmark whose observation is the whole prompt (Search, E.3): its text tokenized as it is,
    without a chat template (E.3's teacher was trained on Search-R1's raw prompt from a base checkpoint, D.2). Only
    full responses exist there; there is no history to drop, so a prompt over ``budget_tokens`` goes ahead
    (``over_budget``) and one over ``limit_tokens`` is :class:`PromptTooLong`."""
    if mode is not Mode.FULL_RESPONSE:
        raise ValueError(f"mode={mode.value}: benchmark {benchmark.name!r} has only full-response prompts")
    ids = tokenizer.encode(current.observation, add_special_tokens=False)
    if limit_tokens is not None and len(ids) > limit_tokens:
        raise PromptTooLong(f"the {benchmark.name} prompt needs {len(ids)} tokens, more than the model takes with "
                            f"this request's response budget ({limit_tokens})")
    return Prompt(list(ids), current.observation, 0, over_budget=len(ids) > budget_tokens)


def render_recent_steps(prompts: RecentStepsPrompts, *, task_description: str, history: Sequence[Step],
                        current: Transition) -> tuple[str, int]:
    """The user message of a :class:`RecentStepsPrompts` set after ``len(history)`` steps, and how many history
    steps it shows."""
    steps = len(history)
    if steps < prompts.first_steps:
        template, shown = prompts.first, []
    else:
        template, shown = prompts.later, list(history[steps - min(prompts.window, steps):])
    entries = [Step(prompts.observation(s.observation), s.action) for s in shown]
    text = template.format(task_description=task_description, current_observation=prompts.observation(
                               current.observation), step_count=steps, current_step=steps + 1,
                           history_length=len(shown), action_history=format_history(entries, steps - len(shown) + 1),
                           **prompts.fields(current))
    return text, len(shown)


def recent_steps_prompt(tokenizer, benchmark: Benchmark, mode: Mode, *, task_description: str,
                        history: Sequence[Step], current: Transition, budget_tokens: int,
                        limit_tokens: int | None = None) -> Prompt:
    """The full-response prompt of the UOPD paper's set (``rollout.prompts: uopd``; ``benchmark.uopd_prompts``),
    chat-templated. Its history is E.1/E.2's fixed window, not fitted: a prompt over ``budget_tokens`` goes ahead
    (``over_budget``), one over ``limit_tokens`` is :class:`PromptTooLong`."""
    if benchmark.uopd_prompts is None:
        raise ValueError(f"rollout.prompts='uopd': benchmark {benchmark.name!r} has no UOPD-paper prompts (003 "
                         f"Appendix E gives ALFWorld's, WebShop's and Search's)")
    if mode is not Mode.FULL_RESPONSE:
        raise ValueError(f"mode={mode.value}: rollout.prompts='uopd' has only think-then-act prompts (003 E.1/E.2)")
    text, shown = render_recent_steps(benchmark.uopd_prompts, task_description=task_description, history=history,
                                      current=current)
    ids = list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False, enable_thinking=True))
    if limit_tokens is not None and len(ids) > limit_tokens:
        raise PromptTooLong(f"the {benchmark.name} UOPD-paper prompt needs {len(ids)} tokens, more than the model "
                            f"takes with this request's response budget ({limit_tokens}); its history is E.1/E.2's "
                            f"fixed window, never shortened")
    return Prompt(ids, text, shown, over_budget=len(ids) > budget_tokens)
