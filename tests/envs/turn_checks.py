"""One turn's transition check (``Benchmark.check``) from the fields it compares, for the check tests."""

from actfirst.envs.base import Reference


def turn_check(benchmark, *, action, admissible, done, ref_done, **next_fields):
    """``benchmark``'s check of one turn: ``action`` from a state with the ``admissible`` list, the student reaching a
    next transition with ``done`` and the ``next_<field>`` values (``next_observation``, ``next_admissible``,
    ``next_templates``...), the reference one with ``ref_done`` and the ``ref_next_<field>`` values."""
    cls = benchmark.transition_class

    def transition(prefix, is_done):
        fields = {k.removeprefix(prefix): tuple(v) if isinstance(v, list) else v for k, v in next_fields.items()
                  if k.startswith(prefix)}
        return cls(**{"admissible": (), **fields}, score=0.0, done=is_done, won=False)

    current = cls(observation="", admissible=tuple(admissible), score=0.0, done=False, won=False)
    reference = Reference("task", [action], [current, transition("ref_next_", ref_done)], "test")
    return benchmark.check(reference, 0, action=action, current=current, next=transition("next_", done))
