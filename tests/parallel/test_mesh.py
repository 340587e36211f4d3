"""The 2-D mesh (``parallel.mesh``): 4 gloo ranks on the CPU as 2 nodes of 2 (torchrun's environment with
LOCAL_WORLD_SIZE=2), the tiny real Qwen3 student under FSDP2. On the hybrid mesh (replicate across nodes, shard
within) one update gives the flat mesh's loss, gradients and weights; the only collectives that cross nodes are the
gradient all-reduces between replicas and the step's few metric sums; the weight-sync gather and a sharded teacher's
all-gathers stay inside a node; DCP checkpoints written on either mesh load on the other (the hybrid one on one rank
too)."""

import dataclasses
import sys
from pathlib import Path
from typing import Self, get_args, get_type_hints

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_helpers import random_samples, spawn_ranks

from actfirst.core.config import ParallelConfig, TrainConfig
from actfirst.core.schema import load_config, paths_unchecked
from actfirst.core.user_input import ConfigError
from actfirst.parallel.context import MESHES, mesh_shape

NODES, PER_NODE = 2, 2
ADAM_LR = 1e-3
PARAM_ATOL = 2e-6
"""A parameter after the hybrid update may differ from the flat one by this much (float32 sums in another order: a
reduce-scatter over 2 then an all-reduce over 2, against one reduce-scatter over 4; 0.2% of an AdamW step)."""
GRAD_RTOL = 1e-5
"""Gradients: relative to the largest entry of their tensor."""
LATEST = "checkpoints/update_000001"
"""The one training checkpoint each run writes, under its out_dir."""
METRIC_NUMEL = 16
"""A collective over every rank in the step carries a few numbers (the update's metric sums), never parameters or
gradients."""


def _node(rank: int) -> int:
    return rank // PER_NODE


class CollectiveLog:
    """Every collective this rank runs inside the ``with`` block, as (op, ranks of its group, elements of its first
    tensor argument: the output of c10d's ops, the input of the functional ones): a TorchDispatchMode that only looks
    (c10d ops take their ProcessGroup, functional ones its registered name)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...], int]] = []
        self._mode = None

    def __enter__(self) -> Self:
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace in ("c10d", "_c10d_functional") and "wait" not in str(func) \
                        and "wrap" not in str(func):
                    log.calls.append(_describe(func, args))
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


def _describe(func, args) -> tuple[str, tuple[int, ...], int]:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    group, numel = None, 0
    for a in args:
        if isinstance(a, torch.Tensor):
            numel = numel or a.numel()
        elif isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            numel = numel or sum(t.numel() for t in a)
        elif isinstance(a, torch.ScriptObject) and a._type().qualified_name().endswith(".c10d.ProcessGroup"):
            group = dist.ProcessGroup.unbox(a)
        elif isinstance(a, str) and group is None:
            group = _resolve_process_group(a)
    return str(func.name()).split("::")[-1], tuple(dist.get_process_group_ranks(group)), numel


def _policy(model_dir, ctx):
    from transformers import AutoModelForCausalLM

    from actfirst.parallel.fsdp import apply_fsdp
    from actfirst.train.head import LMHeadModel

    policy = LMHeadModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    apply_fsdp(policy, policy.blocks, ctx.mesh)
    return policy


def _updater(policy):
    from actfirst.core.config import LossConfig, OptimConfig
    from actfirst.train.student import StudentUpdater

    return StudentUpdater(policy, optim=OptimConfig(lr=ADAM_LR, grad_clip=1.0), loss=LossConfig(), temperature=0.8,
                          num_updates=10, num_minibatches=1, micro_batch_tokens=40)


def _optim_state(policy, optimizer):
    from actfirst.parallel.fsdp import full_tensor

    return {n: {k: full_tensor(v).clone() for k, v in optimizer.state[p].items()} for n, p in policy.named_parameters()}


def _update(model_dir, ctx, samples, totals, save_dir):
    """One update on ``ctx``'s mesh: gradients, metrics, weights gathered after it, the collectives of the step and
    of the gather, the optimizer state; a training checkpoint in ``save_dir``."""
    from transformers import AutoTokenizer

    from actfirst.parallel.fsdp import full_tensor
    from actfirst.parallel.weight_sync import gathered_parameters
    from actfirst.train.state import save_training_checkpoint

    policy = _policy(model_dir, ctx)
    up = _updater(policy)
    up.accumulate_gradients(samples, 0, totals)
    grads = {n: full_tensor(p.grad).clone() for n, p in policy.model.named_parameters()}
    up.optimizer.zero_grad(set_to_none=True)
    with CollectiveLog() as step:
        metrics = up.update(samples, current_version=0)
    with CollectiveLog() as gather:
        params = {n: t.clone() for n, t in gathered_parameters(policy.model, dtype=torch.float32, bucket_bytes=3000)}
    save_training_checkpoint(save_dir, update=1, keep=1, ctx=ctx, policy=policy, optimizer=up.optimizer,
                             tokenizer=AutoTokenizer.from_pretrained(model_dir),
                             trainer_state={"updater": up.state_dict()}, rank_state={"rank": ctx.rank})
    return {"metrics": metrics, "grads": grads, "params": params, "optim": _optim_state(policy, up.optimizer),
            "step": step.calls, "gather": gather.calls,
            "local_grad_numel": sum(p.numel() for p in policy.parameters()) // PER_NODE}


def _load(model_dir, ctx, checkpoint):
    """The optimizer state of ``checkpoint`` loaded onto ``ctx``'s mesh (resharded), gathered back."""
    from actfirst.train.state import load_training_checkpoint

    policy = _policy(model_dir, ctx)
    up = _updater(policy)
    load_training_checkpoint(checkpoint, ctx=ctx, policy=policy, optimizer=up.optimizer)
    return _optim_state(policy, up.optimizer)


