"""The Python API of bench: ceilings for a device, candidates, one call to bench ops."""

from __future__ import annotations

import torch

from kernelab.bench import roofline
from kernelab.bench.cache import cache_bytes
from kernelab.bench.runner import (
    BenchConfig,
    BenchInterrupted,
    BenchResult,
    Subject,
    plan_cases,
    run,
)
from kernelab.bench.telemetry import open_telemetry
from kernelab.bench.timers import timer_for


def open_ledger(url: str | None = None):
    """The results ledger, or None when the ledger package is not available."""
    try:
        from kernelab import ledger
    except ImportError:
        return None
    return ledger.open(url=url)


def ceilings_for(
    info, db=None, measure_if_missing: bool = True, progress=None, remeasure: bool = True
):
    """Stored measured ceilings, else datasheet peaks; a CPU is measured now.

    A CPU's speed on a shared host moves with its neighbours, and a ceiling measured in a slow
    moment makes honest runs look faster than the hardware (and be marked invalid). So a CPU
    is measured at every call (about a second) and each ceiling is the best of the stored and
    the new value; a better one is stored. ``measure_if_missing=False`` never measures (stored
    ceilings, else datasheet peaks, else none); ``remeasure=False`` measures a CPU only when
    nothing is stored for it (many short runs in a row, after `kernelab ceilings`). Returns
    (Ceilings, note): the note says what was done ("" when stored ceilings were used as they
    are).
    """
    stored = db.ceilings(info.key) if db is not None else {}
    if info.type != "cpu" or not measure_if_missing or (stored and not remeasure):
        if stored:
            return roofline.resolve(info, stored), ""
        if info.spec is not None:
            return roofline.resolve(info), (
                f"no measured ceilings stored for {info.key}: using datasheet peaks "
                "(run `kernelab ceilings` to measure)"
            )
        return roofline.resolve(info), (
            f"no ceilings for {info.key}: no floor, no % of roofline "
            "(run `kernelab ceilings` to measure)"
        )
    best = dict(stored)
    raised = []
    unstored = None
    for r in roofline.measure(info, cache_bytes(info)[0], progress):
        old = stored.get(r["name"])
        if old is None or r["value"] > old["value"]:
            best[r["name"]] = {**r, "measured": "now"}
            raised.append(r["name"])
            if db is not None and unstored is None:
                try:
                    db.put_ceiling(info.key, r["name"], r["value"], r["unit"], r["source"])
                except Exception as exc:  # a full disk: bench on with them, unstored
                    unstored = f"{type(exc).__name__}: {exc}"
    if not stored:
        note = f"no ceilings stored for {info.key}: measured them now"
        note += " and stored them" if db is not None and unstored is None else ""
    elif raised:
        note = f"ceilings of {info.key} measured now, higher than stored: {', '.join(raised)}"
    else:
        note = ""
    if unstored:
        note += f" (the ledger could not store them: {unstored})"
    return roofline.resolve(info, best), note


def candidate(spec: str, op) -> Subject:
    """A user's ``file.py:function`` as a subject for ``op`` (its signature is checked)."""
    from kernelab._loader import check_signature, load_callable

    fn = load_callable(spec)
    shape = op.shapes("representative")[0]
    names = list(op.inputs(shape, op.dtypes[0], "meta").keys())
    check_signature(fn, names)
    name = spec.rpartition(":")[2]
    return Subject(f"candidate:{name}", fn, "candidate")


def bench(
    ops,
    device: str | None = None,
    cfg: BenchConfig | None = None,
    *,
    candidate: Subject | None = None,
    ceilings=None,
    db=None,
    progress=None,
    remeasure: bool = True,
) -> BenchResult:
    """Bench ``ops`` (Op objects) on ``device``; see :class:`BenchConfig` for the knobs.
    ``remeasure``: see :func:`ceilings_for`."""
    from kernelab.hardware import detect

    info = detect(device)
    cfg = cfg or BenchConfig()
    plan_cases(ops, info.type, cfg, candidate)  # a selection of nothing fails before any work
    note = ""
    if ceilings is None:
        ceilings, note = ceilings_for(info, db, progress=progress, remeasure=remeasure)
    dev = "cpu" if info.type == "cpu" else f"cuda:{info.index}"
    timer = timer_for(dev, threads=torch.get_num_threads())
    telemetry = open_telemetry(info)
    try:
        result = run(
            ops,
            info,
            cfg,
            ceilings,
            timer=timer,
            telemetry=telemetry,
            candidate=candidate,
            progress=progress,
        )
    except BenchInterrupted as exc:  # the finished cases travel with it
        if note:
            exc.result.skipped.insert(0, note)
        raise
    if note:
        result.skipped.insert(0, note)
    if info.type != "cpu" and not telemetry.available:
        result.skipped.append(
            "telemetry: install nvidia-ml-py (NVIDIA) or amdsmi (AMD) for clocks, power, energy"
        )
    return result


def floors(spec, ops, shape_set: str = "representative", dtypes=None, dims=None) -> list[dict]:
    """Datasheet speed-of-light floor of every shape of ``ops`` on the device ``spec``;
    ``dims``: explicit sizes instead of the set's shapes (each a dict naming every dim)."""
    from kernelab.bench.runner import explicit_shapes

    ceil = roofline.datasheet(spec)
    rows = []
    for op in ops:
        shapes = explicit_shapes(op, list(dims), shape_set) if dims else op.shapes(shape_set)
        for shape in shapes:
            for dt in dtypes or op.dtypes:
                if dt not in op.dtypes:
                    continue
                cost = op.cost(op.inputs(shape, dt, "meta"))
                r = roofline.roofline(cost, 1.0, ceil, dt)
                rows.append(
                    {
                        "op": op.name,
                        "shape_label": shape.label,
                        "shape_key": shape.key,
                        "dtype": str(dt).removeprefix("torch."),
                        "bytes": cost.bytes,
                        "flops": cost.flops,
                        "floor_s": r["floor_s"],
                        "bound": r["bound"],
                        "ceiling_source": r["ceiling_source"],
                    }
                )
    return rows
