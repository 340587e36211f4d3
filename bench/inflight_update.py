"""A weight update in the middle of a batch of long requests: requeued (``async``) against kept (``inflight``).

    python bench/inflight_update.py --model assets/demo/student-warmstart --requests 32 --tokens 256 --repeats 2

One in-process engine with the demo's student settings (float32, 1 GiB of KV cache, b_max = --requests). Each run
submits --requests full responses whose lengths are drawn uniformly from [--tokens / 4, --tokens] (ignore EOS, the
same seeded draw in every run) and, once the engine has generated --at of the batch's tokens, loads weights into it:
``update_weights(...)`` (the requests in flight restart: their tokens are discarded) or ``update_weights(...,
keep_in_flight=True)`` (they continue with every token). The weights loaded are the model's own, so what the load
costs and what becomes of the requests is measured, not what new weights would say. Runs go in ABBA order
(requeue, keep, keep, requeue) per repeat. Reported per run: the batch's wall-clock from submission to the last
completion, the load's own seconds, tokens generated, discarded and kept across the load, and the requests that
span two versions. Results: one JSON object (--out), written atomically.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

from safetensors.torch import load_file

from actfirst.core.config import EngineConfig, SchedulerConfig
from actfirst.core.files import write_atomically
from actfirst.core.user_input import check_model_dir, check_writable_file, command, positive_int
from actfirst.engine.core import ActFirstEngine
from actfirst.engine.request import RequestKind, SamplingSpec

MODES = {"requeue": False, "keep": True}


async def one_run(engine: ActFirstEngine, weights: dict, lengths: list[int], prompts: list[list[int]], at: float,
                  keep: bool) -> dict:
    """One batch with one weight load once ``at`` of its tokens were generated; the run's figures."""
    counters = (engine.num_generated_tokens, engine.num_discarded_tokens, engine.num_carried_tokens, engine.num_steps)
    start = time.perf_counter()
    futures = [engine.submit(p, RequestKind.FULL_RESPONSE, SamplingSpec(max_tokens=n, min_tokens=n, ignore_eos=True,
                                                                          seed=i))
               for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
    target = counters[0] + round(at * sum(lengths))
    while engine.num_generated_tokens < target:
        await asyncio.sleep(0)
    t0 = time.perf_counter()
    version = engine.update_weights(weights.items(), keep_in_flight=keep)
    load_s = time.perf_counter() - t0
    results = await asyncio.gather(*futures)
    wall = time.perf_counter() - start
    assert [len(r.token_ids) for r in results] == lengths
    generated, discarded, carried, steps = (engine.num_generated_tokens - counters[0],
                                            engine.num_discarded_tokens - counters[1],
                                            engine.num_carried_tokens - counters[2], engine.num_steps - counters[3])
    return {"wall_s": wall, "load_s": load_s, "steps": steps, "generated_tokens": generated,
            "delivered_tokens": sum(lengths), "discarded_tokens": discarded, "carried_tokens": carried,
            "spanning_requests": sum(len(set(r.token_versions)) > 1 for r in results),
            "old_version_tokens": sum(v < version for r in results for v in r.token_versions)}


def summarize(runs: list[dict]) -> dict:
    """Per mode: the median of each figure over its runs."""
    out = {}
    for mode in MODES:
        rows = [r for r in runs if r["mode"] == mode]
        out[mode] = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "mode"}
    return out


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="assets/demo/student-warmstart", help="the student's model directory")
    parser.add_argument("--requests", type=positive_int, default=32, help="full responses in the batch (= b_max)")
    parser.add_argument("--tokens", type=positive_int, default=256, help="the longest response's tokens")
    parser.add_argument("--prompt-tokens", type=positive_int, default=256)
    parser.add_argument("--at", type=float, default=0.5, help="share of the batch's tokens generated at the load")
    parser.add_argument("--repeats", type=positive_int, default=2, help="ABBA blocks (requeue, keep, keep, requeue)")
    parser.add_argument("--out", default="runs/inflight_update.json")
    args = parser.parse_args(argv)
    check_model_dir(args.model, "--model")
    check_writable_file(args.out, "--out")
    if not 0 < args.at < 1:
        parser.error(f"--at={args.at}: must be in (0, 1)")
    engine = ActFirstEngine.from_config(
        EngineConfig(model=args.model, dtype="float32", max_model_len=args.prompt_tokens + args.tokens,
                     max_num_seqs=args.requests, max_num_batched_tokens=max(4096, args.prompt_tokens + args.tokens),
                     kv_cache_gib=1),
        SchedulerConfig(b_max=args.requests))
    weights = load_file(f"{args.model}/model.safetensors")
    rng = random.Random(0)
    vocab = int(engine.vllm.engine.model_config.hf_config.vocab_size)
    lengths = [rng.randint(max(1, args.tokens // 4), args.tokens) for _ in range(args.requests)]
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
    asyncio.run(engine.generate(prompts[0], RequestKind.FULL_RESPONSE, SamplingSpec(max_tokens=8)))  # warm-ups:
    engine.update_weights(weights.items())  # the first load and the first generation are several times slower
    order = [m for _ in range(args.repeats) for m in ("requeue", "keep", "keep", "requeue")]
    runs = []
    for k, mode in enumerate(order):
        row = {"mode": mode, **asyncio.run(one_run(engine, weights, lengths, prompts, args.at, MODES[mode]))}
        runs.append(row)
        print(f"[{k + 1}/{len(order)}] {mode:7s}: {row['wall_s']:6.2f} s, load {1e3 * row['load_s']:.0f} ms, "
              f"{row['generated_tokens']} generated, {row['discarded_tokens']} discarded, {row['carried_tokens']} "
              f"kept across the load, {row['spanning_requests']} requests of two versions", flush=True)
    summary = summarize(runs)
    ratio = summary["requeue"]["wall_s"] / summary["keep"]["wall_s"]
    print(f"median wall: requeue {summary['requeue']['wall_s']:.2f} s, keep {summary['keep']['wall_s']:.2f} s "
          f"(requeue / keep {ratio:.2f}x)")
    write_atomically(args.out, json.dumps({"args": vars(args), "lengths": lengths, "runs": runs, "median": summary,
                                           "requeue_over_keep_wall": ratio}, indent=1))
    asyncio.run(engine.shutdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
