"""The ranking the tuner can make without a GPU: inspect's verdict on every config.

Every config of every shape is compiled for the target in one batch (identical compilations
are compiled once and read from inspect's cache after that), pruned for the reasons
:func:`kernelab.inspect.prune` gives, and the survivors ranked by what the compiled code
shows: no spills first, then the highest occupancy, then the widest global access, then the
fewest registers. For a config that launches several kernels, its worst kernel counts.

This is a static preference, not a timing: it says which configs are worth timing first and
which need not be timed at all.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: How many of the survivors a ranking names as preferred.
PREFERRED = 3


@dataclass
class Standing:
    """What inspect says of one surviving config (its worst kernel for each figure)."""

    config: object
    spill_bytes: int
    occupancy: float | None  # fraction of the SM's warps, None when unknown
    widest_bits: int  # widest global load or store, 0 when the kernel has none
    registers: int | None

    def key(self) -> tuple:
        occ = -1.0 if self.occupancy is None else self.occupancy
        regs = 0 if self.registers is None else self.registers
        return (self.spill_bytes > 0, -occ, -self.widest_bits, regs)

    def summary(self) -> str:
        occ = "occ ?" if self.occupancy is None else f"occ {self.occupancy:.0%}"
        width = f"{self.widest_bits}-bit" if self.widest_bits else "no global access"
        regs = "" if self.registers is None else f", {self.registers} regs"
        return f"{occ}, {width}, {self.spill_bytes} spills{regs}"


@dataclass
class StaticRanking:
    pruned: Counter = field(default_factory=Counter)  # reason (by kind) -> count
    ranked: list[Standing] = field(default_factory=list)  # survivors, preferred first


@dataclass
class Analysis:
    rankings: list[StaticRanking]
    compiled: int  # compilations made now
    cached: int  # compilations read from inspect's cache
    seconds: float


def _widest(facts: dict) -> int:
    return max((int(w) for w in (*facts["loads"], *facts["stores"])), default=0)


def rank(
    op,
    shapes: Sequence,
    dtype,
    target: str,
    category: Callable[[str], str],
    progress: Callable[[str], None] | None = None,
) -> Analysis:
    """One :class:`StaticRanking` per shape, in order, from one batch of compilations."""
    from kernelab.inspect import Job, analyze_jobs, from_launch, resolve_target

    started = time.perf_counter()
    tgt = resolve_target(target)
    jobs, owners = [], []  # owners[i] = (shape index, config index)
    configs_of = []
    for s, shape in enumerate(shapes):
        configs = list(op.tuning_space(shape, dtype))
        configs_of.append(configs)
        for c, config in enumerate(configs):
            for launch in op.launches(shape, dtype, config):
                spec = from_launch(launch, label=f"{shape.label} {launch.name}")
                jobs.append(Job(spec, tgt, f"{op.name}/{launch.name}/{target}", op.name))
                owners.append((s, c, launch))

    def tick(done: int, total: int) -> None:
        if progress and total and (done == total or done % 8 == 0):
            progress(f"inspect {op.name}: {done}/{total} compilations for {target}")

    reports = analyze_jobs(jobs, progress=tick, counterfactuals=False)
    by_config: dict[tuple[int, int], list] = {}
    for (s, c, launch), rep in zip(owners, reports, strict=True):
        by_config.setdefault((s, c), []).append((launch, rep))
    rankings = []
    for s, configs in enumerate(configs_of):
        ranking = StaticRanking()
        for c, config in enumerate(configs):
            standing = _judge(config, by_config.get((s, c), []), target, category, ranking)
            if standing is not None:
                ranking.ranked.append(standing)
        ranking.ranked.sort(key=Standing.key)
        rankings.append(ranking)
    cached_of: dict[str, bool] = {}
    for job, rep in zip(jobs, reports, strict=True):
        cached_of.setdefault(job.spec.identity(), rep.cached)
    cached = sum(cached_of.values())
    return Analysis(rankings, len(cached_of) - cached, cached, time.perf_counter() - started)


def _judge(config, launches, target, category, ranking: StaticRanking) -> Standing | None:
    """Prune ``config`` (count its first reason) or return its standing."""
    from kernelab.inspect import prune

    for launch, rep in launches:
        verdict = prune(launch, target, report=rep)
        if not verdict.keep:
            ranking.pruned[category(verdict.reasons[0])] += 1
            return None
    facts = [rep.facts or {} for _, rep in launches]
    occs = [rep.occupancy["occupancy"] for _, rep in launches if rep.occupancy]
    regs = [f["registers"] for f in facts if f.get("registers") is not None]
    return Standing(
        config,
        spill_bytes=max((int(f.get("spill_bytes") or 0) for f in facts), default=0),
        occupancy=min(occs) if len(occs) == len(launches) and occs else None,
        widest_bits=min((_widest(f) for f in facts if "loads" in f), default=0),
        registers=max(regs) if regs else None,
    )
