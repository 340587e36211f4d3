"""Every rollout strategy on the real simulators (generated ALFWorld games, ScienceWorld), the real engine and a tiny
random student: what each strategy executes, the NAP fallback, the invalid-proposal rule, prefix replay, and that
full responses never block a transition."""

import asyncio
import time

import pytest
from transformers import AutoTokenizer

from actfirst.core.config import (
    RolloutConfig,
    SchedulerConfig,
    ThinkingBudgetConfig,
)
from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.base import Reference
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.tasks import ScienceWorldTask
from actfirst.envs.workers import EnvPool
from actfirst.preparation.reference_cache import replay
from actfirst.rollout.runner import RolloutRunner, episode_samples
from actfirst.rollout.strategies import ActionSource, TCODConfig, UOPDConfig, make_strategy

BUDGET = ThinkingBudgetConfig(first_stage=24, total=32, second_stage=8, fast_action_tokens=6)


def build_references(benchmark, tasks, actions_of):
    """References by replaying a known solution of each task (what ``actfirst.references`` selects from)."""

    async def run():
        with EnvPool(benchmark.env_spec(), size=1) as pool:
            refs = {}
            for task in tasks:
                executed, transitions = await replay(pool.workers[0], task, actions_of(task))
                assert transitions[-1].done and benchmark.succeeded(transitions[-1])
                refs[benchmark.task_key(task)] = Reference(benchmark.task_key(task), executed, transitions, "test")
            return refs

    return asyncio.run(run())


@pytest.fixture(scope="module")
def alfworld(alfworld_games):
    from actfirst.envs.alfworld.env import walkthrough

    benchmark = get_benchmark("alfworld", ALFWorldConfig(games="generated", max_turns=5))
    tasks = alfworld_games[:3]
    return benchmark, tasks, build_references(benchmark, tasks, walkthrough)


@pytest.fixture(scope="module")
def scienceworld():
    cfg = ScienceWorldConfig(train_task_types=["find-non-living-thing"], max_turns=4)
    benchmark = get_benchmark("scienceworld", cfg)
    tasks = [ScienceWorldTask("find-non-living-thing", v) for v in (0, 1)]

    async def gold(pool, task):
        return await pool.workers[0].acall("gold_path", task)

    with EnvPool(benchmark.env_spec(), size=1) as pool:
        paths = {t: asyncio.run(gold(pool, t)) for t in tasks}
    return benchmark, tasks, build_references(benchmark, tasks, lambda t: [a for a in paths[t]
                                                                          if not a.startswith("open door")])


def run(engine, tiny_model_dir, setup, strategy, budget=BUDGET, play=None, max_prompt_tokens=2000, batch_index=0,
        tcod=None, intervention=None, prompts="actfirst"):
    """One rollout batch of ``setup``'s tasks; ``play(pool, runner_kwargs)``, when given, runs it instead."""
    benchmark, tasks, refs = setup
    engine.reconfigure(SchedulerConfig(b_max=8))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = RolloutConfig(strategy=strategy, batch_tasks=len(tasks), max_prompt_tokens=max_prompt_tokens,
                        budget=budget, prompts=prompts)
    strat = make_strategy(strategy, tcod)

    async def go():
        with EnvPool(benchmark.env_spec(), size=len(tasks)) as pool:
            kwargs = dict(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool, strategy=strat, cfg=cfg,
                          references=refs if strat.uses_references else None, seed=3, intervention=intervention)
            if play is not None:
                return await play(pool, kwargs)
            return await RolloutRunner(**kwargs).run_batch(tasks, batch_index=batch_index)

    return asyncio.run(go()), refs


def check_common(batch, benchmark):
    """What every strategy must do: one full response and one sample per visited context, finished."""
    for episode in batch.episodes:
        assert episode.failure is None
        assert 1 <= episode.num_turns <= benchmark.max_turns
        # A full response for every visited context: one per executed turn (the last context may end the episode).
        assert len(episode.full_responses) == episode.num_turns
        samples = episode_samples(episode, "x")
        assert [s.turn for s in samples] == list(range(episode.num_turns))
        for s, r in zip(samples, episode.full_responses, strict=True):
            assert len(s.response_ids) == len(s.loss_mask) == len(s.logprobs) > 0
            assert r.weight_version >= 0
    assert len(batch.samples) == sum(e.num_turns for e in batch.episodes)


