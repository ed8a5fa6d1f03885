"""Running one task in a worker: the instrument's Python API, and what the ledger will store.

:func:`execute` returns ``{"kind", "cases", "provenance", "summary"}``: ``kind``, ``cases`` and
``provenance`` are :meth:`kernelab.ledger.Ledger.record_run`'s arguments (the same cases the
single command produces), ``summary`` a few words for people. Workers never write to the
ledger: the process that runs the sweep does (one writer per sweep).
"""

from __future__ import annotations

import functools

import orjson

from kernelab.sweep.tasks import Task


@functools.cache
def _base_provenance(device: str) -> dict:
    from kernelab import ledger

    return ledger.provenance(device)


def _provenance(device: str, task: Task, **extra) -> dict:
    from kernelab.ledger import now_iso

    prov = dict(_base_provenance(device))
    prov["time"] = now_iso()
    prov["sweep_task"] = {**task.row(), "params": orjson.loads(task.params)}
    prov.update(extra)
    return prov


def _shape(op, task: Task):
    sizes = orjson.loads(task.params).get("sizes")
    if sizes:  # explicit sizes: the shapes they make with the set's options
        from kernelab.bench.runner import explicit_shapes

        shapes = explicit_shapes(op, [sizes], task.shape_set)
    else:
        shapes = op.shapes(task.shape_set)
    for s in shapes:
        if s.key == task.shape_key:
            return s
    raise LookupError(f"{task.op}: no shape {task.shape_key!r} in set {task.shape_set!r}")


def _config(op, shape, dtype, task: Task):
    if task.config == "default":
        return None
    from kernelab.sweep.tasks import config_text

    for c in op.tuning_space(shape, dtype):
        if config_text(c) == task.config:
            return c
    raise LookupError(f"{task.op}: config {task.config} is not in the tuning space any more")


class _Narrowed:
    """An op seen through one shape and one config: what ``inspect.ops.plan`` plans for it
    are exactly the jobs ``kernelab inspect`` plans for that shape and config."""

    def __init__(self, op, shape, config):
        self._op, self._shape, self._config = op, shape, config
        self.tuning_space = None if config is None else (lambda s, d: [config])

    def shapes(self, shape_set):
        return [self._shape]

    def __getattr__(self, name):
        return getattr(self._op, name)


def _device(task: Task) -> str:
    """The torch device a task runs on; a GPU task checks that it got the type it asked for."""
    if not task.gpu:
        return "cpu"
    from kernelab.hardware import detect

    info = detect("cuda") if _cuda() else None
    if info is None or info.type == "cpu":
        raise RuntimeError(f"task asked for a {task.target} GPU; this worker has no GPU")
    if task.target.lower() not in info.name.lower():
        raise RuntimeError(f"task asked for a {task.target} GPU; this worker has {info.name}")
    return f"cuda:{info.index}"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _inspect(task: Task) -> dict:
    from kernelab import ops as registry
    from kernelab.inspect.ops import plan
    from kernelab.inspect.report import analyze_jobs
    from kernelab.inspect.targets import TARGETS

    op = registry.get(task.op)
    dtype = _dtype(task.dtype)
    shape = _shape(op, task)
    config = _config(op, shape, dtype, task)
    p = plan(
        [_Narrowed(op, shape, config)],
        [TARGETS[task.target]],
        space=config is not None,
        dtypes=[task.dtype],
        shape_set=task.shape_set,
    )
    if p.skipped and not p.jobs:
        raise RuntimeError("; ".join(p.skipped))
    reports = analyze_jobs(p.jobs, 1, True)
    cases = []
    for r in reports:
        d = r.as_dict()
        d.pop("cached")
        f = r.facts or {}
        cases.append(
            {
                "op": task.op,
                "variant": task.variant,
                "shape_key": task.shape_key,
                "shape_label": r.label,
                "dtype": task.dtype,
                "device": task.target,
                "mode": "static",
                "metrics": {
                    "kernel": r.kernel,
                    "registers": f.get("registers"),
                    "spill_bytes": f.get("spill_bytes") or 0,
                    "shared_bytes": f.get("shared_bytes"),
                    "occupancy": (r.occupancy or {}).get("occupancy"),
                    "report": d,
                },
                "flags": [f"{x.severity}:{x.kind}" for x in r.findings]
                + (["error"] if r.error else [])
                + (["unsupported"] if r.unsupported else []),
            }
        )
    ok = sum(r.ok and not r.unsupported for r in reports)
    summary = f"{len(reports)} kernel(s), {ok} clean, {sum(r.cached for r in reports)} cached"
    return {
        "kind": "inspect",
        "cases": cases,
        "provenance": _provenance("cpu", task, triton=reports[0].triton if reports else None),
        "summary": summary,
    }


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _verify(task: Task) -> dict:
    from kernelab.verify import ledger_cases, run_provenance, verify

    params = orjson.loads(task.params)
    device = _device(task)
    kw = {"trials": params["trials"]} if params.get("trials") else {}
    report = verify(
        [task.op],
        variants=[task.variant],
        shape_sets=[task.shape_set],
        dtypes=[task.dtype],
        device=device,
        seed=params["seed"],
        **kw,
    )
    cases = ledger_cases(report, task.target)
    failed = sum(not c.passed for c in report.cases)
    prov = _provenance(device, task, **run_provenance(report))
    return {
        "kind": "verify",
        "cases": cases,
        "provenance": prov,
        "summary": f"{len(cases)} case(s), {failed} failed",
    }


