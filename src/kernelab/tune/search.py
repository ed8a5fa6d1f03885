"""Search over configurations: exhaustive for small spaces, successive halving for large ones.

``measure(config, effort)`` returns a time in seconds (lower is better); ``effort`` is a
relative amount of timing work (1 = a brief measurement). Successive halving times every
survivor briefly, keeps the best 1/eta, and times those eta times longer, until one remains —
so most of the budget goes to the configurations that might win.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Trial:
    config: object
    times: dict[int, float] = field(default_factory=dict)  # effort -> seconds
    error: str | None = None

    @property
    def best(self) -> float:
        """The time at the highest effort measured (the most trustworthy)."""
        if not self.times:
            return math.inf
        return self.times[max(self.times)]


def exhaustive(
    configs: Sequence, measure: Callable[[object, int], float], effort: int = 1
) -> list[Trial]:
    trials = [Trial(c) for c in configs]
    for t in trials:
        _measure(t, measure, effort)
    return sorted(trials, key=lambda t: t.best)


def successive_halving(
    configs: Sequence, measure: Callable[[object, int], float], eta: int = 3, min_effort: int = 1
) -> list[Trial]:
    """All trials, ranked; the first has survived every round."""
    if eta < 2:
        raise ValueError(f"eta: expected an integer >= 2, got {eta!r}")
    trials = [Trial(c) for c in configs]
    alive, effort = list(trials), min_effort
    while alive:
        for t in alive:
            _measure(t, measure, effort)
        alive = sorted((t for t in alive if t.error is None), key=lambda t: t.best)
        if len(alive) <= 1:
            break
        alive = alive[: max(1, len(alive) // eta)]
        effort *= eta
    return sorted(trials, key=lambda t: (-max(t.times, default=0), t.best))


def search(
    configs: Sequence,
    measure: Callable[[object, int], float],
    exhaustive_below: int = 16,
    eta: int = 3,
) -> tuple[str, list[Trial]]:
    """Exhaustive when the space is small, successive halving otherwise."""
    if len(configs) <= exhaustive_below:
        return "exhaustive", exhaustive(configs, measure)
    return "successive halving", successive_halving(configs, measure, eta)


def _measure(trial: Trial, measure, effort: int) -> None:
    try:
        trial.times[effort] = float(measure(trial.config, effort))
    except Exception as exc:  # a config that fails to compile or launch is out, not fatal
        trial.error = f"{type(exc).__name__}: {exc}"
