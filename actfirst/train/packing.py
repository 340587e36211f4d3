"""Padding-free micro-batches: whole samples packed into one row, each attending only to itself.

A sample's tokens are its context c_b followed by every response token x_b (sampled and inserted: inserted tokens
stay in the context, B.4), so the state at row index i scores token i + 1 under c_{b,j} = c_b + x_{b,<j}
(Sec. 3, Eq. 3). Samples are never split: a forward over x_b needs its whole context.

Isolation comes from ``position_ids`` that restart at 0 for every sample, with no attention mask and no KV cache.
Transformers (5.x, ``masking_utils.find_packed_sequence_indices``) turns each restart into a sequence boundary, and
what each attention implementation then gets for a row of several samples differs (``parallel.attention``):

- flash_attention_2 (and 3, 4): no mask at all; flash-attn's varlen kernel over the samples' boundaries, each
  sample attending causally to itself, no wasted FLOPs. The boundaries (``cu_seq_lens``) and the longest sample
  (``max_length``) are computed here, once per row, and passed to the forward (:func:`final_hidden`): left to
  itself, transformers derives them from ``position_ids`` in every layer (``_flash_attention_forward`` in
  ``modeling_flash_attention_utils``: ``_is_packed_sequence``'s Python-side test of a device tensor, then
  ``prepare_fa_kwargs_from_position_ids``' ``nonzero`` and a tensor max that flash-attn turns into an int), three
  host syncs per layer, and again in each checkpointed block's recompute. Given all four of ``cu_seq_lens_q/k`` and
  ``max_length_q/k``, it takes its varlen branch directly, with a Python int for the lengths: no layer syncs.
- flex_attention: a ``BlockMask`` (block-sparse, 128 x 128 blocks): blocks across two samples are skipped, none is
  materialized. On the CPU, torch (2.13) has no FlexAttention backward, and transformers compiles its forward.
- sdpa: a dense [1, 1, T, T] boolean mask; it rules out SDPA's flash kernel, repeats K/V to every query head, and
  becomes a [T x T] bias per layer that autograd saves for the backward. A one-sample row gets no mask (``is_causal``).

RoPE sees each sample's own positions. Other implementations get no mask from transformers, so
:func:`final_hidden` refuses them for rows holding more than one sample.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from actfirst.core.user_input import ConfigError
from actfirst.parallel.context import reduce_max
from actfirst.rollout.sample import Sample

# The attention implementations whose masks honour position_ids restarts (transformers 5.x masking_utils).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
"""The implementations that take a row's sample boundaries as ``cu_seq_lens_q/k`` and ``max_length_q/k``."""
PACKING_ATTENTION = ("sdpa", "eager", "flex_attention", *VARLEN_ATTENTION)


@dataclasses.dataclass(slots=True)
class MicroBatch:
    """One packed row and its supervised positions (one entry per response token of its samples)."""

    input_ids: torch.Tensor
    """[T] int64: each sample's context_ids + response_ids, concatenated."""
    position_ids: torch.Tensor
    """[T] int64, restarting at 0 for every sample."""
    positions: torch.Tensor
    """[N] int64: row index whose final hidden state scores the token at index + 1."""
    targets: torch.Tensor
    """[N] int64: input_ids[positions + 1], the response tokens."""
    mask: torch.Tensor
    """[N] float32: the samples' loss_mask (1 sampled, 0 inserted)."""
    logp_old: torch.Tensor
    """[N] float32: log pi_old (the sampling log-probs)."""
    logp_teacher: torch.Tensor | None
    """[N] float32: log pi_teacher, when the samples were scored."""
    sample_idx: torch.Tensor
    """[N] int64: each token's sample index in the list given to :func:`pack`."""
    sft_weight: torch.Tensor
    """[N] float32: an SFT target's sampled tokens carry its ``sft_weight`` (and ``mask`` 0: no PPO term); 0
    elsewhere (the loss's aggregation normalizes it: ``actfirst.train.student``)."""
    samples: list[int]
    """Indices (in the list given to :func:`pack`) of the samples in this row, in row order."""
    cu_seq_lens: torch.Tensor
    """[len(samples) + 1] int32: where each sample starts in the row, then the row's length (flash-attn's
    ``cu_seqlens``)."""
    max_length: int
    """The row's longest sample, in tokens (flash-attn's ``max_seqlen``)."""

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    def to(self, device: torch.device | str) -> MicroBatch:
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device)
                                            for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})


