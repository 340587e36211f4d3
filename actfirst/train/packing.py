"""Padding-free and padded micro-batches of whole samples, each sample attending only to itself.

A sample's tokens are its context c_b followed by every response token x_b (sampled and inserted: inserted tokens
stay in the context, B.4), so the state at index i of its tokens scores token i + 1 under c_{b,j} = c_b + x_{b,<j}
(Sec. 3, Eq. 3). Samples are never split: a forward over x_b needs its whole context. No attention mask and no KV
cache are passed. How samples share a micro-batch is its :data:`Layout`, which :func:`layout_for` derives from the
attention implementation that runs it (the one place this is decided):

- ``packed`` (flash-attn, FlexAttention): one row holding several samples back to back, whose ``position_ids``
  restart at 0 for every sample. Transformers (5.x, ``masking_utils.find_packed_sequence_indices``) turns each
  restart into a sequence boundary:

  - flash_attention_2 (and 3, 4): no mask at all; flash-attn's varlen kernel over the samples' boundaries, each
    sample attending causally to itself, no wasted FLOPs. The boundaries (``cu_seq_lens``) and the longest sample
    (``max_length``) are computed here, once per row, and passed to the forward (:func:`final_hidden`): left to
    itself, transformers derives them from ``position_ids`` in every layer (``_flash_attention_forward`` in
    ``modeling_flash_attention_utils``: ``_is_packed_sequence``'s Python-side test of a device tensor, then
    ``prepare_fa_kwargs_from_position_ids``' ``nonzero`` and a tensor max that flash-attn turns into an int), three
    host syncs per layer, and again in each checkpointed block's recompute. Given all four of ``cu_seq_lens_q/k``
    and ``max_length_q/k``, it takes its varlen branch directly, with a Python int for the lengths: no layer syncs.
  - flex_attention: a ``BlockMask`` (block-sparse, 128 x 128 blocks): blocks across two samples are skipped, none is
    materialized. On the CPU, torch (2.13) has no FlexAttention backward, and transformers compiles its forward.
  - sdpa (when asked for): a dense [1, 1, T, T] boolean mask; it rules out SDPA's flash kernel, repeats K/V to every
    query head, and becomes a [T x T] bias per layer that autograd saves for the backward: attention costs T^2 per
    row, not the sum of each sample's own. Eager attention gets the same dense mask.

- ``padded`` (SDPA, eager and any other implementation; the CPU): one row per sample, the rows right-padded to the
  longest and stacked [B, T], ``position_ids`` 0..T-1 in every row. Each row is a plain causal sequence: SDPA gets
  ``is_causal`` and no mask (its flash kernel, K/V heads not repeated), attention costs each sample's own length
  squared (plus the padding's), and the padding comes after every real token of its row, so no real token attends
  to it and no scored state reads it. Samples are grouped by length (longest first), so that a row's padding is the
  difference to a neighbour in length.

RoPE sees each sample's own positions in both layouts. Implementations outside :data:`PACKING_ATTENTION` get no
mask from transformers, so :func:`final_hidden` refuses them for packed rows holding more than one sample.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
from typing import Literal, get_args

import torch

from actfirst.core.user_input import ConfigError
from actfirst.parallel.context import reduce_max
from actfirst.rollout.sample import Sample

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
"""The implementations that take a row's sample boundaries as ``cu_seq_lens_q/k`` and ``max_length_q/k``."""
PACKED_ATTENTION = ("flex_attention", *VARLEN_ATTENTION)
"""The implementations that skip the work across a packed row's samples: they get the ``packed`` layout."""
PACKING_ATTENTION = ("sdpa", "eager", *PACKED_ATTENTION)
"""The implementations whose masks honour position_ids restarts (transformers 5.x masking_utils)."""

Layout = Literal["packed", "padded"]
"""How :func:`pack` lays out the samples of a micro-batch (see the module docstring)."""


