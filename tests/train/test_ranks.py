"""The trainer's multi-rank pieces, on real gloo process groups of spawned processes (torchrun's environment, the
student under FSDP2), without engines: a 2-rank update equals a 1-rank update on the same global batch; the
weight gather gives every rank the full parameters a bucket at a time; a sharded teacher scores like a whole one
when the ranks hold different numbers of samples; the optimizer's DCP checkpoint written at 2 ranks loads at 1."""


import pytest
import torch
from train_helpers import random_samples, spawn_ranks

from actfirst.core.config import LossConfig, OptimConfig
from actfirst.parallel.weight_sync import plan_buckets

ADAM_LR = 1e-3
PARAM_ATOL = 2e-6
"""A parameter of a 2-rank update may differ from the 1-rank one by this much (float32 sums in another order; the
AdamW step of lr 1e-3 is about 1e-3 in every coordinate, so this is 0.2% of a step)."""
GRAD_RTOL = 1e-5
"""Gradients: relative to the largest entry of their tensor."""


def _policy(model_dir):
    from transformers import AutoModelForCausalLM

    from actfirst.parallel.context import init_parallel
    from actfirst.parallel.fsdp import apply_fsdp
    from actfirst.train.head import LMHeadModel

    ctx = init_parallel()
    policy = LMHeadModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    apply_fsdp(policy, policy.blocks, ctx.mesh)
    return ctx, policy


def _full(policy, bucket_bytes=1 << 30):
    from actfirst.parallel.weight_sync import gathered_parameters

    return {n: t.clone() for n, t in gathered_parameters(policy.model, dtype=torch.float32,
                                                         bucket_bytes=bucket_bytes)}


