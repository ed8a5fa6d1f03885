"""Comparing two stored runs case by case, with confidence intervals from the raw samples.

The rule (what ``kernelab compare`` prints and gates on)
--------------------------------------------------------

Cases of run A (baseline) and run B (candidate) are matched on (op, variant, shape_key,
dtype, device, mode). For each pair:

* ``basis`` and ``ratio``. The bench times every variant of a case interleaved with eager
  PyTorch (``REFERENCE_VARIANT``), code that is not under test, one batch of samples per
  subject per round, and stores which samples each round took (``metrics["batches"]``). A
  case other than the reference, with a converged, valid reference case in both runs, the
  same torch version in both, and at least ``MIN_ROUNDS`` rounds shared with it in each, is
  judged **relative to the reference** (basis "vs torch"): per round, the median of its
  batch over the reference's median in the same round; ``ratio`` = median of those per-round
  ratios in B / the same in A. Whatever slowed the whole process in a round (a neighbour on
  the core, a lower clock, a cache trashed by a context switch) slows both and divides out;
  two processes of the same code can differ by 20-40 % in absolute time on a loaded CPU.
  Otherwise (the reference itself, groups without one, runs recorded before the bench
  stored its rounds) the basis is "absolute": ``ratio`` = median(B) / median(A) of the raw
  per-sample times (> 1: B is slower).
* ``ci_low``, ``ci_high``: a percentile bootstrap interval of that ratio (``confidence``,
  default 95 %), resampling each run's values (per-round ratios, or samples) with
  replacement ``resamples`` times with a fixed seed, so the same two runs always give the
  same interval.
* ``noise``: how far the same code moves between two timings of itself, estimated from each
  run as the change between the medians of the first and second half of its values (stored
  in the order taken), and never below ``noise_floor`` (default 2 %). The larger of A's and
  B's estimates is used.
* machine spread: how far a run's median can land from another run's of the same code,
  because the machine's state differs between them: from the rounds of each run, half the
  ratio of the 90th to the 10th percentile of its per-round values, sqrt(p90 / p10) - 1
  (per-round ratios on the "vs torch" basis, per-round medians on the absolute one); the
  larger of A's and B's. A run whose rounds disagree by 30 % cannot tell a 10 % change.
* ``drift`` (absolute basis only): how far the machine itself moved between the two runs:
  the change of the reference's median between the runs, for the same shape, dtype, device
  and mode, is the drift of that group. For the reference's own cases (and groups without
  one), the median drift over the other groups. Only converged, valid reference cases count.
* ``spread``: vs torch, the larger of the noise and the machine spread; absolute, the
  larger of the noise, the sum of the two medians' own confidence half-widths (``metrics
  ["rel_ci"]``, what the stopping rule measured) and the machine spread, plus the drift
  (itself widened by the reference medians' half-widths).
* verdict ``unreliable`` when either run's stopping rule did not converge (``metrics
  ["converged"]`` false: the noise target was not reached in the time allowed, as on a loaded
  machine), or when the interval excludes 1 (and the change is beyond the noise floor) but
  its near end is within ``spread``: the machine moves that much on its own, so the
  measurement cannot say. An unreliable case is
  never faster or slower and never a regression.
* verdict ``slower`` when the whole interval lies above 1 + ``spread`` (``ci_low - 1 >
  spread``); ``faster`` when it lies below 1 - ``spread`` (``1 - ci_high > spread``);
  otherwise
  ``ambiguous`` (the interval straddles 1, or the change is within the noise floor, or a run
  has fewer than ``MIN_SAMPLES`` samples). ``invalid`` when the bench marked either time
  invalid (``metrics["valid"]`` false, or a flag containing "invalid": below the
  speed-of-light floor, wrong outputs, work left running), so an invalid time is never a win
  or a loss.
* ``regression``: verdict ``slower`` and ``ratio > 1 + threshold`` (default 5 %). Any
  regression makes ``kernelab compare`` exit with status 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

KEY_FIELDS = ("op", "variant", "shape_key", "dtype", "device", "mode")
GROUP_FIELDS = ("op", "shape_key", "dtype", "device", "mode")
REFERENCE_VARIANT = "torch"
MIN_SAMPLES = 4
#: Rounds a case needs in both runs to be judged against the reference, or to give a spread.
MIN_ROUNDS = 6
SEED = 20240611


def case_key(case: dict) -> tuple[str, ...]:
    return tuple(str(case[k]) for k in KEY_FIELDS)


def _median(case: dict) -> float | None:
    samples = case.get("samples") or []
    if samples:
        return float(np.median(samples))
    m = (case.get("metrics") or {}).get("median_s")
    return float(m) if isinstance(m, int | float) else None


def bootstrap_medians(samples, size: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``size`` bootstrap resamples of ``samples``, drawn exactly in O(size).

    A resample draws indices floor(n·U) of the sorted samples for n uniforms U, so its j-th
    smallest value is sorted[floor(n·U_(j))], and the j-th order statistic of n uniforms is
    Beta(j, n - j + 1); the next one is U_(j) + (1 - U_(j))·Beta(1, n - j). This gives the same
    distribution as resampling and taking np.median, without materialising the resamples.
    """
    xs = np.sort(np.asarray(samples, dtype=np.float64))
    n = xs.size

    def at(u: np.ndarray) -> np.ndarray:
        return xs[np.minimum((u * n).astype(np.int64), n - 1)]

    if n == 1:
        return np.full(size, xs[0])
    m = (n + 1) // 2
    u1 = rng.beta(m, n - m + 1, size=size)
    if n % 2:
        return at(u1)
    u2 = u1 + (1 - u1) * rng.beta(1, n - m, size=size)
    return (at(u1) + at(u2)) / 2