@pytest.mark.parametrize("setup_name", ["alfworld", "scienceworld"])
def test_actfirst_fast_actions_fallback_and_invalid_proposal(engine, tiny_model_dir, setup_name, request):
    setup = request.getfixturevalue(setup_name)
    benchmark = setup[0]
    batch, refs = run(engine, tiny_model_dir, setup, "actfirst")
    check_common(batch, benchmark)
    for episode in batch.episodes:
        assert episode.guided
        fallback = episode.fallback_turn
        for record in episode.turns:
            # The executed action is the fast one, never the full response's.
            assert record.fast is not None and record.action == record.fast.action
            assert record.source in (ActionSource.INVERSE_DYNAMICS, ActionSource.NAP_RETRY, ActionSource.NEXT_ACTION)
            if fallback is None or record.turn <= fallback:  # guided: inverse dynamics, checked
                assert record.source != ActionSource.NEXT_ACTION and record.check is not None
            else:  # the fallback is permanent: NAP, no check
                assert record.source == ActionSource.NEXT_ACTION and record.check is None
            # B.5: an invalid proposal was replaced by one NAP request before execution.
            if record.source == ActionSource.NAP_RETRY:
                assert record.proposal is not None
            if record.proposal is not None:
                assert record.source == ActionSource.NAP_RETRY
            # A guided turn's check read its state's admissible list, so its validity is known (ScienceWorld builds the
            # list only there in a training rollout; ALFWorld with every transition).
            assert record.valid is not None or (record.check is None and setup_name == "scienceworld")
        if fallback is not None:
            assert episode.turns[fallback].check != "passed"
            assert all(r.check == "passed" for r in episode.turns[:fallback])
        assert episode.aligned_turns == sum(r.check == "passed" for r in episode.turns)
    # A tiny random student proposes junk: its proposals are invalid, so the retry rule is exercised.
    assert any(r.source == ActionSource.NAP_RETRY for e in batch.episodes for r in e.turns)
    # Exactly one fast-action request per turn, plus exactly one NAP request per invalid proposal (the engine's
    # records; reconfigure cleared them before this batch).
    fast = [r for r in engine.records if r.kind.name == "FAST_ACTION"]
    assert len(fast) == sum(1 + (r.proposal is not None) for e in batch.episodes for r in e.turns)


def test_scienceworld_builds_admissible_lists_only_where_read(engine, tiny_model_dir, scienceworld):
    # Vanilla OPD's training rollout runs no check: no list, no validity; an evaluation counts invalid turns: all.
    for evaluation in (False, True):
        async def play(pool, kwargs, evaluation=evaluation):
            runner = RolloutRunner(**kwargs, evaluation=evaluation)
            return await runner.run_batch(scienceworld[1], batch_index=0)

        batch, _ = run(engine, tiny_model_dir, scienceworld, "vanilla", play=play)
        check_common(batch, scienceworld[0])
        valid = [r.valid for e in batch.episodes for r in e.turns]
        assert valid and all((v is None) != evaluation for v in valid)


class HeldFullResponseRunner(RolloutRunner):
    """Fault injection: every full response, once generated, is held back until ``release`` is set, as if the
    student's reasoning took forever."""

    def __init__(self, release: asyncio.Event, **kwargs):
        super().__init__(**kwargs)
        self.release = release

    async def full_response(self, prompt_ids: list[int], seed: int):
        response, _ = await super().full_response(prompt_ids, seed)
        await self.release.wait()
        return response, time.perf_counter()


