"""Which cases a verify run covers, and the Python API that runs them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager

import torch

from kernelab._host import memory_available as host_memory_available
from kernelab._host import torch_threads
from kernelab._loader import check_signature
from kernelab.core import dtype_name
from kernelab.core.sampling import two_tiles
from kernelab.ops import Op, all_ops, get
from kernelab.verify import _full
from kernelab.verify._case import Subject, run_case
from kernelab.verify._types import Report

#: Trials per shape and dtype (the first: two calls of the candidate, later ones one; see
#: _case).
DEFAULT_TRIALS = 2

#: On CPU, batch sizes (rows, tokens) are cut to these for the interpreter; labels show it.
CPU_CAPS = {"representative": 4}
CPU_CAP_OTHER = 32


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def new_seed() -> int:
    """A fresh run seed (METHOD.md: the default seed changes from run to run)."""
    return secrets.randbelow(2**31 - 1)


def _ops(ops) -> list[Op]:
    if ops is None:
        return all_ops()
    if isinstance(ops, str | Op):
        ops = [ops]
    return [o if isinstance(o, Op) else get(o) for o in ops]


def _shape_sets(op: Op, shape_sets) -> list[str]:
    if isinstance(shape_sets, str):
        shape_sets = [shape_sets]
    names: list[str] = []
    for s in shape_sets:
        if s == "all":
            names += list(op.shape_sets)
        elif s in op.shape_sets:
            names.append(s)
        else:
            raise ValueError(
                f"shape_sets: expected 'all' or one of {sorted(op.shape_sets)}, got {s!r}"
            )
    return list(dict.fromkeys(names))


def _dtype(d) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    found = getattr(torch, str(d), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"dtypes: expected dtype names such as bfloat16, got {d!r}")
    return found


def _cap_of(op: Op, shape, shape_set: str, cap: int) -> int:
    """The cap for one shape: an edge shape (any set but representative) of an op that
    declares its tiles is never cut below two tiles, and keeps its last partial tile."""
    tiles = op.sampling.tile if op.sampling is not None else {}
    tile = tiles.get(shape.batch_dim) if shape.batch_dim is not None else None
    if shape_set == "representative" or not tile:
        return cap
    return two_tiles(int(shape.dims[shape.batch_dim]), cap, tile)


def _capped(op: Op, shape_set: str, device, cap: int | None) -> list[tuple]:
    """(declared, capped) for every shape of a set."""
    if cap is None:
        cap = CPU_CAPS.get(shape_set, CPU_CAP_OTHER) if torch.device(device).type == "cpu" else 0
    return [
        (s, s.reduced(_cap_of(op, s, shape_set, cap)) if cap else s) for s in op.shapes(shape_set)
    ]


def shapes_for(op: Op, shape_set: str, device, cap: int | None):
    """The shapes of a set, batch size capped on CPU, duplicates (after capping) dropped."""
    seen, out = set(), []
    for _, r in _capped(op, shape_set, device, cap):
        if r.key not in seen:
            seen.add(r.key)
            out.append(r)
    return out


def full_shapes_for(op: Op, shape_set: str, device, cap: int | None):
    """The shapes of a set whose batch size a cap cut, as declared (for the full-size cases),
    when the op declares its outputs row-independent."""
    if op.sampling is None:
        return []
    seen, out = set(), []
    for s, r in _capped(op, shape_set, device, cap):
        if s.batch_dim and r.dims[s.batch_dim] != s.dims[s.batch_dim] and s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


#: ``tier`` of :func:`verify`: "full" runs every shape of the sets on every dtype; "quick"
#: (``kernelab run``'s default) runs every edge shape and the smallest and the largest
#: representative one, each on one dtype, the dtypes taken in turn (each dtype of the op on
#: some shape): the edge sets are where every tile remainder, empty input and kernel path is
#: crossed at the smallest size, and the representative ends keep the real widths.
TIERS = ("quick", "full")


def _elements(op: Op, shape) -> int:
    """Input elements of a shape (on meta tensors, nothing allocated): the quick tier's
    measure of a case's size, and its budget's."""
    try:
        inputs = op.inputs(shape, op.dtypes[0], "meta")
    except Exception:  # an input generator that cannot work on "meta"
        return _numel(shape.dims)
    return sum(v.numel() for v in inputs.values() if isinstance(v, torch.Tensor))


def quick_cases(op: Op, shape_sets, device, cap: int | None, dtypes=None) -> list[tuple]:
    """(shape set, shape, dtype) of the quick tier (``TIERS``), in the order they run; the
    dtypes (default: the op's) taken in turn over the shapes."""
    dtypes = list(op.dtypes if dtypes is None else dtypes)
    cases, turn = [], 0
    for shape_set in shape_sets:
        shapes = shapes_for(op, shape_set, device, cap)
        if shape_set == "representative" and len(shapes) > 2:
            by_size = sorted(shapes, key=lambda s: _elements(op, s))
            ends = {by_size[0].key, by_size[-1].key}
            shapes = [s for s in shapes if s.key in ends]
        for shape in shapes:
            cases.append((shape_set, shape, dtypes[turn % len(dtypes)]))
            turn += 1
    return cases


#: Each op's share of the report card's quick tier on CPU (``kernelab run``: all ops under 5
#: minutes of a 2-core machine, docs/verify.md): cases, and input elements summed over them
#: (a case's interpreted work grows with them; a paged KV cache of a few thousand slots is the
#: largest). Counted on meta tensors by ``quick_over_budget``, which the registry's test runs.
QUICK_BUDGET = {"cases": 24, "elements": 2**24}


def quick_over_budget(op: Op, budget=None) -> list[str]:
    """Why an op's quick tier on CPU exceeds its share (``QUICK_BUDGET``), one line each."""
    budget = QUICK_BUDGET if budget is None else budget
    cases = quick_cases(op, list(op.shape_sets), "cpu", None)
    elements = sum(_elements(op, shape) for _, shape, _ in cases)
    over = []
    if len(cases) > budget["cases"]:
        over.append(f"{op.name}: {len(cases)} quick cases, over its {budget['cases']}")
    if elements > budget["elements"]:
        over.append(f"{op.name}: {elements} input elements, over its {budget['elements']}")
    return over


@contextmanager
def cpu_threads(device):
    """On CPU, torch single-threaded while verify runs (restored afterwards).

    Cases on CPU are small (capped batch sizes); intra-op threads only add synchronisation, and
    on a shared machine they spin against other processes: on a loaded 2-core machine the whole
    default verify of RMSNorm took 56 s with 2 threads and 17 s with 1 (benchmarks/bench_verify.py).
    """
    if torch.device(device).type != "cpu":
        yield
        return
    with torch_threads(1):
        yield


def run_subject(
    report: Report,
    op: Op,
    subject: Subject,
    shape_sets: Sequence[str],
    dtypes: Iterable[torch.dtype],
    device,
    trials: int,
    cap: int | None,
    baseline: Callable | None,
    progress: Callable[[str], None] | None = None,
    shapes: Sequence | None = None,
    tier: str = "full",
) -> None:
    from kernelab.core.runtime.interpreter import numeric_warnings

    before = numeric_warnings()
    with cpu_threads(device):
        _run_subject(
            report, op, subject, shape_sets, dtypes, device, trials, cap, baseline, progress,
            shapes, tier,
        )  # fmt: skip
    for message, n in numeric_warnings().items():
        if n > before.get(message, 0):
            seen = report.interpreter_warnings.get(message, 0)
            report.interpreter_warnings[message] = seen + n - before.get(message, 0)


def _run_subject(
    report, op, subject, shape_sets, dtypes, device, trials, cap, baseline, progress, shapes,
    tier="full",
) -> None:  # fmt: skip
    from kernelab.core.runtime.interpreter import interpreted_launches

    launches = interpreted_launches()
    dtypes = list(dtypes)
    quick = None
    if tier == "quick" and shapes is None and dtypes:
        quick = {(n, sh.key): d for n, sh, d in quick_cases(op, shape_sets, device, cap, dtypes)}
    dist_offset, turn = 0, 0
    for shape_set in shape_sets:
        chosen = shapes_for(op, shape_set, device, cap) if shapes is None else list(shapes)
        if quick is not None:
            chosen = [sh for sh in chosen if (shape_set, sh.key) in quick]
        for shape in chosen:
            # Through an interpreter (known, or seen so far), each shape's partial-update and
            # allocating calls are made on one dtype, the dtypes taken in turn: they made a
            # capped case 5 calls instead of 3, and the default verify 1.4-1.6x as long
            slow = subject.interpreted
            if slow is None:
                slow = interpreted_launches() > launches
            pick = dtypes[turn % len(dtypes)] if dtypes else None
            turn += 1
            for dtype in dtypes if quick is None else [quick[(shape_set, shape.key)]]:
                why = subject.supports(shape) if subject.supports is not None else None
                if why:
                    report.skipped.append(f"{op.name}/{subject.name} {shape.label}: {why}")
                    continue
                too_big = reference_too_big(op, shape, dtype)
                if too_big:
                    report.skipped.append(f"{op.name}/{subject.name} {shape.label}: {too_big}")
                    continue
                if progress:
                    progress(f"verify {op.name}/{subject.name} {shape_set} {shape.label} {dtype}")
                report.cases.append(
                    run_case(
                        op,
                        subject,
                        shape,
                        shape_set,
                        dtype,
                        device,
                        report.seed,
                        trials,
                        baseline,
                        dist_offset,
                        extra=not slow or dtype == pick,
                    )
                )
                dist_offset += trials
    interpreted = subject.interpreted
    if interpreted is None:
        interpreted = interpreted_launches() > launches
    if interpreted or shapes is not None or baseline is None or not dtypes or quick is not None:
        return
    _run_full(report, op, subject, shape_sets, dtypes, device, cap, baseline, progress)


def _run_full(report, op, subject, shape_sets, dtypes, device, cap, baseline, progress) -> None:
    """Each shape a cap cut, once at full size (``_full``), the dtypes taken in turn."""
    turn, seen = 0, set()
    for shape_set in shape_sets:
        for declared in full_shapes_for(op, shape_set, device, cap):
            dtype = dtypes[turn % len(dtypes)]
            turn += 1
            why = subject.supports(declared) if subject.supports is not None else None
            if why:
                continue  # said for the capped case
            try:
                held = op.sampling.holds(op.inputs(declared, dtype, "meta"))
            except Exception:
                held = False
            if not held:
                continue
            shape, cuts = _full.budget_cut(op, declared, dtype)
            if shape.key in seen:  # another declared shape cut to the same sizes
                continue
            seen.add(shape.key)
            for note in cuts:
                report.cut.append(
                    f"{op.name}/{subject.name} {declared.label} {dtype_name(dtype)}: full-size "
                    f"case cut to {note} (over {_full.MAX_ELEMENTS:.3g} input elements or "
                    f"{_full.MAX_FLOPS:.3g} FLOPs)"
                )
            if progress:
                progress(f"verify {op.name}/{subject.name} {shape_set} {shape.label} {dtype}")
            report.cases.append(
                _full.run_full_case(
                    op, subject, shape, shape_set, dtype, device, report.seed, baseline, turn
                )
            )


#: Share of the host's available memory a case's float64 reference may take.
REFERENCE_MEMORY_SHARE = 0.25


def reference_too_big(op: Op, shape, dtype) -> str | None:
    """Why a case cannot be verified on this host, or None. The float64 reference holds a CPU
    copy of every input (and each in-place argument twice) in float64: a full-size paged KV
    cache of 128k tokens × 64 sequences is over 100 GB. Sized on meta tensors, nothing
    allocated."""
    try:
        inputs = op.inputs(shape, dtype, "meta")
    except Exception:
        return None
    need = sum(
        v.numel() * 8 * (2 if k in op.contract.inplace else 1)
        for k, v in inputs.items()
        if isinstance(v, torch.Tensor)
    )
    have = host_memory_available()
    if need <= REFERENCE_MEMORY_SHARE * have:
        return None
    return (
        f"its float64 reference needs {need / 2**30:.1f} GiB of host memory, more than "
        f"{REFERENCE_MEMORY_SHARE:.0%} of the {have / 2**30:.1f} GiB available: not verified here"
    )


def candidate_on(fn: Callable, device) -> Callable:
    """A user's candidate as verify calls it: on the CPU, plain ``@triton.jit`` kernels it
    launches run through kernelab's interpreter (no TRITON_INTERPRET needed)."""
    if torch.device(device).type != "cpu":
        return fn
    from kernelab.core.runtime.interpreter import interpreted_on_cpu

    return interpreted_on_cpu(fn)


def _check_common(trials: int, seed) -> None:
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials: expected a positive integer, got {trials!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")


def verify(
    ops=None,
    variants: Sequence[str] | None = None,
    shape_sets: str | Sequence[str] = ("representative", "edge"),
    dtypes: Sequence | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    trials: int = DEFAULT_TRIALS,
    cap: int | None = None,
    progress: Callable[[str], None] | None = None,
    tier: str = "full",
) -> Report:
    """Verify registered ops' variants; see the package docstring for what is checked.

    ``tier``: "full" (every shape of the sets on every dtype, and the full-size cases) or
    "quick" (``TIERS``: the report card's; no full-size cases).

    ``variants`` None: every variant that runs here, except ``compile`` on CPU (inductor
    builds C++, which is slow: name it to include it). ``cap``: batch size limit (None: 4 for
    representative and 32 for other shape sets on CPU, none on GPUs; 0: none).
    """
    _check_common(trials, seed)
    if tier not in TIERS:
        raise ValueError(f"tier: expected one of {list(TIERS)}, got {tier!r}")
    device = str(device or default_device())
    dev_type = torch.device(device).type
    seed = new_seed() if seed is None else seed
    selected = _ops(ops)
    report = Report(
        seed, device, trials, [shape_sets] if isinstance(shape_sets, str) else list(shape_sets)
    )
    started = time.perf_counter()
    if variants is not None:
        known = {v for op in selected for v in op.variants}
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise ValueError(f"variants: expected names among {sorted(known)}, got {unknown}")
    wanted_dtypes = None if dtypes is None else [_dtype(d) for d in dtypes]
    for op in selected:
        sets = _shape_sets(op, shape_sets)
        op_dtypes = (
            op.dtypes if wanted_dtypes is None else [d for d in wanted_dtypes if d in op.dtypes]
        )
        for d in wanted_dtypes or ():
            if d not in op.dtypes:
                report.skipped.append(f"{op.name}: dtype {dtype_name(d)} not supported by the op")
        baseline = op.eager.fn if op.eager is not None else None
        for variant in op.variants.values():
            if variants is not None and variant.name not in variants:
                continue
            ok, why = variant.runs_on(dev_type)
            if not ok:
                report.skipped.append(f"{op.name}/{variant.name}: {why}")
                continue
            unasked, why = variant.by_default(dev_type)
            if not unasked and variants is None:
                report.skipped.append(
                    f"{op.name}/{variant.name}: {why}; ask for it with --variant {variant.name}"
                )
                continue
            subject = Subject(
                variant.name,
                variant.fn,
                variant.prepare,
                variant.supports,
                interpreted=variant.interpreted,
            )
            run_subject(
                report, op, subject, sets, op_dtypes, device, trials, cap, baseline, progress,
                tier=tier,
            )  # fmt: skip
    report.seconds = time.perf_counter() - started
    return report


def input_names(op: Op) -> list[str]:
    """The argument names an op passes (its input dict's keys, on its first shape)."""
    shape = min(
        (s for name in op.shape_sets for s in op.shapes(name)),
        key=lambda s: _numel(s.dims),
    )
    try:
        return list(op.inputs(shape, op.dtypes[0], "meta", seed=0).keys())
    except Exception:  # an input generator that cannot work on "meta": use the CPU
        return list(op.inputs(shape, op.dtypes[0], "cpu", seed=0).keys())


def _numel(dims) -> int:
    n = 1
    for v in dims.values():
        n *= max(int(v), 1)
    return n


def verify_candidate(
    fn: Callable,
    op,
    shape_sets: str | Sequence[str] = ("representative", "edge"),
    dtypes: Sequence | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    trials: int = DEFAULT_TRIALS,
    cap: int | None = None,
    name: str = "candidate",
    progress: Callable[[str], None] | None = None,
    shapes: Sequence | None = None,
) -> Report:
    """Verify any callable with a registered op's signature (called as ``fn(**inputs)``).

    On the CPU, plain ``@triton.jit`` kernels that ``fn`` launches run through kernelab's
    interpreter, with its fixes (``kernelab.core.runtime.interpreter``).

    ``shapes``: explicit ``Shape`` objects instead of the op's shape sets (labelled "given").
    """
    _check_common(trials, seed)
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    (op,) = _ops(op)
    check_signature(fn, input_names(op))
    device = str(device or default_device())
    seed = new_seed() if seed is None else seed
    sets = [shape_sets] if isinstance(shape_sets, str) else list(shape_sets)
    report = Report(seed, device, trials, ["given"] if shapes is not None else sets)
    started = time.perf_counter()
    op_dtypes = op.dtypes if dtypes is None else [_dtype(d) for d in dtypes]
    for d in op_dtypes:
        if d not in op.dtypes:
            raise ValueError(
                f"dtypes: op {op.name!r} takes {[dtype_name(x) for x in op.dtypes]}, "
                f"got {dtype_name(d)}"
            )
    baseline = op.eager.fn if op.eager is not None else None
    run_subject(
        report,
        op,
        Subject(name, candidate_on(fn, device)),
        ["given"] if shapes is not None else _shape_sets(op, shape_sets),
        op_dtypes,
        device,
        trials,
        cap,
        baseline,
        progress,
        shapes,
    )
    report.seconds = time.perf_counter() - started
    return report
