"""The trackers of ``report_to`` through the metrics sink, with the real libraries writing real files, read back with
their own readers: TensorBoard's event files (EventAccumulator), a wandb run in offline mode (its transaction log,
decoded with wandb's own record protobuf), a local Trackio project (Trackio's SQLite storage). And the refusals: an
unknown tracker, and one that is not installed (its import blocked by a fault-injection finder), refused by key
through the command line before any work."""

import json
import struct
import sys

import pytest

from actfirst.train.metrics import MetricsSink
from actfirst.train.trackers import TRACKERS, TrackedRun, open_trackers, tracker_locations

CONFIG = {"benchmark": "scienceworld", "optim": {"lr": 1e-6}, "num_updates": 2}
RECORDS = [{"loss": 0.5, "probe/gap": -1.5, "queue": {"wait_s": 0.25}, "failures": ["x"], "kernel/path": "torch",
            "skipped_nan": float("nan"), "overlapped": True},
           {"loss": 0.25, "probe/gap": -1.0, "queue": {"wait_s": 0.5}, "failures": [], "kernel/path": "torch",
            "skipped_nan": float("nan"), "overlapped": False}]
SCALARS = [{"update": 1, "loss": 0.5, "probe/gap": -1.5, "queue/wait_s": 0.25},
           {"update": 2, "loss": 0.25, "probe/gap": -1.0, "queue/wait_s": 0.5}]
"""What every tracker receives of RECORDS: the finite numbers, nested keys as a/b."""


@pytest.fixture
def curve(tmp_path):
    """A real training-curve PNG (actfirst.train.plots draws it from a metrics file)."""
    from actfirst.train.plots import plot_training_curve

    (tmp_path / "plot").mkdir()
    (tmp_path / "plot" / "metrics.jsonl").write_text(
        "".join(json.dumps({"update": u, "elapsed_s": 10.0 * u, "probe/gap": -1.0 / u}) + "\n" for u in (1, 2)))
    return plot_training_curve(tmp_path / "plot")


def log_run(out_dir, names, curve, first_update=1, records=RECORDS):
    """One session of a run: the sink with the trackers ``names``, ``records`` from ``first_update`` on, the curve at
    the last update."""
    sink = MetricsSink(out_dir, open_trackers(names, TrackedRun(out_dir, "actfirst-test", CONFIG, first_update)))
    for update, record in enumerate(records, start=first_update):
        sink.log(update, record)
    sink.log_image(first_update + len(records) - 1, "training_curve", curve)
    sink.close()


def test_tensorboard_events_hold_every_update_the_config_and_the_curve(tmp_path, curve):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    log_run(out, ["tensorboard"], curve)
    where = tracker_locations(["tensorboard"], out, "actfirst-test")["tensorboard"]
    events = EventAccumulator(where.split(" ")[0], size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(SCALARS[0])
    for key in SCALARS[0]:
        assert [(e.step, e.value) for e in events.Scalars(key)] == [(u, pytest.approx(s[key]))
                                                                   for u, s in enumerate(SCALARS, start=1)]
    [image] = events.Images("training_curve")
    assert image.step == 2 and image.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    assert (image.width, image.height) == (700, 600)  # plots.TRAINING_CURVE_SIZE at its DPI
    [text] = events.Tensors("config/text_summary")
    assert json.loads(text.tensor_proto.string_val[0].decode().strip("`\n")) == CONFIG
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # JSONL beside it, always

    # A resumed session (from update 2) replaces what the redone update logged before, as metrics.jsonl does.
    log_run(out, ["tensorboard"], curve, first_update=2, records=[{"loss": 7.0}, {"loss": 9.0}])
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5), (2, 7.0), (3, 9.0)]


def test_no_tracker_writes_the_jsonl_only(tmp_path, curve):
    out = tmp_path / "run"
    log_run(out, [], curve)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    assert [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0.5, 0.25]


