"""Teacher scoring and the student update per update on the CPU, with each micro-batch layout, on the same samples.

    python bench/packing_cpu.py --config configs/demo/scienceworld_lifespan_surveyed_thoughts.yaml \
        --teacher assets/demo/teacher --student assets/demo/student-warmstart --repeats 4

The layouts (``actfirst.train.packing``): ``packed`` (several samples in one row; through SDPA a dense T x T mask
per row, what the CPU ran before issue 46) and ``padded`` (one right-padded row per sample, SDPA's ``is_causal``,
no mask: what the CPU runs now); ``--variants`` may also give a layout its own ``micro_batch_tokens``
(``padded@1``: every sample a forward of its own).

Samples: one update's worth (``batch_samples``) of full responses shaped as the config's, collected once into
``--samples`` (JSON; reused when it exists): every step of the config's reference cache replayed in the simulator
(``actfirst.train.sft.expert_steps``, as preparation does), its prompt as a rollout renders it (B.1/B.2) and the
config's built-model thought (``prepare.build_models.thoughts``) with the step's action as the response, through the
student's tokenizer; ``batch_samples`` of them (``--pick``: a seeded draw, or the longest). log pi_old is the
student's own log-prob at the sampling temperature (a float32 forward, as the engine's).

Models and the update as the trainer builds them (``Trainer._build_models``): the teacher in ``teacher_dtype``, the
student's float32 master weights under FSDP2 (world of one) computing in ``parallel.compute_dtype``, the config's
``parallel.attention`` (SDPA on the CPU), ``micro_batch_tokens``, ``num_minibatches``, optimizer and loss; one
student per variant, from the same weights. Torch threads: what the trainer gives scoring and the update beside a
one-thread engine (``actfirst.train.update_thread.update_threads``; one on 2 cores), or ``--threads``.

Per repeat, the variants in turn, alternating (ABAB...; each repeat reverses the order of the one before: ABBA for
two): the teacher scores the batch (``TeacherScorer.score``), the student updates on it
(``StudentUpdater.update``, the samples ``--version-lag`` versions behind: one by default, as under the async
pipeline, where the update's forward for the mismatch metric skips them); seconds of each and the load average
(``/proc/loadavg``) when each began. The first repeat warms up (not in the summary unless ``--repeats 1``). Seconds
are wall-clock and the measuring thread's CPU time (with one torch thread, what the work took whatever else loads
the machine). Printed: per variant, the mean seconds of scoring, update and both, and each variant's speedup over
the first, the median of per-repeat ratios with their range; a check that every variant's teacher log-probs equal
the first's. ``--out``: everything, as JSON, written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from pathlib import Path

import torch

from actfirst.core.files import write_atomically
from actfirst.core.user_input import ConfigError, check_writable_file, command, positive_int


@dataclasses.dataclass(frozen=True)
class Variant:
    """A layout with the micro-batch budget it runs at."""

    layout: str
    micro_batch_tokens: int

    @property
    def name(self) -> str:
        return f"{self.layout}@{self.micro_batch_tokens}"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--config`` with its overrides, ``--teacher`` and ``--student`` (what :func:`load_cfg` reads)."""
    parser.add_argument("--config", required=True, help="a training config (its shapes, budget and optimizer)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for --config (key=value)")
    parser.add_argument("--teacher", help="teacher directory (default: the config's)")
    parser.add_argument("--student", help="student directory (default: the config's student.model)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--variants", nargs="+", default=["packed", "padded"],
                        help="layout[@micro_batch_tokens] (default budget: the config's)")
    parser.add_argument("--repeats", type=positive_int, default=4, help="rounds over the variants, the first a warm-up")
    parser.add_argument("--version-lag", type=int, choices=[0, 1], default=1,
                        help="how many updates behind the samples are: 1 under the async pipeline (the default "
                             "pipeline; collected ahead, under the weights before the update), 0 serial")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: the trainer's on this CPU)")
    parser.add_argument("--samples", default="runs/packing_cpu/samples.json", help="collected once, then reused")
    parser.add_argument("--pick", choices=["random", "longest"], default="random",
                        help="the batch: a seeded draw of the steps, or the longest ones (the demo's rollouts reach "
                             "later turns, with longer histories, than its references' 2.9 steps)")
    parser.add_argument("--seed", type=int, default=0, help="which steps --pick random draws")
    parser.add_argument("--out", default="runs/packing_cpu/result.json")
    return parser.parse_args(argv)