def bootstrap_ratio(
    a, b, confidence: float = 0.95, resamples: int = 4000, seed: int = SEED
) -> tuple[float, float, float]:
    """median(b)/median(a) and a percentile bootstrap interval for it."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_ratio: both sample sets must be non-empty")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a value in (0, 1), got {confidence!r}")
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(b, resamples, rng) / bootstrap_medians(a, resamples, rng)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


def half_drift(samples) -> float:
    """|median(second half) / median(first half) - 1|: the same code timed twice."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < MIN_SAMPLES:
        return 0.0
    h = x.size // 2
    return float(abs(np.median(x[h:]) / np.median(x[:h]) - 1))


def round_medians(case: dict) -> dict[int, float]:
    """The median of each batch of samples, by the round it was taken in.

    The bench stores, per case, ``metrics["batches"]``: ``[round, index of the batch's first
    sample]`` for every batch, in the order taken; every subject of a case takes one batch per
    round, interleaved. A case without that record (an older run), or with one that does not
    fit its samples, has none.
    """
    batches = (case.get("metrics") or {}).get("batches")
    samples = case.get("samples") or []
    if not isinstance(batches, list) or not samples:
        return {}
    marks = []
    for b in batches:
        ok = isinstance(b, list | tuple) and len(b) == 2
        if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in b):
            return {}
        marks.append((int(b[0]), int(b[1])))
    starts = [m[1] for m in marks]
    if starts != sorted(starts) or starts[0] < 0 or starts[-1] >= len(samples):
        return {}
    out = {}
    for i, (rnd, start) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else len(samples)
        if end > start:
            out[rnd] = float(np.median(samples[start:end]))
    return out


def relative_rounds(case: dict, reference: dict) -> list[float]:
    """Per round, this case's batch median over the reference's, both taken in that round."""
    mine, ref = round_medians(case), round_medians(reference)
    return [mine[k] / ref[k] for k in sorted(mine) if ref.get(k, 0) > 0]


