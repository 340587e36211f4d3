"""Activation checkpointing per decoder block (``parallel.activation_checkpointing``): the student's loss and
gradients are those without it, it keeps fewer activations for the backward, and under FSDP2 (applied after it, on
real gloo ranks) the parameters keep their Hugging Face names (weight sync, checkpoints and export use them)."""

import pytest
import torch
from train_helpers import random_samples, spawn_ranks
from transformers import Qwen3ForCausalLM

from actfirst.core.config import LossConfig, OptimConfig
from actfirst.parallel.checkpointing import apply_activation_checkpointing
from actfirst.train.head import LMHeadModel
from actfirst.train.student import StudentUpdater


def saved_bytes(run) -> int:
    """Bytes of the tensors autograd saves for the backward while ``run()`` runs, outside checkpointed blocks (a
    checkpointed block saves its own tensors through hooks of its own, and keeps only its inputs)."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return total


def gradients(policy, samples, **updater_kw):
    """The student's loss (Eq. 32) over ``samples`` and its gradient, name by name, with the bytes saved for it."""
    up = StudentUpdater(policy, optim=OptimConfig(lr=1e-3), loss=LossConfig(), temperature=0.9, num_updates=10,
                        **updater_kw)
    stats = []
    saved = saved_bytes(lambda: stats.append(up.accumulate_gradients(samples, current_version=0)))
    return stats[0].loss, {n: p.grad.clone() for n, p in policy.model.named_parameters()}, saved


def test_same_loss_and_gradients_with_and_without_checkpointing(tiny_model_dir, gen):
    plain = LMHeadModel(Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).train())
    checkpointed = LMHeadModel(Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).train())
    names = [n for n, _ in checkpointed.named_parameters()]
    blocks = checkpointed.blocks
    assert apply_activation_checkpointing(checkpointed, checkpointed.blocks) is checkpointed
    assert [n for n, _ in checkpointed.named_parameters()] == names  # the same modules, the same names
    assert checkpointed.blocks == blocks
    samples = random_samples(gen, 6, plain.model.config.vocab_size, max_context=30, max_response=12)
    loss, grads, saved = gradients(plain, samples, micro_batch_tokens=60)
    loss_ac, grads_ac, saved_ac = gradients(checkpointed, samples, micro_batch_tokens=60)
    assert loss_ac == pytest.approx(loss, rel=1e-12, abs=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, rtol=1e-12, atol=1e-14, msg=name)
    assert saved_ac < saved / 2  # the blocks' activations are not kept


def test_refuses_a_block_outside_the_model(tiny_model_dir):
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    other = Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="block 0 .* is not a module of the model given"):
        apply_activation_checkpointing(model, list(other.model.layers))


def fsdp_rank(model_dir, shards):
    """One rank: the student under FSDP2 with and without checkpointing (applied first, as the trainer does); the
    loss and full gradients of its share, the names weight sync gathers, and a refusal to checkpoint afterwards."""
    from transformers import AutoModelForCausalLM

    from actfirst.parallel.context import init_parallel
    from actfirst.parallel.fsdp import apply_fsdp, full_tensor
    from actfirst.parallel.weight_sync import gathered_parameters

    ctx = init_parallel()
    out = {}
    for ac in (False, True):
        policy = LMHeadModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train())
        if ac:
            apply_activation_checkpointing(policy, policy.blocks)
        apply_fsdp(policy, policy.blocks, ctx.mesh)
        loss, grads, saved = gradients(policy, shards[ctx.rank], micro_batch_tokens=50)
        out[ac] = {"loss": loss, "saved": saved, "grads": {n: full_tensor(g) for n, g in grads.items()},
                   "gathered": [n for n, _ in gathered_parameters(policy.model, dtype=torch.float32,
                                                                  bucket_bytes=1 << 30)]}
    try:
        apply_activation_checkpointing(policy, policy.blocks)
    except ValueError as e:
        out["refusal"] = str(e)
    return out


def test_under_fsdp2_on_two_ranks_same_gradients_and_names(tiny_model_dir, gen):
    hf_names = list(Qwen3ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict())
    samples = random_samples(gen, 8, 200, max_context=30, max_response=12)
    ranks = spawn_ranks(fsdp_rank, 2, str(tiny_model_dir), [samples[:4], samples[4:]])
    for out in ranks:
        assert out[True]["gathered"] == out[False]["gathered"]
        assert set(out[True]["gathered"]) <= set(hf_names)  # tied weights are gathered once
        assert out[True]["loss"] == pytest.approx(out[False]["loss"], rel=1e-6)
        for name, grad in out[False]["grads"].items():
            torch.testing.assert_close(out[True]["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
        assert out[True]["saved"] < out[False]["saved"] / 2
        assert "already sharded: apply activation checkpointing before fully_shard" in out["refusal"]