def run_with_held_full_responses(engine, tiny_model_dir, setup, strategy, patience_s):
    """Run a batch whose full responses are held until every episode has stopped stepping (its transition
    finished the episode or reached the turn limit), or until ``patience_s`` passed; returns the batch, the release
    time and the number of steps taken while the full responses were held."""
    benchmark, tasks, _ = setup

    async def play(pool, runner_kwargs):
        release = asyncio.Event()
        steps = [0] * len(tasks)
        stepping = [True] * len(tasks)
        all_done = asyncio.Event()
        for slot, worker in enumerate(pool.workers):
            def counted(action, slot=slot, astep=worker.astep):
                async def step():
                    nxt = await astep(action)
                    steps[slot] += 1
                    if nxt.finished or steps[slot] == benchmark.max_turns:
                        stepping[slot] = False
                        if not any(stepping):
                            all_done.set()
                    return nxt
                return step()
            worker.astep = counted
        runner = HeldFullResponseRunner(release, **runner_kwargs)
        batch = asyncio.ensure_future(runner.run_batch(tasks, batch_index=0))
        # Until every episode stopped stepping, the patience ran out, or the batch failed (raised below).
        await asyncio.wait({batch, asyncio.ensure_future(all_done.wait())}, timeout=patience_s,
                           return_when=asyncio.FIRST_COMPLETED)
        held_steps = sum(steps)
        released_at = time.perf_counter()
        release.set()
        return await batch, released_at, held_steps

    return run(engine, tiny_model_dir, setup, strategy, play=play)[0]


def test_no_full_response_blocks_a_transition(engine, tiny_model_dir, alfworld):
    """With every full response held back, the no-ID strategy still plays each episode to its end."""
    batch, released_at, held_steps = run_with_held_full_responses(engine, tiny_model_dir, alfworld, "no_id",
                                                                  patience_s=120)
    check_common(batch, alfworld[0])
    assert held_steps == sum(e.num_turns for e in batch.episodes) > len(batch.episodes)
    for episode in batch.episodes:
        assert all(r.source == ActionSource.NEXT_ACTION and r.check is None for r in episode.turns)
        assert all(r.step_started < released_at for r in episode.turns)
        assert not episode.guided
    # Fast actions were admitted first: no fast action waited behind a full response's admission.
    fast = [r for r in engine.records if r.kind.name == "FAST_ACTION"]
    full = [r for r in engine.records if r.kind.name == "FULL_RESPONSE"]
    assert fast and full
    assert not any(f.arrival_seq < seq < f.admit_seqs[0] for x in full for seq in x.admit_seqs for f in fast)


def test_held_full_responses_stop_vanilla(engine, tiny_model_dir, alfworld):
    """The control: vanilla executes the full response's action, so while full responses are held nothing steps."""
    batch, released_at, held_steps = run_with_held_full_responses(engine, tiny_model_dir, alfworld, "vanilla",
                                                                  patience_s=3)
    assert held_steps == 0
    check_common(batch, alfworld[0])
    assert all(r.step_started > released_at for e in batch.episodes for r in e.turns)


def test_vanilla_executes_the_full_response_action(engine, tiny_model_dir, alfworld):
    batch, _ = run(engine, tiny_model_dir, alfworld, "vanilla")
    check_common(batch, alfworld[0])
    for episode in batch.episodes:
        assert not episode.guided
        for record, response in zip(episode.turns, episode.full_responses, strict=True):
            assert record.source == ActionSource.FULL_RESPONSE and record.fast is None
            assert record.action == response.action


@pytest.mark.parametrize("strategy,fraction", [("ref_prefix_50", 0.5), ("ref_prefix_100", 1.0)])
def test_prefix_replay_executes_exactly_the_reference_prefix(engine, tiny_model_dir, alfworld, strategy, fraction):
    import math

    batch, refs = run(engine, tiny_model_dir, alfworld, strategy)
    check_common(batch, alfworld[0])
    for episode in batch.episodes:
        ref = refs[episode.task]
        k = math.ceil(fraction * len(ref.actions))
        replayed = [r.action for r in episode.turns if r.source == ActionSource.REFERENCE]
        assert replayed == ref.actions[: min(k, episode.num_turns)]
        assert all(r.source == ActionSource.NEXT_ACTION for r in episode.turns[k:])
        if fraction == 1.0 and len(ref.actions) <= alfworld[0].max_turns:
            assert episode.won and episode.num_turns == len(ref.actions)


