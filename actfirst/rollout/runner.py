"""The episode runner: a rollout batch of tasks driven concurrently through one engine and one pool of workers.

Per turn t of an episode (Sec. 4, Appendix B.2):

1. the context c_t = q + h_t + o_t is snapshotted and its full response is submitted at once (Sec. 4.3), without
   the reference; its action is executed only by think-then-act;
2. the strategy names the action's source: the full response, a fast action (inverse dynamics with the reference
   next observation o_{t+1}^ref, or NAP), or a replayed reference action;
3. the environment executes the action; a guided turn is then checked against the reference (B.5);
4. (o_t, action) joins the stored history h_{t+1}.

A batch ends when every episode and every full response of it has finished (Appendix C.5). An environment worker
that dies or raises fails its episode with the reason; the batch goes on, and the samples of the contexts already
visited are kept.

Prompts follow B.2: history is dropped, oldest pair first, to fit ``rollout.max_prompt_tokens``; a no-history prompt
still over it goes ahead as it is (counted: ``prompts_over_budget``). Only a prompt that the model cannot take with
its response budget (``max_model_len`` less the response's tokens) is refused: an inverse-dynamics prompt then falls
back to next-action prediction for that turn (counted: ``id_overflow_naps``); a full-response or next-action prompt
ends the episode with the reason, as a failed environment does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from actfirst.config import RolloutConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.envs.base import Reference, Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.workers import EnvError, EnvPool, EnvWorker, WorkerDied
from actfirst.prompts import Mode, Prompt, PromptTooLong, Step, build_prompt
from actfirst.rollout.actions import FastAction, generate_fast_action
from actfirst.rollout.budget import FullResponse, generate_full_response
from actfirst.rollout.strategies import ActionSource, RolloutStrategy
from actfirst.train.sample import Sample


@dataclasses.dataclass(slots=True)
class TurnRecord:
    """One executed turn."""

    turn: int
    source: ActionSource
    action: str
    """The executed action."""
    proposal: str | None
    """An invalid inverse-dynamics proposal that was replaced by a NAP request (B.5), else None."""
    fast: FastAction | None
    """The fast action whose action was executed (None for full-response and reference actions)."""
    valid: bool
    check: str | None
    """The check's outcome on a guided turn ("passed" or the failed condition), else None."""
    step_started: float
    """When the environment step began (perf_counter), to compare with full-response completion times."""


@dataclasses.dataclass(slots=True)
class EpisodeResult:
    """One episode of a rollout batch."""

    task: str
    task_type: str
    turns: list[TurnRecord]
    score: float
    won: bool
    done: bool
    guided: bool
    """Whether the episode started with reference guidance (Appendix F's denominators)."""
    fallback_turn: int | None
    aligned_turns: int
    fully_aligned: bool
    """Completed the reference trajectory and terminated without a fallback (Appendix F)."""
    contexts: list[list[int]]
    """Each visited context's full-response prompt (token ids), in turn order."""
    full_responses: list[FullResponse]
    full_response_done: list[float]
    """perf_counter time at which each turn's full response finished."""
    failure: str | None
    """Why the episode was cut short (a worker died, the environment raised, a prompt the model cannot take)."""
    prompts: PromptCounts = dataclasses.field(default_factory=lambda: PromptCounts())
    """How often B.2 went past its budget (see the module docstring)."""

    @property
    def num_turns(self) -> int:
        return len(self.turns)


@dataclasses.dataclass(slots=True)
class PromptCounts:
    """An episode's prompts that B.2 could not fit to ``rollout.max_prompt_tokens``."""

    over_budget: int = 0
    """Requests sent with no history and still over the budget (B.2: "until it fits or no history remains")."""
    id_overflow_naps: int = 0
    """Inverse-dynamics prompts the model could not take, replaced by a next-action request for that turn."""


@dataclasses.dataclass(slots=True)
class RolloutBatch:
    """What one rollout batch produced."""

    episodes: list[EpisodeResult]
    samples: list[Sample]
    wall_s: float

    @property
    def num_transitions(self) -> int:
        return sum(e.num_turns for e in self.episodes)


