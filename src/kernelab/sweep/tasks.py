"""A spec expanded into tasks, each task's key and resource request, and running one task.

A task is one unit of work of an existing instrument, run through its Python API:

- inspect: one op × shape × dtype × config × compile target: every kernel the op launches
  there, compiled and analysed exactly as ``kernelab inspect`` does (``inspect.ops.plan`` on
  the op narrowed to that shape and config, then ``analyze_jobs``);
- verify: one op × variant × shape set × dtype × seed × device type (``kernelab.verify.verify``);
- bench: one op × shape set × dtype × device type, every variant asked for timed together in
  one process, interleaved (``kernelab.bench.bench``), stored as ``kernelab bench`` stores it;
- tune: one op × shape × dtype × compile target: the tuning space pruned statically (what
  ``kernelab tune`` does on a CPU);
- floors: one op × shape set × dtype × GPU type: every shape's speed-of-light floor from the
  type's datasheet (``kernelab.bench.floors``, what ``kernelab bench --floors-for`` prints).

The key of a task hashes what decides its result: kind, op, variant, shape, dtype, config,
target, the task's parameters, the op's kernel source hash and the versions of kernelab, torch,
triton (and inspect's parser). A stored key is never run again.

Tasks are plain frozen data (picklable, sent to process-pool or Ray workers); a worker finds
the op, shape and config again by name from the registry.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import Counter
from dataclasses import dataclass

import orjson

from kernelab.sweep.spec import GPU_TYPES, SweepSpec, max_tasks, too_many

#: Rough core-seconds per unit of work, for ``--dry-run``'s estimate (measured on a 2-core
#: x86_64 VM, cold caches: inspect ~0.1 s per kernel and target compiled — the 1,840-job
#: bfloat16 gate took 67–95 s on 2 cores —, verify ~0.05 s per case and trial on CPU, bench
#: ~1 s of ceilings plus ~0.6 s per case and variant, tune ~0.1 s per config pruned).
COST_S = {
    "inspect": 0.1,
    "verify": 0.05,
    "bench": 0.6,
    "bench_start": 1.0,
    "tune": 0.1,
    "floors": 0.001,
}


@dataclass(frozen=True)
class Task:
    kind: str
    op: str
    variant: str  # a variant name, or "+"-joined names (bench), or "*" (every one)
    shape_set: str
    shape_key: str  # a shape's key (inspect, tune) or the shape set and filter (verify, bench)
    dtype: str
    config: str  # "default", or the config's fields as JSON
    target: str  # a compile target or a device type
    params: str  # JSON of the kind's parameters (seed, trials, mode, ...)
    kernel_hash: str
    key: str
    units: int = 1  # work units for the cost estimate (kernels, cases, configs)

    @property
    def gpu(self) -> bool:
        """Whether the task runs on a GPU (floors of a GPU type are computed on a CPU)."""
        return self.kind in ("verify", "bench", "tune") and self.target in GPU_TYPES

    def row(self) -> dict:
        """The ``sweep_tasks`` fields of this task."""
        return {
            "key": self.key,
            "kind": self.kind,
            "op": self.op,
            "variant": self.variant,
            "shape_key": self.shape_key,
            "dtype": self.dtype,
            "config": self.config,
            "target": self.target,
        }

    def label(self) -> str:
        parts = [self.kind, self.op, self.variant, self.shape_key, self.dtype, self.target]
        if self.config != "default":
            parts.append(self.config)
        return " ".join(parts)


def resources(task: Task) -> dict:
    """What a task asks the scheduler for: one CPU; a GPU task one GPU and one unit of the
    custom resource of its device type (``{"gpu:H100": 1}``), so it lands on such a node."""
    if task.gpu:
        return {"num_cpus": 1, "num_gpus": 1, "resources": {f"gpu:{task.target}": 1}}
    return {"num_cpus": 1}


@functools.cache
def versions() -> dict:
    import torch
    import triton

    import kernelab
    from kernelab.inspect.runner import PARSER_VERSION

    return {
        "kernelab": kernelab.__version__,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "inspect_parser": PARSER_VERSION,
    }


def _json(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def config_text(config) -> str:
    """A config as the task key holds it: "default", a config class's fields as JSON, or a
    plain value's JSON (an op whose configs are one number: moe_topk's tokens per program)."""
    if config is None:
        return "default"
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return _json(dataclasses.asdict(config))
    if isinstance(config, int | str) and not isinstance(config, bool):
        return _json(config)
    raise TypeError(
        f"a config of type {type(config).__name__} ({config!r:.60}): expected a dataclass "
        "instance or a plain integer or string"
    )


def _space(op, shape, dtype) -> list:
    """``op``'s tuning space for the shape, every config checked to have a task key."""
    from kernelab.core import dtype_name

    space = list(op.tuning_space(shape, dtype))
    for i, config in enumerate(space):
        try:
            config_text(config)
        except TypeError as exc:
            raise ValueError(
                f"{op.name}: tuning_space({shape.label}, {dtype_name(dtype)})[{i}]: {exc}"
            ) from None
    return space


