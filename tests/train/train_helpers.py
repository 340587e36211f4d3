"""Shared builders for the train tests."""

import torch

from actfirst.train.sample import Sample


def random_samples(gen: torch.Generator, num: int, vocab: int, *, max_context: int = 24, max_response: int = 12,
                   version: int = 0, scored: bool = True) -> list[Sample]:
    """Samples of random lengths and ids, some inserted (masked) tokens, log-probs in a plausible range."""
    out = []
    for i in range(num):
        c = int(torch.randint(1, max_context + 1, (), generator=gen))
        r = int(torch.randint(1, max_response + 1, (), generator=gen))
        mask = (torch.rand(r, generator=gen) > 0.2).long()
        old = (-torch.rand(r, generator=gen) * 6) * mask
        teacher = old + torch.randn(r, generator=gen) * 0.5
        out.append(Sample(context_ids=torch.randint(0, vocab, (c,), generator=gen).tolist(),
                          response_ids=torch.randint(0, vocab, (r,), generator=gen).tolist(),
                          loss_mask=mask.tolist(), logprobs=old.tolist(), weight_version=version, task=f"t{i}",
                          turn=i, strategy="actfirst", teacher_logprobs=teacher.tolist() if scored else None))
    return out
