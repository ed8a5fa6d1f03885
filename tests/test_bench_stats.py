"""Statistics, stopping rule, timers and cache flush of bench (no timing assertions)."""

import math

import pytest
import torch

from kernelab.bench import cache, stats
from kernelab.bench.timers import HostTimer, timer_for


def test_summary_of_known_samples():
    s = stats.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.q1, s.q3, s.min, s.mean) == (5, 3.0, 2.0, 4.0, 1.0, 3.0)
    assert s.cv == pytest.approx(math.sqrt(2.5) / 3.0)
    assert stats.summarize([2.0] * 10).cv == 0.0
    assert stats.summarize([2.0] * 10).rel_ci == 0.0


def test_median_ci_narrows_with_more_samples():
    gen = torch.Generator().manual_seed(0)
    small = (1.0 + 0.1 * torch.randn(20, generator=gen)).abs().tolist()
    large = (1.0 + 0.1 * torch.randn(2000, generator=gen)).abs().tolist()
    assert stats.summarize(large).rel_ci < stats.summarize(small).rel_ci
    lo, hi = stats.median_ci(sorted(large))
    assert lo <= stats.quantile(sorted(large), 0.5) <= hi
    assert math.isinf(stats.summarize([1.0, 2.0]).rel_ci)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [-1.0, 1.0]])
def test_summarize_rejects_bad_samples(bad):
    with pytest.raises(ValueError, match="samples"):
        stats.summarize(bad)


def test_stop_rule():
    rule = stats.StopRule(rel_ci=0.05, min_samples=5, min_time=0.1, max_time=1.0)
    tight = stats.summarize([1.0] * 10)
    noisy = stats.summarize([1.0, 5.0, 0.1, 9.0, 2.0, 7.0])
    assert rule.converged(tight, 0.2) and rule.done(tight, 0.2)
    assert not rule.converged(tight, 0.05)  # minimum time not yet spent
    assert not rule.converged(stats.summarize([1.0] * 4), 0.2)  # too few samples
    assert not rule.done(noisy, 0.5)
    assert rule.done(noisy, 1.5) and not rule.converged(noisy, 1.5)  # timeout
    assert stats.stable(1.0, 1.02) and not stats.stable(1.0, 1.5) and not stats.stable(None, 1)


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"rel_ci": 0}, "rel_ci"),
        ({"min_samples": 2}, "min_samples"),
        ({"min_samples": 10, "max_samples": 5}, "max_samples"),
        ({"min_time": 2.0, "max_time": 1.0}, "max_time"),
    ],
)
def test_stop_rule_rejects_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        stats.StopRule(**kwargs)


def test_host_timer_runs_before_outside_each_sample():
    calls, befores = [], []
    timer = timer_for("cpu")
    assert isinstance(timer, HostTimer) and timer.graph(lambda: None, 10) is None
    xs, last = timer.samples(
        lambda: calls.append(1) or len(calls), 4, 3, lambda: befores.append(len(calls))
    )
    assert len(xs) == 4 and all(x >= 0 for x in xs)
    assert len(calls) == 12 and last == 12
    assert befores == [0, 3, 6, 9]  # before() ran between samples, never inside one


def test_flush_rewrites_a_buffer_twice_the_cache():
    flush = cache.Flush("cpu", 1 << 16)
    assert flush.nbytes == 2 << 16
    flush()
    first = flush.buffer[:8].clone()
    flush()
    assert not torch.equal(first, flush.buffer[:8])
    with pytest.raises(ValueError, match="factor"):
        cache.Flush("cpu", 1 << 16, factor=1.0)


def test_cpu_cache_size_from_sysfs(tmp_path):
    for i, (level, size) in enumerate([(1, "32K"), (2, "1024K"), (3, "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert cache.cpu_cache_bytes(str(tmp_path)) == 32 * 2**20
    assert cache.cpu_cache_bytes(str(tmp_path / "missing")) is None