def _check_spaces(spec: SweepSpec, ops) -> None:
    """Before anything is expanded: each op's tuning space, at the first shape of each set
    and dtype, holds configs a task key can name (a bad entry is named at once, not after
    the other ops' tasks)."""
    if spec.kind != "inspect" or spec.configs == "default":
        return
    for op in ops:
        if op.tuning_space is None or op.launches is None:
            continue
        for dtype in _dtypes(op, spec.dtypes):
            for shape_set in spec.shape_sets:
                shapes = _shapes(op, shape_set, spec.shapes, spec.sizes)
                if shapes:
                    _space(op, shapes[0], dtype)


def _make(kind, op, variant, shape_set, shape_key, dtype, config, target, params, units=1):
    from kernelab.core.runtime.tuned import kernel_hash

    khash = kernel_hash(op.kernels) if op.kernels else "-"
    text = _json(
        [kind, op.name, variant, shape_key, dtype, config, target, params, khash, versions()]
    )
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    return Task(
        kind,
        op.name,
        variant,
        shape_set,
        shape_key,
        dtype,
        config,
        target,
        params,
        khash,
        key,
        units,
    )


def _dtypes(op, names) -> list:
    """The op's dtypes that are named (all when none are); as ``kernelab inspect``, an op
    taking none of them is run in its first."""
    from kernelab.core import dtype_name

    if not names:
        return list(op.dtypes)
    return [d for d in op.dtypes if dtype_name(d) in names] or list(op.dtypes[:1])


def _shapes(op, shape_set, wanted, sizes=None):
    """The shapes of a sweep: the set's (filtered by label), or the explicit ``sizes``."""
    if sizes:
        from kernelab.bench.runner import explicit_shapes

        return explicit_shapes(op, [dict(d) for d in sizes], shape_set)
    shapes = op.shapes(shape_set)
    if wanted:
        shapes = [s for s in shapes if any(w in s.label for w in wanted)]
    return shapes


def _selection(spec) -> tuple[str, dict]:
    """How a floors or bench task names the shapes it covers (its shape key's suffix), and
    the parameters that select them again in the worker."""
    if spec.sizes:
        from kernelab.bench.runner import dims_label

        labels = [dims_label(dict(d)) for d in spec.sizes]
        return f"[{'|'.join(labels)}]", {"sizes": [dict(d) for d in spec.sizes]}
    return (f"[{'|'.join(spec.shapes)}]" if spec.shapes else ""), {
        "shapes": list(spec.shapes or ())
    }


def _configs(op, shape, dtype, configs, skipped: list[str], matched=None) -> list:
    """The configs of a task list: [None] (the default), the space, or the space's configs
    that a table of ``configs`` selects (the index of each table that selected one goes into
    ``matched``)."""
    if configs == "default":
        return [None]
    if op.tuning_space is None:
        skipped.append(f"{op.name}: declares no tuning space; default configs only")
        return [None]
    space = _space(op, shape, dtype)
    if configs == "space":
        return space or [None]
    out = []
    for i, fields in enumerate(configs):
        if space and not dataclasses.is_dataclass(space[0]):
            shown = ", ".join(map(repr, space[:4])) + (", ..." if len(space) > 4 else "")
            raise ValueError(
                f"spec.configs[{i}]: {op.name}'s configs are plain values ({shown}), not "
                'tables of fields; use configs = "space"'
            )
        for name, _ in fields:
            if space and not hasattr(space[0], name):
                known = ", ".join(f.name for f in dataclasses.fields(space[0]))
                raise ValueError(f"spec.configs[{i}].{name}: {op.name}'s configs have {known}")
        picked = [c for c in space if all(getattr(c, k) == v for k, v in fields)]
        if picked and matched is not None:
            matched.add(i)
        out += [c for c in picked if c not in out]
    return out


