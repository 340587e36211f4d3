"""Supervised fine-tuning on reference trajectories: the CPU demo's teacher, and the student's warm start.

The paper's teachers are task-specialized agents and its students start from instruction-tuned Qwen3 checkpoints
that answer every prompt mode. No weights can be downloaded here, so the demo makes both from the reference cache
(C.2): every step t of a reference (context c_t with its B.2 history, action a_t, reference next observation
o_{t+1}) becomes one example per prompt mode (B.1):

- full response: ``<think>`` a reasoning ``</think>`` then ``<action>a_t</action>`` (think-then-act);
- next-action prediction and inverse dynamics: ``<action>a_t</action>`` (action only).

The reasoning is one of :data:`THOUGHTS`: ``short`` (the goal and the step, about 30 tokens: the main demo, whose
rollouts are bound by the environment), ``restated`` (the context restated before the step, hundreds of tokens:
a full response as long against its action as a real model's thinking, so that think-then-act rollouts are bound
by generation as on a GPU), ``decided`` (as long: the step first, then the context restated), ``surveyed``
(the task and the action commands restated, then the short thought: about 150 tokens, the same at every step but
the decision) or ``enumerated`` (as ``surveyed`` with the commands one per line, numbered: about 365 tokens, toward the
paper's 512-token full responses).

Prompts are rendered by :func:`actfirst.rollout.prompts.build_prompt`, the same code the rollouts use, from transitions
replayed in the simulator (the cache's transitions are slimmed: no admissible list, no object aliases).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.response_format import ACTION_CLOSE, ACTION_OPEN, THINK_CLOSE, THINK_OPEN
from actfirst.preparation.reference_cache import replay
from actfirst.rollout.prompts import Mode, Step, build_prompt, render
from actfirst.rollout.sample import Sample
from actfirst.train.packing import final_hidden, layout_for, pack

ALL_MODES = (Mode.FULL_RESPONSE, Mode.NEXT_ACTION, Mode.INVERSE_DYNAMICS)


@dataclasses.dataclass(frozen=True, slots=True)
class ExpertStep:
    """One step of a reference trajectory as the rollouts see it: history h_t, o_t, a_t and o_{t+1}."""

    task: str
    history: tuple[Step, ...]
    current: Transition
    action: str
    next_observation: str


def goal(task_description: str) -> str:
    """The task's goal phrase: its first sentence, without "Your task is to"."""
    first = re.split(r"(?<=[.!?])\s", task_description.strip(), maxsplit=1)[0].rstrip(".!? ")
    return re.sub(r"^(your task is to)\s+", "", first, flags=re.IGNORECASE) or "complete the task"


Thought = Callable[[Benchmark, ExpertStep], str]
"""A reasoning text for an expert step (what a full response thinks before its action)."""


def short_thought(benchmark: Benchmark, step: ExpertStep) -> str:
    """About 30 tokens: the goal and the step the agent chooses."""
    return f"My task is to {goal(step.current.task_description)}. The next step is: {step.action}."


def _task_restated(step: ExpertStep) -> str:
    """The task description as the restating thoughts open: "The task says: ..."."""
    return f"The task says: {step.current.task_description.strip()}"


def _context_restated(benchmark: Benchmark, step: ExpertStep) -> str:
    """The prompt's context restated line by line: the task, the steps taken, the current observation and the
    admissible-action information (the benchmark's B.1 prompt fields)."""
    done = "; ".join(s.action for s in step.history) or "none yet"
    options = "\n".join(f"{name.replace('_', ' ').capitalize()}: {value}."
                        for name, value in benchmark.prompt_fields(step.current).items())
    return (f"{_task_restated(step)}\n"
            f"Steps taken ({len(step.history)}): {done}.\n"
            f"What I see now: {step.current.observation.strip()}\n"
            f"{options}")


def restated_thought(benchmark: Benchmark, step: ExpertStep) -> str:
    """Hundreds of tokens: the goal, then the context restated from the prompt. Every part is in the prompt, so a
    small model learns to write it by copying. The step itself is named only in the action field: a thought that
    ended "The next step is: a." taught the small models to continue ``<action>a`` with "." and the thought's lines
    (measured: a third of the student's actions empty or garbled, more after OPD updates)."""
    return (f"My task is to {goal(step.current.task_description)}.\n"
            f"{_context_restated(benchmark, step)}\n"
            "Now I choose the next step.")


