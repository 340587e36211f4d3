"""Environment worker processes: the configured environment, results, failures, restarts and clean shutdown, with
real ScienceWorld JVMs and ALFWorld games.

Faults are injected by killing real processes (SIGKILL, SIGINT), and, where a restart or a call that never answers
is what matters, by a fault-injection environment (``fault_injection_env.py``) that is slow to start and whose step
crashes or hangs its worker.
"""

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from fault_injection_env import fault_injection_spec

from actfirst.envs.alfworld.config import ALFWorldConfig
from actfirst.envs.benchmarks import get_benchmark
from actfirst.envs.scienceworld.config import ScienceWorldConfig
from actfirst.envs.scienceworld.tasks import ScienceWorldTask
from actfirst.envs.workers import EnvError, EnvPool, EnvWorker, WorkerDied

TASK = ScienceWorldTask("find-non-living-thing", 0)
SCIENCEWORLD = get_benchmark("scienceworld")


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def jvm_of(worker):
    (jvm,) = [p for p in worker.pids()[1:] if "java" in psutil.Process(p).name()]
    return jvm


@pytest.fixture
def worker():
    worker = EnvWorker(SCIENCEWORLD.env_spec())
    worker.start()
    yield worker
    worker.close()


def test_worker_runs_the_environment_and_its_jvm(worker):
    pids = worker.pids()
    assert len(pids) >= 2 and any("java" in psutil.Process(p).name() for p in pids[1:])
    first = worker.reset(TASK)
    assert first.observation.startswith("This room is called the hallway.")
    assert worker.step("go to kitchen").observation == "You move to the kitchen."
    assert worker.memory_bytes() > 100 * 2**20


def test_a_worker_and_its_jvm_keep_to_the_cores_given():
    """``cores`` (``parallel.cpu_pin_cores``): the worker pins itself before its environment starts, so every
    thread of the worker and of the JVM it starts runs on those cores only; this process's own are untouched."""
    mine = os.sched_getaffinity(0)
    core = max(mine)
    worker = EnvWorker(SCIENCEWORLD.env_spec(), cores=(core,))
    worker.start()
    try:
        assert worker.reset(TASK).observation.startswith("This room is called the hallway.")
        threads = {(pid, int(tid)) for pid in worker.pids() for tid in os.listdir(f"/proc/{pid}/task")}
        assert len(threads) > 10  # the JVM's threads among them
        assert {t: os.sched_getaffinity(t) for _, t in threads} == {t: {core} for _, t in threads}
        assert os.sched_getaffinity(0) == mine
    finally:
        worker.close()


def test_the_configured_environment_is_built_in_the_worker(alfworld_games):
    plain = get_benchmark("scienceworld", dataclasses.replace(SCIENCEWORLD.config, max_turns=2, simplification=""))
    workers = {"easy": EnvWorker(SCIENCEWORLD.env_spec()), "plain": EnvWorker(plain.env_spec()),
               "alfworld": EnvWorker(get_benchmark("alfworld",
                                                   ALFWorldConfig(games="generated", max_turns=2)).env_spec())}
    try:
        easy, none = workers["easy"].reset(TASK), workers["plain"].reset(TASK)
        # The easy preset's teleport action is there only with the simplification; closed doors only without it.
        assert "teleport to kitchen" in easy.admissible and "teleport to kitchen" not in none.admissible
        assert "open door to kitchen" in none.admissible and "open door to kitchen" not in easy.admissible
        for name in ("easy", "plain"):
            steps = [workers[name].step("look around") for _ in range(2)]
            assert [s.truncated for s in steps] == [False, name == "plain"]  # max_turns 30 and 2
        workers["alfworld"].reset(alfworld_games[0])
        assert [workers["alfworld"].step("look").truncated for _ in range(2)] == [False, True]
    finally:
        for w in workers.values():
            w.close()