def wandb_records(path):
    """The records of a ``.wandb`` transaction log. wandb 0.31 ships no Python reader for it: the file is a 7-byte
    header (``:W&B``, magic, version) and LevelDB-log framing (32 KiB blocks; each chunk a 7-byte header of CRC,
    length and type: 1 full, 2 first, 3 middle, 4 last) around wandb's own ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_metrics_config_and_curve(tmp_path, monkeypatch, curve):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    log_run(out, ["wandb"], curve)
    where = tracker_locations(["wandb"], out, "actfirst-test")["wandb"]
    assert where.startswith(f"{tmp_path / 'wandb_dir' / 'wandb'} (offline")
    [log] = (tmp_path / "wandb_dir" / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(log))
    [run] = [r.run for r in records if r.HasField("run")]
    assert (run.project, run.display_name, run.run_id) == ("actfirst-test", "run", (out / "wandb_run_id").read_text())
    config = {item.key: json.loads(item.value_json) for item in run.config.update if not item.key.startswith("_")}
    assert config == CONFIG
    history = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.HasField("history")]
    assert [{k: h[k] for k in SCALARS[0]} for h in history] == SCALARS
    assert [h["_step"] for h in history] == [1, 2]
    assert history[1]["training_curve/_type"] == "image-file"
    assert (log.parent / "files" / history[1]["training_curve/path"]).read_bytes() == curve.read_bytes()


def test_trackio_local_project_holds_the_metrics_config_and_curve(tmp_path, monkeypatch, curve):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read once, when trackio is first imported
    pytest.importorskip("trackio", reason="trackio is not installed (scripts/setup.sh installs tensorboard and wandb)")
    from trackio.sqlite_storage import SQLiteStorage

    out = tmp_path / "run"
    log_run(out, ["trackio"], curve)
    logs = SQLiteStorage.get_logs("actfirst-test", "run")
    assert [{k: row[k] for k in SCALARS[0]} for row in logs if "loss" in row] == SCALARS
    [image] = [row for row in logs if "training_curve" in row]
    assert image["step"] == 2 and image["training_curve"]["_type"] == "trackio.image"
    config = SQLiteStorage.get_run_config("actfirst-test", "run")
    assert {k: v for k, v in config.items() if not k.startswith("_")} == CONFIG


class BlockImportFaultInjection:
    """Fault injection: a meta-path finder that makes the named top-level packages unimportable, as if they were
    not installed (``importlib.util.find_spec`` and ``import`` both fail). :meth:`install` also takes them out of
    ``sys.modules`` (an imported package is found there first); monkeypatch puts everything back."""

    def __init__(self, *names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):  # None (not blocked): the next finders look for it
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by fault injection)", name=name)

    def install(self, monkeypatch):
        monkeypatch.setattr(sys, "meta_path", [self, *sys.meta_path])
        for module in [m for m in sys.modules if m.split(".")[0] in self.names]:
            monkeypatch.delitem(sys.modules, module)


def run_cli(tmp_path, overrides, capsys):
    """``python -m actfirst.run`` in this process, with a teacher that does not exist and nothing to build, so that a
    run the refusal under test let through stops at once (naming ``teacher``) instead of preparing the demo."""
    from actfirst.run import main

    status = main([f"out_dir={tmp_path / 'run'}", f"teacher={tmp_path / 'absent'}", "prepare.build_models=null",
                   *overrides])
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_an_uninstalled_tracker_is_refused_by_key_before_any_work(name, tmp_path, monkeypatch, capsys):
    BlockImportFaultInjection(TRACKERS[name].module).install(monkeypatch)
    status, err = run_cli(tmp_path, [f"report_to=[{name}]"], capsys)
    assert status == 2
    assert err == f"python -m actfirst.run: error: report_to=[{name!r}]: {name} is not installed (pip install {name})"
    assert not (tmp_path / "run").exists()  # nothing prepared, no rank started


@pytest.mark.parametrize(("value", "why"), [
    ("[mlflow]", "unknown tracker 'mlflow'; choose from ['tensorboard', 'trackio', 'wandb']"),
    ("[tensorboard,tensorboard]", "names a tracker twice"),
])
def test_an_unknown_or_repeated_tracker_is_refused_by_key(value, why, tmp_path, capsys):
    status, err = run_cli(tmp_path, [f"report_to={value}"], capsys)
    names = value.strip("[]").split(",")
    assert status == 2 and err == f"python -m actfirst.run: error: report_to={names!r}: {why}"
    assert not (tmp_path / "run").exists()


def test_report_to_as_trl_users_write_it(tmp_path):
    """``report_to: none`` (TRL's spelling of no tracker), one name alone, ``all`` (every installed tracker)."""
    from actfirst.core.config import DEMO_CONFIG, TrainConfig
    from actfirst.core.schema import load_config, paths_unchecked
    from actfirst.train.trackers import installed

    def report_to(*overrides):
        with paths_unchecked():
            return load_config(TrainConfig, DEMO_CONFIG, list(overrides)).report_to

    assert report_to("report_to=none") == [] and report_to("report_to=[none]") == []
    assert report_to("report_to=tensorboard") == ["tensorboard"]
    assert report_to("report_to=all") == sorted(n for n, t in TRACKERS.items() if installed(t.module))
    config = tmp_path / "none.yaml"
    config.write_text(f"base: {DEMO_CONFIG}\nreport_to: none\n")
    with paths_unchecked():
        assert load_config(TrainConfig, config).report_to == []
