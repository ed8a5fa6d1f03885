"""Reports: one per kernel × target × config, for ops' launches and for users' kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kernelab.inspect import runner, tpu
from kernelab.inspect.findings import Finding, findings, narrow_accesses, occupancy_of, widths
from kernelab.inspect.spec import Spec, from_launch
from kernelab.inspect.targets import TARGETS, Target, resolve_target


@dataclass
class KernelReport:
    """What the compiler made of one kernel for one target and config."""

    key: str  # stable name: op/kernel/target/dtype/shape (baseline key)
    op: str | None
    kernel: str
    target: str
    label: str  # shape and dtype, or the user's signature
    config: str  # constexprs, warps, stages
    facts: dict | None = None  # registers, spills, shared, loads, stores, tensor cores, ...
    occupancy: dict | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    unsupported: str | None = None  # the target lacks a type the kernel uses: nothing to judge
    triton: str | None = None
    cached: bool = False
    #: The compilation's cache key (kernel source, launch, target, compiler, parser versions).
    cache_key: str | None = None
    #: Not compiled: the baseline holds this key's entry (:func:`kernelab.inspect.baseline.trust`).
    trusted: dict | None = None

    @property
    def is_tpu(self) -> bool:
        t = TARGETS.get(self.target)
        return t is not None and t.is_tpu

    @property
    def ok(self) -> bool:
        return self.error is None and not any(f.severity == "error" for f in self.findings)

    def summary(self) -> str:
        """E.g. '128-bit, 0 spills, occ 100%', or the first finding."""
        if self.error:
            return self.error if self.is_tpu else f"compile error: {self.error}"
        if self.unsupported:
            return f"not for this target: {self.unsupported}"
        if self.is_tpu:
            return tpu.summary(self.facts or {})
        f = self.facts or {}
        occ = self.occupancy
        parts = [widths(f), f"{f.get('spill_bytes') or 0} spills"]
        if f.get("tensor_cores"):
            parts.append("+".join(sorted(f["tensor_cores"])))
        if occ:
            parts.append(f"occ {occ['occupancy']:.0%}")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "op": self.op,
            "kernel": self.kernel,
            "target": self.target,
            "label": self.label,
            "config": self.config,
            "facts": self.facts,
            "occupancy": self.occupancy,
            "findings": [x.as_dict() for x in self.findings],
            "error": self.error,
            "unsupported": self.unsupported,
            "triton": self.triton,
            "cached": self.cached,
            "cache_key": self.cache_key,
            "trusted": self.trusted is not None,
        }


@dataclass
class Job:
    spec: Spec
    target: Target
    key: str
    op: str | None = None

    def report(self, **fields) -> KernelReport:
        """This job's report, its names filled in, with ``fields`` (facts, error, ...)."""
        return KernelReport(
            key=self.key,
            op=self.op,
            kernel=self.spec.name,
            target=self.target.name,
            label=self.spec.label,
            config=self.spec.config_text(),
            **fields,
        )


class _Progress:
    """One (done, total) count over consecutive runner runs (each counts from 0)."""

    def __init__(self, progress: Callable[[int, int], None] | None):
        self._progress = progress
        self._before = 0
        self._last = 0

    def __call__(self, done: int, total: int) -> None:
        self._last = total
        if self._progress:
            self._progress(self._before + done, self._before + total)

    def next(self) -> None:
        self._before += self._last
        self._last = 0