def test_no_nap_ends_the_episode_at_the_first_failed_check(engine, tiny_model_dir, alfworld):
    batch, _ = run(engine, tiny_model_dir, alfworld, "no_nap")
    check_common(batch, alfworld[0])
    assert any(e.fallback_turn is not None for e in batch.episodes)  # junk proposals fail their checks
    for episode in batch.episodes:
        if episode.fallback_turn is not None:
            assert episode.num_turns == episode.fallback_turn + 1
        assert all(r.source != ActionSource.NEXT_ACTION for r in episode.turns)


def test_a_dying_worker_fails_its_episode_and_the_batch_goes_on(engine, tiny_model_dir, alfworld):
    """Fault injection: the environment worker of one episode is killed mid-episode."""
    import os
    import signal

    benchmark, tasks, refs = alfworld
    engine.reconfigure(SchedulerConfig(b_max=8))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = RolloutConfig(strategy="no_id", batch_tasks=len(tasks), max_prompt_tokens=2000, budget=BUDGET)

    async def go():
        with EnvPool(benchmark.env_spec(), size=len(tasks)) as pool:
            runner = RolloutRunner(engine=engine, tokenizer=tokenizer, benchmark=benchmark, pool=pool,
                                   strategy=make_strategy("no_id"), cfg=cfg, references=None, seed=5)
            victim = pool.workers[0]

            async def kill_soon():
                while engine.num_steps < 3:
                    await asyncio.sleep(0.01)
                os.kill(victim.pid, signal.SIGKILL)

            batch, _ = await asyncio.gather(runner.run_batch(tasks, 0), kill_soon())
            again = await runner.run_batch(tasks, 1)  # the restarted worker plays the next episode
            return batch, again

    batch, again = asyncio.run(go())
    failed = [e for e in batch.episodes if e.failure is not None]
    assert len(failed) == 1 and "WorkerDied" in failed[0].failure
    # The samples of the contexts it had visited are kept; the other episodes finished.
    # Killed during a reset (no context yet) or during a step (its context's full response is kept).
    assert len(failed[0].full_responses) in (failed[0].num_turns, failed[0].num_turns + 1)
    assert all(e.failure is None for e in again.episodes)