def _teacher(model_dir, ctx, samples):
    """A teacher sharded over ``ctx``'s mesh scores ``samples``: its log-probs and collectives."""
    from actfirst.train.teacher import TeacherScorer

    scorer = TeacherScorer.load(model_dir, student_tokenizer=model_dir, micro_batch_tokens=30, shard=ctx, device="cpu")
    with CollectiveLog() as log:
        scorer.score(samples)
    return [s.teacher_logprobs for s in samples], log.calls


def mesh_rank(model_dir, shards, unscored, out_dir):
    """One of 4 ranks (2 nodes of 2): the same update, teacher scoring and checkpoint on the hybrid mesh and on the
    flat one (the same process group), then each checkpoint loaded on the other mesh."""
    from actfirst.parallel.context import init_parallel
    from actfirst.train.student import BatchTotals

    hybrid, flat = init_parallel(mesh="auto"), init_parallel(mesh="flat")
    samples, total = shards[hybrid.rank], BatchTotals.of([s for shard in shards for s in shard])
    out = {"dims": (hybrid.mesh.mesh_dim_names, flat.mesh.mesh_dim_names)}
    for name, ctx in (("hybrid", hybrid), ("flat", flat)):
        out[name] = _update(model_dir, ctx, samples, total, f"{out_dir}/{name}")
        out[name]["teacher"] = _teacher(model_dir, ctx, [dataclasses.replace(s) for s in unscored[hybrid.rank]])
    out["hybrid_on_flat"] = _load(model_dir, flat, f"{out_dir}/hybrid/{LATEST}")
    out["flat_on_hybrid"] = _load(model_dir, hybrid, f"{out_dir}/flat/{LATEST}")
    return out


def one_rank_load(model_dir, checkpoint):
    """A job of one rank resumes from the 4-rank hybrid checkpoint: the optimizer state, and the saved ranks."""
    from actfirst.parallel.context import init_parallel

    return _load(model_dir, init_parallel(), checkpoint)


def _inside_a_node(ranks: tuple[int, ...]) -> bool:
    return len({_node(r) for r in ranks}) == 1


@pytest.fixture(scope="module")
def runs(loads):
    """The 4 ranks' results."""
    return loads[:-1]