def load_cfg(args: argparse.Namespace):
    """The config with its overrides (input paths unchecked: the models may be given apart) and the model paths."""
    from actfirst.core.config import TrainConfig
    from actfirst.core.schema import load_config, paths_unchecked
    from actfirst.core.user_input import check_model_dir

    with paths_unchecked():
        cfg = load_config(TrainConfig, args.config, args.overrides)
    teacher, student = args.teacher or cfg.teacher, args.student or cfg.student.model
    check_model_dir(teacher, "--teacher")
    check_model_dir(student, "--student")
    return cfg, teacher, student


def collect(cfg, student_dir: str, pick: str, seed: int) -> list[dict]:
    """The batch's samples (see the module docstring) as JSON-ready dicts, log pi_old not yet set."""
    import asyncio

    from transformers import AutoTokenizer

    from actfirst.envs.benchmarks import get_benchmark
    from actfirst.envs.workers import EnvPool
    from actfirst.preparation.reference_cache import load_references
    from actfirst.rollout.prompts import Mode
    from actfirst.train.sft import THOUGHTS, examples, expert_steps

    benchmark = get_benchmark(cfg.benchmark, cfg.env)
    references = load_references(cfg.references, benchmark=benchmark)
    tasks = [t for t in cfg.training_tasks(benchmark) if benchmark.task_key(t) in references]
    with EnvPool(benchmark.env_spec(), size=1) as pool:
        steps = asyncio.run(expert_steps(benchmark, pool, tasks, references))
    build = cfg.prepare.build_models
    thought = THOUGHTS[build.thoughts if build is not None else "short"]
    samples = examples(AutoTokenizer.from_pretrained(student_dir), benchmark, steps, modes=[Mode.FULL_RESPONSE],
                       max_prompt_tokens=cfg.rollout.max_prompt_tokens, thought=thought)
    size = min(cfg.batch_samples, len(samples))
    if pick == "random":
        chosen = sorted(random.Random(seed).sample(range(len(samples)), size))
    else:
        chosen = sorted(sorted(range(len(samples)), key=lambda i: -samples[i].num_tokens)[:size])
    return [{"context_ids": samples[i].context_ids, "response_ids": samples[i].response_ids, "task": samples[i].task,
             "turn": samples[i].turn} for i in chosen]


def response_logprobs(model_dir: str, samples: list, temperature: float) -> list[list[float]]:
    """Each sample's response tokens' log-probs under the model in ``model_dir`` at ``temperature`` (float32,
    through the LM head's fused gather, one sample per forward)."""
    from transformers import AutoModelForCausalLM

    from actfirst.kernels.dispatch import logprob_gather
    from actfirst.train.head import LMHeadModel
    from actfirst.train.packing import pack

    head = LMHeadModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval())
    out: list[list[float]] = [[] for _ in samples]
    with torch.no_grad():
        for mb in pack(samples, 1, head.layout):
            logp, _ = head(mb, lambda hidden, weight, mb=mb: logprob_gather(hidden, weight, mb.targets, temperature))
            out[mb.samples[0]] = logp.tolist()
    return out


def sampling_logprobs(student_dir: str, samples: list, temperature: float) -> None:
    """Set each sample's log pi_old to the student's own log-prob at ``temperature`` (float32)."""
    for sample, logprobs in zip(samples, response_logprobs(student_dir, samples, temperature), strict=True):
        sample.logprobs = logprobs


