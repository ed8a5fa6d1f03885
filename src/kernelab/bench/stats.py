"""Statistics of timing samples and the stopping rule (METHOD.md, "Time properly").

A measurement stops on statistics, not a fixed count: when the confidence interval of the
median is narrow enough relative to the median, after a minimum number of samples and a
minimum time, or at a timeout (then it says the target was not reached).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median, quartiles, min, coefficient of variation and count of per-call seconds."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    mean: float
    cv: float
    #: Half-width of the ~95% confidence interval of the median, relative to the median.
    rel_ci: float

    def as_dict(self) -> dict:
        return {
            "n": self.n,
            "median_s": self.median,
            "q1_s": self.q1,
            "q3_s": self.q3,
            "min_s": self.min,
            "mean_s": self.mean,
            "cv": self.cv,
            "rel_ci": self.rel_ci,
        }


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if not sorted_xs:
        raise ValueError("samples: expected at least one sample, got none")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: expected a value in [0, 1], got {q!r}")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def median_ci(sorted_xs: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median (order statistics).

    Ranks ``n/2 ∓ z·√n/2`` of the sorted sample bound the median with the binomial (normal
    approximation) coverage; no assumption on the shape of the timing distribution.
    """
    n = len(sorted_xs)
    if n == 0:
        raise ValueError("samples: expected at least one sample, got none")
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return sorted_xs[lo], sorted_xs[hi]


def summarize(samples: Sequence[float]) -> Summary:
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("samples: expected at least one sample, got none")
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise ValueError("samples: expected finite non-negative seconds")
    n = len(xs)
    med = quantile(xs, 0.5)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    cv = math.sqrt(var) / mean if mean > 0 else 0.0
    lo, hi = median_ci(xs)
    rel_ci = (hi - lo) / 2 / med if med > 0 else (0.0 if hi == lo else math.inf)
    if n < 3:
        rel_ci = math.inf  # two samples say nothing about spread
    return Summary(n, med, quantile(xs, 0.25), quantile(xs, 0.75), xs[0], mean, cv, rel_ci)


@dataclass(frozen=True)
class StopRule:
    """When to stop sampling one case.

    Stop once ``n >= min_samples``, ``elapsed >= min_time`` and the relative half-width of the
    median's confidence interval is at most ``rel_ci``; or at ``max_time`` / ``max_samples``
    (then the target is reported as not reached).
    """

    rel_ci: float = 0.02
    min_samples: int = 10
    min_time: float = 0.05
    max_time: float = 2.0
    max_samples: int = 10_000

    def __post_init__(self):
        if not self.rel_ci > 0:
            raise ValueError(f"rel_ci: expected a positive fraction, got {self.rel_ci!r}")
        if self.min_samples < 3:
            raise ValueError(f"min_samples: expected at least 3, got {self.min_samples!r}")
        if self.max_samples < self.min_samples:
            raise ValueError(
                f"max_samples: expected at least min_samples ({self.min_samples}), "
                f"got {self.max_samples!r}"
            )
        if self.max_time < self.min_time or self.min_time < 0:
            raise ValueError(
                f"max_time: expected 0 <= min_time <= max_time, "
                f"got min_time={self.min_time!r}, max_time={self.max_time!r}"
            )

    def converged(self, summary: Summary | None, elapsed: float) -> bool:
        """Whether the noise target is met (with enough samples and time)."""
        return (
            summary is not None
            and summary.n >= self.min_samples
            and elapsed >= self.min_time
            and summary.rel_ci <= self.rel_ci
        )

    def done(self, summary: Summary | None, elapsed: float) -> bool:
        n = 0 if summary is None else summary.n
        if n >= self.max_samples or (elapsed >= self.max_time and n >= 3):
            return True
        return self.converged(summary, elapsed)

    def as_dict(self) -> dict:
        return {
            "rel_ci": self.rel_ci,
            "min_samples": self.min_samples,
            "min_time_s": self.min_time,
            "max_time_s": self.max_time,
            "max_samples": self.max_samples,
        }


def stable(previous: float | None, current: float, tolerance: float = 0.05) -> bool:
    """Warm-up test: two consecutive batch medians within ``tolerance`` of each other."""
    if previous is None or previous <= 0:
        return False
    return abs(current - previous) / previous <= tolerance
