"""The frozen teacher: log pi_teacher of every response token under the sample's own context (Appendix B.4).

"The frozen teacher scores the generated tokens under the same contexts" (B.4): the advantage of Eq. 29 compares
teacher and student on identical token ids, so the teacher must share the student's tokenizer; a different one is
refused when the scorer is built. Scores are at temperature 1 (pi_phi itself), in packed micro-batches, through the
fused ``logprob_gather`` (never [tokens x vocab] logits).

With several ranks the teacher is either replicated (each rank scores its own samples alone) or sharded with FSDP2
over the ranks (``parallel.teacher: shard``; every rank then runs as many scoring forwards, empty ones included).

The teacher runs one forward at a time, whoever calls: the update's scoring and UOPD's proposal scores during the
rollout (``actfirst.rollout.intervention``) both call :meth:`TeacherScorer.score`, from their own threads, and take
its lock; two forwards at once would hold twice the activations ``micro_batch_tokens`` was sized for.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from actfirst.core.user_input import check_model_dir
from actfirst.kernels.dispatch import logprob_gather
from actfirst.models.loading import empty_model, load_weights
from actfirst.models.tokenizers import check_same_tokenizer
from actfirst.parallel.context import ParallelContext
from actfirst.parallel.fsdp import apply_fsdp
from actfirst.rollout.sample import Sample
from actfirst.train.head import LMHeadModel
from actfirst.train.packing import attention_implementation, pack, pad_across_ranks


def _load_tokenizer(tok: str | Path | PreTrainedTokenizerBase) -> tuple[PreTrainedTokenizerBase, str]:
    if isinstance(tok, PreTrainedTokenizerBase):
        return tok, str(tok.name_or_path or "<tokenizer object>")
    return AutoTokenizer.from_pretrained(str(tok)), str(tok)


class TeacherScorer:
    """The frozen teacher (eval, no gradients); :meth:`score` fills ``Sample.teacher_logprobs`` (B.4)."""

    def __init__(self, model: torch.nn.Module, *, micro_batch_tokens: int = 8192,
                 device: str | torch.device | None = None, shard: ParallelContext | None = None,
                 name: str = "teacher", attention: str = "auto") -> None:
        """``model``: a Hugging Face causal LM (or one on the meta device, which :meth:`load` fills). ``shard``:
        FSDP2-shard it over that context's ranks (every rank must then score together); None: a whole copy on
        ``device`` (default: the GPU when there is one). ``name`` is what errors call it (its directory);
        ``attention`` is ``parallel.attention`` (packed rows' attention)."""
        if micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={micro_batch_tokens!r}: must be >= 1")
        self.model_dir = name
        self.micro_batch_tokens = micro_batch_tokens
        self.sharded = shard is not None
        self.device = shard.device if shard is not None else torch.device(
            device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = next(model.parameters()).dtype
        model.set_attn_implementation(attention_implementation(attention, self.device, dtype, backward=False))
        model.eval().requires_grad_(False)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.head = LMHeadModel(model)
        self._forward = threading.Lock()
        """Held by :meth:`score` around its forwards: one at a time, whichever thread calls."""
        if shard is not None:
            apply_fsdp(self.head, self.head.blocks, shard.mesh)
        elif self.head.model.device.type != "meta":  # (one on the meta device: ``load`` fills it there)
            self.head.to(self.device)

    @classmethod
    def load(cls, model_dir: str | Path, *, student_tokenizer: str | Path | PreTrainedTokenizerBase,
             dtype: str = "float32", **kwargs) -> TeacherScorer:
        """The teacher of ``model_dir`` in ``dtype``, after checking that it has the student's tokenizer (a
        mismatch is refused, naming what differs); ``kwargs`` as for the constructor."""
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype={dtype!r}: not a torch dtype (e.g. 'float32', 'bfloat16')")
        check_model_dir(model_dir, "teacher")
        student_tok, student_name = _load_tokenizer(student_tokenizer)
        teacher_tok, _ = _load_tokenizer(model_dir)
        check_same_tokenizer(student_tok, teacher_tok, student_name=student_name, teacher_name=str(model_dir))
        scorer = cls(empty_model(model_dir, getattr(torch, dtype)), name=str(model_dir), **kwargs)
        load_weights(scorer.head.model, model_dir, scorer.device)  # sharded: this rank's shard only
        return scorer

    @torch.no_grad()
    def score(self, samples: list[Sample]) -> None:
        """Set each sample's ``teacher_logprobs``: log pi_teacher(x_{b,j} | c_{b,j}) at temperature 1, every token.
        A sample that has them already (UOPD scored its proposal during the rollout) keeps them: the teacher is
        frozen, so they would come out the same. Safe from several threads at once: their forwards take turns."""
        for i, s in enumerate(samples):
            bad = [t for t in s.context_ids + s.response_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} of sample {i} (task {s.task!r}, turn {s.turn}) is outside the "
                                 f"teacher's vocabulary [0, {self.vocab_size}) ({self.model_dir})")
        samples = [s for s in samples if s.teacher_logprobs is None]  # frozen: a score given once stands
        micro_batches = pack(samples, self.micro_batch_tokens)
        with self._forward:
            for mb in pad_across_ranks(micro_batches) if self.sharded else micro_batches:
                mb = mb.to(self.device)
                logp, _ = self.head(mb, lambda hidden, weight, mb=mb: logprob_gather(hidden, weight, mb.targets))
                if not mb.samples:  # padding (a sharded teacher: another rank has more micro-batches)
                    continue
                parts = logp.cpu().split([len(samples[i].response_ids) for i in mb.samples])
                for i, part in zip(mb.samples, parts, strict=True):
                    samples[i].teacher_logprobs = part.tolist()
