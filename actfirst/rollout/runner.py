"""The episode runner: a rollout batch of tasks driven concurrently through one engine and one pool of workers.

Per turn t of an episode (Sec. 4, Appendix B.2):

1. the strategy names the action's source: the full response, a fast action (inverse dynamics with the reference
   next observation o_{t+1}^ref, or NAP), or a replayed reference action;
2. the context c_t = q + h_t + o_t is snapshotted and its full response is submitted at once (Sec. 4.3), without
   the reference (except for a replayed turn of a strategy whose prefix carries no loss: TCOD-B2F); its action is
   executed only by think-then-act;
3. with UOPD, the full response is the student's proposal, and the teacher's action may replace it
   (``actfirst.rollout.intervention``);
4. the environment executes the action; a guided turn is then checked against the reference (B.5);
5. (o_t, action) joins the stored history h_{t+1}.

A strategy may end an episode before the benchmark's turn limit (TCOD-F2B's horizon W_n).

Turn t of an episode with base seed b samples its full response with seed b + 2t and its fast action with b + 2t + 1
(:func:`turn_seeds`). Two switches serve measurements that collect no samples (C.5's rollout quality):
``full_responses=False`` generates a full response only where the executed action is its action (think-then-act),
and ``trace=True`` keeps every transition and the environment's state after it (``TextEnv.state``). Training uses
neither.

A batch ends when every episode and every full response of it has finished (Appendix C.5). An environment worker
that dies or raises fails its episode with the reason; the batch goes on, and the samples of the contexts already
visited are kept.

Prompts follow B.2: history is dropped, oldest pair first, to fit ``rollout.max_prompt_tokens``; a no-history prompt
still over it goes ahead as it is (counted: ``prompts_over_budget``). Only a prompt that the model cannot take with
its response budget (``max_model_len`` less the response's tokens) is refused: an inverse-dynamics prompt then falls
back to next-action prediction for that turn (counted: ``id_overflow_naps``); a full-response or next-action prompt
ends the episode with the reason, as a failed environment does. With ``rollout.prompts: uopd`` (003 E.1/E.2) the
history is those templates' two-step window, never dropped: a prompt over the budget goes ahead, counted the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from actfirst.core.config import RolloutConfig
from actfirst.engine.core import ActFirstEngine
from actfirst.envs.base import EnvState, Reference, Transition
from actfirst.envs.benchmarks import Benchmark
from actfirst.envs.workers import EnvError, EnvPool, EnvWorker, WorkerDied
from actfirst.rollout.actions import FastAction, generate_fast_action
from actfirst.rollout.budget import FullResponse, generate_full_response
from actfirst.rollout.intervention import Intervention, InterventionRecord, teacher_action
from actfirst.rollout.prompts import Mode, Prompt, PromptTooLong, Step, build_prompt
from actfirst.rollout.sample import Sample
from actfirst.rollout.strategies import ActionSource, Guidance, RolloutStrategy


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
    step_done: float
    """When the environment step returned (perf_counter): the transition's completion (C.5's throughput windows)."""
    seed: int | None
    """The sampling seed of the student's request whose action was executed (None: a reference or teacher action)."""


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
    """Each sampled context's full-response prompt (token ids), in turn order: every visited context but the
    replayed ones of a strategy whose prefix carries no loss (TCOD-B2F)."""
    full_responses: list[FullResponse]
    full_response_done: list[float]
    """perf_counter time at which each context's full response finished."""
    failure: str | None
    """Why the episode was cut short (a worker died, the environment raised, a prompt the model cannot take)."""
    prompts: PromptCounts = dataclasses.field(default_factory=lambda: PromptCounts())
    """How often B.2 went past its budget (see the module docstring)."""
    context_turns: list[int] = dataclasses.field(default_factory=list)
    """The turn of each entry of ``contexts`` (empty: one per turn, in order)."""
    teacher_responses: list[FullResponse | None] = dataclasses.field(default_factory=list)
    """UOPD: the teacher's full response at each entry of ``contexts`` where it intervened, else None."""
    replaced: list[bool] = dataclasses.field(default_factory=list)
    """UOPD: whether the teacher's action was chosen in place of the proposal at each entry of ``contexts`` (so
    the proposal carries no loss, even when the environment failed before executing it)."""
    proposal_scores: list[list[float] | None] = dataclasses.field(default_factory=list)
    """UOPD: the teacher's log-probs of each entry's full response, when the rule scored it (its sample carries
    them, and the update does not score it again)."""
    interventions: list[InterventionRecord] = dataclasses.field(default_factory=list)
    """UOPD: the decision at each student turn."""
    transitions: list[Transition] = dataclasses.field(default_factory=list)
    """With ``trace``: o_1 and every executed turn's transition, in order (else empty)."""
    states: list[EnvState] = dataclasses.field(default_factory=list)
    """With ``trace``: the environment's state after each of ``transitions`` (else empty)."""

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