def load_samples(args: argparse.Namespace, cfg, student_dir: str) -> list:
    """The batch from ``--samples``, collected and written there first when it does not exist."""
    from actfirst.rollout.sample import Sample

    path = Path(args.samples)
    made = {"config": args.config, "student": student_dir, "pick": args.pick, "seed": args.seed}
    if not path.exists():
        check_writable_file(path, "--samples")
        rows = collect(cfg, student_dir, args.pick, args.seed)
        samples = [Sample(context_ids=r["context_ids"], response_ids=r["response_ids"],
                          loss_mask=[1] * len(r["response_ids"]), logprobs=[0.0] * len(r["response_ids"]),
                          weight_version=0, task=r["task"], turn=r["turn"], strategy="bench") for r in rows]
        sampling_logprobs(student_dir, samples, cfg.rollout.temperature)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**made, "samples": [dataclasses.asdict(s) for s in samples]}))
    saved = json.loads(path.read_text())
    if {k: saved.get(k) for k in made} != made:
        raise ConfigError(f"--samples={args.samples!r}: collected for {({k: saved.get(k) for k in made})}, not "
                          f"{made}; name another file")
    return [Sample(**s) for s in saved["samples"]]


def build(cfg, teacher_dir: str, student_dir: str, variants: list[Variant], ctx) -> dict:
    """Per variant: (its TeacherScorer, its StudentUpdater), built as the trainer builds them."""
    from actfirst.train.head import load_policy
    from actfirst.train.packing import attention_implementation
    from actfirst.train.student import StudentUpdater
    from actfirst.train.teacher import TeacherScorer

    compute = getattr(torch, cfg.parallel.compute_dtype)
    attention = attention_implementation(cfg.parallel.attention, ctx.device, compute, backward=True)
    teacher = TeacherScorer.load(teacher_dir, student_tokenizer=student_dir, dtype=cfg.teacher_dtype,
                                 device=ctx.device, attention=cfg.parallel.attention).head.model
    out = {}
    for v in variants:  # the same frozen teacher for every variant
        scorer = TeacherScorer(teacher, micro_batch_tokens=v.micro_batch_tokens, device=ctx.device,
                               attention=cfg.parallel.attention, layout=v.layout, name=teacher_dir)
        policy = load_policy(student_dir, mesh=ctx.mesh, device=ctx.device, compute_dtype=compute, attention=attention,
                             activation_checkpointing=cfg.parallel.activation_checkpointing, layout=v.layout)
        out[v] = (scorer, StudentUpdater(policy, optim=cfg.optim, loss=cfg.loss, temperature=cfg.rollout.temperature,
                                         num_updates=cfg.num_updates, num_minibatches=cfg.num_minibatches,
                                         micro_batch_tokens=v.micro_batch_tokens))
    return out


def loadavg() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(models: dict, samples: list, repeats: int, version_lag: int) -> tuple[list[dict], dict]:
    """Every repeat's rows (the variants alternating, the order reversed each repeat) and each variant's teacher
    log-probs of its last repeat. Seconds: wall-clock (``*_s``) and this thread's CPU time (``*_cpu_s``: with one
    torch thread the work runs in the calling thread, so it counts what the work took, not what the machine's other
    load took from it)."""
    variants, rows, scores = list(models), [], {}
    for repeat in range(repeats):
        for v in variants if repeat % 2 == 0 else variants[::-1]:
            scorer, updater = models[v]
            batch = [dataclasses.replace(s, teacher_logprobs=None) for s in samples]
            load = loadavg()
            t0, c0 = time.perf_counter(), time.thread_time()
            scorer.score(batch)
            t1, c1 = time.perf_counter(), time.thread_time()
            metrics = updater.update(batch, current_version=version_lag)  # the samples are of version 0
            t2, c2 = time.perf_counter(), time.thread_time()
            scores[v] = torch.tensor([x for s in batch for x in s.teacher_logprobs])
            rows.append({"repeat": repeat, "variant": v.name, "score_s": t1 - t0, "update_s": t2 - t1,
                         "total_s": t2 - t0, "score_cpu_s": c1 - c0, "update_cpu_s": c2 - c1, "total_cpu_s": c2 - c0,
                         "loadavg_1m": load, "loss": metrics["loss"]})
            print(f"repeat {repeat} {v.name:>12}: score {t1 - t0:6.2f} s ({c1 - c0:5.2f} CPU), update {t2 - t1:6.2f} s "
                  f"({c2 - c1:5.2f} CPU), load {load:.2f}", flush=True)
    return rows, scores