class RolloutRunner:
    """Runs rollout batches of a benchmark's tasks with one strategy on one engine and one pool of workers."""

    def __init__(self, *, engine: ActFirstEngine, tokenizer: PreTrainedTokenizerBase, benchmark: Benchmark,
                 pool: EnvPool, strategy: RolloutStrategy, cfg: RolloutConfig,
                 references: dict[str, Reference] | None, seed: int = 0, evaluation: bool = False) -> None:
        if strategy.uses_references and references is None:
            raise ValueError(f"rollout.strategy={strategy.name!r}: needs a reference cache")
        self.engine = engine
        self.tokenizer = tokenizer
        self.benchmark = benchmark
        self.pool = pool
        self.strategy = strategy
        self.cfg = cfg
        self.references = references
        self.seed = seed
        self.max_model_len = engine.max_model_len
        # D.5 (Search): at evaluation, an episode truncated at the turn limit gets one more turn.
        self.forced_answer = evaluation and benchmark.forced_answer_turn

    async def run_batch(self, tasks: Sequence[Any], batch_index: int) -> RolloutBatch:
        """Run one episode per task, concurrently (one worker each); returns when all of them, and all their full
        responses, have finished."""
        if len(tasks) > len(self.pool.workers):
            raise ValueError(f"{len(tasks)} tasks: more than the pool's {len(self.pool.workers)} workers")
        start = time.perf_counter()
        episodes = await asyncio.gather(*(self.run_episode(task, worker, seed=self._seed(batch_index, slot))
                                          for slot, (task, worker) in enumerate(zip(tasks, self.pool.workers))))
        samples = [s for e in episodes for s in episode_samples(e, self.strategy.name)]
        return RolloutBatch(list(episodes), samples, time.perf_counter() - start)

    def _seed(self, batch_index: int, slot: int) -> int:
        return (self.seed * 1_000_003 + batch_index * 4_099 + slot * 1_031) % (1 << 30)

    # -- one episode ----------------------------------------------------------------------------------------------

    async def run_episode(self, task: Any, worker: EnvWorker, seed: int) -> EpisodeResult:
        key = self.benchmark.task_key(task)
        reference = self.references.get(key) if self.strategy.uses_references else None
        if self.strategy.uses_references and reference is None:
            raise KeyError(f"task {key!r}: no reference in the cache")
        guidance = self.strategy.start()
        guided_episode = guidance.active
        history: list[Step] = []
        turns: list[TurnRecord] = []
        contexts: list[list[int]] = []
        full_tasks: list[asyncio.Future] = []
        last: Transition | None = None
        failure = None
        counts = PromptCounts()
        try:
            current = await worker.areset(task)
            last = current
            for t in range(self.benchmark.max_turns + self.forced_answer):
                context = self._prompt(Mode.FULL_RESPONSE, current, history, counts).token_ids
                full = asyncio.ensure_future(self.full_response(context, seed + 2 * t))
                contexts.append(context)
                full_tasks.append(full)
                guided = guidance.active
                source = self.strategy.source(guidance, t, len(reference.actions) if reference else 0)
                action, proposal, source, fast = await self._action(source, full, current, history, reference, t,
                                                                    seed + 2 * t + 1, counts)
                step_started = time.perf_counter()
                nxt = await worker.astep(action)
                check, go_on = None, True
                if guided:  # B.5: every guided transition is checked, whatever produced its action
                    result = self.benchmark.check(reference, t, action=action, current=current, next=nxt,
                                                  previous=guidance.previous)
                    check = "passed" if result.passed else result.reason
                    go_on = self.strategy.after_check(guidance, t, result)
                turns.append(TurnRecord(t, source, action, proposal, fast, nxt.valid, check, step_started))
                history.append(Step(current.observation, action))
                if self.forced_answer and nxt.truncated and t + 1 == self.benchmark.max_turns:
                    nxt = await worker.acall("force_answer")
                current = last = nxt
                if nxt.finished or not go_on:
                    break
        except (WorkerDied, EnvError, PromptTooLong) as exc:
            failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"
        except BaseException:  # anything else ends the run: leave no request of this episode behind
            for full in full_tasks:
                full.cancel()
            raise
        fulls = list(await asyncio.gather(*full_tasks))
        done = bool(last and last.done)
        return EpisodeResult(
            task=key, task_type=self.benchmark.task_type(task), turns=turns, score=last.score if last else 0.0,
            won=bool(last and self.benchmark.succeeded(last)), done=done, guided=guided_episode,
            fallback_turn=guidance.fallback_turn, aligned_turns=guidance.aligned_turns,
            fully_aligned=guided_episode and guidance.active and done and failure is None, contexts=contexts,
            full_responses=[f for f, _ in fulls], full_response_done=[d for _, d in fulls], failure=failure,
            prompts=counts)

    def _prompt(self, mode: Mode, current: Transition, history: list[Step], counts: PromptCounts,
                reference_next: str | None = None) -> Prompt:
        """The request of ``mode`` fitted by B.2; the model's limit is max_model_len less the response's budget."""
        response = self.cfg.budget.total if mode is Mode.FULL_RESPONSE else self.cfg.budget.fast_action_tokens
        prompt = build_prompt(self.tokenizer, self.benchmark, mode, task_description=current.task_description,
                              history=history, current=current, budget_tokens=self.cfg.max_prompt_tokens,
                              limit_tokens=self.max_model_len - response, reference_next_observation=reference_next)
        counts.over_budget += prompt.over_budget
        return prompt

    async def full_response(self, prompt_ids: list[int], seed: int) -> tuple[FullResponse, float]:
        """The full response (B.3) to a context's prompt, and when it finished."""
        budget = self.cfg.budget
        response = await generate_full_response(
            self.engine, self.tokenizer, prompt_ids, first_stage=budget.first_stage, total=budget.total,
            second_stage=budget.second_stage, temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=seed,
            response_format=self.benchmark.response_format)
        return response, time.perf_counter()

    async def _fast(self, prompt: Prompt, seed: int) -> FastAction:
        return await generate_fast_action(self.engine, prompt.token_ids, max_tokens=self.cfg.budget.fast_action_tokens,
                                          temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=seed)

    async def _action(self, source: ActionSource, full: asyncio.Future, current: Transition, history: list[Step],
                      reference: Reference | None, t: int, seed: int, counts: PromptCounts
                      ) -> tuple[str, str | None, ActionSource, FastAction | None]:
        """(executed action, replaced invalid proposal or None, its source, the fast action executed or None)."""
        if source is ActionSource.FULL_RESPONSE:
            response, _ = await full
            return response.action, None, source, None
        if source is ActionSource.REFERENCE:
            return reference.actions[t], None, source, None
        if source is ActionSource.INVERSE_DYNAMICS and t >= len(reference.actions):
            source = ActionSource.NEXT_ACTION  # nothing left to condition on; the check fails ("reference exhausted")
        if source is ActionSource.INVERSE_DYNAMICS:
            reference_next = self.benchmark.reference_observation(reference.transitions[t + 1].observation)
            try:
                prompt = self._prompt(Mode.INVERSE_DYNAMICS, current, history, counts, reference_next)
            except PromptTooLong:  # the reference does not fit the model: next-action prediction for this turn
                counts.id_overflow_naps += 1
                source = ActionSource.NEXT_ACTION
        if source is ActionSource.NEXT_ACTION:
            fast = await self._fast(self._prompt(Mode.NEXT_ACTION, current, history, counts), seed)
            return fast.action, None, source, fast
        fast = await self._fast(prompt, seed)
        if self.benchmark.valid_action(fast.action, current):
            return fast.action, None, source, fast
        # B.5: an invalid proposal triggers one NAP request from the unchanged context before execution.
        retry = await self._fast(self._prompt(Mode.NEXT_ACTION, current, history, counts), seed + (1 << 29))
        return retry.action, fast.action, ActionSource.NAP_RETRY, retry


def episode_samples(episode: EpisodeResult, strategy: str) -> list[Sample]:
    """The episode's turn-level samples: one per visited context, its full response (B.4)."""
    return [r.to_sample(c, task=episode.task, turn=t, strategy=strategy)
            for t, (c, r) in enumerate(zip(episode.contexts, episode.full_responses))]
