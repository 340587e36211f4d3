"""The rollout-speedup model as a live diagnostic (000 Appendix A.2 and C.5): every rollout batch's measured
completion time next to Eq. 36's idealized estimates and Eq. 25's lower bound, computed from the batch's own
request records.

For episode i of a batch with T_i executed turns, l_full,i and l_fast,i are the medians of its full responses' and
fast actions' in-slot times (admission to completion, summed over a full response's budget stages). The paper
calibrates these from single requests on an idle engine; here they are the run's own, measured under its load, so
they include the slowdown that batching brings. Per batch B:

- Eq. 36: C_Vanilla,B = max_i T_i l_full,i and C_ActFirst,B = max_i [(T_i - 1) l_fast,i + max(l_fast,i, l_full,i)]
  (the paper's fixed T becomes each episode's own T_i);
- Eq. 25: C_ActFirst,B >= max{max_i [(T_i - 1) l_fast,i + l_full,i], (the summed in-slot time of every request) /
  b_max} (Eq. 23's integral, bounded by the measured slot-time itself);
- measured: the batch's wall-clock (environment steps, prompt rendering and queueing included).

Speedups over a set of batches are ratios of sums (Eq. 35): ``eq36`` = sum C_Vanilla / sum C_ActFirst (Eq. 36's
prediction), ``measured`` = sum C_Vanilla (Eq. 36) / sum measured (the run has no Vanilla twin; its full responses
stand in for one), ``eq26`` = sum C_Vanilla (Eq. 36) / sum Eq. 25 (the bound of Eq. 26 on that Vanilla time). An
episode without fast actions (Vanilla OPD, replayed turns) contributes its Vanilla estimate only.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence

FIELDS = ("vanilla_eq36_s", "actfirst_eq36_s", "actfirst_eq25_s", "measured_s")


@dataclasses.dataclass(slots=True)
class EpisodeLatencies:
    """What the model needs of one episode."""

    turns: int
    full_s: Sequence[float]
    """In-slot time of each full response."""
    fast_s: Sequence[float]
    """In-slot time of each fast action (empty: none were generated)."""


def batch_times(episodes: Iterable[EpisodeLatencies], *, wall_s: float, b_max: int) -> dict[str, float]:
    """One rollout batch's Eq. 36 estimates, Eq. 25 bound and measured completion time (seconds; see the module
    docstring). Episodes without a full response are left out of the estimates."""
    vanilla = actfirst = chain = slot = 0.0
    for ep in episodes:
        slot += sum(ep.full_s) + sum(ep.fast_s)
        if not ep.full_s or ep.turns == 0:
            continue
        full = statistics.median(ep.full_s)
        vanilla = max(vanilla, ep.turns * full)
        fast = statistics.median(ep.fast_s) if ep.fast_s else full  # no fast action: every turn waits for a full one
        actfirst = max(actfirst, (ep.turns - 1) * fast + max(fast, full))
        chain = max(chain, (ep.turns - 1) * fast + full)
    return {"vanilla_eq36_s": vanilla, "actfirst_eq36_s": actfirst, "actfirst_eq25_s": max(chain, slot / b_max),
            "measured_s": wall_s}


def speedups(times: dict[str, float]) -> dict[str, float | None]:
    """Eq. 36's predicted speedup, the measured one against Eq. 36's Vanilla time, and Eq. 26's bound, from summed
    :func:`batch_times` (None where a denominator is 0)."""

    def ratio(a: str, b: str) -> float | None:
        return times[a] / times[b] if times[b] > 0 else None

    return {"eq36": ratio("vanilla_eq36_s", "actfirst_eq36_s"), "measured": ratio("vanilla_eq36_s", "measured_s"),
            "eq26": ratio("vanilla_eq36_s", "actfirst_eq25_s")}