def _table(fields) -> str:
    return "{" + ", ".join(f"{k} = {_json(v)}" for k, v in fields) + "}"


def _compile_targets(op, shape, dtype, targets) -> list[str]:
    """The targets among ``targets`` that some launch of the op compiles for."""
    from kernelab.core.runtime.backends import get_backend

    try:
        backends = {launch.backend for launch in op.launches(shape, dtype, None)}
    except Exception:
        return list(targets)  # the worker reports the failure
    ok = set().union(*(get_backend(b).targets for b in backends)) if backends else set()
    return [t for t in targets if t in ok]


def _variants(op, spec: SweepSpec) -> list[str]:
    """The variants a verify or bench task times: those asked for, else every variant its
    backend takes unasked on each target's device (not torch.compile on a CPU, say)."""
    if spec.kind == "floors":
        return ["-"]
    devices = {"cpu" if t == "cpu" else "cuda" for t in spec.targets}
    return [
        v.name
        for v in op.variants.values()
        if (spec.variants is None or v.name in spec.variants)
        and (spec.variants is not None or all(v.by_default(d)[0] for d in devices))
    ]


def count(spec: SweepSpec) -> int:
    """How many tasks :func:`expand` makes of ``spec``, without making them (no key is
    hashed): products of the spec's lists, and for inspect and tune each shape's configs and
    targets."""
    from kernelab import ops as registry

    n = 0
    matched: set[int] = set()
    spaced = []  # the ops whose tuning spaces the config tables were matched against
    for op in (registry.get(name) for name in spec.ops):
        dtypes = _dtypes(op, spec.dtypes)
        if spec.kind not in ("inspect", "tune"):
            per = len(spec.targets) * len(dtypes) * len(spec.shape_sets)
            if spec.kind == "verify":
                per *= len(_variants(op, spec)) * len(spec.seeds)
            n += per if _variants(op, spec) else 0
            continue
        if op.launches is None or (spec.kind == "tune" and op.tuning_space is None):
            continue
        for dtype in dtypes:
            for shape_set in spec.shape_sets:
                for shape in _shapes(op, shape_set, spec.shapes, spec.sizes):
                    targets = len(_compile_targets(op, shape, dtype, spec.targets))
                    if spec.kind == "tune":
                        n += targets + sum(t in GPU_TYPES for t in spec.targets)
                    else:
                        configs = _configs(op, shape, dtype, spec.configs, [], matched)
                        n += targets * len(configs)
                        if op.tuning_space is not None and op.name not in spaced:
                            spaced.append(op.name)
    if spec.kind == "inspect" and not isinstance(spec.configs, str) and spaced:
        for i, fields in enumerate(spec.configs):
            if i not in matched:
                raise ValueError(
                    f"spec.configs[{i}] {_table(fields)}: matches no config of the tuning "
                    f"space of {', '.join(spaced)} (for the shapes and dtypes of the sweep)"
                )
    return n