class _UnpicklableConfigFaultInjection(ScienceWorldConfig):
    """A config that cannot be pickled: the worker's process cannot be started (fault injection)."""

    def __reduce__(self):
        raise TypeError("this config cannot be pickled (fault injection)")


def test_a_process_that_cannot_start_raises_its_own_error():
    config = SCIENCEWORLD.config
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    unpicklable = _UnpicklableConfigFaultInjection(**fields)
    spec = dataclasses.replace(SCIENCEWORLD.env_spec(), config=unpicklable)
    pool = EnvPool(spec, size=1)
    with pytest.raises(TypeError, match="cannot be pickled"):  # not the close's AttributeError on a pipe never opened
        pool.start()
    (worker,) = pool.workers
    assert worker.pid is None
    pool.close()  # closing again is harmless


def test_dead_worker_fails_the_episode_with_a_reason_and_is_restarted(worker):
    worker.reset(TASK)
    old = worker.pids()
    os.kill(old[0], signal.SIGKILL)
    with pytest.raises(WorkerDied, match=r"died \(signal 9\); restarted as \d+"):
        worker.step("go to kitchen")
    assert worker.restarts == 1 and worker.pid != old[0]
    assert wait_gone(old) == []  # its JVM went with it
    assert worker.reset(TASK).turn == 0  # the restarted worker serves the next episode


def test_worker_killed_between_calls_fails_the_next_step_and_serves_the_next_reset(worker):
    worker.reset(TASK)
    worker.step("go to kitchen")
    old = worker.pids()
    os.kill(old[0], signal.SIGKILL)
    assert wait_gone(old[:1]) == []  # dead before the next call starts
    with pytest.raises(WorkerDied, match=rf"worker {old[0]} died \(signal 9\); restarted as \d+; its episode is lost"):
        worker.step("look around")
    assert worker.restarts == 1 and wait_gone(old) == []
    with pytest.raises(WorkerDied, match="its episode is lost"):  # still no episode to continue
        worker.step("look around")
    with pytest.raises(WorkerDied, match="its episode is lost"):  # nor its state (C.5) to read
        worker.call("state")
    first = worker.reset(TASK)  # a new episode runs on the restarted worker
    assert first.turn == 0 and worker.step("go to kitchen").observation == "You move to the kitchen."
    assert worker.call("state").content[0].startswith("This room is called the kitchen.")
    assert worker.restarts == 1


def test_a_hung_worker_is_killed_after_the_call_timeout_fault_injection(worker):
    """Fault injection: the worker process is stopped (SIGSTOP), so its call never answers. What is asserted is the
    outcome: killed with its JVM, named, restarted, usable (its first reset gets the start-up time, not the 2 s)."""
    worker.call_timeout_s = 2.0
    worker.reset(TASK)
    old = worker.pids()
    os.kill(old[0], signal.SIGSTOP)
    with pytest.raises(WorkerDied, match=rf"worker {old[0]} gave no reply to step within 2 s \(killed\); restarted"):
        asyncio.run(worker.astep("go to kitchen"))
    assert worker.restarts == 1 and wait_gone(old) == []
    assert asyncio.run(worker.areset(TASK)).turn == 0  # the restarted worker plays the next episode


def test_the_first_call_after_a_start_gets_the_start_up_time(worker):
    """A call limit no reply can meet (a microsecond) applies to every call but the first after a (re)start, whose
    simulator may still be warming up: the first reset plays, the step after it is killed, and the restarted
    worker's first reset plays again."""
    worker.call_timeout_s = 1e-6
    assert asyncio.run(worker.areset(TASK)).turn == 0
    with pytest.raises(WorkerDied, match=r"gave no reply to step within 1e-06 s \(killed\); restarted as \d+"):
        asyncio.run(worker.astep("go to kitchen"))
    assert worker.restarts == 1 and asyncio.run(worker.areset(TASK)).turn == 0


