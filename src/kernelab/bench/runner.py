"""The bench runner: every subject of a case timed in one process, in interleaved order.

A subject is a zero-argument closure over inputs made outside the timed region (the op's
inputs, then the variant's ``prepare``); only the call is timed. For each case (op, shape,
dtype) the runner warms every subject up until its times are stable, then takes batches of
samples round-robin (the order rotating each round) until each subject meets the stopping
rule, and checks its timed outputs, its clocks and its caching before it reports a number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from kernelab.bench import integrity, rotation, threads
from kernelab.bench.cache import Flush, cache_bytes, tensor_bytes
from kernelab.bench.roofline import Ceilings, roofline
from kernelab.bench.shapes import dims_label as dims_label
from kernelab.bench.shapes import empty_inputs, inputs_key, select_shapes, unmatched
from kernelab.bench.shapes import explicit_shapes as explicit_shapes
from kernelab.bench.shapes import parse_dims as parse_dims
from kernelab.bench.stats import StopRule, stable, summarize
from kernelab.bench.telemetry import NoTelemetry, energy_per_call
from kernelab.core import dtype_name
from kernelab.core.runtime.backends import INTERPRETED

#: Default stopping rules: the CPU is noisier and slower to sample than a GPU.
CPU_RULE = StopRule(rel_ci=0.03, min_samples=10, min_time=0.05, max_time=0.5)
GPU_RULE = StopRule(rel_ci=0.01, min_samples=20, min_time=0.1, max_time=2.0)

#: On the CPU, shapes keep at most this many rows (tokens) unless asked otherwise: prefill
#: shapes of GPU size take seconds per call on a small host and add nothing to the method.
CPU_MAX_ROWS = 128

#: Wall time aimed at per batch of samples (between two looks at the stopping rule).
BATCH_S = 0.02
#: On the host, at most 25 samples a batch and at least 8 rounds before a converged case
#: stops: compare reads from its rounds how far the machine moves (ledger/compare.py).
HOST_BATCH_MAX, HOST_MIN_ROUNDS = 25, 8
#: A hot-mode sample holds enough back-to-back calls to last at least this long.
HOT_SAMPLE_S = 1e-4
WARMUP_MAX_S = 1.0
WARMUP_BATCHES = 20
#: Wall time of the host-clock cross-check, per repetition.
HOST_CHECK_S = 0.005
HOST_CHECK_TRIES = 7


@dataclass(frozen=True)
class Subject:
    """Something to time: a variant of an op or a user's candidate."""

    name: str
    fn: Callable[..., object]
    kind: str
    prepare: Callable[[dict], dict] | None = None


@dataclass
class BenchConfig:
    shape_set: str = "representative"
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype the op declares
    variants: tuple[str, ...] | None = None  # None: every variant that can be timed here
    mode: str = "auto"  # "auto" (cold for memory-bound shapes), "cold" or "hot"
    rule: StopRule | None = None  # None: CPU_RULE or GPU_RULE
    seed: int = 0
    compile: bool = False  # time "compile" variants on the CPU (slow to compile there)
    max_rows: int | None = None  # cap the batch dimension (None: CPU_MAX_ROWS on CPU; 0: none)
    shapes: tuple[str, ...] | None = None  # keep shapes whose label contains one of these
    #: explicit sizes (each a dict of every dim of the op): bench these instead of a set's
    dims: tuple[dict, ...] | None = None
    graph_calls: int = 100
    energy_window_s: float = 0.3  # 0 disables energy measurement
    budget_s: float | None = None  # stop starting new cases after this many seconds

    def __post_init__(self):
        if self.mode not in ("auto", "cold", "hot"):
            raise ValueError(f"mode: expected auto, cold or hot, got {self.mode!r}")
        if self.graph_calls < 1:
            raise ValueError(f"graph_calls: expected at least 1, got {self.graph_calls!r}")


@dataclass
class BenchResult:
    device: dict
    ceilings: dict
    config: dict
    cases: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False  # by a KeyboardInterrupt: ``cases`` are the finished ones


class BenchInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt during a bench, carrying the cases finished before it
    (``result``, a :class:`BenchResult` with ``interrupted`` set)."""

    def __init__(self, result: BenchResult):
        super().__init__("bench interrupted")
        self.result = result


def subjects_for(op, device_type: str, cfg: BenchConfig, candidate=None):
    """The subjects of ``op`` to time on ``device_type``, and what was left out and why."""
    subjects, skipped = [], []
    if candidate is not None:
        subjects.append(candidate)
    for variant in op.variants.values():
        if cfg.variants is not None and variant.name not in cfg.variants:
            continue
        ok, why = variant.runs_on(device_type)
        if not ok:
            skipped.append(f"{op.name}/{variant.name}: {why}")
            continue
        timed, why = variant.timed_on(device_type)
        if not timed:
            skipped.append(f"{op.name}/{variant.name}: {why}")
            continue
        asked = cfg.variants is not None and variant.name in cfg.variants
        unasked, why = variant.by_default(device_type)
        if not unasked and not (cfg.compile or asked):
            skipped.append(
                f"{op.name}/{variant.name}: {why}; ask with --compile or --variants {variant.name}"
            )
            continue
        subjects.append(Subject(variant.name, variant.fn, variant.kind, variant.prepare))
    if cfg.variants is not None:
        unknown = [v for v in cfg.variants if v not in op.variants]
        if unknown and candidate is None:
            raise ValueError(
                f"variants: op {op.name!r} has {sorted(op.variants)}, got unknown {unknown}"
            )
    return subjects, skipped


class _Run:
    """State of one subject during a case."""

    def __init__(self, subject: Subject, args: dict):
        self.subject, self.args = subject, args
        self.pristine = integrity.clone_inputs(args)
        self.current = args  # the input set of the next call (rotating in the timed loop)
        self.call = lambda: subject.fn(**self.current)
        self.rotation = None
        #: [round, index of the batch's first sample]: which samples each round took
        self.batches: list[list[int]] = []
        self.samples: list[float] = []
        self.elapsed = 0.0  # in the timer, flushes included
        self.wall = 0.0  # in the sampling loop, bookkeeping included
        self.calls = 1
        self.batch = 3
        self.done = False
        self.throttled = 0
        self.flags: list[str] = []
        self.metrics: dict = {}
        self.telemetry: list[dict] = []


def _first_call(run, op, shape, dtype, on_cpu: bool, skipped) -> bool:
    """The first call of a subject, alone; False if it must not be timed.

    On the CPU it runs with users' plain @triton.jit kernels interpreted (so that a candidate
    that launches them runs at all), and any kernel launched through the interpreter, by
    kernelab or by the candidate, is seen: such a subject is reported as not timed."""
    if not on_cpu:
        run.call()
        return True
    from kernelab.core.runtime.interpreter import interpreting_user_kernels

    with interpreting_user_kernels() as watch:
        run.call()
    if not watch.launches:
        return True
    if skipped is not None:
        skipped.append(
            f"{op.name}/{run.subject.name}: {INTERPRETED} (not timed: its first call on "
            f"{shape.label} {dtype_name(dtype)} launched {watch.launches} Triton kernel(s) "
            "through the interpreter)"
        )
    return False


def bench_case(
    op, shape, dtype, subjects, info, timer, ceilings: Ceilings, cfg, telemetry=None, skipped=None
):
    """Time every subject on one (shape, dtype); return one case dict per subject timed.

    A subject whose first call on the CPU launches a Triton kernel through the interpreter is
    not timed: a line saying so goes to ``skipped`` (a list), and it has no case. Nor is an
    empty shape (an input tensor with no elements: there is no work to time)."""
    telemetry = telemetry or NoTelemetry()
    device = "cpu" if info.type == "cpu" else f"cuda:{info.index}"
    rule = cfg.rule or (CPU_RULE if info.type == "cpu" else GPU_RULE)
    inputs = op.inputs(shape, dtype, device, seed=cfg.seed)
    empty = empty_inputs(inputs)
    if empty:
        if skipped is not None:
            skipped.append(
                f"{op.name} {shape.label} {dtype_name(dtype)}: not timed: an empty shape "
                f"({', '.join(empty)} without elements: no work)"
            )
        return []
    shape_key = shape.key or inputs_key(inputs)  # a user's op may have no sizes
    cost = op.cost(inputs)
    ref = integrity.Reference.build(op, inputs, dtype)
    cache_size, cache_source = cache_bytes(info)
    set_bytes = tensor_bytes(inputs)
    bound = roofline(cost, 1.0, ceilings, dtype)["bound"] or "memory"
    mode = cfg.mode if cfg.mode != "auto" else ("cold" if bound == "memory" else "hot")
    inplace = [n for n in op.contract.inplace if isinstance(inputs.get(n), torch.Tensor)]
    runs = []
    for s in subjects:
        args = s.prepare(dict(inputs)) if s.prepare else inputs
        runs.append(_Run(s, args))
    cold = mode == "cold" and set_bytes < 2 * cache_size  # else hot, or already past the cache
    flush = None

    def before_for(run):
        def before():
            for n in inplace:
                run.args[n].copy_(run.pristine[n])

        return before if inplace else None

    watch = threads.Watch(threads.torch_workers())
    # warm-up: first call alone (compilation, autotuning), then batches until stable
    for run in list(runs):
        watch.mark(("warm", run))
        t0 = time.perf_counter()
        if not _first_call(run, op, shape, dtype, info.type == "cpu", skipped):
            runs.remove(run)
            continue
        timer.sync()
        run.metrics["first_call_s"] = time.perf_counter() - t0
        prev, spent, batches = None, 0.0, 0
        # at least one batch (its median sizes the timed batches), whatever the time limit
        while not batches or (
            spent < min(WARMUP_MAX_S, rule.max_time) and batches < WARMUP_BATCHES
        ):
            batches += 1
            t0 = time.perf_counter()
            xs, _ = timer.samples(run.call, 5, run.calls)
            spent += time.perf_counter() - t0
            med = sorted(xs)[2]
            if mode == "hot" and not inplace and med * run.calls < HOT_SAMPLE_S:
                run.calls = min(1000, max(1, math.ceil(HOT_SAMPLE_S / max(med, 1e-9))))
                prev = None
                continue
            if stable(prev, med):
                break
            prev = med
        most = HOST_BATCH_MAX if timer.kind == "host" else 200
        run.batch = max(3, min(most, rule.max_samples, int(BATCH_S / max(med * run.calls, 1e-7))))
        run.metrics["warmup_s"] = spent
        before = before_for(run)
        if before is not None:
            before()  # restore in-place arguments after warm-up
    watch.mark(None)
    rots = rotation.build(
        op, shape, dtype, device, inputs, ref, runs, cfg.seed, cold, cache_size if cold else 0
    )
    cold_how = "none (hot)" if mode == "hot" else "working set exceeds 2x cache"
    if cold and all(len(r.copies) == len(r.slots) for r in rots):
        flush = Flush(device, cache_size)  # copies could not do (too many, or no memory)
        cold_how = f"flush {flush.nbytes / 2**20:.0f} MiB between samples"
    elif cold:
        held = sum(r.held_bytes() for r in {id(r.places): r for r in rots}.values())
        cold_how = f"rotate copies of the inputs ({held / 2**20:.0f} MiB)"
    for run, rot in zip(runs, rots, strict=True):
        run.rotation = rot
        run.flags.extend(f"rotation: {note}" for note in rot.notes)  # a warning, not invalid

    def rotate_for(run):
        def before():
            run.current = run.rotation.advance()  # in-place arguments restored with it
            if flush is not None:
                flush()

        return before

    # interleaved rounds
    snap0 = telemetry.snapshot()
    rnd = 0
    while not all(r.done for r in runs):
        order = runs[rnd % len(runs) :] + runs[: rnd % len(runs)]
        rnd += 1
        for run in order:
            if run.done:
                continue
            alive = set(integrity.threading.enumerate())
            watch.mark(("time", run))
            t0 = time.perf_counter()
            n = max(1, min(run.batch, rule.max_samples - len(run.samples)))
            spent = run.rotation.spent
            xs, result = timer.samples(run.call, n, run.calls, rotate_for(run), run.rotation.keep)
            run.elapsed += time.perf_counter() - t0 - (run.rotation.spent - spent)
            summary = summarize([*run.samples, *xs])
            rounds = len(run.batches) + 1 >= (HOST_MIN_ROUNDS if timer.kind == "host" else 1)
            run.done = rule.done(summary, run.elapsed) and (
                rounds or not rule.converged(summary, run.elapsed)
            )
            lazy = integrity.not_plain(result) if run.done else None  # before any read
            early = integrity.snapshot(result) if run.done and not lazy else None
            if telemetry.throttle():
                run.throttled += len(xs)
            run.batches.append([rnd - 1, len(run.samples)])
            run.samples.extend(xs)
            run.wall += time.perf_counter() - t0
            if run.done:
                run.metrics.update(summary.as_dict())
                run.metrics["sampling_wall_s"] = run.wall
                run.metrics["converged"] = rule.converged(summary, run.elapsed)
                run.metrics["batches"] = run.batches
                if lazy:
                    run.flags.append(f"wrong output of timed calls: {lazy}")
                _after_loop(run, result, early, alive, timer, inplace, lazy)
    watch.mark(None)
    snap1 = telemetry.snapshot()
    candidates = {r for r in runs if r.subject.kind == "candidate"}
    timed = {r: sum(r.samples) * r.calls for r in runs}
    for run, flags in threads.verdicts(watch, timed, candidates).items():
        run.flags.extend(flags)
    for run in runs:
        run.metrics["cpu"] = watch.summary(run)
        run.metrics["rotation"] = run.rotation.summary()

    for run in runs:
        _device_extras(run, timer, telemetry, cfg, info)
        if inplace:
            integrity.refill(run.args, run.pristine)
    _fresh_checks(op, shape, dtype, device, runs, timer, cfg)

    in_cache = mode == "hot" and set_bytes <= cache_size
    for run in runs:
        m = run.metrics
        roof = roofline(cost, m["median_s"], ceilings, dtype, in_cache=in_cache)
        m.update({k: v for k, v in roof.items() if k != "below_floor"})
        if m.get("joules_per_call"):
            m["flops_per_joule"] = cost.flops / m["joules_per_call"]
            m["bytes_per_joule"] = cost.bytes / m["joules_per_call"]
        if roof["below_floor"]:
            run.flags.append(
                f"below-floor: invalid: median {m['median_s'] * 1e6:.2f} µs < floor "
                f"{m['floor_s'] * 1e6:.2f} µs (work skipped, or a stale ceiling: "
                f"{m['ceiling_source']})"
            )
        if not m.get("converged"):
            run.flags.append(f"noise target not reached (±{m['rel_ci'] * 100:.1f}% of median)")
        if run.throttled:
            run.flags.append(f"throttled: {run.throttled} of {m['n']} samples")
        m["throttled_samples"] = run.throttled
        m["calls_per_sample"] = run.calls
        m["valid"] = not any(_invalidates(f) for f in run.flags)
    baseline = next((r for r in runs if r.subject.name == "torch"), None)
    cases = []
    for run in runs:
        m = run.metrics
        if baseline is not None and baseline.metrics["valid"] and m["valid"]:
            m["speedup_vs_torch"] = baseline.metrics["median_s"] / m["median_s"]
        for key in ("sm_clock_mhz", "temperature_c", "power_w"):
            if key in snap1:
                m[key] = snap1[key]
        cases.append(
            {
                "op": op.name,
                "variant": run.subject.name,
                "kind": run.subject.kind,
                "shape_key": shape_key,
                "shape_label": shape.label,
                "dtype": dtype_name(dtype),
                "device": info.key,
                "mode": mode,
                "cold_cache": cold_how,
                "cache_bytes": cache_size,
                "cache_source": cache_source,
                "threads": timer.threads,
                "timer": timer.kind,
                "seed": cfg.seed,
                "metrics": {
                    **m,
                    "threads": timer.threads,
                    "cold_cache": cold_how,
                    "cache_bytes": cache_size,
                },
                "flags": run.flags,
                "telemetry": {"before": snap0, "after": snap1, "source": telemetry.source},
                "samples": run.samples,
            }
        )
    return cases


#: Flags that make a number unusable (the rest are warnings about its quality).
_INVALID = (
    "below-floor",
    "wrong output",
    "work left running",
    "threads left running",
    "host/device disagreement",
    "results cached",
    "work on another thread",
    "background load",
    "slowed by background load",
)


def _invalidates(flag: str) -> bool:
    return flag.startswith(_INVALID)


def _after_loop(run, result, early, alive, timer, inplace, lazy=None) -> None:
    """Checks right after a subject's last timed batch, before anything else touches it.
    ``alive``: the threads before the batch. ``lazy``: why the outputs are not plain tensors
    (already flagged): they are not read."""
    left = integrity.settle(timer, alive)
    if not lazy and not integrity.bitwise_equal(early, integrity.snapshot(result)):
        run.flags.append("work left running after return: outputs changed after the call")
    if not lazy:  # each checked timed output against the inputs it was computed from
        run.flags.extend(f for f in run.rotation.check(result) if f)
    run.current = run.rotation.reset()  # the subject's own inputs, as written
    changed, spawned = False, 0
    if not lazy:
        changed, spawned, _ = integrity.returned_early(run.call, timer)
    if changed and not any(f.startswith("work left") for f in run.flags):
        run.flags.append("work left running after return: outputs changed after the call")
    if spawned or left:
        run.flags.append(f"threads left running after return: {max(spawned, left)}")
    med = run.metrics["median_s"]
    calls = max(3, min(1000, math.ceil(HOST_CHECK_S / max(med, 1e-9))))
    dispatch = timer.dispatch(run.call, calls) if timer.kind != "host" else 0.0
    # The same back-to-back loop, on the timer and on the host clock stopped only once all
    # work is done. Noise only ever adds time, hidden work adds it every time: keep the
    # fastest of each, interleaved, and try again (a few times) while they disagree.
    timed, host = math.inf, math.inf
    for _ in range(HOST_CHECK_TRIES):
        timed = min(timed, timer.samples(run.call, 1, calls)[0][0])
        host = min(host, integrity.host_clock(run.call, timer, calls)[0])
        if not integrity.host_disagrees(host, timed, dispatch):
            break
    run.metrics["host_clock_s"] = host
    if timer.kind != "host":
        run.metrics["host_dispatch_s"] = dispatch
    # On the host the timer is this same clock: what the cross-check could add (threads the
    # calls left running, work on threads that already existed) is caught above and by the
    # per-thread CPU time (threads.py), while under load two windows of the same clock part by
    # 4x on honest code (eager torch at load 9-13); so it judges device timers only.
    if timer.kind != "host" and integrity.host_disagrees(host, timed, dispatch):
        run.flags.append(
            f"host/device disagreement: synchronised host clock {host * 1e6:.1f} µs/call vs "
            f"timer {timed * 1e6:.1f} µs (work left on another stream or thread?)"
        )
    for n in inplace:
        run.args[n].copy_(run.pristine[n])


def _device_extras(run, timer, telemetry, cfg, info) -> None:
    """GPU only: graph-replay kernel time, launch overhead, energy per call."""
    if timer.kind == "host":
        return
    m = run.metrics
    try:
        kernel = timer.graph(run.call, cfg.graph_calls)
        hot, _ = timer.samples(run.call, 5, cfg.graph_calls)
        eager = sorted(hot)[2]
        m["graph_kernel_s"] = kernel
        m["eager_call_s"] = eager
        m["launch_overhead_s"] = eager - kernel if kernel is not None else None
    except Exception as exc:  # capture fails for code that syncs or allocates oddly
        timer.sync()
        m["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    if cfg.energy_window_s > 0 and telemetry.available:
        per = max(1, int(0.005 / max(m["median_s"], 1e-9)))
        energy = energy_per_call(run.call, timer, telemetry, per, cfg.energy_window_s)
        if energy:
            m["joules_per_call"] = energy["joules_per_call"]
            m["energy_window_s"] = energy["window_s"]


def _fresh_checks(op, shape, dtype, device, runs, timer, cfg) -> None:
    """Fresh values at the same addresses (pointer caches), then at new addresses. The
    tolerance is derived on the fresh values themselves: eager torch's error moves with the
    data (a quantization scale's error is one element's rounding), so one input set's
    tolerance does not carry to another."""
    fresh = op.inputs(shape, dtype, device, seed=cfg.seed + 1)
    ref = integrity.Reference.build(op, fresh, dtype)
    for run in runs:
        s = run.subject
        prepared = s.prepare(integrity.clone_inputs(fresh)) if s.prepare else fresh
        integrity.refill(run.args, prepared)
        before = set(integrity.threading.enumerate())
        result = run.call()
        integrity.settle(timer, before)
        if integrity.not_plain(result):  # flagged already; its outputs are not read
            integrity.refill(run.args, run.pristine)
            continue
        wrong = ref.check(result, run.args)
        if wrong:
            run.flags.append(f"results cached by pointer: fresh data at the same address: {wrong}")
        args = integrity.clone_inputs(prepared)  # new addresses; the old buffers stay alive
        result = s.fn(**args)
        integrity.settle(timer, before)
        wrong = ref.check(result, args)
        if wrong:
            run.flags.append(f"results cached by shape or call count: new inputs: {wrong}")
        integrity.refill(run.args, run.pristine)


def plan_cases(ops, device_type: str, cfg: BenchConfig, candidate=None):
    """The cases a bench runs, ``[(op, shape, dtype, subjects)]`` in order op → shape → dtype,
    and the lines saying what was left out. A selection that holds no case (a ``--shape``
    matching no label, a dtype no op takes, no variant timed here) is a ValueError naming
    what there is: never an empty run."""
    notes = []
    max_rows = cfg.max_rows
    if max_rows is None and device_type == "cpu":
        max_rows = CPU_MAX_ROWS
        notes.append(
            f"cpu: batch dimension capped at {CPU_MAX_ROWS} (--max-rows 0 for full shapes)"
        )
    plan, why = [], []
    for op in ops:
        subjects, skipped = subjects_for(op, device_type, cfg, candidate)
        notes.extend(skipped)
        dtypes = cfg.dtypes or op.dtypes
        for dt in dtypes:
            if dt not in op.dtypes:
                notes.append(f"{op.name}: does not take {dtype_name(dt)}")
        shapes = select_shapes(op, cfg, max_rows)
        takes = [d for d in dtypes if d in op.dtypes]
        if not shapes and cfg.shapes:
            why.append(unmatched(op, cfg))
            notes.append(f"{op.name}: {why[-1]}")
        elif not takes:
            names = ", ".join(dtype_name(d) for d in op.dtypes)
            why.append(f"--dtype: {op.name} takes {names}")
        elif not subjects:
            told = "; ".join(skipped) or "it has no variant"
            why.append(f"{op.name}: no variant selected can be timed on {device_type} ({told})")
        for shape in shapes if subjects else ():
            for dt in takes:
                plan.append((op, shape, dt, subjects))
    if not plan:
        raise ValueError(why[0] if len(why) == 1 else "nothing to bench: " + "; ".join(why))
    return plan, notes


def run(
    ops,
    info,
    cfg: BenchConfig,
    ceilings: Ceilings,
    *,
    timer,
    telemetry=None,
    candidate: Subject | None = None,
    progress=None,
) -> BenchResult:
    """Bench ``ops`` on the device ``info``; cases in order op → shape → dtype."""
    started = time.perf_counter()
    rule = cfg.rule or (CPU_RULE if info.type == "cpu" else GPU_RULE)
    result = BenchResult(
        info.as_dict(),
        ceilings.as_dict(),
        {
            "shape_set": cfg.shape_set,
            "mode": cfg.mode,
            "rule": rule.as_dict(),
            "seed": cfg.seed,
            "timer": timer.kind,
            "threads": timer.threads,
        },
    )
    plan, notes = plan_cases(ops, info.type, cfg, candidate)
    result.skipped.extend(notes)
    done = 0
    try:
        for op, shape, dt, subjects in plan:
            if cfg.budget_s is not None and time.perf_counter() - started > cfg.budget_s:
                result.skipped.append(
                    f"time budget of {cfg.budget_s:.0f} s spent: {len(plan) - done} case(s) not run"
                )
                break
            if progress:
                name = f"{op.name} {shape.label} {dtype_name(dt)}"
                progress(f"bench {name} ({done + 1}/{len(plan)})")
            case = replace(cfg, rule=rule)
            skipped = result.skipped
            result.cases.extend(
                bench_case(op, shape, dt, subjects, info, timer, ceilings, case, telemetry, skipped)
            )
            done += 1
    except KeyboardInterrupt as exc:
        result.seconds = time.perf_counter() - started
        result.interrupted = True
        result.skipped.append(
            f"interrupted: {done} of {len(plan)} case(s) finished, the rest not run"
        )
        raise BenchInterrupted(result) from exc
    result.seconds = time.perf_counter() - started
    return result