def round_spread(series) -> float:
    """How far a run's median can land from another run's on the same machine: half the
    ratio between the 90th and 10th percentiles of the per-round values (0: too few)."""
    x = np.asarray(series, dtype=np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    if x.size < MIN_ROUNDS:
        return 0.0
    lo, hi = np.quantile(x, [0.1, 0.9])
    return float(np.sqrt(hi / lo) - 1)


def _unconverged(case: dict) -> bool:
    """The stopping rule ended this case without reaching its noise target."""
    return (case.get("metrics") or {}).get("converged") is False


def _rel_ci(case: dict) -> float:
    """The relative half-width of this case's median interval, as the bench measured it."""
    v = (case.get("metrics") or {}).get("rel_ci")
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
        return 0.0
    return float(v)


def _unusable(case: dict) -> bool:
    """A reference case that cannot serve as the machine term."""
    return _unconverged(case) or _invalid(case)


def _invalid(case: dict) -> bool:
    """The bench marked this time invalid (``metrics.valid`` false, or an "invalid" flag)."""
    if (case.get("metrics") or {}).get("valid") is False:
        return True
    return any("invalid" in str(f).lower() for f in case.get("flags") or [])


@dataclass
class CaseComparison:
    op: str
    variant: str
    shape_key: str
    shape_label: str
    dtype: str
    device: str
    mode: str
    median_a: float | None
    median_b: float | None
    n_a: int
    n_b: int
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    noise: float
    verdict: str  # faster | slower | ambiguous | unreliable | invalid
    regression: bool
    note: str = ""
    spread: float = 0.0
    #: "absolute": B/A of the case's own medians; "vs torch": of its medians over the
    #: reference variant's, round by round in each run (the machine term divided out)
    basis: str = "absolute"


@dataclass
class Comparison:
    run_a: dict
    run_b: dict
    threshold: float
    confidence: float
    noise_floor: float
    cases: list[CaseComparison] = field(default_factory=list)
    only_a: list[dict] = field(default_factory=list)
    only_b: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.regression]

    def counts(self) -> dict[str, int]:
        out = {"faster": 0, "slower": 0, "ambiguous": 0, "unreliable": 0, "invalid": 0}
        for c in self.cases:
            out[c.verdict] += 1
        out["regressions"] = len(self.regressions)
        out["only_a"] = len(self.only_a)
        out["only_b"] = len(self.only_b)
        return out

    def as_dict(self) -> dict:
        return {
            "baseline": self.run_a,
            "candidate": self.run_b,
            "threshold": self.threshold,
            "confidence": self.confidence,
            "noise_floor": self.noise_floor,
            "counts": self.counts(),
            "cases": [asdict(c) for c in self.cases],
            "only_in_baseline": self.only_a,
            "only_in_candidate": self.only_b,
            "notes": self.notes,
        }


