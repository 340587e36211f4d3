"""Rollout-speedup benchmark: think-then-act against ActFirst scheduling on the real engine.

The paper's rollout-efficiency experiment (Sec. 5.4, Appendix C.5, Table 8, Figure 3a/b): N tasks per batch,
fixed contexts, T virtual turns, fixed-length fast actions and full responses, b_max swept. Under think-then-act
(Vanilla OPD) scheduling each task's next turn waits for its full response; under ActFirst scheduling the fast
action and the full response are submitted together and the fast action releases the next turn. A batch ends
when every request has finished. Paired repeats use the same engine, contexts and seeds, order alternated.

Next to each measured speedup (Eq. 35) it reports the estimates and bounds of ``rollout_model.py``: the
idealized estimate of Eq. 36 (single-request latencies, median of three per context), the concurrency bound of
Eq. 25-26, a throughput bound (ActFirst's tokens over the best decode rate of a concurrency sweep measured in the
same run) and a step model (the same schedule replayed with the sweep's measured step times). On a CPU decode
throughput levels off at 64-128 sequences, so overlap is not free and the last two are the ones that bind.

    python bench/rollout_speedup.py --config bench/configs/rollout_speedup_cpu.yaml [key=value ...]

Writes ``results.json``, ``measurements.jsonl``, ``table.md`` and ``speedup.png`` to ``out_dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch and vLLM start their thread pools

from rollout_model import estimates  # noqa: E402
from rollout_speedup_config import RolloutSpeedupConfig  # noqa: E402
from speedup_contexts import alfworld_contexts  # noqa: E402

from actfirst.core.config import ModelConfig, SchedulerConfig  # noqa: E402
from actfirst.core.schema import load_config, paths_unchecked, to_dict  # noqa: E402
from actfirst.core.user_input import check_writable_dir, command  # noqa: E402
from actfirst.engine.core import ActFirstEngine, summarize_records  # noqa: E402
from actfirst.engine.request import RequestKind, SamplingSpec  # noqa: E402
from actfirst.models.build import build_model, environment_corpus  # noqa: E402
from actfirst.models.hub import resolve_model  # noqa: E402

FAST, FULL = RequestKind.FAST_ACTION, RequestKind.FULL_RESPONSE

# The closing instructions of the paper's ALFWorld templates (Appendix B.1): think-then-act for full responses,
# action-only (no reference) for fast actions. The observation part of each context is synthetic ALFWorld text.
FULL_TAIL = ("Now it's your turn to take an action.\nYou should first reason step-by-step about the current "
             "situation. This reasoning process MUST be enclosed within <think> </think> tags.\nOnce you've "
             "finished your reasoning, you should choose an admissible action for current step and present it "
             "within <action> </action> tags.")
FAST_TAIL = ("Now it's your turn to take an action.\nYou should choose an admissible action for current step and "
             "present it within <action> </action> tags.")


def make_contexts(tokenizer, cfg: RolloutSpeedupConfig) -> list[tuple[list[int], list[int]]]:
    """(fast-action prompt, full-response prompt) token ids for each of num_batches * num_tasks contexts, of the
    kind ``cfg.contexts`` names."""
    if cfg.contexts == "alfworld":
        return alfworld_contexts(tokenizer, cfg)
    return synthetic_contexts(tokenizer, cfg)


def synthetic_contexts(tokenizer, cfg: RolloutSpeedupConfig) -> list[tuple[list[int], list[int]]]:
    """ALFWorld-like text of ``context_tokens`` tokens closed by the B.1 tails (a quick check, no simulator)."""
    rng = random.Random(cfg.seed)
    sentences = [s for s in environment_corpus() if "{" not in s and len(s) > 10]
    contexts = []
    for _ in range(cfg.num_batches * cfg.num_tasks):
        target = rng.randint(*cfg.context_tokens)
        body = "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
        while len(tokenizer(body)["input_ids"]) < target:
            body += rng.choice(sentences) + " "
        pair = []
        for tail in (FAST_TAIL, FULL_TAIL):
            msgs = [{"role": "user", "content": body + "\n" + tail}]
            pair.append(list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)))
        contexts.append(tuple(pair))
    return contexts


def spec(tokens: int, temperature: float, seed: int) -> SamplingSpec:
    """Fixed-length generation (Table 8 fixes the lengths): ignore EOS, min = max tokens."""
    return SamplingSpec(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=temperature, seed=seed)


def analyze(cfg: RolloutSpeedupConfig, lat: dict, rates: dict[int, float], row: dict) -> dict:
    """A measured setting plus its mean/sd speedup (Eq. 35) and every estimate and bound (rollout_model.py)."""
    speedups = row["speedups"]
    out = dict(row, speedup_mean=statistics.mean(speedups),
               speedup_sd=statistics.stdev(speedups) if len(speedups) > 1 else 0.0)
    out.update(estimates(num_tasks=cfg.num_tasks, num_batches=cfg.num_batches, turns=row["turns"],
                         fast_tokens=cfg.fast_action_tokens, full_tokens=row["full_tokens"], b_max=row["b_max"],
                         policy=row["policy"], lat_fast=lat["fast"], lat_full=lat[f"full_{row['full_tokens']}"],
                         rates=rates, c_vanilla=statistics.mean(row["vanilla_s"]), speedup=out["speedup_mean"]))
    return out


async def think_then_act_batch(engine, contexts, turns, full_tokens, temperature, seed) -> float:
    """Vanilla OPD scheduling: each turn waits for the full response. Returns the batch completion time."""

    async def task(i, full_prompt):
        for t in range(turns):
            await engine.generate(full_prompt, FULL, spec(full_tokens, temperature, seed + 1000 * i + t))

    start = time.perf_counter()
    await asyncio.gather(*(task(i, full) for i, (_, full) in enumerate(contexts)))
    return time.perf_counter() - start


async def act_first_batch(engine, contexts, turns, full_tokens, fast_tokens, temperature, seed) -> float:
    """ActFirst scheduling: fast action and full response submitted together; the fast action releases the next
    turn; the batch ends when every full response has finished."""

    async def task(i, fast_prompt, full_prompt):
        fulls = []
        for t in range(turns):
            fulls.append(engine.submit(full_prompt, FULL, spec(full_tokens, temperature, seed + 1000 * i + t)))
            await engine.generate(fast_prompt, FAST, spec(fast_tokens, temperature, seed + 7 + 1000 * i + t))
        await asyncio.gather(*fulls)

    start = time.perf_counter()
    await asyncio.gather(*(task(i, fast, full) for i, (fast, full) in enumerate(contexts)))
    return time.perf_counter() - start


async def single_request_latencies(engine, contexts, tokens_by_kind, temperature, seed) -> dict:
    """Median of three isolated latencies per context (prefill and decoding), for Eq. 36."""
    out = {}
    for name, kind, tokens in tokens_by_kind:
        lat = []
        for i, (fast, full) in enumerate(contexts):
            prompt = fast if kind == FAST else full
            samples = []
            for _ in range(3):
                start = time.perf_counter()
                await engine.generate(prompt, kind, spec(tokens, temperature, seed + i))
                samples.append(time.perf_counter() - start)
            lat.append(statistics.median(samples))
        out[name] = lat
    return out


async def decode_rate_sweep(engine, contexts, concurrencies, tokens, temperature) -> dict[int, float]:
    """Generated tokens per second with c requests running together (full-response prompts, ``tokens`` each)."""
    rates = {}
    for c in concurrencies:
        engine.reconfigure(SchedulerConfig(b_max=c))
        prompts = [contexts[i % len(contexts)][1] for i in range(c)]
        start = time.perf_counter()
        await asyncio.gather(*(engine.generate(p, FULL, spec(tokens, temperature, 17 + i))
                               for i, p in enumerate(prompts)))
        rates[c] = c * tokens / (time.perf_counter() - start)
        print(f"  decode rate at concurrency {c:4d}: {rates[c]:9.0f} tok/s", flush=True)
    return rates


async def run(cfg: RolloutSpeedupConfig, out_dir: Path) -> dict:
    from transformers import AutoTokenizer

    print(f"engine: {cfg.engine.model}", flush=True)
    engine = ActFirstEngine.from_config(cfg.engine, SchedulerConfig(b_max=max(cfg.b_max)))
    tokenizer = AutoTokenizer.from_pretrained(cfg.engine.model)
    contexts = make_contexts(tokenizer, cfg)
    batches = [contexts[b * cfg.num_tasks:(b + 1) * cfg.num_tasks] for b in range(cfg.num_batches)]
    temp = cfg.temperature
    log = open(out_dir / "measurements.jsonl", "w")

    def emit(record):
        log.write(json.dumps(record) + "\n")
        log.flush()

    # Warm-up (excluded from timing): the first log-prob request pays a one-time cost.
    await asyncio.gather(*(engine.generate(full, FULL, spec(8, temp, 0)) for _, full in contexts[:4]))

    print("single-request latencies (median of 3) ...", flush=True)
    kinds = [("fast", FAST, cfg.fast_action_tokens)] + [(f"full_{L}", FULL, L) for L in cfg.full_response_tokens]
    lat = await single_request_latencies(engine, contexts, kinds, temp, cfg.seed)
    for name, values in lat.items():
        print(f"  {name:9s} median {statistics.median(values) * 1e3:8.1f} ms", flush=True)
        emit({"kind": "single_latency", "name": name, "latencies_s": values})

    print("peak decode rate (concurrency sweep) ...", flush=True)
    rates = await decode_rate_sweep(engine, contexts, cfg.concurrency_sweep, min(cfg.full_response_tokens), temp)
    emit({"kind": "decode_rate", "rates": rates})

    raw_rows: list[dict] = []

    async def paired(L, b_max, turns, policy, repeats):
        row = await paired_speedup(engine, cfg, batches, L, b_max, turns, policy, repeats)
        emit({"kind": "speedup", **row})
        raw_rows.append(row)
        print_row(analyze(cfg, lat, rates, row))

    default_policy = cfg.scheduler.fast_action_admission
    print(f"Figure 3a: speedup against b_max (T={cfg.turns[0]}, policy {default_policy}) ...", flush=True)
    for L in cfg.full_response_tokens:
        for b in cfg.b_max:
            await paired(L, b, cfg.turns[0], default_policy, cfg.repeats)
    print(f"Figure 3b: speedup against T (b_max={max(cfg.b_max)}) ...", flush=True)
    for L in cfg.full_response_tokens:
        for T in cfg.turns_sweep:
            if T != cfg.turns[0]:
                await paired(L, max(cfg.b_max), T, default_policy, cfg.repeats)
    print("fast-action admission policies ...", flush=True)
    for p in cfg.admission_policies:
        if p != default_policy:
            for b in cfg.b_max:
                await paired(cfg.full_response_tokens[0], b, cfg.turns[0], p, 1)
    await engine.shutdown()
    log.close()
    return assemble(cfg, lat, rates, raw_rows)


async def paired_speedup(engine: ActFirstEngine, cfg: RolloutSpeedupConfig, batches: list, L: int, b_max: int,
                         turns: int, policy: str, repeats: int) -> dict:
    """Think-then-act against act-first on the same batches, ``repeats`` times in alternating order: the row of
    measurements (times, speedups, ActFirst's request records and peak in flight)."""
    speedups, van_total, af_total, records, peak = [], [], [], [], 0
    temp = cfg.temperature
    for k in range(repeats):
        times = {}
        order = ("vanilla", "actfirst") if k % 2 == 0 else ("actfirst", "vanilla")
        for strategy in order:
            # The fast-action admission policy is ActFirst's; think-then-act has no fast actions and runs
            # with every slot open to its full responses.
            engine.reconfigure(SchedulerConfig(b_max=b_max, fast_action_admission=policy
                                               if strategy == "actfirst" else "wait"))
            total = 0.0
            for batch in batches:
                if strategy == "vanilla":
                    total += await think_then_act_batch(engine, batch, turns, L, temp, cfg.seed)
                else:
                    total += await act_first_batch(engine, batch, turns, L, cfg.fast_action_tokens, temp, cfg.seed)
            times[strategy] = total
            if strategy == "actfirst":
                records += engine.records
                peak = max(peak, engine.peak_in_flight)
        speedups.append(times["vanilla"] / times["actfirst"])
        van_total.append(times["vanilla"])
        af_total.append(times["actfirst"])
    by_kind = summarize_records(records)
    return {"full_tokens": L, "b_max": b_max, "turns": turns, "policy": policy, "speedups": speedups,
            "vanilla_s": van_total, "actfirst_s": af_total,
            "fast_action_wait_p95_ms": by_kind["fast_action"]["queue_wait_p95_ms"], "requests": by_kind,
            "peak_in_flight": peak}


def print_row(row: dict) -> None:
    """One analyzed row on a line."""
    print(f"  L={row['full_tokens']:4d} b_max={row['b_max']:4d} T={row['turns']:2d} {row['policy']:8s} speedup "
          f"{row['speedup_mean']:.2f}x (sd {row['speedup_sd']:.2f}) ideal {row['ideal']:.2f} "
          f"conc-bound {row['concurrency_bound']:.2f} tput-bound {row['throughput_bound']:.2f} "
          f"({row['pct_of_throughput_bound']:.0f}%) step-model {row['step_model']:.2f} "
          f"({row['pct_of_step_model']:.0f}%) "
          f"fast-wait p95 {row['fast_action_wait_p95_ms']:.1f} ms", flush=True)


def assemble(cfg: RolloutSpeedupConfig, lat: dict, rates: dict[int, float], raw_rows: list[dict]) -> dict:
    """Results of a run (or of its measurements.jsonl): every row analyzed and sorted into Figure 3a, 3b and the
    admission-policy comparison."""
    rows = [analyze(cfg, lat, rates, r) for r in raw_rows]
    policy, t0, b_top = cfg.scheduler.fast_action_admission, cfg.turns[0], max(cfg.b_max)
    return {"config": to_dict(cfg), "decode_rates": rates,
            "single_latency_median_s": {k: statistics.median(v) for k, v in lat.items()},
            "figure_3a": [r for r in rows if r["policy"] == policy and r["turns"] == t0],
            "figure_3b": [r for r in rows if r["policy"] == policy and r["b_max"] == b_top],
            "admission_policies": [r for r in rows if r["full_tokens"] == cfg.full_response_tokens[0]
                                   and r["turns"] == t0]}


def load_measurements(path: Path) -> tuple[dict, dict[int, float], list[dict]]:
    """Single-request latencies, decode rates and raw speedup rows from a measurements.jsonl."""
    lat, rates, rows = {}, {}, []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "single_latency":
            lat[rec["name"]] = rec["latencies_s"]
        elif rec["kind"] == "decode_rate":
            rates = {int(c): r for c, r in rec["rates"].items()}
        elif rec["kind"] == "speedup":
            rows.append({k: v for k, v in rec.items() if k != "kind"})
    return lat, rates, rows


PAPER_3A = {128: {16: 0.80, 256: 1.49}, 512: {16: 0.92, 256: 2.42}}


def table(results: dict) -> str:
    lines = ["| full tokens | b_max | T | policy | speedup (sd) | paper | Eq. 36 ideal | Eq. 25 bound | "
             "throughput bound (%) | step model (%) | fast wait p95 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in results["figure_3a"] + results["figure_3b"] + results["admission_policies"]:
        key = (r["full_tokens"], r["b_max"], r["turns"], r["policy"])
        if key in seen:
            continue
        seen.add(key)
        paper = PAPER_3A.get(r["full_tokens"], {}).get(r["b_max"]) if r["turns"] == 4 else None
        lines.append(f"| {r['full_tokens']} | {r['b_max']} | {r['turns']} | {r['policy']} | "
                     f"{r['speedup_mean']:.2f}x ({r['speedup_sd']:.2f}) | {f'{paper:.2f}x' if paper else '-'} | "
                     f"{r['ideal']:.2f}x | {r['concurrency_bound']:.2f}x | {r['throughput_bound']:.2f}x "
                     f"({r['pct_of_throughput_bound']:.0f}%) | "
                     f"{r['step_model']:.2f}x ({r['pct_of_step_model']:.0f}%) | "
                     f"{r['fast_action_wait_p95_ms']:.1f} |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths = sorted({r["full_tokens"] for r in results["figure_3a"]})
    for i, L in enumerate(lengths):
        color = f"C{i}"
        rows = sorted((r for r in results["figure_3a"] if r["full_tokens"] == L), key=lambda r: r["b_max"])
        x = [r["b_max"] for r in rows]
        ax_a.errorbar(x, [r["speedup_mean"] for r in rows], yerr=[r["speedup_sd"] for r in rows], marker="o",
                      color=color, label=f"{L}-token full responses", capsize=3)
        ax_a.plot(x, [r["ideal"] for r in rows], "--", color=color, alpha=0.6, label=f"{L}: Eq. 36 ideal")
        ax_a.plot(x, [r["throughput_bound"] for r in rows], ":", color=color, alpha=0.9, label=f"{L}: throughput bound")
        ax_a.plot(x, [r["step_model"] for r in rows], "-.", color=color, alpha=0.7, label=f"{L}: step model")
        if L in PAPER_3A and rows and rows[0]["turns"] == 4:
            ax_a.scatter(list(PAPER_3A[L]), list(PAPER_3A[L].values()), marker="x", s=60, color=color,
                         label=f"{L}: paper (GPU, Qwen3-1.7B)")
        rows_b = sorted((r for r in results["figure_3b"] if r["full_tokens"] == L), key=lambda r: r["turns"])
        ax_b.errorbar([r["turns"] for r in rows_b], [r["speedup_mean"] for r in rows_b],
                      yerr=[r["speedup_sd"] for r in rows_b], marker="o", color=color, capsize=3, label=f"{L} tokens")
        ax_b.plot([r["turns"] for r in rows_b], [r["ideal"] for r in rows_b], "--", color=color, alpha=0.6)
        ax_b.plot([r["turns"] for r in rows_b], [r["step_model"] for r in rows_b], "-.", color=color, alpha=0.7)
    for ax in (ax_a, ax_b):
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.grid(alpha=0.3)
        ax.set_ylabel("rollout speedup (think-then-act / ActFirst)")
    ax_a.set_xscale("log", base=2)
    ax_a.set_xlabel("b_max (concurrency cap)")
    ax_a.set_title(f"(a) speedup vs b_max, T={results['figure_3a'][0]['turns']}")
    ax_a.legend(fontsize=7)
    ax_b.set_xlabel("virtual turns T")
    ax_b.set_title(f"(b) speedup vs T, b_max={max(r['b_max'] for r in results['figure_3b'])}\n"
                   "(dashed: Eq. 36 ideal, dash-dot: step model)", fontsize=10)
    ax_b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@command
def main(argv: list[str] | None = None) -> int:
    """Measure (or, with ``--report``, only re-report); returns the exit status."""
    parser = argparse.ArgumentParser(description="ActFirst rollout-speedup benchmark (paper Fig. 3a/b)")
    parser.add_argument("--config", default=str(Path(__file__).parent / "configs" / "rollout_speedup_cpu.yaml"))
    parser.add_argument("--model-config", default=None,
                        help="ModelConfig YAML: build this model at engine.model first if that directory is missing")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="only rebuild results.json, table.md and speedup.png from DIR/measurements.jsonl")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. scheduler.b_max=64")
    args = parser.parse_args(argv)
    if args.report:
        out_dir = Path(args.report)
        cfg = load_config(RolloutSpeedupConfig, args.config, args.overrides)
        write_results(assemble(cfg, *load_measurements(out_dir / "measurements.jsonl")), out_dir)
        return 0

    with paths_unchecked():  # engine.model may be the model --model-config builds
        model_path = load_config(RolloutSpeedupConfig, args.config, args.overrides).engine.model
    if args.model_config and not Path(model_path).is_dir():
        model_cfg = load_config(ModelConfig, args.model_config, key="--model-config")
        check_writable_dir(Path(model_path).parent, "engine.model")
        print(f"building {args.model_config} at {model_path}", flush=True)
        build_model(model_cfg, model_path)
    cfg = load_config(RolloutSpeedupConfig, args.config, args.overrides)
    model = resolve_model(cfg.engine.model, "engine.model", cfg.engine.revision, revision_key="engine.revision")
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model=str(model)))
    check_writable_dir(cfg.out_dir, "out_dir")
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = asyncio.run(run(cfg, out_dir))
    results["wall_s"] = time.perf_counter() - start
    write_results(results, out_dir)
    return 0


def write_results(results: dict, out_dir: Path) -> None:
    results["machine"] = {"cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS")}
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    md = table(results)
    (out_dir / "table.md").write_text(md + "\n")
    plot(results, out_dir / "speedup.png")
    print(md)
    print(f"wrote {out_dir}/results.json, table.md, speedup.png")


if __name__ == "__main__":
    sys.exit(main())
