"""Crossover studies: two implementations across one dimension, and where the winner changes.

A study takes one shape of an op (the *base*), sets one of its sizes (``dim``) to each value of
a sweep, and compares side B against side A at every point:

* **measured** (:func:`measure`): two variants of one op, timed in one process, interleaved,
  by the bench runner (every integrity check applies); each point's verdict is compare's rule
  (``kernelab.ledger.compare.compare_cases``: a bootstrap interval of the ratio of medians
  that must exclude 1 by more than the noise), so "faster" and "slower" are confirmed, and
  "ambiguous" is not;
* **from floors** (:func:`floors`): two ops (w4a16_gemm against gemm, say) by their declared
  cost models on a device of the hardware table; the verdict is exact: faster or slower
  when the floors differ by more than ``tie`` (2 %, compare's noise floor), else "tie".

A crossover is named only between two points whose verdicts are both confirmed (faster,
slower, or from floors a tie) and differ; ambiguous points between them stay inside the
bracket. From floors the bracket is narrowed to the exact value by bisection over the
integers (floors cost nothing to evaluate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kernelab.core import Shape, dtype_name

#: Floors within this fraction of each other are a tie (compare's default noise floor).
TIE = 0.02
CONFIRMED = ("faster", "slower", "tie")


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``"M=1,16,256"`` → ("M", [1, 16, 256]); ``"M=1..4096"`` → powers of two in the range."""
    dim, sep, values = (text or "").partition("=")
    dim = dim.strip()
    if not sep or not dim or not values.strip():
        raise ValueError(f"sweep: expected DIM=v1,v2,... or DIM=lo..hi, got {text!r}")
    try:
        if ".." in values:
            lo, hi = (int(v) for v in values.split("..", 1))
            if lo <= 0 or hi < lo:
                raise ValueError
            out, v = [], lo
            while v <= hi:
                out.append(v)
                v *= 2
        else:
            out = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"sweep: expected positive integers (DIM=1,2,4 or DIM=1..4096), got {text!r}"
        ) from None
    if len(out) < 2 or any(v <= 0 for v in out):
        raise ValueError(f"sweep: expected at least two positive values, got {text!r}")
    if sorted(set(out)) != out:
        raise ValueError(f"sweep: expected increasing values without repeats, got {text!r}")
    return dim, out


def base_shape(op, dim: str, shape_set: str = "representative", labels=None) -> Shape:
    """The first shape of ``op``'s set that has ``dim`` (and whose label contains one of
    ``labels``, when given)."""
    shapes = [s for s in op.shapes(shape_set) if dim in s.dims]
    if labels:
        shapes = [s for s in shapes if any(k in s.label for k in labels)]
    if not shapes:
        have = sorted({k for s in op.shapes(shape_set) for k in s.dims})
        raise ValueError(
            f"sweep: op {op.name!r} has no {shape_set} shape with a size {dim!r}"
            + (f" matching {list(labels)}" if labels else "")
            + f"; its sizes: {', '.join(have)}"
        )
    return shapes[0]


def at(shape: Shape, dim: str, value: int) -> Shape:
    """``shape`` with ``dim`` set to ``value`` (a size the op's inputs read)."""
    dims = {**shape.full_dims, dim: value}
    return replace(
        shape, dims=dims, declared={}, label=f"{shape.label} [{dim}={value}]", reduce_to={}
    )