def compare_cases(
    a: dict,
    b: dict,
    threshold: float = 0.05,
    confidence: float = 0.95,
    noise_floor: float = 0.02,
    resamples: int = 4000,
    drift: float = 0.0,
    ref_a: dict | None = None,
    ref_b: dict | None = None,
    same_run: bool = False,
) -> CaseComparison:
    """Compare one baseline case ``a`` with one candidate case ``b`` (see the module rule).

    ``drift``: how far the machine moved between the two runs (a fraction), from
    :func:`machine_drift`; 0 when unknown. ``ref_a``, ``ref_b``: the reference variant's cases
    of the same group in each run, timed interleaved with ``a`` and ``b``; with them (and
    enough rounds in both) the case is judged relative to the reference. ``same_run``: ``a``
    and ``b`` are two subjects timed interleaved in one run (a crossover study), so no
    machine spread between runs applies to them.
    """
    sa = a.get("samples") or []
    sb = b.get("samples") or []
    ma, mb = _median(a), _median(b)
    ra = rb = []
    if ref_a is not None and ref_b is not None and not any(map(_unusable, (ref_a, ref_b))):
        ra, rb = relative_rounds(a, ref_a), relative_rounds(b, ref_b)
    relative = min(len(ra), len(rb)) >= MIN_ROUNDS
    if relative:  # the machine term is divided out; its spread is the per-round ratios'
        xa, xb = ra, rb
        machine = max(round_spread(ra), round_spread(rb))
        noise = max(noise_floor, half_drift(ra), half_drift(rb))
        spread = max(noise, machine)
    else:
        xa, xb = sa, sb
        machine = 0.0
        if not same_run:
            machine = max(round_spread(list(round_medians(c).values())) for c in (a, b))
        noise = max(noise_floor, half_drift(sa), half_drift(sb))
        spread = max(noise, _rel_ci(a) + _rel_ci(b), machine) + drift
    ratio = lo = hi = None
    note = ""
    if ma and mb:
        ratio = float(np.median(xb) / np.median(xa)) if relative else mb / ma
    if _invalid(a) or _invalid(b):
        verdict = "invalid"
        which = " and ".join(n for n, c in (("baseline", a), ("candidate", b)) if _invalid(c))
        flags = [str(f) for c in (a, b) if _invalid(c) for f in c.get("flags") or []]
        note = f"{which} time marked invalid" + (": " + "; ".join(flags) if flags else "")
    elif _unconverged(a) or _unconverged(b):
        verdict = "unreliable"
        which = " and ".join(n for n, c in (("baseline", a), ("candidate", b)) if _unconverged(c))
        note = (
            f"stopping rule did not converge in {which} (median ±"
            f"{max(_rel_ci(a), _rel_ci(b)):.1%}): the machine was too noisy to tell"
        )
    elif len(sa) < MIN_SAMPLES or len(sb) < MIN_SAMPLES or not (ma and mb):
        verdict = "ambiguous"
        note = f"too few samples for an interval (need {MIN_SAMPLES} in each run)"
    else:
        ratio, lo, hi = bootstrap_ratio(xa, xb, confidence, resamples)
        if lo <= 1 <= hi:
            verdict, note = "ambiguous", "interval straddles 1"
        elif abs(ratio - 1) <= noise_floor:
            verdict, note = "ambiguous", f"change within noise ({noise_floor:.1%})"
        elif (lo - 1 if ratio > 1 else 1 - hi) <= spread:  # the interval's near end
            verdict = "unreliable"
            if relative or machine >= max(noise, drift):
                why = "the rounds of one run differ as much"
            elif drift > noise:
                why = "the reference variant moved as much"
            else:
                why = "run-to-run"
            near = lo - 1 if ratio > 1 else 1 - hi
            note = (
                f"change {abs(ratio - 1):.1%} (at least {max(near, 0):.1%}) within the spread "
                f"({spread:.1%}, {why})"
            )
        else:
            verdict = "slower" if ratio > 1 else "faster"
    if relative and verdict != "invalid":
        basis = f"vs {REFERENCE_VARIANT}, {len(ra)}/{len(rb)} rounds"
        note = f"{basis}; {note}" if note else basis
    regression = verdict == "slower" and ratio is not None and ratio > 1 + threshold
    return CaseComparison(
        op=b["op"],
        variant=b["variant"],
        shape_key=b["shape_key"],
        shape_label=b.get("shape_label") or b["shape_key"],
        dtype=b["dtype"],
        device=b["device"],
        mode=b["mode"],
        median_a=ma,
        median_b=mb,
        n_a=len(sa),
        n_b=len(sb),
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        noise=noise,
        verdict=verdict,
        regression=regression,
        note=note,
        spread=spread,
        basis=f"vs {REFERENCE_VARIANT}" if relative else "absolute",
    )


def _group(case: dict) -> tuple[str, ...]:
    return tuple(str(case[k]) for k in GROUP_FIELDS)