def layout_for(attn_implementation: str) -> Layout:
    """The layout for a model whose attention is ``attn_implementation`` (``config._attn_implementation``):
    ``packed`` where attention skips the work across samples (flash-attn's varlen kernel, FlexAttention's block
    mask), ``padded`` everywhere else (SDPA, whose mask for a packed row is dense, eager, and the rest)."""
    return "packed" if attn_implementation in PACKED_ATTENTION else "padded"


@dataclasses.dataclass(slots=True)
class MicroBatch:
    """One forward's samples and its supervised positions (one entry per response token of its samples)."""

    layout: Layout
    """How the samples share it (:func:`layout_for`)."""
    input_ids: torch.Tensor
    """[R, T] int64: each sample's context_ids + response_ids; packed: R = 1, the samples concatenated; padded: one
    row per sample, right-padded to the longest with token 0."""
    position_ids: torch.Tensor
    """[R, T] int64: packed, restarting at 0 for every sample; padded, 0..T-1 in every row."""
    positions: torch.Tensor
    """[N] int64: index into the flattened [R * T] rows whose final hidden state scores the token at index + 1."""
    targets: torch.Tensor
    """[N] int64: input_ids.flatten()[positions + 1], the response tokens."""
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
    """Indices (in the list given to :func:`pack`) of the samples in this micro-batch, in row order."""
    num_tokens: int
    """The samples' tokens (padding excluded)."""
    max_length: int
    """The longest sample, in tokens (flash-attn's ``max_seqlen``; padded: the rows' length)."""
    cu_seq_lens: torch.Tensor | None
    """Packed: [len(samples) + 1] int32, where each sample starts in the row, then the row's length (flash-attn's
    ``cu_seqlens``); padded: None."""

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


def _padded_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Sample indices per micro-batch, by decreasing length: each takes the next ones while (its samples) x (its
    longest) stays within ``max_tokens`` (a longer sample rides alone)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in groups]