@pytest.fixture(scope="module")
def loads(tiny_model_dir, tmp_path_factory):
    """The 4 ranks' results, then the optimizer state of the hybrid checkpoint loaded by one rank."""
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    gen = torch.Generator().manual_seed(13)
    batch = random_samples(gen, 8, vocab_size, max_context=30, max_response=10)
    unscored = random_samples(gen, 7, vocab_size, max_context=30, max_response=10, scored=False)
    shards = [batch[r::4] for r in range(4)]
    teacher_shards = [unscored[:3], unscored[3:5], unscored[5:6], unscored[6:]]  # unequal: padding micro-batches
    out = tmp_path_factory.mktemp("mesh")
    ranks = spawn_ranks(mesh_rank, NODES * PER_NODE, str(tiny_model_dir), shards, teacher_shards, str(out),
                        ranks_per_node=PER_NODE)
    one, = spawn_ranks(one_rank_load, 1, str(tiny_model_dir), str(out / "hybrid" / LATEST))
    return [*ranks, one]


def test_auto_is_hybrid_across_nodes(runs):
    assert all(r["dims"] == (("replicate", "shard"), ("shard",)) for r in runs)


def test_hybrid_update_equals_flat_update(runs):
    for r in runs:
        hybrid, flat = r["hybrid"], r["flat"]
        for name, g in flat["grads"].items():
            scale = float(g.abs().max())
            torch.testing.assert_close(hybrid["grads"][name], g, rtol=0, atol=GRAD_RTOL * max(scale, 1e-12), msg=name)
        worst = max(float((hybrid["params"][n] - p).abs().max()) for n, p in flat["params"].items())
        assert worst <= PARAM_ATOL, worst
        for key in ("num_tokens", "num_supervised", "clip_frac", "dual_clip_frac", "skipped"):
            assert hybrid["metrics"][key] == flat["metrics"][key], key
        for key in ("loss", "grad_norm", "mismatch_mean", "teacher_minus_old"):
            assert hybrid["metrics"][key] == pytest.approx(flat["metrics"][key], rel=1e-5, abs=1e-7), key
    print(f"hybrid vs flat: largest parameter difference after the update {worst:.2e} (AdamW lr {ADAM_LR})")
    assert all(torch.equal(runs[0]["hybrid"]["params"][n], r["hybrid"]["params"][n])
               for r in runs for n in runs[0]["hybrid"]["params"])


def test_only_gradient_all_reduces_and_metric_sums_cross_nodes(runs):
    """HSDP's traffic: a unit's all-gather and reduce-scatter inside the node; each reduced gradient shard then goes
    across nodes once (an all-reduce with the replica holding the same shard); else only the metric sums."""
    for rank, r in enumerate(runs):
        step = r["hybrid"]["step"]
        replicas = (rank % PER_NODE, rank % PER_NODE + PER_NODE)
        inside = [c for c in step if _inside_a_node(c[1])]
        grads = [c for c in step if c[1] == replicas]
        others = [c for c in step if not _inside_a_node(c[1]) and c[1] != replicas]
        assert {op for op, _, _ in grads} == {"allreduce_"}, grads
        scattered = sorted(n for op, _, n in inside if "reduce_scatter" in op)
        assert scattered and sorted(n for _, _, n in grads) == scattered  # each shard once, nothing more
        assert any("allgather" in op for op, _, _ in inside)
        assert all(op == "allreduce_" and len(ranks) == 4 and n <= METRIC_NUMEL for op, ranks, n in others), others
        # the flat mesh: the all-gathers and reduce-scatters span both nodes (what the hybrid mesh keeps inside)
        flat = r["flat"]["step"]
        assert any("allgather" in op and len(ranks) == 4 for op, ranks, _ in flat)
        across = [sum(n for _, ranks, n in calls if not _inside_a_node(ranks)) for calls in (step, flat)]
    print(f"output elements of the collectives that span nodes in one update, rank 3: hybrid {across[0]}, "
          f"flat {across[1]}")