def _bins(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per row, each row at most ``max_tokens`` (a longer sample rides alone)."""
    loads: list[int] = []
    bins: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                loads[b] += lengths[i]
                bins[b].append(i)
                break
        else:
            loads.append(lengths[i])
            bins.append([i])
    return [sorted(b) for b in bins]


def pack(samples: list[Sample], max_tokens: int) -> list[MicroBatch]:
    """Pack whole samples into rows of at most ``max_tokens`` tokens (first-fit decreasing, no padding).

    A sample longer than ``max_tokens`` gets a row of its own. Every response token is a supervised position
    (masked ones carry mask 0). ``logp_teacher`` is filled when every sample has ``teacher_logprobs``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r}: must be >= 1")
    scored = [s.teacher_logprobs is not None for s in samples]
    if any(scored) and not all(scored):
        raise ValueError(f"teacher_logprobs=None for sample {scored.index(False)} while sample {scored.index(True)} "
                         "is scored: a batch is scored as a whole")
    for i, s in enumerate(samples):
        if s.teacher_logprobs is not None and len(s.teacher_logprobs) != len(s.response_ids):
            raise ValueError(f"teacher_logprobs of sample {i} (task {s.task!r}, turn {s.turn}) has "
                             f"{len(s.teacher_logprobs)} entries for {len(s.response_ids)} response tokens")
    out = []
    for row in _bins([s.num_tokens for s in samples], max_tokens):
        ids: list[int] = []
        pos_ids: list[int] = []
        positions: list[int] = []
        sample_idx: list[int] = []
        starts = [0]
        for i in row:
            s = samples[i]
            starts.append(starts[-1] + s.num_tokens)
            start = len(ids) + len(s.context_ids)
            ids += s.context_ids + s.response_ids
            pos_ids += range(s.num_tokens)
            positions += range(start - 1, start - 1 + len(s.response_ids))
            sample_idx += [i] * len(s.response_ids)
        input_ids = torch.tensor(ids, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        targets = input_ids[pos + 1]
        expected = torch.tensor([t for i in row for t in samples[i].response_ids], dtype=torch.long)
        if not torch.equal(targets, expected):  # the logit at position i scores token i + 1
            raise RuntimeError("packing misaligned: input_ids[positions + 1] != the samples' response tokens")
        teacher = (torch.tensor([x for i in row for x in samples[i].teacher_logprobs], dtype=torch.float32)
                   if all(scored) else None)
        sft = [samples[i].sft_weight > 0 for i in row]
        out.append(MicroBatch(
            input_ids=input_ids, position_ids=torch.tensor(pos_ids, dtype=torch.long), positions=pos, targets=targets,
            mask=torch.tensor([0 if is_sft else m
                               for i, is_sft in zip(row, sft, strict=True) for m in samples[i].loss_mask],
                              dtype=torch.float32),
            sft_weight=torch.tensor([m * samples[i].sft_weight if is_sft else 0.0
                                     for i, is_sft in zip(row, sft, strict=True) for m in samples[i].loss_mask],
                                    dtype=torch.float32),
            logp_old=torch.tensor([x for i in row for x in samples[i].logprobs], dtype=torch.float32),
            logp_teacher=teacher, sample_idx=torch.tensor(sample_idx, dtype=torch.long), samples=row,
            cu_seq_lens=torch.tensor(starts, dtype=torch.int32), max_length=max(samples[i].num_tokens for i in row)))
    return out


def empty_micro_batch() -> MicroBatch:
    """A two-token row whose one scored position has mask 0: it adds nothing to a loss or a gradient. A rank runs
    these when it has fewer micro-batches than another (see :func:`pad_across_ranks`)."""
    zero = torch.zeros(1, dtype=torch.float32)
    return MicroBatch(input_ids=torch.zeros(2, dtype=torch.long), position_ids=torch.arange(2), positions=
                      torch.zeros(1, dtype=torch.long), targets=torch.zeros(1, dtype=torch.long), mask=zero,
                      logp_old=zero, logp_teacher=zero, sample_idx=torch.zeros(1, dtype=torch.long), sft_weight=zero,
                      samples=[], cu_seq_lens=torch.tensor([0, 2], dtype=torch.int32), max_length=2)


def pad_across_ranks(micro_batches: list[MicroBatch]) -> list[MicroBatch]:
    """``micro_batches`` followed by empty ones up to the most any rank has: under FSDP2 every forward and backward
    is a collective, so every rank must run as many (a collective itself; every rank calls it)."""
    most = int(reduce_max([len(micro_batches)])[0])
    return micro_batches + [empty_micro_batch() for _ in range(most - len(micro_batches))]


def final_hidden(model: torch.nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
    """Final normalized hidden states [len(positions), H] of a packed forward in which no sample sees another.

    ``model`` is a Hugging Face causal LM (``model.model`` its decoder). No attention mask and ``use_cache=False``:
    transformers only detects packing from position_ids when both are absent. The flash-attn implementations get the
    row's boundaries as computed by :func:`pack` (see the module docstring).
    """
    impl = model.config._attn_implementation
    if len(micro_batch.samples) > 1 and impl not in PACKING_ATTENTION:
        raise ValueError(f"attn_implementation={impl!r}: packed rows need one of {PACKING_ATTENTION} "
                         "(others ignore position_ids restarts and would let samples attend to each other)")
    varlen = {}
    if impl in VARLEN_ATTENTION:  # self-attention: the queries' boundaries are the keys'
        cu, longest = micro_batch.cu_seq_lens, micro_batch.max_length
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
    out = model.model(input_ids=micro_batch.input_ids[None], position_ids=micro_batch.position_ids[None],
                      use_cache=False, **varlen)
    return out.last_hidden_state[0, micro_batch.positions]


def attention_implementation(requested: str, device: torch.device | str, dtype: torch.dtype, *,
                             backward: bool) -> str:
    """The attention implementation that ``parallel.attention`` = ``requested`` means on ``device`` for a model
    computing in ``dtype`` that runs a backward (the student) or not (the teacher). auto: flash_attention_2 when
    ``flash_attn`` imports on a GPU and ``dtype`` is 16-bit (flash-attn has no float32 kernel), else flex_attention
    on a GPU, sdpa on the CPU. Raises :class:`ConfigError` (one line) for one that cannot run here."""
    device = torch.device(device)
    flash_runs = device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
    has_flash = importlib.util.find_spec("flash_attn") is not None
    if requested == "auto":
        if device.type != "cuda":
            return "sdpa"
        return "flash_attention_2" if has_flash and flash_runs else "flex_attention"
    if requested == "flash_attention_2" and not (has_flash and flash_runs):
        why = ("the flash_attn package is not installed (the gpu extra)" if not has_flash else
               f"it runs on CUDA in bfloat16 or float16, and this model computes in {dtype} on {device.type}")
        raise ConfigError(f"parallel.attention={requested!r}: {why} (auto picks what runs here)")
    if requested == "flex_attention" and backward and device.type == "cpu":
        raise ConfigError(f"parallel.attention={requested!r}: torch {torch.__version__} has no FlexAttention "
                          "backward on the CPU (auto picks sdpa there)")
    return requested
