"""SampleBuffer: FIFO order, the one-version staleness rule and no reuse (Appendix B.4)."""

import pytest

from actfirst.rollout.sample import Sample
from actfirst.train.buffer import SampleBuffer


def sample(version: int, tag: int) -> Sample:
    return Sample(context_ids=[1, 2], response_ids=[3], loss_mask=[1], logprobs=[-0.5], weight_version=version,
                  task=f"task{tag}", turn=tag, strategy="actfirst")


def test_fifo_staleness_and_no_reuse():
    buf = SampleBuffer()
    buf.add([sample(0, 0), sample(1, 1), sample(0, 2), sample(2, 3), sample(1, 4), sample(2, 5)])
    assert len(buf) == 6 and buf.num_added == 6
    assert buf.num_eligible(1) == 4 and buf.num_eligible(2) == 4 and buf.num_eligible(3) == 2
    # At version 2, version-0 samples are discarded; the two oldest of versions 1 and 2 come out in FIFO order.
    batch = buf.take(2, current_version=2)
    assert [s.turn for s in batch] == [1, 3]
    assert buf.num_dropped == 2 and buf.num_consumed == 2 and len(buf) == 2
    # Not enough eligible: None, nothing consumed.
    assert buf.take(3, current_version=2) is None
    assert len(buf) == 2 and buf.num_consumed == 2
    # Consumed samples never return; the rest stays for the next update under the same rule.
    batch = buf.take(2, current_version=2)
    assert [s.turn for s in batch] == [4, 5]
    assert len(buf) == 0 and buf.take(1, current_version=2) is None
    assert (buf.num_added, buf.num_consumed, buf.num_dropped) == (6, 4, 2)


def test_stale_samples_drop_when_the_version_moves_on():
    buf = SampleBuffer()
    buf.add([sample(3, 0), sample(4, 1), sample(4, 2)])
    assert [s.turn for s in buf.take(1, current_version=4)] == [0]
    assert buf.take(3, current_version=6) is None  # both version-4 samples are now too old
    assert buf.num_dropped == 2 and len(buf) == 0


def test_newer_than_current_is_an_error():
    buf = SampleBuffer()
    buf.add([sample(5, 0)])
    with pytest.raises(ValueError, match="weight_version=5.*current_version=4"):
        buf.take(1, current_version=4)
    with pytest.raises(ValueError, match="n=0"):
        buf.take(0, current_version=5)


def test_state_dict_roundtrip():
    buf = SampleBuffer()
    buf.add([sample(0, 0), sample(1, 1), sample(1, 2)])
    buf.take(1, current_version=2)
    state = buf.state_dict()
    assert all(isinstance(d, dict) for d in state["samples"])
    other = SampleBuffer()
    other.load_state_dict(state)
    assert (len(other), other.num_added, other.num_consumed, other.num_dropped) == (1, 3, 1, 1)
    assert other.take(1, current_version=2) == [sample(1, 2)]


def spanning(versions: list[int], tag: int) -> Sample:
    """A response whose tokens came from several weight versions (``pipeline: inflight``)."""
    n = len(versions)
    return Sample(context_ids=[1, 2], response_ids=[3] * n, loss_mask=[1] * n, logprobs=[-0.5] * n,
                  weight_version=min(versions), token_versions=versions, task=f"task{tag}", turn=tag,
                  strategy="actfirst")


def test_staleness_reads_the_oldest_token():
    """A sample is as old as its oldest token: [3, 4, 4] is dropped at version 5 though most of it is version 4."""
    buf = SampleBuffer()
    buf.add([spanning([3, 4, 4], 0), spanning([4, 5], 1), spanning([5, 5, 5], 2), spanning([4, 4], 3)])
    assert buf.num_eligible(5) == 3
    assert [s.turn for s in buf.take(2, current_version=5)] == [1, 2]
    assert buf.num_dropped == 1
    assert buf.take(1, current_version=6) is None and buf.num_dropped == 2  # [4, 4] is now too old
    other = SampleBuffer()
    other.add([spanning([6, 7], 4)])
    restored = SampleBuffer()
    restored.load_state_dict(other.state_dict())
    assert restored.take(1, current_version=7)[0].token_versions == [6, 7]


def test_token_versions_must_match_the_sample():
    with pytest.raises(ValueError, match="oldest 4.*weight_version=5"):
        Sample(context_ids=[1], response_ids=[3, 3], loss_mask=[1, 1], logprobs=[-0.5, -0.5], weight_version=5,
               token_versions=[4, 5], task="t", turn=0, strategy="actfirst")
    with pytest.raises(ValueError, match=r"token_versions \(1 entries.*\(2\)"):
        Sample(context_ids=[1], response_ids=[3, 3], loss_mask=[1, 1], logprobs=[-0.5, -0.5], weight_version=5,
               token_versions=[5], task="t", turn=0, strategy="actfirst")