TIMES = ("score_s", "update_s", "total_s", "score_cpu_s", "update_cpu_s", "total_cpu_s")


def summarize(rows: list[dict], names: list[str], repeats: int) -> dict:
    """Per variant: the mean of each of :data:`TIMES` over the measured repeats (all but the first, unless there is
    one), and the speedup of scoring + update over the first variant, wall-clock and CPU: the per-repeat ratios'
    median, mean and range."""
    kept = [r for r in rows if r["repeat"] > 0 or repeats == 1]
    by = {(r["repeat"], r["variant"]): r for r in kept}
    out = {}
    for name in names:
        mine = [r for r in kept if r["variant"] == name]
        out[name] = {key: statistics.mean(r[key] for r in mine) for key in TIMES}
        out[name]["loadavg"] = [r["loadavg_1m"] for r in mine]
        for kind, key in (("wall", "total_s"), ("cpu", "total_cpu_s")):
            ratios = [by[(r["repeat"], names[0])][key] / r[key] for r in mine]
            out[name][f"speedup_{kind}"] = {"median": statistics.median(ratios), "mean": statistics.mean(ratios),
                                            "min": min(ratios), "max": max(ratios)}
    return out


def table(summary: dict) -> list[str]:
    """The summary as Markdown rows."""
    rows = ["| variant | micro-batches | padding tokens | score (s) | update (s) | both (s) | both, CPU (s) | "
            "speedup, wall: median (range) | speedup, CPU: median (range) | teacher diff |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        wall, cpu = s["speedup_wall"], s["speedup_cpu"]
        rows.append(f"| {name} | {s['micro_batches']} | {s['padding']:,} | {s['score_s']:.2f} | {s['update_s']:.2f} | "
                    f"{s['total_s']:.2f} | {s['total_cpu_s']:.2f} | {wall['median']:.2f}x ({wall['min']:.2f}-"
                    f"{wall['max']:.2f}) | {cpu['median']:.2f}x ({cpu['min']:.2f}-{cpu['max']:.2f}) | "
                    f"{s['teacher_max_abs_diff']:.1e} |")
    return rows


@command
def main(argv: list[str] | None = None) -> int:
    """Collect or load the samples, build the models, measure, print and write the results."""
    from actfirst.core.threads import thread_counts
    from actfirst.parallel.context import init_parallel
    from actfirst.train.packing import pack
    from actfirst.train.update_thread import set_torch_threads, update_threads

    args = parse_args(argv)
    check_writable_file(args.out, "--out")
    cfg, teacher_dir, student_dir = load_cfg(args)
    variants = []
    for text in args.variants:
        layout, _, tokens = text.partition("@")
        variants.append(Variant(layout, int(tokens) if tokens else cfg.micro_batch_tokens))
    threads = set_torch_threads(args.threads or update_threads(cfg.parallel.cpu_update_threads, engine_threads=1,
                                                               ranks_here=1))
    samples = load_samples(args, cfg, student_dir)
    ctx = init_parallel()
    models = build(cfg, teacher_dir, student_dir, variants, ctx)
    print(f"{len(samples)} samples, {sum(s.num_tokens for s in samples):,} tokens "
          f"({sum(len(s.response_ids) for s in samples):,} scored); torch threads {threads}", flush=True)
    rows, scores = measure(models, samples, args.repeats, args.version_lag)
    names = [v.name for v in variants]
    summary = summarize(rows, names, args.repeats)
    first = scores[variants[0]]
    for v in variants:
        summary[v.name]["teacher_max_abs_diff"] = float((scores[v] - first).abs().max())
        mbs = pack(samples, v.micro_batch_tokens, v.layout)
        summary[v.name].update(micro_batches=len(mbs), padding=sum(mb.input_ids.numel() - mb.num_tokens for mb in mbs))
    print("\n".join(table(summary)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out, json.dumps({
        "config": args.config, "overrides": args.overrides, "teacher": teacher_dir, "student": student_dir,
        "samples": len(samples), "tokens": sum(s.num_tokens for s in samples),
        "scored_tokens": sum(len(s.response_ids) for s in samples), "threads": thread_counts(),
        "repeats": args.repeats, "version_lag": args.version_lag, "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