def analyze_jobs(
    jobs: Sequence[Job],
    workers: int | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    counterfactuals: bool = True,
) -> list[KernelReport]:
    """Compile (or read from the cache) every job, then the aligned counterfactuals needed
    (unless ``counterfactuals`` is False: the vectorisation findings then cannot say whether
    alignment is what kept an access narrow)."""
    # GPU compilations first, their counterfactuals next (both in forked workers), the TPU
    # lowerings last: they run in this process and start jax's threads, after which a fork
    # is unsafe (a child may inherit a lock a jax thread holds)
    gpu = [i for i, j in enumerate(jobs) if not j.target.is_tpu]
    tpu_jobs = [i for i, j in enumerate(jobs) if j.target.is_tpu]
    step = _Progress(progress)
    first: list = [None] * len(jobs)
    out = runner.run([(jobs[i].spec, jobs[i].target) for i in gpu], workers, use_cache, step)
    for i, r in zip(gpu, out, strict=True):
        first[i] = r
    need = [
        i
        for i, (j, r) in enumerate(zip(jobs, first, strict=True))
        if counterfactuals
        and not j.target.is_tpu  # (not lowered yet)
        and "facts" in r
        and narrow_accesses(r["facts"])
        and j.spec.missing_alignment()
    ]
    aligned = runner.run(
        [(jobs[i].spec.all_aligned(), jobs[i].target) for i in need], workers, use_cache
    )
    aligned_of = {i: a.get("facts") for i, a in zip(need, aligned, strict=True)}
    step.next()
    out = runner.run([(jobs[i].spec, jobs[i].target) for i in tpu_jobs], workers, use_cache, step)
    for i, r in zip(tpu_jobs, out, strict=True):
        first[i] = r
    reports = []
    for i, (job, res) in enumerate(zip(jobs, first, strict=True)):
        rep = job.report(
            triton=res.get("triton"),
            cached=bool(res.get("cached")),
            cache_key=runner.cache_key(job.spec, job.target),
        )
        if "error" in res:
            rep.error = res["error"]
        elif "unsupported" in res:
            rep.unsupported = res["unsupported"]
        elif job.target.is_tpu:
            rep.facts = res["facts"]
            rep.findings = tpu.findings(res["facts"], job.target)
        else:
            facts = res["facts"]
            occ = occupancy_of(facts, job.target)
            rep.facts = facts
            rep.occupancy = occ.as_dict() if occ else None
            rep.findings = findings(
                facts,
                job.target,
                occ,
                job.spec.missing_alignment(),
                aligned_of.get(i),
                job.spec.max_elements,
            )
        reports.append(rep)
    return reports


def analyze_spec(
    spec: Spec, targets: Sequence[str | Target] = ("sm_90",), use_cache: bool = True
) -> list[KernelReport]:
    jobs = [
        Job(spec, t, f"{spec.name}/{t.name}/{spec.identity()[:8]}")
        for t in (resolve_target(x) for x in targets)
    ]
    return analyze_jobs(jobs, use_cache=use_cache)


def analyze(
    launch, target: str | Target = "sm_90", max_elements: int | None = None, use_cache=True
) -> KernelReport:
    """Analyse one :class:`kernelab.ops.Launch` for one target (the autotuner's entry point)."""
    spec = from_launch(launch, max_elements=max_elements)
    return analyze_spec(spec, (target,), use_cache)[0]


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reasons: tuple[str, ...]


def prune(launch, target: str | Target = "sm_90", report: KernelReport | None = None) -> Verdict:
    """Whether a config is worth timing on ``target``: it must compile, not spill, fit in
    shared memory, reach one block per SM, and keep tensor cores where the kernel has a dot;
    on a TPU target, lower and fit in VMEM."""
    rep = report or analyze(launch, target)
    reasons = []
    if rep.error:
        reasons.append(rep.error if rep.is_tpu else f"does not compile: {rep.error}")
    elif rep.unsupported:
        reasons.append(f"not for this target: {rep.unsupported}")
    else:
        kinds = {f.kind for f in rep.findings}
        if "spills" in kinds:
            reasons.append(f"spills {rep.facts.get('spill_bytes') or 0} bytes per thread")
        if "shared-limit" in kinds:
            reasons.append(f"needs {rep.facts['shared_bytes']} bytes of shared memory")
        if rep.occupancy is not None and rep.occupancy["blocks_per_sm"] < 1:
            reasons.append(f"cannot reach one block per SM ({rep.occupancy['limiter']})")
        if "no-tensor-cores" in kinds:
            reasons.append("loses tensor cores")
        if "vmem" in kinds:
            reasons.append(next(f.message for f in rep.findings if f.kind == "vmem"))
    return Verdict(not reasons, tuple(reasons))