def machine_drift(
    cases_a: dict[tuple, dict], cases_b: dict[tuple, dict]
) -> tuple[dict[tuple, float], list[float]]:
    """Per group, |ratio - 1| of the reference variant's medians between the runs.

    Returns (drift by group, all group drifts). Only groups where the reference case is in
    both runs, converged and valid, with a median, count.
    """
    by_group: dict[tuple, float] = {}
    for key, b in cases_b.items():
        a = cases_a.get(key)
        if a is None or b.get("variant") != REFERENCE_VARIANT:
            continue
        if any(_unconverged(c) or _invalid(c) for c in (a, b)):
            continue
        ma, mb = _median(a), _median(b)
        if ma and mb:
            # the move, plus how uncertain each of its two medians is
            by_group[_group(b)] = abs(mb / ma - 1) + _rel_ci(a) + _rel_ci(b)
    return by_group, list(by_group.values())


def _drift_for(case: dict, by_group: dict[tuple, float]) -> float:
    """The drift that applies to ``case`` (see the module rule)."""
    group = _group(case)
    if case.get("variant") != REFERENCE_VARIANT and group in by_group:
        return by_group[group]
    others = [d for g, d in by_group.items() if g != group]
    return float(np.median(others)) if others else 0.0


def _key_dict(case: dict) -> dict:
    out = {k: case[k] for k in KEY_FIELDS}
    out["shape_label"] = case.get("shape_label") or case["shape_key"]
    return out


def compare_runs(
    run_a: dict,
    run_b: dict,
    threshold: float = 0.05,
    confidence: float = 0.95,
    noise_floor: float = 0.02,
    resamples: int = 4000,
) -> Comparison:
    """Compare two runs as returned by :meth:`Ledger.get_run` (A: baseline, B: candidate)."""
    if not isinstance(threshold, int | float) or threshold < 0:
        raise ValueError(f"threshold: expected a fraction >= 0 (0.05 = 5%), got {threshold!r}")
    if not isinstance(noise_floor, int | float) or noise_floor < 0:
        raise ValueError(f"noise_floor: expected a fraction >= 0, got {noise_floor!r}")
    summary = ("id", "kind", "label", "created", "device_key", "device", "commit")
    result = Comparison(
        run_a={k: run_a.get(k) for k in summary},
        run_b={k: run_b.get(k) for k in summary},
        threshold=float(threshold),
        confidence=float(confidence),
        noise_floor=float(noise_floor),
    )
    if run_a.get("id") == run_b.get("id"):
        result.notes.append("baseline and candidate are the same run")
    if run_a.get("device_key") != run_b.get("device_key"):
        result.notes.append(
            f"runs were on different devices: {run_a.get('device_key')!r} vs "
            f"{run_b.get('device_key')!r}"
        )
    cases_a: dict[tuple, dict] = {}
    for c in run_a.get("cases", []):
        cases_a.setdefault(case_key(c), c)
    cases_b: dict[tuple, dict] = {}
    for c in run_b.get("cases", []):
        cases_b.setdefault(case_key(c), c)
    by_group, _ = machine_drift(cases_a, cases_b)
    ref_versions = [
        ((r.get("provenance") or {}).get("versions") or {}).get(REFERENCE_VARIANT)
        for r in (run_a, run_b)
    ]
    same_reference = ref_versions[0] == ref_versions[1]
    if not same_reference:
        result.notes.append(
            f"{REFERENCE_VARIANT} differs between the runs ({ref_versions[0]} vs "
            f"{ref_versions[1]}): its variant is not the same code, so no case is judged "
            "relative to it"
        )
    seen = set()
    for c in run_b.get("cases", []):
        key = case_key(c)
        if key in seen:
            continue
        seen.add(key)
        if key in cases_a:
            drift = _drift_for(c, by_group)
            refs = (None, None)
            if c.get("variant") != REFERENCE_VARIANT and same_reference:
                ref_key = (*key[:1], REFERENCE_VARIANT, *key[2:])
                refs = (cases_a.get(ref_key), cases_b.get(ref_key))
            result.cases.append(
                compare_cases(
                    cases_a[key], c, threshold, confidence, noise_floor, resamples, drift, *refs
                )
            )
        else:
            result.only_b.append(_key_dict(c))
    result.only_a = [_key_dict(c) for k, c in cases_a.items() if k not in seen]
    return result