@dataclass
class Study:
    dim: str
    a: str
    b: str
    how: str  # "measured" | "floors"
    device: str
    base: str  # the base shape's label
    points: list[dict] = field(default_factory=list)
    crossovers: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "dim": self.dim,
            "a": self.a,
            "b": self.b,
            "how": self.how,
            "device": self.device,
            "base": self.base,
            "points": self.points,
            "crossovers": self.crossovers,
            "notes": self.notes,
            "summary": self.summary(),
        }

    def summary(self) -> str:
        if not self.crossovers:
            verdicts = {p["verdict"] for p in self.points}
            if verdicts <= {"faster"} or verdicts <= {"slower"} or verdicts <= {"tie"}:
                (v,) = verdicts or {"ambiguous"}
                word = "as fast as" if v == "tie" else f"{v} than"
                return f"{self.b} is {word} {self.a} at every {self.dim} swept: no crossover"
            return "no crossover named: verdicts on the two sides are not both confirmed"
        parts = []
        words = {"faster": "faster than", "slower": "slower than", "tie": "as fast as"}
        for c in self.crossovers:
            if c.get("at") is not None:
                where = f"up to {self.dim} = {c['last_before']}, {words[c['to']]} it from {c['at']}"
            else:
                where = (
                    f"at {self.dim} ≤ {c['low']}, {words[c['to']]} it from {c['high']} "
                    f"(the crossover lies in between)"
                )
            parts.append(f"{self.b} is {words[c['from']]} {self.a} {where}")
        return "; ".join(parts)


def name_crossovers(points: Sequence[dict]) -> list[dict]:
    """Transitions between consecutive confirmed verdicts that differ (ambiguous and invalid
    points in between stay inside the bracket)."""
    out, last = [], None
    for p in points:
        if p["verdict"] not in CONFIRMED:
            continue
        if last is not None and p["verdict"] != last["verdict"]:
            out.append(
                {"low": last["value"], "high": p["value"], "from": last["verdict"],
                 "to": p["verdict"], "at": None}
            )  # fmt: skip
        last = p
    return out


# --- from floors -----------------------------------------------------------------------------


def _floor(op, shape, dtype, ceilings) -> tuple[float, dict]:
    from kernelab.bench.roofline import roofline

    cost = op.cost(op.inputs(shape, dtype, "meta"))
    r = roofline(cost, 1.0, ceilings, dtype)
    return r["floor_s"] or 0.0, {"flops": cost.flops, "bytes": cost.bytes, "bound": r["bound"]}


def _floor_verdict(ratio: float, tie: float) -> str:
    if ratio < 1 - tie:
        return "faster"
    if ratio > 1 + tie:
        return "slower"
    return "tie"


def floors(
    spec, op_a, op_b, dim: str, values: Sequence[int], dtype, *, labels=None, tie: float = TIE
) -> Study:
    """Side B (``op_b``) against side A (``op_a``) by their floors on the device ``spec``."""
    from kernelab.bench.roofline import datasheet

    ceilings = datasheet(spec)
    base_a, base_b = base_shape(op_a, dim, labels=labels), base_shape(op_b, dim, labels=labels)
    shared = set(base_a.dims) & set(base_b.dims) - {dim}
    differ = [k for k in sorted(shared) if base_a.full_dims[k] != base_b.full_dims[k]]
    if differ:
        raise ValueError(
            f"sweep: the base shapes of {op_a.name} and {op_b.name} differ in {differ} "
            f"({base_a.label!r} vs {base_b.label!r}); choose one with --shape"
        )
    study = Study(dim, op_a.name, op_b.name, "floors", spec.name, base_a.label)
    study.notes.append(f"{ceilings.source(dtype)}; a tie is within {tie:.0%}")

    def point(v: int) -> dict:
        fa, ca = _floor(op_a, at(base_a, dim, v), dtype, ceilings)
        fb, cb = _floor(op_b, at(base_b, dim, v), dtype, ceilings)
        ratio = fb / fa if fa else float("inf")
        return {
            "value": v,
            "a_s": fa,
            "b_s": fb,
            "speedup": fa / fb if fb else None,
            "lo": None,
            "hi": None,
            "floor_ratio": fa / fb if fb else None,
            "verdict": _floor_verdict(ratio, tie),
            "a_bound": ca["bound"],
            "b_bound": cb["bound"],
            "a_bytes": ca["bytes"],
            "b_bytes": cb["bytes"],
            "a_flops": ca["flops"],
            "b_flops": cb["flops"],
        }

    study.points = [point(v) for v in values]
    study.crossovers = name_crossovers(study.points)
    for c in study.crossovers:  # narrow each bracket: the first value with the new verdict
        lo, hi = c["low"], c["high"]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if point(mid)["verdict"] == c["from"]:
                lo = mid
            else:
                hi = mid
        c["at"] = hi
        c["last_before"] = lo
    return study