def test_jvm_killed_between_steps_fails_the_next_step_and_serves_the_next_reset(worker):
    worker.reset(TASK)
    worker.step("go to kitchen")
    old, jvm = worker.pids(), jvm_of(worker)
    os.kill(jvm, signal.SIGKILL)
    assert wait_gone([jvm]) == []  # a zombie of the worker counts as gone
    with pytest.raises(WorkerDied, match=rf"lost its child {jvm} \(java\); restarted as \d+; its episode is lost"):
        worker.step("look around")
    assert worker.restarts == 1 and wait_gone(old) == []  # what was left of the worker is killed
    first = worker.reset(TASK)
    assert first.turn == 0 and worker.step("go to kitchen").observation == "You move to the kitchen."
    assert jvm_of(worker) != jvm and worker.restarts == 1


def test_jvm_killed_during_steps_fails_the_call_then_the_next_reset_plays(worker):
    worker.reset(TASK)

    async def kill_during(call, delay):
        pending = asyncio.create_task(call)
        await asyncio.sleep(delay)
        assert not pending.done()  # the JVM dies while the worker is stepping
        os.kill(jvm_of(worker), signal.SIGKILL)
        return await asyncio.gather(pending, return_exceptions=True)

    # Hundreds of steps in one call (the simulator's own step, as reference shortening uses it): the kill lands
    # during a step, whose failure reaches the worker as a py4j error while its JVM is dead.
    (died,) = asyncio.run(kill_during(worker.acall("succeeds", TASK, ["look around"] * 2000), 1.0))
    assert isinstance(died, WorkerDied) and "lost its child" in str(died) and "(java)" in str(died), died
    assert "the environment raised" in str(died) and worker.restarts == 1
    with pytest.raises(WorkerDied, match="its episode is lost"):
        worker.step("look around")
    first = worker.reset(TASK)
    assert first.turn == 0 and worker.step("go to kitchen").observation == "You move to the kitchen."


def test_environment_errors_keep_the_worker(worker):
    with pytest.raises(EnvError, match="Traceback"):
        worker.call("no_such_method")
    assert worker.restarts == 0 and worker.reset(TASK).turn == 0


def test_a_cancelled_call_does_not_shift_replies(worker):
    async def main():
        call = asyncio.create_task(worker.areset(ScienceWorldTask("boil", 0)))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        first = await worker.areset(TASK)  # must be this call's reply, not the cancelled one's
        return first, await worker.astep("go to kitchen")

    first, nxt = asyncio.run(main())
    assert first.task_description.startswith("Your task is to find a(n) non-living thing")
    assert nxt.observation == "You move to the kitchen." and nxt.turn == 1


def test_a_cancel_that_comes_with_the_reply_ends_the_call_fault_injection():
    """Fault injection (a step that answers at once, under a call limit as in training): the loop is busy (an engine
    step on its thread) while the step's reply arrives, then a Ctrl-C cancels the episode's task 0-11 loop turns
    later. A call that accepts the cancel (``Task.cancel`` returns True) must end cancelled, whatever the turn.
    Python 3.11's ``asyncio.wait_for`` returned the reply instead when its inner wait had finished first
    (gh-86296: here at 3 to 5 turns); the episode then went on to a step of a hung simulator, and Ctrl-C waited for
    that step's whole limit (``rollout.env_timeout_s``: 600 s)."""
    worker = EnvWorker(fault_injection_spec(), call_timeout_s=60.0)
    worker.start()

    async def cancel_after(turns, busy_s):
        call = asyncio.create_task(worker.astep("wait"))
        await asyncio.sleep(0)  # the step is sent
        time.sleep(busy_s)  # the loop busy while the reply arrives
        for _ in range(turns):
            await asyncio.sleep(0)
        accepted = call.cancel()
        try:
            await call
        except asyncio.CancelledError:
            return accepted, "cancelled"
        return accepted, "returned"

    async def sweep(busy_s):
        outcomes = []
        for turns in range(12):
            await worker.areset(0)  # the owed reply drained: every try starts alike
            outcomes.append(await cancel_after(turns, busy_s))
        return outcomes

    try:
        sweeps = []
        for busy_s in (0.3, 1.0, 3.0):  # longer where a loaded machine's reply came after the last try
            sweeps.append(asyncio.run(sweep(busy_s)))
            if not sweeps[-1][-1][0]:
                break
        print(sweeps)
        assert all(outcome == "cancelled" for s in sweeps for accepted, outcome in s if accepted), sweeps
        assert sweeps[-1][0][0] and not sweeps[-1][-1][0], sweeps  # the turns span the call's end
        assert asyncio.run(worker.areset(1)).observation == "task 1" and worker.restarts == 0
    finally:
        worker.close()


