"""Checkpoints: a Hugging Face directory transformers loads as is plus the trainer state; atomic under SIGKILL (real
child processes killed during and between writes, resumed, compared with an uninterrupted run); write failures
reported with the directory and the OS error, the previous checkpoint intact; metrics truncated on resume."""

import errno
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from train_helpers import random_samples
from transformers import AutoModelForCausalLM, AutoTokenizer

from actfirst.core.config import LossConfig, OptimConfig
from actfirst.train import checkpoint
from actfirst.train.buffer import SampleBuffer
from actfirst.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    truncate_metrics,
)
from actfirst.train.head import LMHeadModel
from actfirst.train.student import StudentUpdater

REPO = Path(__file__).resolve().parents[2]
KILLS = 20
HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"}

# A zygote: imports torch and transformers once, then forks one child per command (a JSON line on stdin) and
# reports "pid <pid>" and "exit <pid> <status>". `train` is a miniature training run: it resumes from the latest
# checkpoint (weights through from_pretrained, optimizer, RNG, counters; metrics truncated), then per update takes an
# AdamW step on random ids (torch RNG) and adds python and numpy random draws to a counter, appends its metrics,
# checkpoints with a ballast tensor that makes the write slow enough to be killed inside, and pauses (the rollouts).
ZYGOTE = r'''
import json, os, random, resource, signal, sys, time, traceback
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from actfirst.train.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, restore_rng,
                                       save_checkpoint, truncate_metrics)


def load(out, model_dir):
    ckpt = latest_checkpoint(out)
    model = AutoModelForCausalLM.from_pretrained(ckpt or model_dir, dtype=torch.float32)
    return ckpt, model, AutoTokenizer.from_pretrained(ckpt or model_dir)


def train(out, model_dir, until, ballast_mb, pause_s, keep):
    ckpt, model, tok = load(out, model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if ckpt is None:
        update, total = 0, 0
        random.seed(1), np.random.seed(2), torch.manual_seed(3)
    else:
        state = load_checkpoint(ckpt)
        update, total = state["update"], state["total"]
        opt.load_state_dict(state["optimizer"])
        restore_rng(state)
    truncate_metrics(f"{out}/metrics.jsonl", update)
    print("resumed", update, flush=True)
    ballast = torch.zeros(ballast_mb << 18)
    while update < until:
        update += 1
        loss = model(torch.randint(0, 200, (2, 12))).logits.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += random.randint(1, 9) + int(np.random.randint(1, 9))
        with open(f"{out}/metrics.jsonl", "a") as f:
            f.write(json.dumps({"update": update, "loss": loss.item(), "total": total}) + "\n")
        print("begin", update, flush=True)
        t0 = time.perf_counter()
        save_checkpoint(out, update=update, model=model, tokenizer=tok, keep=keep, extra={"ballast": ballast},
                        trainer_state={"update": update, "total": total, "optimizer": opt.state_dict()})
        print("saved", update, time.perf_counter() - t0, flush=True)
        time.sleep(pause_s)


def write_limited(out, model_dir, limit, ballast_mb):
    """Checkpoint 1, then checkpoint 2 with files limited to `limit` bytes (the kernel's EFBIG, a real fault)."""
    _, model, tok = load(out, model_dir)
    save_checkpoint(out, update=1, model=model, tokenizer=tok, trainer_state={})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_checkpoint(out, update=2, model=model, tokenizer=tok, trainer_state={},
                        extra={"ballast": torch.zeros(ballast_mb << 18)})
    except CheckpointError as e:
        print("error", json.dumps(str(e)), flush=True)


for line in sys.stdin:
    cmd = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            globals()[cmd.pop("fn")](**cmd)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    print("pid", pid, flush=True)
    print("exit", pid, os.waitpid(pid, 0)[1], flush=True)
'''