def decided_thought(benchmark: Benchmark, step: ExpertStep) -> str:
    """Hundreds of tokens that carry the decision: the short thought (the goal and the step), then the context
    restated as a check. The step is chosen where the context is the prompt alone, not after the model's own copy of
    it: in ``restated`` thoughts a copying mistake (a wrong room, a step never taken) comes before the decision and
    steers it, and the few tokens that decide get a small share of OPD's per-token advantage."""
    return f"{short_thought(benchmark, step)}\n{_context_restated(benchmark, step)}\nSo I take that step."


def _commands(benchmark: Benchmark, step: ExpertStep) -> tuple[str, ...]:
    """The action commands the prompt lists (``Benchmark.action_commands``); a transition without them has no fixed
    list to restate."""
    commands = benchmark.action_commands(step.current)
    if not commands:
        raise ValueError("prepare.build_models.thoughts restates the action commands a prompt lists; "
                         f"benchmark {benchmark.name!r}'s transition of task {step.task!r} has none")
    return commands


def surveyed_thought(benchmark: Benchmark, step: ExpertStep) -> str:
    """About 150 tokens (ScienceWorld's lifespan tasks) that are the same at every step of a task but for the
    decision: the task and the action commands restated (the prompt's parts that do not change within an episode),
    then the short thought. A small student learns the fixed text in its warm start, so that OPD's per-token
    advantage can sit on the few tokens that decide, as in the main demo, while a full response still decodes about
    25 times its action's tokens (000 Sec. 5.3 times 128- and 512-token responses against 16-token fast actions).
    The commands are the benchmark's ``Benchmark.action_commands``; a transition without them has no fixed list to
    restate."""
    commands = _commands(benchmark, step)
    return (f"{_task_restated(step)}\n"
            f"The action commands: {', '.join(commands)}.\n"
            f"{short_thought(benchmark, step)}")


def enumerated_thought(benchmark: Benchmark, step: ExpertStep) -> str:
    """About 365 tokens (ScienceWorld's lifespan tasks: 25 commands), the same at every step of a task but for the
    decision: :func:`surveyed_thought` with the action commands one per line, each numbered against their count
    ("Command 3 of 25: deactivate OBJ."), so that a full response decodes toward the paper's 512 tokens (000 Sec. 5.3)
    and a think-then-act rollout is bound by generation even against packed scoring and the update. The numbers
    say where the list stands, so a small model copying it does not lose its place in a repeated line."""
    commands = _commands(benchmark, step)
    listed = "\n".join(f"Command {i} of {len(commands)}: {command}." for i, command in enumerate(commands, 1))
    return f"{_task_restated(step)}\n{listed}\n{short_thought(benchmark, step)}"


THOUGHTS: dict[str, Thought] = {"short": short_thought, "restated": restated_thought, "decided": decided_thought,
                                "surveyed": surveyed_thought, "enumerated": enumerated_thought}
"""The reasoning styles a built model learns (``prepare.build_models.thoughts``)."""


def response_text(benchmark: Benchmark, mode: Mode, step: ExpertStep, thought: Thought = short_thought) -> str:
    """The target response of ``step`` in ``mode`` (the end-of-turn token is added by the tokenizer's EOS)."""
    action = f"{ACTION_OPEN}{step.action}{ACTION_CLOSE}"
    if mode is Mode.FULL_RESPONSE:
        return f"{THINK_OPEN}\n{thought(benchmark, step)}\n{THINK_CLOSE}\n\n{action}"
    return action


def replayed_steps(task: str, actions: Sequence[str], transitions: Sequence[Transition], start: int = 0
                   ) -> list[ExpertStep]:
    """The steps from ``start`` on of a replay (``transitions``: o_1..o_{T+1} of ``actions``), each with its history."""
    history = [Step(transitions[t].observation, action) for t, action in enumerate(actions)]
    return [ExpertStep(task, tuple(history[:t]), transitions[t], actions[t], transitions[t + 1].observation)
            for t in range(start, len(actions))]