def test_weight_sync_gather_stays_inside_a_node(runs):
    for rank, r in enumerate(runs):
        node = tuple(range(_node(rank) * PER_NODE, (_node(rank) + 1) * PER_NODE))
        calls = r["hybrid"]["gather"]
        assert len(calls) == len(r["hybrid"]["params"]), calls  # one all-gather per parameter
        assert {(op, ranks) for op, ranks, _ in calls} == {("all_gather_into_tensor", node)}
        assert {ranks for _, ranks, _ in r["flat"]["gather"]} == {(0, 1, 2, 3)}


def test_sharded_teacher_gathers_inside_a_node_and_scores_as_on_flat(runs):
    for _rank, r in enumerate(runs):
        (hybrid, hybrid_calls), (flat, _) = r["hybrid"]["teacher"], r["flat"]["teacher"]
        assert len(hybrid) == len(flat) and hybrid
        for x, y in zip(hybrid, flat, strict=True):
            assert len(x) == len(y) and max(abs(u - v) for u, v in zip(x, y, strict=True)) < 1e-5
        gathers = [c for c in hybrid_calls if "allgather" in c[0]]
        assert gathers and all(_inside_a_node(ranks) for _, ranks, _ in gathers), gathers
        # besides them only the count of micro-batches (pad_across_ranks: every rank runs as many)
        assert all(op == "allreduce_" and n <= METRIC_NUMEL for op, _, n in hybrid_calls if "allgather" not in op)


def test_checkpoints_load_on_the_other_mesh_and_on_one_rank(runs, loads):
    for r in runs:
        for saved, loaded in ((r["hybrid"]["optim"], r["hybrid_on_flat"]), (r["flat"]["optim"], r["flat_on_hybrid"]),
                              (r["hybrid"]["optim"], loads[-1])):
            assert saved.keys() == loaded.keys()
            for name, state in saved.items():
                for key, value in state.items():
                    assert torch.equal(loaded[name][key], value), (name, key)


@pytest.mark.parametrize("mesh,rank,world,local,per_node,shape", [
    ("auto", 3, 4, 1, 2, (2, 2)),
    ("auto", 3, 4, 3, 4, (4,)),       # one node: flat
    ("flat", 3, 4, 1, 2, (4,)),
    ("hybrid", 3, 4, 3, 4, (1, 4)),
    ("hybrid", 0, 1, 0, 1, (1, 1)),
])
def test_mesh_shape(mesh, rank, world, local, per_node, shape):
    assert mesh_shape(mesh, rank=rank, world=world, local=local, per_node=per_node) == shape


@pytest.mark.parametrize("mesh,rank,world,local,per_node,message", [
    ("tree", 0, 4, 0, 2, "parallel.mesh='tree': must be one of ['auto', 'flat', 'hybrid']"),
    ("auto", 5, 6, 1, 4, "parallel.mesh='auto': a hybrid mesh needs the same number of ranks on every node"),
    ("hybrid", 1, 4, 0, 2, "RANK=1 LOCAL_RANK=0 of WORLD_SIZE=4 with LOCAL_WORLD_SIZE=2"),
])
def test_mesh_shape_refuses(mesh, rank, world, local, per_node, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mesh_shape(mesh, rank=rank, world=world, local=local, per_node=per_node)


def test_config_key():
    """``parallel.mesh`` takes exactly the meshes ``init_parallel`` builds (default auto), and names a bad value."""
    assert get_args(get_type_hints(ParallelConfig)["mesh"]) == MESHES and ParallelConfig().mesh == "auto"
    demo = Path(__file__).parents[2] / "configs" / "demo" / "scienceworld_lifespan.yaml"
    with paths_unchecked():
        assert load_config(TrainConfig, demo, ["parallel.mesh=hybrid"]).parallel.mesh == "hybrid"
        with pytest.raises(ConfigError, match=r"parallel.mesh='tree': must be one of \['auto', 'flat', 'hybrid'\]"):
            load_config(TrainConfig, demo, ["parallel.mesh=tree"])