def expand(spec: SweepSpec, limit: int | None = None) -> tuple[list[Task], list[str]]:
    """The tasks of ``spec`` (in a stable order) and what was left out, one line each.

    More than ``limit`` tasks (:func:`kernelab.sweep.spec.max_tasks`) is a
    :class:`~kernelab.sweep.spec.SpecError`, raised before any task is made."""
    from kernelab import ops as registry
    from kernelab.core import dtype_name

    tasks: list[Task] = []
    skipped: list[str] = []
    suffix, selection = _selection(spec)  # floors and bench: their shapes, named once
    ops = [registry.get(n) for n in spec.ops]
    _check_spaces(spec, ops)
    cap = max_tasks(limit)
    n = count(spec)
    if n > cap:
        raise too_many(f"spec: {n:,} tasks", cap)
    for op in ops:
        if spec.kind in ("inspect", "tune"):
            if op.launches is None:
                skipped.append(f"{op.name}: declares no launches (nothing to compile)")
                continue
            if spec.kind == "tune" and op.tuning_space is None:
                skipped.append(f"{op.name}: declares no tuning space (nothing to tune)")
                continue
            variant = next((v.name for v in op.variants.values() if v.tuned), "*")
            for dtype in _dtypes(op, spec.dtypes):
                dt = dtype_name(dtype)
                for shape_set in spec.shape_sets:
                    for shape in _shapes(op, shape_set, spec.shapes, spec.sizes):
                        targets = _compile_targets(op, shape, dtype, spec.targets)
                        if spec.kind == "tune":  # GPU types: timed there (Triton variants)
                            targets += [t for t in spec.targets if t in GPU_TYPES]
                        sized = _json({"sizes": dict(shape.dims)}) if spec.sizes else "{}"
                        if spec.kind == "tune":
                            n = len(op.tuning_space(shape, dtype))
                            for t in targets:
                                tasks.append(
                                    _make(
                                        "tune",
                                        op,
                                        variant,
                                        shape_set,
                                        shape.key,
                                        dt,
                                        "space",
                                        t,
                                        sized,
                                        n,
                                    )
                                )
                            continue
                        for config in _configs(op, shape, dtype, spec.configs, skipped):
                            for t in targets:
                                tasks.append(
                                    _make(
                                        "inspect",
                                        op,
                                        variant,
                                        shape_set,
                                        shape.key,
                                        dt,
                                        config_text(config),
                                        t,
                                        sized,
                                    )
                                )
            continue
        variants = _variants(op, spec)
        if not variants:
            skipped.append(f"{op.name}: none of the variants asked for ({spec.variants})")
            continue
        for dtype in _dtypes(op, spec.dtypes):
            dt = dtype_name(dtype)
            for shape_set in spec.shape_sets:
                n_shapes = len(_shapes(op, shape_set, spec.shapes, spec.sizes))
                if spec.kind == "floors":
                    shape_key = shape_set + suffix
                    params = _json(selection)
                    for t in spec.targets:
                        tasks.append(
                            _make(
                                "floors",
                                op,
                                "-",
                                shape_set,
                                shape_key,
                                dt,
                                "default",
                                t,
                                params,
                                n_shapes,
                            )
                        )
                    continue
                if spec.kind == "bench":
                    shape_key = shape_set + suffix
                    params = _json({"mode": spec.mode, "max_rows": spec.max_rows, **selection})
                    for t in spec.targets:
                        tasks.append(
                            _make(
                                "bench",
                                op,
                                "+".join(variants),
                                shape_set,
                                shape_key,
                                dt,
                                "default",
                                t,
                                params,
                                n_shapes * len(variants),
                            )
                        )
                    continue
                for variant in variants:
                    for seed in spec.seeds:
                        params = _json({"seed": seed, "trials": spec.trials})
                        for t in spec.targets:
                            tasks.append(
                                _make(
                                    "verify",
                                    op,
                                    variant,
                                    shape_set,
                                    shape_set,
                                    dt,
                                    "default",
                                    t,
                                    params,
                                    n_shapes,
                                )
                            )
    skipped = list(dict.fromkeys(skipped))
    if not tasks:
        why = "; ".join(skipped) or (
            f"no shape label contains {' or '.join(map(repr, spec.shapes))}"
            if spec.shapes
            else f"no launch of theirs compiles for {', '.join(spec.targets)}"
            if spec.kind in ("inspect", "tune")
            else "nothing selected"
        )
        raise ValueError(f"spec: no task to run for ops {', '.join(spec.ops)}: {why}")
    return tasks, skipped


def estimate(tasks: list[Task]) -> dict:
    """Task count per kind and the estimated core-seconds (see :data:`COST_S`)."""
    counts = Counter(t.kind for t in tasks)
    trials = {}
    seconds = 0.0
    for t in tasks:
        per = COST_S[t.kind] * t.units
        if t.kind == "verify":
            trials.setdefault(t.params, orjson.loads(t.params).get("trials") or 3)
            per *= trials[t.params]
        if t.kind == "bench":
            per += COST_S["bench_start"]
        seconds += per
    return {
        "tasks": dict(counts),
        "gpu_tasks": sum(t.gpu for t in tasks),
        "core_seconds": round(seconds, 1),
    }


__all__ = ["COST_S", "Task", "count", "estimate", "expand", "resources", "versions"]