def update_rank(model_dir, shards, save_dir, aggregation="seq_mean_token_mean"):
    """One rank: gradients of its share (two mini-batches), one update, the gathered result; with ``save_dir`` a
    training checkpoint after it."""
    from actfirst.parallel.fsdp import full_tensor
    from actfirst.train.student import BatchTotals, StudentUpdater

    ctx, policy = _policy(model_dir)
    samples = shards[ctx.rank]
    up = StudentUpdater(policy, optim=OptimConfig(lr=ADAM_LR, grad_clip=1.0), loss=LossConfig(aggregation=aggregation),
                        temperature=0.8, num_updates=10, num_minibatches=2, micro_batch_tokens=40)
    half = len(samples) // 2
    first = [s for shard in shards for s in shard[:len(shard) // 2]]  # every rank's first mini-batch
    up.accumulate_gradients(samples[:half], 0, BatchTotals.of(first))
    grads = {n: full_tensor(p.grad).clone() for n, p in policy.model.named_parameters()}
    up.optimizer.zero_grad(set_to_none=True)
    metrics = up.update(samples, current_version=0)
    after = _full(policy, bucket_bytes=3000)  # many small buckets
    if save_dir is not None:
        from transformers import AutoTokenizer

        from actfirst.train.state import save_training_checkpoint

        save_training_checkpoint(save_dir, update=1, keep=1, ctx=ctx, policy=policy, optimizer=up.optimizer,
                                 tokenizer=AutoTokenizer.from_pretrained(model_dir),
                                 trainer_state={"updater": up.state_dict()}, rank_state={"rank": ctx.rank})
    optim = {n: {k: full_tensor(v).clone() for k, v in up.optimizer.state[p].items()}
             for n, p in policy.named_parameters()}
    return {"metrics": metrics, "grads": grads, "params": after, "optim": optim}


def load_rank(model_dir, checkpoint):
    """One rank of a job of another size: the optimizer state of ``checkpoint``, resharded, gathered back."""
    from actfirst.parallel.fsdp import full_tensor
    from actfirst.train.state import load_training_checkpoint
    from actfirst.train.student import StudentUpdater

    ctx, policy = _policy(model_dir)
    up = StudentUpdater(policy, optim=OptimConfig(lr=ADAM_LR), loss=LossConfig(), temperature=0.8, num_updates=10)
    trainer_state, rank_states = load_training_checkpoint(checkpoint, ctx=ctx, policy=policy, optimizer=up.optimizer)
    optim = {n: {k: full_tensor(v).clone() for k, v in up.optimizer.state[p].items()}
             for n, p in policy.named_parameters()}
    return {"trainer": trainer_state, "ranks": [s["rank"] for s in rank_states], "optim": optim}


def teacher_rank(model_dir, shards, shard):
    from actfirst.parallel.context import init_parallel
    from actfirst.train.teacher import TeacherScorer

    ctx = init_parallel()
    scorer = TeacherScorer.load(model_dir, student_tokenizer=model_dir, micro_batch_tokens=30,
                           shard=ctx if shard else None, device="cpu")
    samples = shards[ctx.rank]
    scorer.score(samples)
    return [s.teacher_logprobs for s in samples]


@pytest.fixture(scope="module")
def batch(tiny_model_dir, vocab_size):
    gen = torch.Generator().manual_seed(11)
    return random_samples(gen, 8, vocab_size, max_context=30, max_response=10)


def test_two_rank_update_equals_one_rank_update_and_its_checkpoint_loads_at_one_rank(tiny_model_dir, batch,
                                                                                      tmp_path):
    # The 1-rank run's mini-batches are batch[:4] and batch[4:]; each rank holds half of each.
    one, = spawn_ranks(update_rank, 1, str(tiny_model_dir), [batch], None)
    shards = [batch[0:2] + batch[4:6], batch[2:4] + batch[6:8]]
    two = spawn_ranks(update_rank, 2, str(tiny_model_dir), shards, str(tmp_path / "two"))
    for name, g in one["grads"].items():
        scale = float(g.abs().max())
        for r in two:
            torch.testing.assert_close(r["grads"][name], g, rtol=0, atol=GRAD_RTOL * max(scale, 1e-12), msg=name)
    worst = max(float((two[0]["params"][n] - p).abs().max()) for n, p in one["params"].items())
    print(f"2 ranks vs 1: largest parameter difference after the update {worst:.2e} (AdamW lr {ADAM_LR})")
    assert worst <= PARAM_ATOL
    assert all(torch.equal(two[0]["params"][n], two[1]["params"][n]) for n in one["params"])
    m1, m2 = one["metrics"], two[0]["metrics"]
    assert m2 == two[1]["metrics"] | {"update_s": m2["update_s"]}  # every rank reports the global figures
    for key in ("num_tokens", "num_supervised", "clip_frac", "dual_clip_frac", "skipped", "version_lag_mean"):
        assert m2[key] == m1[key], key
    for key in ("loss", "grad_norm", "mismatch_mean", "mismatch_max", "teacher_minus_old"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key

    # The optimizer state written by the two ranks (DCP, sharded) loads resharded into one rank.
    loaded, = spawn_ranks(load_rank, 1, str(tiny_model_dir), str(tmp_path / "two" / "checkpoints" / "update_000001"))
    assert loaded["ranks"] == [0, 1] and loaded["trainer"]["world_size"] == 2
    assert loaded["trainer"]["updater"] == {"updates_done": 1}
    for name, state in two[0]["optim"].items():
        for key, value in state.items():
            assert torch.equal(loaded["optim"][name][key], value), (name, key)


def test_token_mean_over_two_ranks_equals_one_rank(tiny_model_dir, batch):
    """003's token-mean aggregation divides by the supervised tokens of the mini-batch over all ranks: the ranks
    here hold different numbers of them, and 2 ranks still give 1 rank's gradients, loss and update."""
    one, = spawn_ranks(update_rank, 1, str(tiny_model_dir), [batch], None, "token_mean")
    shards = [batch[0:2] + batch[4:6], batch[2:4] + batch[6:8]]
    print("supervised tokens per rank:", [sum(s.num_supervised for s in shard) for shard in shards])
    two = spawn_ranks(update_rank, 2, str(tiny_model_dir), shards, None, "token_mean")
    for name, g in one["grads"].items():
        torch.testing.assert_close(two[0]["grads"][name], g, rtol=0, atol=GRAD_RTOL * max(float(g.abs().max()), 1e-12),
                                   msg=name)
    assert max(float((two[0]["params"][n] - p).abs().max()) for n, p in one["params"].items()) <= PARAM_ATOL
    assert two[0]["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-5, abs=1e-7)
    seq_mean, = spawn_ranks(update_rank, 1, str(tiny_model_dir), [batch], None)
    assert seq_mean["metrics"]["loss"] != pytest.approx(one["metrics"]["loss"], rel=1e-3)  # the key reached the loss


def test_sharded_teacher_scores_as_a_whole_one(tiny_model_dir, vocab_size):
    gen = torch.Generator().manual_seed(5)
    samples = random_samples(gen, 7, vocab_size, max_context=30, max_response=10, scored=False)
    shards = [samples[:5], samples[5:]]  # rank 0 runs more micro-batches: rank 1 pads with empty ones
    whole = spawn_ranks(teacher_rank, 2, str(tiny_model_dir), shards, False)
    sharded = spawn_ranks(teacher_rank, 2, str(tiny_model_dir), shards, True)
    for a, b in zip(whole, sharded, strict=True):
        for x, y in zip(a, b, strict=True):
            assert len(x) == len(y) and max(abs(u - v) for u, v in zip(x, y, strict=True)) < 1e-5


@pytest.mark.parametrize("sizes,limit,want", [
    ([4, 4, 4], 8, [[0, 1], [2]]),
    ([10, 1, 1], 8, [[0], [1, 2]]),       # a parameter larger than a bucket is gathered alone
    ([3, 3, 3, 3], 100, [[0, 1, 2, 3]]),
    ([], 8, []),
])
def test_plan_buckets(sizes, limit, want):
    assert plan_buckets(sizes, limit) == want
    for bucket in plan_buckets(sizes, limit):
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= limit
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        plan_buckets(sizes, 0)


def failing_checkpoint_rank(model_dir, out_dir):
    """Rank 1's own part of a checkpoint cannot be written (a value checkpoints refuse): every rank must raise,
    none wait for the others, and nothing is committed."""
    from transformers import AutoTokenizer

    from actfirst.train.checkpoint import CheckpointError, latest_checkpoint
    from actfirst.train.state import save_training_checkpoint
    from actfirst.train.student import StudentUpdater

    ctx, policy = _policy(model_dir)
    up = StudentUpdater(policy, optim=OptimConfig(lr=ADAM_LR), loss=LossConfig(), temperature=1.0, num_updates=1)
    rank_state = {"rank": ctx.rank} if ctx.rank == 0 else {"rank": object()}
    with pytest.raises(CheckpointError) as error:
        save_training_checkpoint(out_dir, update=1, keep=1, ctx=ctx, policy=policy, optimizer=up.optimizer,
                                 tokenizer=AutoTokenizer.from_pretrained(model_dir),
                                 trainer_state={"updater": up.state_dict()}, rank_state=rank_state)
    return {"message": str(error.value), "latest": latest_checkpoint(out_dir)}


def test_a_rank_whose_checkpoint_part_fails_fails_every_rank(tiny_model_dir, tmp_path):
    results = spawn_ranks(failing_checkpoint_rank, 2, str(tiny_model_dir), str(tmp_path), timeout=120)
    for r in results:
        assert "checkpoint of update 1 not written" in r["message"] and "(rank 1): TypeError" in r["message"]
        assert r["latest"] is None
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(("update_", ".tmp-"))]