def test_guidance_holds_while_checks_pass_then_falls_back_for_good(engine, tiny_model_dir, alfworld, load_chain,
                                                                    tokenizer):
    """A student that always answers the reference's first action (hand-set bigram weights, see conftest): turn 0's
    inverse-dynamics action reproduces the reference transition and passes its check; the same action at turn 1
    does not, and every later turn is NAP, unchecked."""
    from actfirst.train.metrics import rollout_counts, rollout_rates

    benchmark, tasks, refs = alfworld
    task = tasks[0]
    first_action = refs[benchmark.task_key(task)].actions[0]
    prompt_end = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)[-1]
    words = tokenizer.encode(first_action, add_special_tokens=False)
    chain = [prompt_end, *tokenizer.encode("<action>", add_special_tokens=False), *words,
             *tokenizer.encode("</action>", add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    load_chain(chain)
    budget = ThinkingBudgetConfig(first_stage=24, total=32, second_stage=8, fast_action_tokens=len(chain))
    batch, _ = run(engine, tiny_model_dir, (benchmark, [task], refs), "actfirst", budget)
    (episode,) = batch.episodes
    assert [r.action for r in episode.turns] == [first_action] * episode.num_turns
    assert episode.turns[0].source == ActionSource.INVERSE_DYNAMICS and episode.turns[0].check == "passed"
    assert episode.aligned_turns == 1 and episode.fallback_turn == 1 and episode.turns[1].check != "passed"
    assert episode.num_turns == benchmark.max_turns
    assert all(r.source == ActionSource.NEXT_ACTION and r.check is None for r in episode.turns[2:])
    metrics = rollout_rates(rollout_counts(batch.episodes))
    assert metrics["align/first_action"] == 1.0 and metrics["align/full_trajectory"] == 0.0
    assert metrics["align/turn_coverage"] == 1 / episode.num_turns and metrics["fallback/mean_turn"] == 1.0


def test_prompts_over_the_budget_go_ahead_without_history_and_are_counted(engine, tiny_model_dir, alfworld):
    """B.2 with a 10-token budget: no prompt fits even without history, so every request goes without history, as
    it is (the model takes it), and is counted; no episode fails for it."""
    from actfirst.train.metrics import rollout_counts, rollout_rates

    benchmark = alfworld[0]
    batch, _ = run(engine, tiny_model_dir, alfworld, "vanilla", max_prompt_tokens=10)
    for episode in batch.episodes:
        assert episode.failure is None and episode.prompts.over_budget == episode.num_turns  # one full response each
    assert all(len(c) > 10 for e in batch.episodes for c in e.contexts)
    assert rollout_rates(rollout_counts(batch.episodes))["prompt/over_budget"] == batch.num_transitions
    check_common(batch, benchmark)


def test_uopd_prompts_are_every_context_of_real_alfworld_episodes(engine, tiny_model_dir, alfworld):
    """``rollout.prompts: uopd`` reaches the runner: on generated ALFWorld games, every sampled context is E.1's
    prompt of its turn rendered from the episode's own transitions and actions (the first without the task line,
    then the min(2, steps taken) latest steps), chat-templated."""
    from actfirst.rollout.prompts import Step, render_recent_steps

    benchmark, tasks, _ = alfworld

    async def play(pool, kwargs):
        return await RolloutRunner(**kwargs, trace=True).run_batch(tasks, batch_index=0)

    batch, _ = run(engine, tiny_model_dir, alfworld, "vanilla", play=play, prompts="uopd")
    check_common(batch, benchmark)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for episode in batch.episodes:
        actions = [turn.action for turn in episode.turns]
        for t, context in enumerate(episode.contexts):
            current = episode.transitions[t]
            history = [Step(episode.transitions[i].observation, actions[i]) for i in range(t)]
            text, shown = render_recent_steps(benchmark.uopd_prompts, task_description=current.task_description,
                                              history=history, current=current)
            assert shown == min(2, t)
            assert text.startswith("You are an expert agent operating in the ALFRED Embodied Environment." +
                                   ("\nYour current observation is: " if t == 0 else " Your task is to: "))
            assert context == tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                            add_generation_prompt=True, tokenize=True,
                                                            return_dict=False)


def test_an_inverse_dynamics_prompt_the_model_cannot_take_falls_back_to_nap(engine, tiny_model_dir, alfworld):
    """A reference next observation longer than the engine's max_model_len (2,048) makes turn 0's inverse-dynamics
    prompt impossible; B.2 does not shorten the reference, so that turn is next-action prediction, counted, and the
    episode goes on (the check then fails on the reference's observation: the NAP fallback for good)."""
    import dataclasses

    from actfirst.train.metrics import rollout_counts, rollout_rates

    benchmark, tasks, refs = alfworld
    key = benchmark.task_key(tasks[0])
    ref = refs[key]
    long = dataclasses.replace(ref.transitions[1], observation="a very long observation " * 700)
    refs = {key: Reference(key, ref.actions, [ref.transitions[0], long, *ref.transitions[2:]], "test")}
    batch, _ = run(engine, tiny_model_dir, (benchmark, [tasks[0]], refs), "actfirst")
    (episode,) = batch.episodes
    assert episode.failure is None and episode.prompts.id_overflow_naps == 1
    assert episode.turns[0].source == ActionSource.NEXT_ACTION and episode.turns[0].check != "passed"
    assert episode.fallback_turn == 0
    assert rollout_rates(rollout_counts(batch.episodes))["prompt/id_overflow_naps"] == 1


# -- the UOPD paper's methods (003 Appendix D.3, Sec. 4.2) ------------------------------------------------------------


def test_f2b_plays_w_n_student_turns_then_ends(engine, tiny_model_dir, alfworld, n=13, horizon=3):
    """W_n = min(1 + floor(n / eta), T_max), eta 6: think-then-act turns, one sample each (other n: by hand in
    test_intervention.py)."""
    batch, _ = run(engine, tiny_model_dir, alfworld, "f2b", batch_index=n + 1, tcod=TCODConfig(eta=6))
    for episode in batch.episodes:
        assert episode.num_turns == horizon or (episode.done and episode.num_turns < horizon)
        assert all(r.source is ActionSource.FULL_RESPONSE for r in episode.turns)
        assert [s.turn for s in episode_samples(episode, "f2b")] == list(range(episode.num_turns))


@pytest.mark.parametrize("n", [12])
def test_b2f_replays_p_n_reference_actions_without_samples(engine, tiny_model_dir, alfworld, n):
    """P_n = clamp(L - 1 - floor(n / eta), 0, L - 1), eta 5: the replayed turns get no full response and no
    sample; the student plays think-then-act from there."""
    from actfirst.train.metrics import rollout_counts, rollout_rates

    batch, refs = run(engine, tiny_model_dir, alfworld, "b2f", batch_index=n + 1, tcod=TCODConfig(eta=5))
    replayed_total = 0
    for episode in batch.episodes:
        ref = refs[episode.task]
        prefix = min(max(len(ref.actions) - 1 - n // 5, 0), len(ref.actions) - 1)
        replayed = min(prefix, episode.num_turns)
        assert [r.action for r in episode.turns[:replayed]] == ref.actions[:replayed]
        assert all(r.source is ActionSource.REFERENCE for r in episode.turns[:replayed])
        assert all(r.source is ActionSource.FULL_RESPONSE for r in episode.turns[replayed:])
        assert episode.context_turns == list(range(replayed, episode.num_turns))
        assert [s.turn for s in episode_samples(episode, "b2f")] == episode.context_turns
        assert len(episode.full_responses) == episode.num_turns - replayed
        replayed_total += replayed
    assert replayed_total > 0 and any(e.context_turns for e in batch.episodes)  # both parts ran somewhere
    rates = rollout_rates(rollout_counts(batch.episodes))
    assert rates["rollout/replayed_turns"] == pytest.approx(replayed_total / len(batch.episodes))


def intervention(teacher, tiny_model_dir, **uopd):
    from actfirst.rollout.intervention import Intervention

    teacher_engine, scorer = teacher
    return Intervention(UOPDConfig(**uopd), rollout=RolloutConfig(strategy="uopd", budget=BUDGET),
                        teacher_engine=teacher_engine, scorer=scorer,
                        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir), num_updates=10, seed=5)


def test_uopd_holds_the_threshold_and_executes_the_teacher_exactly_above_it(engine, tiny_model_dir, alfworld,
                                                                            teacher):
    rule = intervention(teacher, tiny_model_dir, rate=(0.5, 0.5), buffer_size=256, min_scores=200)
    warm, _ = run(engine, tiny_model_dir, alfworld, "uopd", intervention=rule)
    warm_records = [r for e in warm.episodes for r in e.interventions]
    # Too few scores for a quantile: random at r_n, every score kept.
    assert warm_records and all(r.threshold is None and r.score is not None for r in warm_records)
    assert len(rule.scores) == len(warm_records) == warm.num_transitions
    scores = sorted(rule.scores)
    pos = 0.5 * (len(scores) - 1)  # the 0.5 quantile, interpolated by hand
    tau = scores[int(pos)] + (pos - int(pos)) * (scores[min(int(pos) + 1, len(scores) - 1)] - scores[int(pos)])
    rule.cfg.min_scores = 1
    batch, _ = run(engine, tiny_model_dir, alfworld, "uopd", intervention=rule)
    records = [r for e in batch.episodes for r in e.interventions]
    assert len(rule.scores) == len(warm_records) + len(records)  # the buffer grew during the batch...
    assert all(r.threshold == pytest.approx(tau, abs=1e-12) for r in records)  # ...the episodes' tau did not
    assert {r.intervened for r in records} == {True, False}
    for episode in batch.episodes:
        samples = episode_samples(episode, "uopd", sft_weight=1.0)
        for turn, record in zip(episode.turns, episode.interventions, strict=True):
            assert record.intervened == (record.score > tau)
            assert (turn.source is ActionSource.TEACHER) == record.intervened
            teacher_response = episode.teacher_responses[turn.turn]
            if record.intervened:
                assert turn.action == teacher_response.action == "look" and record.teacher_s > 0
                (target,) = [s for s in samples if s.turn == turn.turn]  # no OPD sample of the replaced proposal
                assert target.sft_weight == 1.0 and target.response_ids == teacher_response.token_ids
            else:
                assert teacher_response is None
                (opd,) = [s for s in samples if s.turn == turn.turn]
                assert opd.sft_weight == 0 and opd.response_ids == episode.full_responses[turn.turn].token_ids
                # scored once, during the rollout: the update's scoring keeps these
                assert opd.teacher_logprobs is not None and len(opd.teacher_logprobs) == len(opd.response_ids)


def test_uopd_a_teacher_response_without_an_action_is_neither_executed_nor_imitated(engine, tiny_model_dir,
                                                                                    alfworld, teacher):
    """A one-token budget truncates every teacher response (no closed action field, B.3): the student's action runs
    and its response stays an OPD sample; no SFT target."""
    rule = intervention(teacher, tiny_model_dir, selection="random", rate=(1.0, 1.0))
    rule.rollout = RolloutConfig(strategy="uopd", budget=ThinkingBudgetConfig(first_stage=1, total=1,
                                                                              second_stage=1))
    batch, _ = run(engine, tiny_model_dir, alfworld, "uopd", intervention=rule)
    records = [r for e in batch.episodes for r in e.interventions]
    assert records and all(r.intervened and r.teacher_no_action for r in records)
    assert all(t.source is ActionSource.FULL_RESPONSE for e in batch.episodes for t in e.turns)
    assert all(s.sft_weight == 0 for s in batch.samples) and len(batch.samples) == batch.num_transitions


@pytest.mark.parametrize("execution", [True, False])
def test_uopd_ablations(engine, tiny_model_dir, alfworld, teacher, execution):
    """Sec. 5.3: random intervention (every turn at rate 1, no score); w/o SFT (beta 0: no SFT target); SFT target
    only (teacher_execution false: the student's action executed, its response an OPD sample beside the teacher's
    SFT target). Rates 0 and 1 by themselves: test_intervention.py."""
    rule = intervention(teacher, tiny_model_dir, selection="random", rate=(1.0, 1.0), teacher_execution=execution)
    batch, _ = run(engine, tiny_model_dir, alfworld, "uopd", intervention=rule)
    for episode in batch.episodes:
        records, turns = episode.interventions, range(episode.num_turns)
        assert len(records) == episode.num_turns and all(r.score is None and r.intervened for r in records)
        assert all((r.source is ActionSource.TEACHER) == execution for r in episode.turns)
        with_sft = sorted((s.turn, s.sft_weight) for s in episode_samples(episode, "uopd", sft_weight=1.0))
        without_sft = sorted((s.turn, s.sft_weight) for s in episode_samples(episode, "uopd", sft_weight=0.0))
        if execution:  # the replaced proposals carry no loss
            assert with_sft == [(t, 1.0) for t in turns] and without_sft == []
        else:
            assert with_sft == sorted([(t, 0.0) for t in turns] + [(t, 1.0) for t in turns])
            assert without_sft == [(t, 0.0) for t in turns]
    assert len(batch.samples) == sum(e.num_turns for e in batch.episodes) * (1 if execution else 2)
