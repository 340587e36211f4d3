"""The rollout-speedup model as a live diagnostic (``actfirst.train.speedup``): Eq. 36 and Eq. 25 by hand on small
batches, the ratios of sums, and the cases without fast actions or full responses. (The loop tests check that every
metrics line carries the figures.)"""

import pytest

from actfirst.train.speedup import EpisodeLatencies, batch_times, speedups


def test_eq36_and_eq25_by_hand():
    """Two episodes: 3 turns with full responses of 1.0, 2.0, 3.0 s (median 2) and fast actions of 0.1 s; 2 turns
    with full responses of 4 s and fast actions of 0.2 and 0.4 s (median 0.3); b_max 2."""
    episodes = [EpisodeLatencies(3, [1.0, 2.0, 3.0], [0.1, 0.1, 0.1]), EpisodeLatencies(2, [4.0, 4.0], [0.2, 0.4])]
    times = batch_times(episodes, wall_s=5.0, b_max=2)
    assert times["vanilla_eq36_s"] == pytest.approx(max(3 * 2.0, 2 * 4.0))
    assert times["actfirst_eq36_s"] == pytest.approx(max(2 * 0.1 + 2.0, 1 * 0.3 + 4.0))
    slot = (6.0 + 0.3 + 8.0 + 0.6) / 2  # Eq. 23: every request's in-slot time over b_max
    assert times["actfirst_eq25_s"] == pytest.approx(max(2 * 0.1 + 2.0, 0.3 + 4.0, slot))
    assert times["measured_s"] == 5.0
    s = speedups(times)
    assert s["eq36"] == pytest.approx(8.0 / 4.3) and s["measured"] == pytest.approx(8.0 / 5.0)
    assert s["eq26"] == pytest.approx(8.0 / slot)


def test_sums_over_batches_and_degenerate_episodes():
    """Speedups over several batches are ratios of sums (Eq. 35); an episode without fast actions (Vanilla OPD)
    waits for a full response every turn; one without full responses or turns adds only its slot time."""
    vanilla = batch_times([EpisodeLatencies(4, [1.0] * 4, [])], wall_s=4.5, b_max=8)
    assert vanilla["vanilla_eq36_s"] == vanilla["actfirst_eq36_s"] == 4.0 and speedups(vanilla)["eq36"] == 1.0
    empty = batch_times([EpisodeLatencies(0, [], [0.5])], wall_s=1.0, b_max=1)
    assert empty["vanilla_eq36_s"] == 0.0 and empty["actfirst_eq25_s"] == 0.5
    total = {k: vanilla[k] + empty[k] for k in vanilla}
    assert speedups(total)["measured"] == pytest.approx(4.0 / 5.5)
    assert speedups(dict.fromkeys(total, 0.0)) == {"eq36": None, "measured": None, "eq26": None}