async def expert_steps(benchmark: Benchmark, pool: Any, tasks: Sequence[Any], references: dict[str, Reference]
                       ) -> list[ExpertStep]:
    """Replay each task's reference (full transitions, as the rollouts see them) and return its steps, each
    observation the reference's recorded one: ScienceWorld lists some of a room's contents in another order on each
    load, so the replay's own text, and every model trained on it, would differ from one preparation to the next."""
    async def one(worker, task) -> list[ExpertStep]:
        ref = references[benchmark.task_key(task)]
        executed, transitions = await replay(worker, task, ref.actions)
        if (executed != ref.actions or len(transitions) != len(ref.transitions)
                or not benchmark.accepts_reference(transitions[-1])):
            raise RuntimeError(f"task {ref.task!r}: its reference no longer replays to success")
        transitions = [dataclasses.replace(live, observation=recorded.observation)
                       for live, recorded in zip(transitions, ref.transitions, strict=True)]
        return replayed_steps(ref.task, executed, transitions)

    return [s for steps in await pool.map(one, tasks) for s in steps]


def corpus(benchmark: Benchmark, steps: Sequence[ExpertStep], modes: Sequence[Mode] = ALL_MODES,
           thought: Thought = short_thought) -> list[str]:
    """Prompt and response texts of ``steps`` (for training a small tokenizer on what the models will read)."""
    texts = []
    for step in steps:
        for mode in modes:
            texts.append(_render(benchmark, mode, step))
            texts.append(response_text(benchmark, mode, step, thought))
    return texts


def _render(benchmark: Benchmark, mode: Mode, step: ExpertStep) -> str:
    ref = benchmark.reference_observation(step.next_observation) if mode is Mode.INVERSE_DYNAMICS else None
    return render(benchmark, mode, task_description=step.current.task_description, history=step.history,
                  step_count=len(step.history), current=step.current, reference_next_observation=ref)


def examples(tokenizer, benchmark: Benchmark, steps: Sequence[ExpertStep], *, modes: Sequence[Mode],
             max_prompt_tokens: int, thought: Thought = short_thought, stray_token_rate: float = 0.0,
             seed: int = 0) -> list[Sample]:
    """One supervised sample per step and mode: the prompt the rollouts would send (B.1, B.2) and the target
    response followed by the end-of-turn token, every response token supervised.

    ``stray_token_rate`` > 0: each token of a full response's thought is, with that probability, replaced by a stray
    token (:func:`with_stray_tokens`, drawn with ``seed``), whose own target is not supervised: the model learns to
    resume the thought after a token it would not have written."""
    if not 0.0 <= stray_token_rate < 1.0:
        raise ValueError(f"stray_token_rate={stray_token_rate!r}: must be in [0, 1)")
    rng = random.Random(seed)
    vocabulary = _stray_vocabulary(tokenizer) if stray_token_rate > 0 else []
    out = []
    eos = tokenizer.eos_token_id
    for step in steps:
        for mode in modes:
            ref = benchmark.reference_observation(step.next_observation) if mode is Mode.INVERSE_DYNAMICS else None
            prompt = build_prompt(tokenizer, benchmark, mode, task_description=step.current.task_description,
                                  history=list(step.history), current=step.current, budget_tokens=max_prompt_tokens,
                                  reference_next_observation=ref)
            target = tokenizer.encode(response_text(benchmark, mode, step, thought), add_special_tokens=False) + [eos]
            mask = [1] * len(target)
            if stray_token_rate > 0 and mode is Mode.FULL_RESPONSE:
                thought_span = _thought_span(tokenizer, benchmark, step, thought)
                target, mask = with_stray_tokens(target, thought_span, stray_token_rate, vocabulary, rng)
            out.append(Sample(context_ids=prompt.token_ids, response_ids=target, loss_mask=mask,
                              logprobs=[0.0] * len(target), weight_version=0, task=step.task,
                              turn=len(step.history), strategy=f"sft:{mode.value}"))
    return out


def _thought_span(tokenizer, benchmark: Benchmark, step: ExpertStep, thought: Thought) -> range:
    """Token positions of a full response's target that lie inside its thought: after ``<think>`` and its newline,
    before the last token of the text up to the thought's end (which may merge with what follows)."""
    opening = len(tokenizer.encode(f"{THINK_OPEN}\n", add_special_tokens=False))
    through = len(tokenizer.encode(f"{THINK_OPEN}\n{thought(benchmark, step)}", add_special_tokens=False))
    return range(opening, through - 1)