def test_one_call_at_a_time(worker):
    async def main():
        return await asyncio.gather(worker.areset(TASK), worker.areset(TASK), return_exceptions=True)

    first, second = asyncio.run(main())
    assert first.turn == 0 and isinstance(second, RuntimeError) and "one call at a time" in str(second)


def test_async_calls_never_block_the_loop():
    async def main(workers):
        ticks = 0  # turns of the loop while both resets were in flight

        async def ticker(calls):
            nonlocal ticks
            while not calls.done():
                ticks += 1
                await asyncio.sleep(0.001)

        resets = asyncio.gather(*(w.areset(TASK) for w in workers))
        await asyncio.gather(resets, ticker(resets))
        firsts = resets.result()
        steps = await asyncio.gather(*(w.astep(a)
                                       for w, a in zip(workers, ["go to kitchen", "look around"], strict=True)))
        os.kill(workers[0].pid, signal.SIGKILL)
        died = await asyncio.gather(workers[0].astep("look around"), return_exceptions=True)
        return ticks, firsts, steps, died[0]

    with EnvPool(SCIENCEWORLD.env_spec(), 2) as pool:
        ticks, firsts, steps, died = asyncio.run(main(pool.workers))
        assert all(f.turn == 0 for f in firsts) and [s.turn for s in steps] == [1, 1]
        assert steps[0].observation == "You move to the kitchen."
        assert isinstance(died, WorkerDied) and pool.workers[0].restarts == 1
        assert ticks > 1  # the loop kept turning while the workers loaded their tasks (a blocking call: 1 at most)
        pids = [p for w in pool.workers for p in w.pids()]
    assert wait_gone(pids) == []  # closing the pool leaves nothing behind


def test_map_plays_every_item_on_whichever_worker_is_free_and_keeps_the_items_order():
    """Items of unequal length (0 to 4 steps after the reset): a worker takes the next item as it finishes one, so
    both workers play, and the results come back in the items' order."""
    items = [(ScienceWorldTask("find-non-living-thing", v), steps) for v, steps in enumerate([4, 0, 3, 1, 0])]

    async def play(worker, item):
        task, steps = item
        transition = await worker.areset(task)
        for _ in range(steps):
            transition = await worker.astep("look around")
        return task, transition.turn, worker.pid

    with EnvPool(SCIENCEWORLD.env_spec(), 2) as pool:
        results = asyncio.run(pool.map(play, items))
        pids = {w.pid for w in pool.workers}
    assert [(task, turn) for task, turn, _ in results] == items
    assert {pid for _, _, pid in results} == pids