class Zygote:
    """The parent's side of ZYGOTE: start a child, read the lines of children and zygote (with a timeout)."""

    def __init__(self, tmp: Path) -> None:
        self.stderr = tmp / "zygote.err"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.live: set[int] = set()
        """Children started and not yet reported exited (unreaped, so their pids are still theirs)."""
        threading.Thread(target=lambda: [self.lines.put(line.rstrip("\n")) for line in self.proc.stdout],
                         daemon=True).start()

    def start(self, fn: str, **kw) -> int:
        self.proc.stdin.write(json.dumps({"fn": fn, **kw}) + "\n")
        self.proc.stdin.flush()
        pid = int(self.expect("pid").split()[1])
        self.live.add(pid)
        return pid

    def line(self, timeout: float = 120) -> str:
        """The next line; fails with the zygote's stderr (children's tracebacks) after ``timeout`` seconds."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no line from the zygote within {timeout} s; stderr:\n{self.stderr.read_text()}")
        if line.startswith("exit "):
            self.live.discard(int(line.split()[1]))
        return line

    def expect(self, prefix: str) -> str:
        """The next line starting with the words ``prefix`` (other lines are skipped)."""
        while (line := self.line()).split()[:len(prefix.split())] != prefix.split():
            pass
        return line

    def exit_status(self, pid: int) -> int:
        status = int(self.expect(f"exit {pid}").split()[2])
        assert status in (0, signal.SIGKILL), f"child {pid}: status {status}; stderr:\n{self.stderr.read_text()}"
        return status

    def kill_live(self) -> None:
        """Kill the children a failed test left running (after reading the exits already reported)."""
        while not self.lines.empty():
            self.line()
        for pid in self.live:
            os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill_live()
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote_process(tmp_path_factory):
    z = Zygote(tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()


@pytest.fixture
def zygote(zygote_process):
    yield zygote_process
    zygote_process.kill_live()


@pytest.fixture
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), \
        AutoTokenizer.from_pretrained(tiny_model_dir)


def tmp_entries(out: Path) -> set[str]:
    root = out / "checkpoints"
    return {p.name for p in root.iterdir() if p.name.startswith(".tmp-")} if root.exists() else set()


def test_checkpoint_is_a_hf_directory_and_trainer_state_round_trips(tmp_path, tiny, gen, vocab_size):
    model, tok = tiny
    updater = StudentUpdater(LMHeadModel(model), optim=OptimConfig(lr=1e-3), loss=LossConfig(), temperature=1.0,
                             num_updates=10)
    updater.update(random_samples(gen, 4, vocab_size), current_version=0)
    buffer = SampleBuffer()
    buffer.add(random_samples(gen, 3, vocab_size, version=1, scored=False))
    counters = {"update": 1, "batch_index": 2, "total_transitions": 37, "weight_version": 1}
    path = save_checkpoint(tmp_path, update=1, model=model, tokenizer=tok, extra={"stream": [3, 1, 2]},
                           trainer_state={"student": updater.state_dict(), "optimizer": updater.optimizer.state_dict(),
                                          "buffer": buffer.state_dict(), **counters})
    draws = (random.random(), np.random.rand(), torch.rand(3))

    assert path == tmp_path / "checkpoints" / "update_000001" == latest_checkpoint(tmp_path)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "update_000001\n"
    assert HF_FILES | {"trainer_state.pt", "checkpoint.json"} == {p.name for p in path.iterdir()}
    meta = json.loads((path / "checkpoint.json").read_text())
    assert meta["update"] == 1 and meta["extra"] == ["stream"] and meta["files"]["model.safetensors"] > 0
    assert {"student", "buffer", "rng", "total_transitions"} <= set(meta["trainer_state"])

    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    loaded_tok = AutoTokenizer.from_pretrained(path)
    assert loaded_tok.chat_template == tok.chat_template is not None
    messages = [{"role": "user", "content": "go to kitchen"}]
    assert loaded_tok.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False)

    state = load_checkpoint(path)
    assert {k: state[k] for k in counters} == counters and state["extra"] == {"stream": [3, 1, 2]}
    fresh = StudentUpdater(LMHeadModel(loaded), optim=OptimConfig(lr=1e-3), loss=LossConfig(), temperature=1.0,
                           num_updates=10)
    fresh.load_state_dict(state["student"])
    fresh.optimizer.load_state_dict(state["optimizer"])
    before, after = updater.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert fresh.updates_done == 1 and before["param_groups"] == after["param_groups"]
    for i, s in before["state"].items():
        for k, v in s.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(after["state"][i][k])), (i, k)
    restored = SampleBuffer()
    restored.load_state_dict(state["buffer"])
    assert restored.state_dict() == buffer.state_dict()
    restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == draws[:2] and torch.equal(again[2], draws[2])


def test_keep_prune_fallback_and_leftovers(tmp_path, tiny):
    model, tok = tiny
    root = tmp_path / "checkpoints"
    for u in (1, 2, 3):
        save_checkpoint(tmp_path, update=u, model=model, tokenizer=tok, trainer_state={}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "update_000002", "update_000003"]
    with pytest.raises(ValueError, match="already the latest"):
        save_checkpoint(tmp_path, update=3, model=model, tokenizer=tok, trainer_state={})
    with pytest.raises(TypeError, match=r"trainer_state\['x'\]\[0\]: float64"):
        save_checkpoint(tmp_path, update=4, model=model, tokenizer=tok, trainer_state={"x": [np.float64(1)]})

    # A run killed after renaming update 4 into place but before moving `latest`: latest stays 3; a resumed run
    # rewrites update 4 over it. Killed writes and deletions leave .tmp- entries, ignored, then removed.
    (root / "latest").write_text("update_000003\n")
    (root / "update_000004").mkdir()
    (root / "update_000004" / "checkpoint.json").write_text("{}")
    (root / ".tmp-update_000005-1").mkdir()
    (root / ".tmp-latest-1").write_text("update_000005")
    assert latest_checkpoint(tmp_path) == root / "update_000003"
    save_checkpoint(tmp_path, update=4, model=model, tokenizer=tok, trainer_state={"mark": 4}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "update_000003", "update_000004"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["mark"] == 4

    # Without a valid pointer: the newest complete checkpoint; a directory without checkpoint.json is not one.
    (root / "update_000009").mkdir()
    for pointer in (None, "update_000007\n", "../elsewhere\n"):
        (root / "latest").unlink(missing_ok=True)
        if pointer:
            (root / "latest").write_text(pointer)
        assert latest_checkpoint(tmp_path) == root / "update_000004"
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(CheckpointError, match="update_000009: not a complete checkpoint"):
        load_checkpoint(root / "update_000009")


def test_keep_best_keeps_the_best_evaluation_beside_the_newest(tmp_path):
    """keep_best: the checkpoint of the best SR so far stays beside the ``keep`` newest; an equal SR does not replace
    it; an update without a checkpoint (the starting student) is never the best; without keep_best it goes."""
    root = tmp_path / "checkpoints"

    def save(update, keep_best=True):
        with checkpoint.checkpoint_transaction(tmp_path, update=update, keep=1, keep_best=keep_best) as d:
            (d / "weights").write_text(str(update))

    def on_disk():
        return sorted(int(p.name[-6:]) for p in root.glob("update_*"))

    def best():
        return json.loads((root / "best").read_text())

    assert not checkpoint.record_best(tmp_path, update=0, sr=100.0, keep=1)  # no checkpoint of update 0
    steps = [(1, 10.0, True, [1]), (2, 30.0, True, [2]), (3, 20.0, False, [2, 3]), (4, 30.0, False, [2, 4])]
    for update, sr, better, kept in steps:
        save(update)
        assert checkpoint.record_best(tmp_path, update=update, sr=sr, keep=1) is better
        assert on_disk() == kept, update
    assert best() == {"checkpoint": "update_000002", "update": 2, "SR": 30.0}
    assert latest_checkpoint(tmp_path) == root / "update_000004"
    (root / "best").write_text("not json")  # a damaged record counts as none
    save(5)
    assert checkpoint.record_best(tmp_path, update=5, sr=1.0, keep=1) and on_disk() == [5]
    save(6, keep_best=False)
    assert on_disk() == [6] and not (root / "best").exists()


@pytest.mark.parametrize("where", ["trainer_state", "pointer"])
def test_disk_full_fault_injection_keeps_previous_checkpoint(tmp_path, tiny, monkeypatch, where):
    """Fault injection (we run as root, where chmod cannot make a directory unwritable): the write of the trainer
    state fails with ENOSPC, or the final replace of `latest` fails with EROFS."""
    model, tok = tiny
    root = tmp_path / "checkpoints"
    first = save_checkpoint(tmp_path, update=1, model=model, tokenizer=tok, trainer_state={"mark": 1})
    code = errno.ENOSPC if where == "trainer_state" else errno.EROFS

    def fault(*args, **kw):
        raise OSError(code, os.strerror(code), str(root))

    if where == "trainer_state":
        monkeypatch.setattr(checkpoint.torch, "save", fault)
    else:
        real_replace = os.replace
        monkeypatch.setattr(checkpoint.os, "replace",
                            lambda src, dst: fault() if Path(dst).name == "latest" else real_replace(src, dst))
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, update=2, model=model, tokenizer=tok, trainer_state={"mark": 2})
    assert str(root) in str(info.value) and os.strerror(code) in str(info.value)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == first and load_checkpoint(first)["mark"] == 1
    assert (root / "latest").read_text() == "update_000001\n" and not tmp_entries(tmp_path)
    assert save_checkpoint(tmp_path, update=2, model=model, tokenizer=tok, trainer_state={}) == root / "update_000002"


def test_unwritable_out_dir_is_reported(tmp_path, tiny):
    """A real OS error without privileges to drop: the output directory lies under a regular file."""
    model, tok = tiny
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"to .*file/run/checkpoints: NotADirectoryError: \[Errno 20\]"):
        save_checkpoint(tmp_path / "file" / "run", update=1, model=model, tokenizer=tok, trainer_state={})


@pytest.mark.parametrize("limit", [100_000, 2_000_000], ids=["model_write", "trainer_state_write"])
def test_real_file_size_limit_keeps_previous_checkpoint(tmp_path, tiny_model_dir, zygote, limit):
    """A real kernel write error (RLIMIT_FSIZE: EFBIG) in a child, inside the safetensors (Rust) model write or
    inside the trainer-state write: reported with the directory and the error, nothing earlier lost."""
    pid = zygote.start("write_limited", out=str(tmp_path), model_dir=str(tiny_model_dir), limit=limit, ballast_mb=4)
    message = json.loads(zygote.expect("error").split(" ", 1)[1])
    assert zygote.exit_status(pid) == 0
    assert str(tmp_path / "checkpoints") in message and "File too large" in message, message
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "update_000001" and not tmp_entries(tmp_path)


def test_sigkill_during_and_between_writes_loses_at_most_one_update(tmp_path, tiny_model_dir, zygote, gen):
    """KILLS runs are killed with SIGKILL at random moments, alternately inside a checkpoint write (after its
    "begin", within the write's duration) and between writes (within the pause after a "saved"), each resumed from
    the latest checkpoint. After every kill the latest checkpoint is complete and loadable, its update the last one
    reported saved or the one in flight; the resumed run starts right after it and its first save removes the
    killed write's leftovers. The run then finishes and equals an uninterrupted run bit for bit: weights, optimizer,
    counters drawn from the python/numpy RNGs, and the metrics series, each update once."""
    out, ref = tmp_path / "run", tmp_path / "reference"
    out.mkdir(), ref.mkdir()
    run = dict(out=str(out), model_dir=str(tiny_model_dir), ballast_mb=32, pause_s=0.2, keep=2)
    saved = begun = 0  # the last update reported saved, and the last one whose write began
    write_s = 0.1  # the duration of the last write
    stale: set[str] = set()  # what the last kill left in checkpoints/
    interrupted_writes = 0

    def follow() -> list[str]:
        """The next line, after updating the counters and checking the leftovers' removal."""
        nonlocal saved, begun, write_s, stale
        words = zygote.line().split()
        if words[0] == "begin":
            begun = int(words[1])
            assert begun == saved + 1
        elif words[0] == "saved":
            saved, write_s = int(words[1]), float(words[2])
            assert not stale & tmp_entries(out), "a killed write's leftovers survived the next save"
            stale = set()
        elif words[0] == "resumed":
            assert int(words[1]) == saved, "the resumed run does not continue from the latest checkpoint"
        elif words[0] == "exit":
            assert int(words[2]) == signal.SIGKILL, f"child died by itself; stderr:\n{zygote.stderr.read_text()}"
        return words

    for k in range(KILLS):
        inside = k % 2 == 1
        pid = zygote.start("train", until=10**6, **run)
        for _ in range(1 + int(torch.randint(0, 2, (), generator=gen))):  # kill at the 1st or 2nd update
            while follow()[0] != ("begin" if inside else "saved"):
                pass
        time.sleep(float(torch.rand((), generator=gen)) * (write_s if inside else run["pause_s"]))
        os.kill(pid, signal.SIGKILL)
        while follow()[:2] != ["exit", str(pid)]:
            pass

        stale = tmp_entries(out)
        interrupted_writes += bool(stale)
        ckpt = latest_checkpoint(out)
        update = 0 if ckpt is None else int(ckpt.name.removeprefix("update_"))
        assert saved <= update <= begun <= saved + 1, (k, inside, saved, update, begun)
        if ckpt is not None:
            assert HF_FILES <= {p.name for p in ckpt.iterdir()}
            assert load_checkpoint(ckpt)["update"] == json.loads((ckpt / "checkpoint.json").read_text())["update"]
            assert load_file(ckpt / "model.safetensors")
        saved = begun = update  # the resumed run continues from here

    final = saved + 2
    assert zygote.exit_status(zygote.start("train", until=final, **run)) == 0
    assert zygote.exit_status(zygote.start("train", until=final, **{**run, "out": str(ref), "ballast_mb": 0,
                                                                       "pause_s": 0})) == 0
    print(f"{interrupted_writes} of {KILLS} kills left a write's leftovers; {final} updates")
    assert interrupted_writes > 0, "no kill landed inside a write"
    name = f"update_{final:06d}"
    assert latest_checkpoint(out) == out / "checkpoints" / name and latest_checkpoint(ref) == ref / "checkpoints" / name
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", f"update_{final - 1:06d}", name]
    got, want = (load_file(d / "checkpoints" / name / "model.safetensors") for d in (out, ref))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    got, want = (load_checkpoint(d / "checkpoints" / name) for d in (out, ref))
    assert got["total"] == want["total"] and torch.equal(got["rng"]["torch"], want["rng"]["torch"])
    for i, s in want["optimizer"]["state"].items():
        assert all(torch.equal(v, got["optimizer"]["state"][i][k]) for k, v in s.items()), i
    metrics = (out / "metrics.jsonl").read_text()
    assert metrics == (ref / "metrics.jsonl").read_text()
    assert [json.loads(line)["update"] for line in metrics.splitlines()] == list(range(1, final + 1))


def test_truncate_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert truncate_metrics(path, 3) == 0 and not path.exists()
    records = [json.dumps({"update": u, "loss": 0.5 * u}) for u in (1, 2, 3, 4, 5)]
    path.write_text("\n".join(records) + "\n" + '{"update": 6, "lo')
    assert truncate_metrics(path, 3) == 3
    assert path.read_text() == "\n".join(records[:3]) + "\n"
    assert truncate_metrics(path, 3) == 0 and truncate_metrics(path, 0) == 3 and path.read_text() == ""
    path.write_text(records[0] + "\nnot json\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record"):
        truncate_metrics(path, 5)
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]