# --- measured ------------------------------------------------------------------------------


def timed_subjects(op, variants: Sequence[str], device_type: str, cfg) -> list:
    """The subjects of variants A and B, in that order, or an error saying why one cannot be
    timed on ``device_type`` (checked before anything is measured)."""
    from kernelab.bench.runner import subjects_for

    if len(variants) != 2 or variants[0] == variants[1]:
        raise ValueError(f"variants: a sweep compares two variants (a,b), got {list(variants)}")
    unknown = [v for v in variants if v not in op.variants]
    if unknown:
        raise ValueError(f"variants: op {op.name!r} has {sorted(op.variants)}, got {unknown}")
    subjects, skipped = subjects_for(op, device_type, replace(cfg, variants=tuple(variants)))
    names = [s.name for s in subjects]
    missing = [v for v in variants if v not in names]
    if missing:
        why = "; ".join(line for line in skipped if any(f"/{v}:" in line for v in missing))
        raise ValueError(f"variants: {missing} cannot be timed on {device_type}: {why}")
    return sorted(subjects, key=lambda s: list(variants).index(s.name))


def measure(
    op,
    variants: Sequence[str],
    dim: str,
    values: Sequence[int],
    info,
    cfg,
    ceilings,
    *,
    timer,
    dtype=None,
    labels=None,
    telemetry=None,
    progress=None,
) -> tuple[Study, list[dict], list[str]]:
    """Time variants A and B of ``op`` at every value of the sweep (``timer``: the device's,
    or any object with the timer interface of :mod:`kernelab.bench.timers`). Returns the study,
    every case timed (for the ledger) and what was skipped."""
    from kernelab.bench.runner import CPU_RULE, GPU_RULE, bench_case
    from kernelab.ledger.compare import compare_cases

    cfg = replace(cfg, rule=cfg.rule or (CPU_RULE if info.type == "cpu" else GPU_RULE))
    subjects = timed_subjects(op, variants, info.type, cfg)
    skipped: list[str] = []
    dtype = dtype or op.dtypes[0]
    if dtype not in op.dtypes:
        names = [dtype_name(d) for d in op.dtypes]
        raise ValueError(f"dtype: op {op.name!r} takes {names}, got {dtype_name(dtype)}")
    base = base_shape(op, dim, cfg.shape_set, labels)
    study = Study(dim, variants[0], variants[1], "measured", info.key, base.label)
    study.notes.append(
        "verdicts by compare's rule: bootstrap interval of the ratio of medians beyond noise"
    )
    cases: list[dict] = []
    for k, v in enumerate(values):
        shape = at(base, dim, v)
        if progress:
            progress(f"sweep {op.name} {dim}={v} {dtype_name(dtype)} ({k + 1}/{len(values)})")
        got = bench_case(op, shape, dtype, subjects, info, timer, ceilings, cfg, telemetry, skipped)
        cases.extend(got)
        by = {c["variant"]: c for c in got}
        if set(variants) - set(by):
            study.points.append({"value": v, "verdict": "invalid", "note": "not timed"})
            continue
        ca, cb = by[variants[0]], by[variants[1]]
        cmp = compare_cases(ca, cb, same_run=True)
        study.points.append(
            {
                "value": v,
                "a_s": cmp.median_a,
                "b_s": cmp.median_b,
                "speedup": 1 / cmp.ratio if cmp.ratio else None,
                "lo": 1 / cmp.ci_high if cmp.ci_high else None,
                "hi": 1 / cmp.ci_low if cmp.ci_low else None,
                "floor_ratio": 1.0,  # variants of one op share its cost model
                "verdict": cmp.verdict,
                "note": cmp.note,
            }
        )
    study.crossovers = name_crossovers(study.points)
    return study, cases, skipped