def test_a_restart_runs_off_the_event_loop_fault_injection():
    """Fault injection: a step that ends its worker process (``os._exit``), on an environment that takes 1.5 s to
    start. The step fails with WorkerDied once the worker has restarted, and meanwhile the loop keeps turning: a
    ticker coroutine counts its turns during the call (a restart inside the loop's thread leaves it 1 or 2)."""
    worker = EnvWorker(fault_injection_spec(start_delay_s=1.5, step="crash"))
    worker.start()

    async def main():
        await worker.areset(0)
        ticks, started = 0, time.monotonic()
        call = asyncio.ensure_future(worker.astep("wait"))
        while not call.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return ticks, time.monotonic() - started, call.exception()

    try:
        ticks, call_s, died = asyncio.run(main())
        assert isinstance(died, WorkerDied) and "died (exit code 1); restarted as" in str(died), died
        assert worker.restarts == 1 and call_s >= 1.5  # the restart ran within the call
        assert ticks >= 20, f"the loop turned {ticks} times in the {call_s:.1f} s of a restart"
        assert asyncio.run(worker.areset(1)).observation == "task 1"  # the restarted worker plays on
    finally:
        worker.close()


def test_a_cancelled_call_that_never_answers_is_drained_within_its_limit_fault_injection():
    """Fault injection: a step that never answers, cancelled. The next call waits for the reply it owes no longer
    than that step's limit (1 s), then kills and restarts the worker and plays on the new one."""
    worker = EnvWorker(fault_injection_spec(step="hang"), call_timeout_s=1.0)
    worker.start()
    old = worker.pid

    async def main():
        await worker.areset(0)  # the first call after a start gets the start-up time; the step gets 1 s
        hung = asyncio.create_task(worker.astep("wait"))
        await asyncio.sleep(0.2)
        hung.cancel()
        await asyncio.gather(hung, return_exceptions=True)
        return await worker.areset(1)

    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(first=asyncio.run(main())), daemon=True)
    try:
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "the next call still waits for the cancelled call's reply after 30 s"
        assert outcome["first"].observation == "task 1" and worker.restarts == 1
        assert f"worker {old} gave no reply to a cancelled call" in worker.last_death and wait_gone([old]) == []
    finally:
        worker.close()


def test_close_cuts_a_restart_short_fault_injection():
    """Fault injection: a step that ends its worker process, whose restart then waits on an environment that takes
    10 minutes to start (in a thread: the loop goes on). Closing the worker meanwhile kills the process it waits on:
    close returns at once, the call fails with WorkerDied, nothing is left."""
    worker = EnvWorker(fault_injection_spec(step="crash"))
    worker.start()
    old = worker.pid
    worker.spec = fault_injection_spec(start_delay_s=600, step="crash")  # every later start

    async def main():
        await worker.areset(0)
        call = asyncio.ensure_future(worker.astep("wait"))
        while worker.pid in (old, None):  # until the restart has started its new process
            await asyncio.sleep(0.05)
        pids = worker.pids()
        started = time.monotonic()
        worker.close()
        closed_s = time.monotonic() - started
        return pids, closed_s, (await asyncio.gather(call, return_exceptions=True))[0]

    pids, closed_s, died = asyncio.run(asyncio.wait_for(main(), 120))
    assert closed_s < 30, f"close waited {closed_s:.0f} s for the restart"
    assert isinstance(died, WorkerDied) and "closed while it started" in str(died), died
    assert worker.pid is None and wait_gone([old, *pids]) == []


SCRIPT = textwrap.dedent("""
    import signal, time
    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.envs.scienceworld.tasks import ScienceWorldTask
    from actfirst.envs.workers import EnvPool

    if __name__ == "__main__":
        # Ctrl-C as in a terminal, even when the test runs in a background job (which starts with SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with EnvPool(get_benchmark("scienceworld").env_spec(), 2) as pool:
            for w in pool.workers:
                w.reset(ScienceWorldTask("find-non-living-thing", 0))
            print(" ".join(str(p) for w in pool.workers for p in w.pids()), flush=True)
            time.sleep(300)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "parent-killed"])
def test_no_worker_or_jvm_outlives_the_parent(tmp_path, sig):
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) >= 4 and all(alive(p) for p in pids)  # two workers and their two JVMs
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert wait_gone(pids) == []
    finally:
        proc.kill()