def pack(samples: list[Sample], max_tokens: int, layout: Layout) -> list[MicroBatch]:
    """Lay whole samples out in micro-batches of at most ``max_tokens`` tokens, padding included (``packed``: first-fit
    decreasing, no padding; ``padded``: by decreasing length); see the module docstring for the layouts.

    A sample longer than ``max_tokens`` gets a micro-batch of its own. Every response token is a supervised position
    (masked ones carry mask 0). ``logp_teacher`` is filled when every sample has ``teacher_logprobs``.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r}: must be >= 1")
    if layout not in get_args(Layout):
        raise ValueError(f"layout={layout!r}: must be one of {list(get_args(Layout))}")
    scored = [s.teacher_logprobs is not None for s in samples]
    if any(scored) and not all(scored):
        raise ValueError(f"teacher_logprobs=None for sample {scored.index(False)} while sample {scored.index(True)} "
                         "is scored: a batch is scored as a whole")
    for i, s in enumerate(samples):
        if s.teacher_logprobs is not None and len(s.teacher_logprobs) != len(s.response_ids):
            raise ValueError(f"teacher_logprobs of sample {i} (task {s.task!r}, turn {s.turn}) has "
                             f"{len(s.teacher_logprobs)} entries for {len(s.response_ids)} response tokens")
    group = _bins if layout == "packed" else _padded_groups
    return [_micro_batch(samples, row, layout, all(scored))
            for row in group([s.num_tokens for s in samples], max_tokens)]


def _micro_batch(samples: list[Sample], row: list[int], layout: Layout, scored: bool) -> MicroBatch:
    """The micro-batch of ``samples[i]`` for ``i`` in ``row``, laid out as ``layout``."""
    lengths = [samples[i].num_tokens for i in row]
    if layout == "packed":
        width, starts = sum(lengths), list(itertools.accumulate(lengths, initial=0))[:-1]
        position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    else:
        width = max(lengths)
        starts = [k * width for k in range(len(row))]
        position_ids = torch.arange(width).expand(len(row), width).contiguous()
    ids = [0] * (len(position_ids) * width)
    positions: list[int] = []
    for start, i in zip(starts, row, strict=True):
        s = samples[i]
        ids[start:start + s.num_tokens] = s.context_ids + s.response_ids
        first = start + len(s.context_ids) - 1  # the state at index p scores token p + 1
        positions += range(first, first + len(s.response_ids))
    input_ids = torch.tensor(ids, dtype=torch.long).view(-1, width)
    pos = torch.tensor(positions, dtype=torch.long)
    targets = input_ids.flatten()[pos + 1]
    expected = torch.tensor([t for i in row for t in samples[i].response_ids], dtype=torch.long)
    if not torch.equal(targets, expected):
        raise RuntimeError("packing misaligned: input_ids[positions + 1] != the samples' response tokens")
    sft = [samples[i].sft_weight > 0 for i in row]

    def per_token(values) -> torch.Tensor:
        return torch.tensor([x for i, is_sft in zip(row, sft, strict=True) for x in values(samples[i], is_sft)],
                            dtype=torch.float32)

    return MicroBatch(
        layout=layout, input_ids=input_ids, position_ids=position_ids, positions=pos, targets=targets,
        mask=per_token(lambda s, is_sft: [0] * len(s.loss_mask) if is_sft else s.loss_mask),
        sft_weight=per_token(lambda s, is_sft: [m * s.sft_weight if is_sft else 0.0 for m in s.loss_mask]),
        logp_old=per_token(lambda s, _: s.logprobs),
        logp_teacher=per_token(lambda s, _: s.teacher_logprobs) if scored else None,
        sample_idx=torch.tensor([i for i in row for _ in samples[i].response_ids], dtype=torch.long), samples=row,
        num_tokens=sum(lengths), max_length=max(lengths),
        cu_seq_lens=torch.tensor([*starts, width], dtype=torch.int32) if layout == "packed" else None)


def empty_micro_batch() -> MicroBatch:
    """A two-token row whose one scored position has mask 0: it adds nothing to a loss or a gradient. A rank runs
    these when it has fewer micro-batches than another (see :func:`pad_across_ranks`)."""
    zero = torch.zeros(1, dtype=torch.float32)
    return MicroBatch(layout="packed", input_ids=torch.zeros(1, 2, dtype=torch.long),
                      position_ids=torch.arange(2)[None], positions=torch.zeros(1, dtype=torch.long),
                      targets=torch.zeros(1, dtype=torch.long), mask=zero, logp_old=zero, logp_teacher=zero,
                      sample_idx=torch.zeros(1, dtype=torch.long), sft_weight=zero, samples=[], num_tokens=0,
                      max_length=2, cu_seq_lens=torch.tensor([0, 2], dtype=torch.int32))


def pad_across_ranks(micro_batches: list[MicroBatch]) -> list[MicroBatch]:
    """``micro_batches`` followed by empty ones up to the most any rank has: under FSDP2 every forward and backward
    is a collective, so every rank must run as many (a collective itself; every rank calls it)."""
    most = int(reduce_max([len(micro_batches)])[0])
    return micro_batches + [empty_micro_batch() for _ in range(most - len(micro_batches))]


def final_hidden(model: torch.nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
    """Final normalized hidden states [len(positions), H] of a forward over ``micro_batch`` in which no sample sees
    another.

    ``model`` is a Hugging Face causal LM (``model.model`` its decoder). No attention mask and ``use_cache=False``:
    transformers only detects packing from position_ids when both are absent. The flash-attn implementations get a
    packed row's boundaries as computed by :func:`pack` (see the module docstring).
    """
    impl = model.config._attn_implementation
    packed = micro_batch.layout == "packed"
    if packed and len(micro_batch.samples) > 1 and impl not in PACKING_ATTENTION:
        raise ValueError(f"attn_implementation={impl!r}: packed rows need one of {PACKING_ATTENTION} "
                         "(others ignore position_ids restarts and would let samples attend to each other)")
    varlen = {}
    if packed and impl in VARLEN_ATTENTION:  # self-attention: the queries' boundaries are the keys'
        cu, longest = micro_batch.cu_seq_lens, micro_batch.max_length
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
    out = model.model(input_ids=micro_batch.input_ids, position_ids=micro_batch.position_ids, use_cache=False,
                      **varlen)
    return out.last_hidden_state.flatten(0, 1)[micro_batch.positions]


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
