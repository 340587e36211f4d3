"""The frozen teacher: log pi_teacher of every response token under the sample's own context (Appendix B.4).

"The frozen teacher scores the generated tokens under the same contexts" (B.4): the advantage of Eq. 29 compares
teacher and student on identical token ids, so the teacher must share the student's tokenizer; a different one is
refused when the scorer is built. Scores are at temperature 1 (pi_phi itself), in packed micro-batches, through the
fused ``logprob_gather`` (never [tokens x vocab] logits).

With several ranks the teacher is either replicated (each rank scores its own samples alone) or sharded with FSDP2
over the ranks (``parallel.teacher: shard``; every rank then runs as many scoring forwards, empty ones included).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from actfirst.kernels.dispatch import logprob_gather
from actfirst.parallel.context import ParallelContext
from actfirst.parallel.fsdp import apply_fsdp
from actfirst.train.head import LMHeadModel
from actfirst.train.packing import pack, pad_across_ranks
from actfirst.train.sample import Sample


def _load_tokenizer(tok: str | Path | PreTrainedTokenizerBase) -> tuple[PreTrainedTokenizerBase, str]:
    if isinstance(tok, PreTrainedTokenizerBase):
        return tok, str(tok.name_or_path or "<tokenizer object>")
    return AutoTokenizer.from_pretrained(str(tok)), str(tok)


def _few(items: set) -> str:
    items = sorted(items, key=repr)
    return ", ".join(repr(x) for x in items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


def tokenizer_differences(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> list[str]:
    """What differs between two tokenizers: vocabulary (token -> id), added tokens, chat template."""
    diffs = []
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only_a, only_b = set(va) - set(vb), set(vb) - set(va)
        moved = {t for t in set(va) & set(vb) if va[t] != vb[t]}
        parts = [f"{len(va)} vs {len(vb)} entries"]
        parts += [f"only in the first: {_few(only_a)}"] if only_a else []
        parts += [f"only in the second: {_few(only_b)}"] if only_b else []
        parts += [f"different ids: {_few(moved)}"] if moved else []
        diffs.append("vocab (" + "; ".join(parts) + ")")
    added_a = {(i, t.content, t.special) for i, t in a.added_tokens_decoder.items()}
    added_b = {(i, t.content, t.special) for i, t in b.added_tokens_decoder.items()}
    if added_a != added_b:
        diffs.append(f"added tokens (id, content, special) only in the first: {_few(added_a - added_b) or 'none'}; "
                     f"only in the second: {_few(added_b - added_a) or 'none'}")
    if a.chat_template != b.chat_template:
        diffs.append("chat template")
    return diffs


class TeacherScorer:
    """The frozen teacher (eval, no gradients); :meth:`score` fills ``Sample.teacher_logprobs`` (B.4)."""

    def __init__(self, model: torch.nn.Module, *, micro_batch_tokens: int = 8192,
                 device: str | torch.device | None = None, shard: ParallelContext | None = None,
                 name: str = "teacher") -> None:
        """``model``: a Hugging Face causal LM. ``shard``: FSDP2-shard it over that context's ranks (every rank must
        then score together); None: a whole copy on ``device`` (default: the GPU when there is one). ``name`` is
        what errors call it (its directory)."""
        if micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={micro_batch_tokens!r}: must be >= 1")
        self.model_dir = name
        self.micro_batch_tokens = micro_batch_tokens
        model.eval().requires_grad_(False)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.head = LMHeadModel(model)
        self.sharded = shard is not None
        if shard is not None:
            self.device = shard.device
            apply_fsdp(self.head, self.head.blocks, shard.mesh)
        else:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.head.to(self.device)

    @classmethod
    def load(cls, model_dir: str | Path, *, student_tokenizer: str | Path | PreTrainedTokenizerBase,
             dtype: str = "float32", **kwargs) -> TeacherScorer:
        """The teacher of ``model_dir`` in ``dtype``, after checking that it has the student's tokenizer (a
        mismatch is refused, naming what differs); ``kwargs`` as for the constructor."""
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype={dtype!r}: not a torch dtype (e.g. 'float32', 'bfloat16')")
        student_tok, student_name = _load_tokenizer(student_tokenizer)
        teacher_tok, _ = _load_tokenizer(model_dir)
        diffs = tokenizer_differences(student_tok, teacher_tok)
        if diffs:
            raise ValueError(f"teacher tokenizer ({model_dir}) differs from the student's ({student_name}): "
                             + "; ".join(diffs) + ". The teacher must score the student's exact token ids (B.4).")
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
        return cls(model, name=str(model_dir), **kwargs)

    @torch.no_grad()
    def score(self, samples: list[Sample]) -> None:
        """Set each sample's ``teacher_logprobs``: log pi_teacher(x_{b,j} | c_{b,j}) at temperature 1, every token."""
        for i, s in enumerate(samples):
            bad = [t for t in s.context_ids + s.response_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} of sample {i} (task {s.task!r}, turn {s.turn}) is outside the "
                                 f"teacher's vocabulary [0, {self.vocab_size}) ({self.model_dir})")
        for s in samples:
            s.teacher_logprobs = None  # re-scored as a whole
        micro_batches = pack(samples, self.micro_batch_tokens)
        for mb in pad_across_ranks(micro_batches) if self.sharded else micro_batches:
            mb = mb.to(self.device)
            logp, _ = self.head(mb, lambda hidden, weight, mb=mb: logprob_gather(hidden, weight, mb.targets))
            if not mb.samples:  # padding (a sharded teacher: another rank has more micro-batches)
                continue
            parts = logp.cpu().split([len(samples[i].response_ids) for i in mb.samples])
            for i, part in zip(mb.samples, parts, strict=True):
                samples[i].teacher_logprobs = part.tolist()