@dataclasses.dataclass(slots=True)
class _Episode:
    """An episode in progress (what :meth:`RolloutRunner.run_episode` builds its result from)."""

    guidance: Guidance
    reference: Reference | None
    seed: int
    rate: float
    threshold: float | None
    """UOPD's r_n and tau_n, held for the episode."""
    current: Transition | None = None
    last: Transition | None = None
    failure: str | None = None
    history: list[Step] = dataclasses.field(default_factory=list)
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    contexts: list[list[int]] = dataclasses.field(default_factory=list)
    context_turns: list[int] = dataclasses.field(default_factory=list)
    full_tasks: list[asyncio.Future] = dataclasses.field(default_factory=list)
    teacher_responses: list[FullResponse | None] = dataclasses.field(default_factory=list)
    replaced: list[bool] = dataclasses.field(default_factory=list)
    proposal_scores: list[list[float] | None] = dataclasses.field(default_factory=list)
    interventions: list[InterventionRecord] = dataclasses.field(default_factory=list)
    counts: PromptCounts = dataclasses.field(default_factory=PromptCounts)
    transitions: list[Transition] = dataclasses.field(default_factory=list)
    states: list[EnvState] = dataclasses.field(default_factory=list)


class RolloutRunner:
    """Runs rollout batches of a benchmark's tasks with one strategy on one engine and one pool of workers."""

    def __init__(self, *, engine: ActFirstEngine, tokenizer: PreTrainedTokenizerBase, benchmark: Benchmark,
                 pool: EnvPool, strategy: RolloutStrategy, cfg: RolloutConfig,
                 references: dict[str, Reference] | None, seed: int = 0,
                 intervention: Intervention | None = None, evaluation: bool = False, full_responses: bool = True,
                 trace: bool = False) -> None:
        if strategy.uses_references and references is None:
            raise ValueError(f"rollout.strategy={strategy.name!r}: needs a reference cache")
        if strategy.intervenes != (intervention is not None):
            raise ValueError(f"rollout.strategy={strategy.name!r}: an intervention must be given exactly when the "
                             "strategy intervenes")
        self.engine = engine
        self.tokenizer = tokenizer
        self.benchmark = benchmark
        self.pool = pool
        self.strategy = strategy
        self.cfg = cfg
        self.references = references
        self.seed = seed
        self.intervention = intervention
        self.max_model_len = engine.max_model_len
        self.full_responses = full_responses
        """A full response for every visited context (Sec. 4.3); False: only where its action is executed."""
        self.trace = trace
        """Keep each episode's transitions and environment states (``EpisodeResult.transitions``, ``states``)."""
        self.admissible_lists = evaluation or trace
        """Every transition carries its admissible list and every turn its validity (the invalid-turn counts of an
        evaluation, C.5's validity in a trace); otherwise an environment that can (ScienceWorld) builds the list
        only for the guided turns, whose B.5 check reads it."""
        # D.5 (Search): at evaluation, an episode truncated at the turn limit gets one more turn.
        self.forced_answer = evaluation and benchmark.forced_answer_turn

    async def run_batch(self, tasks: Sequence[Any], batch_index: int) -> RolloutBatch:
        """Run one episode per task, concurrently (one worker each); returns when all of them, and all their full
        responses, have finished. ``batch_index``: the run's rollout batches so far, this one included (the trainer
        counts from 1); the curricula's n is ``batch_index - 1`` (0 for a batch outside a run's count)."""
        if len(tasks) > len(self.pool.workers):
            raise ValueError(f"{len(tasks)} tasks: more than the pool's {len(self.pool.workers)} workers")
        start = time.perf_counter()
        episodes = await asyncio.gather(*(self.run_episode(task, worker, seed=self._seed(batch_index, slot),
                                                           batch=max(0, batch_index - 1))
                                          for slot, (task, worker) in enumerate(
                                              zip(tasks, self.pool.workers, strict=False))))
        sft_weight = self.intervention.cfg.sft_weight if self.intervention is not None else 0.0
        samples = [s for e in episodes for s in episode_samples(e, self.strategy.name, sft_weight=sft_weight)]
        return RolloutBatch(list(episodes), samples, time.perf_counter() - start)

    def _seed(self, batch_index: int, slot: int) -> int:
        return (self.seed * 1_000_003 + batch_index * 4_099 + slot * 1_031) % (1 << 30)

    # -- one episode ----------------------------------------------------------------------------------------------

    async def run_episode(self, task: Any, worker: EnvWorker, seed: int, batch: int = 0) -> EpisodeResult:
        """One episode of ``task`` on ``worker``; ``batch``: its rollout batch n (0-based), which curricula read."""
        key = self.benchmark.task_key(task)
        reference = self.references.get(key) if self.strategy.uses_references else None
        if self.strategy.uses_references and reference is None:
            raise KeyError(f"task {key!r}: no reference in the cache")
        rate, threshold = self.intervention.episode_rule() if self.intervention is not None else (0.0, None)
        ep = _Episode(guidance=self.strategy.start(batch), reference=reference, seed=seed, rate=rate,
                      threshold=threshold)
        guided_episode = ep.guidance.active
        try:
            ep.current = ep.last = await worker.areset(task, self.admissible_lists)
            await self._trace(ep, worker, ep.current)
            for t in range(self.strategy.horizon(batch, self.benchmark.max_turns) + self.forced_answer):
                if not await self._turn(ep, worker, t):
                    break
        except (WorkerDied, EnvError, PromptTooLong) as exc:
            ep.failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"
        except BaseException:  # anything else ends the run: leave no request of this episode behind
            for full in ep.full_tasks:
                full.cancel()
            raise
        fulls = list(await asyncio.gather(*ep.full_tasks))
        last, guidance = ep.last, ep.guidance
        done = bool(last and last.done)
        return EpisodeResult(
            task=key, task_type=self.benchmark.task_type(task), turns=ep.turns, score=last.score if last else 0.0,
            won=bool(last and self.benchmark.succeeded(last)), done=done, guided=guided_episode,
            fallback_turn=guidance.fallback_turn, aligned_turns=guidance.aligned_turns,
            fully_aligned=guided_episode and guidance.active and done and ep.failure is None, contexts=ep.contexts,
            full_responses=[f for f, _ in fulls], full_response_done=[d for _, d in fulls], failure=ep.failure,
            prompts=ep.counts, context_turns=ep.context_turns, teacher_responses=ep.teacher_responses,
            replaced=ep.replaced, proposal_scores=ep.proposal_scores, interventions=ep.interventions,
            transitions=ep.transitions, states=ep.states)

    async def _turn(self, ep: _Episode, worker: EnvWorker, t: int) -> bool:
        """Turn ``t``: choose, execute and check its action; returns whether the episode goes on."""
        reference, guidance = ep.reference, ep.guidance
        guided = guidance.active
        if guided and ep.current.admissible is None:  # B.5's check (and an ID proposal's validity) reads the list
            ep.current = dataclasses.replace(ep.current, admissible=await worker.acall("admissible"))
        current = ep.current
        source = self.strategy.source(guidance, t, len(reference.actions) if reference else 0)
        full_seed, fast_seed = turn_seeds(ep.seed, t)
        full = None
        if source is ActionSource.FULL_RESPONSE or (self.strategy.samples(source) and self.full_responses):
            context = self._prompt(Mode.FULL_RESPONSE, current, ep.history, ep.counts).token_ids
            full = asyncio.ensure_future(self.full_response(context, full_seed))
            ep.contexts.append(context)
            ep.context_turns.append(t)
            ep.full_tasks.append(full)
            ep.teacher_responses.append(None)
            ep.replaced.append(False)
            ep.proposal_scores.append(None)
        action, proposal, source, fast = await self._action(source, full, current, ep.history, reference, t,
                                                            fast_seed, ep.counts)
        if self.intervention is not None and source is ActionSource.FULL_RESPONSE:
            action, source = await self._intervene(ep, action, fast_seed)
        seed = fast.seed if fast is not None else (full_seed if source is ActionSource.FULL_RESPONSE else None)
        step_started = time.perf_counter()
        nxt = await worker.astep(action)
        step_done = time.perf_counter()
        await self._trace(ep, worker, nxt)
        check, go_on = None, True
        if guided:  # B.5: every guided transition is checked, whatever produced its action
            result = self.benchmark.check(reference, t, action=action, current=current, next=nxt,
                                          previous=guidance.previous)
            check = "passed" if result.passed else result.reason
            go_on = self.strategy.after_check(guidance, t, result)
        ep.turns.append(TurnRecord(t, source, action, proposal, fast, nxt.valid, check, step_started, step_done, seed))
        ep.history.append(Step(current.observation, action))
        if self.forced_answer and nxt.truncated and t + 1 == self.benchmark.max_turns:
            nxt = await worker.acall("force_answer")
        ep.current = ep.last = nxt
        return not nxt.finished and go_on

    async def _trace(self, ep: _Episode, worker: EnvWorker, transition: Transition) -> None:
        """With ``trace``: keep ``transition`` (just returned by ``worker``) and the environment's state after it."""
        if self.trace:
            ep.states.append(await worker.astate())
            ep.transitions.append(transition)

    async def _intervene(self, ep: _Episode, action: str, seed: int) -> tuple[str, ActionSource]:
        """UOPD at a student turn whose proposal (the last context's full response) is ``action``: the action to
        execute and its source."""
        proposal, _ = await ep.full_tasks[-1]
        record, ep.proposal_scores[-1] = await self.intervention.decide(ep.contexts[-1], proposal, ep.rate,
                                                                         ep.threshold)
        ep.interventions.append(record)
        if not record.intervened:
            return action, ActionSource.FULL_RESPONSE
        t0 = time.perf_counter()
        teacher = await self.intervention.teacher_response(ep.contexts[-1], seed, self.benchmark.response_format)
        record.teacher_s = time.perf_counter() - t0
        executed = teacher_action(teacher, self.benchmark.response_format)
        if executed is None:  # truncated (B.3) or ended without a complete action: nothing to execute or imitate
            record.teacher_no_action = True
            return action, ActionSource.FULL_RESPONSE
        ep.teacher_responses[-1] = teacher
        if self.intervention.cfg.teacher_execution:
            ep.replaced[-1] = True
            return executed, ActionSource.TEACHER
        return action, ActionSource.FULL_RESPONSE

    def _prompt(self, mode: Mode, current: Transition, history: list[Step], counts: PromptCounts,
                reference_next: str | None = None) -> Prompt:
        """The request of ``mode`` in ``rollout.prompts``' set (``actfirst``: fitted by B.2); the model's limit is
        max_model_len less the response's budget."""
        response = self.cfg.budget.total if mode is Mode.FULL_RESPONSE else self.cfg.budget.fast_action_tokens
        prompt = build_prompt(self.tokenizer, self.benchmark, mode, task_description=current.task_description,
                              history=history, current=current, budget_tokens=self.cfg.max_prompt_tokens,
                              limit_tokens=self.max_model_len - response, reference_next_observation=reference_next,
                              prompts=self.cfg.prompts)
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

    async def _action(self, source: ActionSource, full: asyncio.Future | None, current: Transition, history: list[Step],
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


def turn_seeds(base: int, turn: int) -> tuple[int, int]:
    """The sampling seeds of turn ``turn`` in an episode of base seed ``base``: (full response, fast action)."""
    return base + 2 * turn, base + 2 * turn + 1


def matched_base(base: int, strategy: RolloutStrategy) -> int:
    """The episode seed under which ``strategy``'s executed action of turn t is sampled with seed ``base + 2t + 1``
    whatever its source (a strategy without fast actions executes its full response's action, sampled with the
    episode seed + 2t): episodes of several strategies played from one ``base`` share each turn's sampling seed
    (C.5)."""
    return base if strategy.fast_actions else base + 1


def episode_samples(episode: EpisodeResult, strategy: str, *, sft_weight: float = 0.0) -> list[Sample]:
    """The episode's turn-level samples (B.4): one per sampled context, its full response; with UOPD, a proposal
    that the teacher's action replaced carries no loss, and an intervened turn's teacher response is an SFT target
    of weight ``sft_weight`` (none when it is 0)."""
    turns = episode.context_turns or list(range(len(episode.contexts)))
    teachers = episode.teacher_responses or [None] * len(episode.contexts)
    replaced = episode.replaced or [False] * len(episode.contexts)
    scores = episode.proposal_scores or [None] * len(episode.contexts)
    samples = []
    for t, context, response, teacher, by_teacher, score in zip(turns, episode.contexts, episode.full_responses,
                                                                 teachers, replaced, scores, strict=False):
        if not by_teacher:
            sample = response.to_sample(context, task=episode.task, turn=t, strategy=strategy)
            sample.teacher_logprobs = score
            samples.append(sample)
        if teacher is not None and sft_weight > 0:
            target = teacher.to_sample(context, task=episode.task, turn=t, strategy=strategy)
            # the teacher's tokens, staled with the proposal they replaced
            target.weight_version, target.token_versions, target.sft_weight = response.weight_version, [], sft_weight
            samples.append(target)
    return samples