def _stray_vocabulary(tokenizer) -> list[int]:
    """The ids a stray token is drawn from: the whole vocabulary but the special tokens."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def with_stray_tokens(target: list[int], span: range, rate: float, vocabulary: Sequence[int],
                      rng: random.Random) -> tuple[list[int], list[int]]:
    """``target`` with each position in ``span`` replaced, with probability ``rate``, by another token drawn
    uniformly from ``vocabulary``, and its loss mask (0 at the stray tokens, 1 elsewhere). A student's sampled full
    responses hold such tokens (bench/opd_gap_sources.py: most deviate from the reference thought at a token the
    student gave a log-prob near -10); a teacher that resumes after them is meant to score the rest of the thought
    as the thought, so that the advantage of Eq. 29 sits on the stray token rather than on all that follows it (on
    the rollout-bound demo it shrinks the gap after the token by a quarter: bench/RESULTS.md)."""
    target, mask = list(target), [1] * len(target)
    for pos in span:
        if rng.random() < rate:
            stray = rng.choice(vocabulary)
            while stray == target[pos]:
                stray = rng.choice(vocabulary)
            target[pos], mask[pos] = stray, 0
    return target, mask


@dataclasses.dataclass(kw_only=True, slots=True)
class SFTResult:
    """What :func:`sft` reports: the mean loss per epoch, wall-clock and throughput."""

    epoch_losses: list[float]
    wall_s: float
    tokens_per_s: float


def sft(model: torch.nn.Module, samples: Sequence[Sample], *, epochs: float, lr: float, batch_tokens: int,
        micro_batch_tokens: int = 2048, seed: int = 0, weight_decay: float = 0.0,
        log: Callable[[str], None] | None = print) -> SFTResult:
    """Cross-entropy on the response tokens of ``samples`` that their loss mask keeps (AdamW, cosine decay to 10%,
    gradient clip 1.0).

    Each optimizer step takes about ``batch_tokens`` tokens of whole samples (a shuffled slice of the data), laid
    out as the model's attention calls for (``packing.layout_for``) in micro-batches of at most ``micro_batch_tokens``
    tokens; ``epochs`` may be fractional (the last epoch then stops early).
    """
    if not samples:
        raise ValueError("samples=[]: nothing to train on")
    if epochs <= 0 or lr <= 0 or batch_tokens < 1:
        raise ValueError(f"epochs={epochs}, lr={lr}, batch_tokens={batch_tokens}: must be positive")
    rng = random.Random(seed)
    mean_len = sum(s.num_tokens for s in samples) / len(samples)
    per_step = max(1, int(batch_tokens // mean_len))
    steps_per_epoch = math.ceil(len(samples) / per_step)
    total_steps = max(1, round(epochs * steps_per_epoch))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    model.train()
    started, tokens, step, losses = time.perf_counter(), 0, 0, []
    while step < total_steps:
        order = list(range(len(samples)))
        rng.shuffle(order)
        epoch_loss, epoch_n = 0.0, 0
        for i in range(0, len(order), per_step):
            if step >= total_steps:
                break
            batch = [samples[j] for j in order[i:i + per_step]]
            optimizer.zero_grad(set_to_none=True)
            n_targets = max(1, sum(sum(s.loss_mask) for s in batch))
            loss_sum = 0.0
            for mb in pack(batch, micro_batch_tokens, layout_for(model.config._attn_implementation)):
                hidden = final_hidden(model, mb)
                logits = model.lm_head(hidden).float()
                loss = (F.cross_entropy(logits, mb.targets, reduction="none") * mb.mask).sum() / n_targets
                loss.backward()
                loss_sum += float(loss.detach())
                tokens += mb.num_tokens
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            epoch_loss += loss_sum * len(batch)
            epoch_n += len(batch)
        losses.append(epoch_loss / max(1, epoch_n))
        if log is not None:
            wall = time.perf_counter() - started
            log(f"[sft] epoch {len(losses)}: loss {losses[-1]:.4f}, step {step}/{total_steps}, "
                f"{tokens / wall:.0f} tok/s, {wall:.0f} s")
    model.eval()
    wall = time.perf_counter() - started
    return SFTResult(epoch_losses=losses, wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else math.nan)