def _bench(task: Task) -> dict:
    from kernelab import ledger
    from kernelab.bench import bench
    from kernelab.bench.runner import BenchConfig
    from kernelab.hardware import detect

    params = orjson.loads(task.params)
    device = _device(task)
    cfg = BenchConfig(
        shape_set=task.shape_set,
        dtypes=(_dtype(task.dtype),),
        variants=None if task.variant == "*" else tuple(task.variant.split("+")),
        mode=params.get("mode") or "auto",
        max_rows=params.get("max_rows"),
        shapes=tuple(params.get("shapes") or ()) or None,
        dims=tuple(params["sizes"]) if params.get("sizes") else None,
    )
    from kernelab import ops as registry

    result = bench([registry.get(task.op)], device, cfg)
    about = {"config": result.config, "ceilings": result.ceilings}  # as `kernelab bench`
    prov = ledger.provenance(detect(device), bench=about)
    prov["sweep_task"] = {**task.row(), "params": params}
    prov["skipped"] = result.skipped
    return {
        "kind": "bench",
        "cases": result.cases,
        "provenance": prov,
        "summary": f"{len(result.cases)} case(s) timed",
    }


def _tune(task: Task) -> dict:
    from kernelab import ops as registry
    from kernelab.tune import tune

    op = registry.get(task.op)
    dtype = _dtype(task.dtype)
    shape = _shape(op, task)
    device = _device(task)  # a GPU task checks it got the GPU type it asked for
    if task.gpu:  # searched by timing on this GPU, pruned for its own architecture
        from kernelab.tune import gpu_measure

        (result,) = tune(op, [shape], dtype, device, measure=gpu_measure())
    else:  # ranked statically for a compile target
        (result,) = tune(op, [shape], dtype, "cpu", target=task.target)
    d = result.as_dict()
    case = {
        "op": task.op,
        "variant": task.variant,
        "shape_key": task.shape_key,
        "shape_label": shape.label,
        "dtype": task.dtype,
        "device": task.target,
        "mode": "tune",
        "metrics": {"space": d["space"], "survivors": d["survivors"], "result": d},
        "flags": sorted(d["pruned"]),
    }
    return {
        "kind": "tune",
        "cases": [case],
        "provenance": _provenance(device, task),
        "summary": f"{d['survivors']}/{d['space']} configs left after pruning",
    }


def _floors(task: Task) -> dict:
    from kernelab import ops as registry
    from kernelab.bench import floors
    from kernelab.hardware.devices import lookup

    params = orjson.loads(task.params)
    wanted = params.get("shapes") or ()
    rows = floors(
        lookup(task.target), [registry.get(task.op)], task.shape_set, [_dtype(task.dtype)],
        dims=params.get("sizes"),
    )  # fmt: skip
    rows = [r for r in rows if not wanted or any(w in r["shape_label"] for w in wanted)]
    cases = [
        {
            "op": r["op"],
            "variant": task.variant,
            "shape_key": r["shape_key"],
            "shape_label": r["shape_label"],
            "dtype": r["dtype"],
            "device": task.target,
            "mode": "floor",
            "metrics": {k: r[k] for k in ("bytes", "flops", "floor_s", "bound", "ceiling_source")},
            "flags": [],
        }
        for r in rows
    ]
    return {
        "kind": "floors",
        "cases": cases,
        "provenance": _provenance("cpu", task),
        "summary": f"{len(cases)} floor(s)",
    }


_KINDS = {
    "inspect": _inspect,
    "verify": _verify,
    "bench": _bench,
    "tune": _tune,
    "floors": _floors,
}


def execute(task: Task) -> dict:
    """Run ``task`` here and return what the ledger will store (see the module docstring)."""
    return _KINDS[task.kind](task)


__all__ = ["execute"]
