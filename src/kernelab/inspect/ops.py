"""Which compilations the registered ops would really make: their declared launches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernelab.core import dtype_name
from kernelab.core.runtime.backends import get_backend
from kernelab.inspect.report import Job
from kernelab.inspect.spec import from_launch
from kernelab.inspect.targets import TPU_TARGETS, Target


@dataclass
class Plan:
    jobs: list[Job] = field(default_factory=list)
    #: Ops (or shapes) not inspected, and why: one line each.
    skipped: list[str] = field(default_factory=list)


def _max_elements(op, shape, dtype) -> int | None:
    """Elements of the largest tensor this shape creates (meta tensors: nothing allocated)."""
    try:
        inputs = op.inputs(shape, dtype, "meta")
    except Exception:
        return None
    sizes = [v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)]
    return max(sizes) if sizes else None


def _dtypes(op, names: Sequence[str] | None) -> list[torch.dtype]:
    """The op's dtypes that are named (all when none are); an op that takes none of the
    named dtypes is inspected in its first dtype rather than not at all."""
    if not names:
        return list(op.dtypes)
    return [d for d in op.dtypes if dtype_name(d) in names] or list(op.dtypes[:1])


def plan(
    ops,
    targets: Sequence[Target],
    space: bool = False,
    dtypes: Sequence[str] | None = None,
    shape_set: str = "representative",
) -> Plan:
    """Jobs for every kernel each op launches for each shape of ``shape_set``, every dtype
    (or those named), every target; with ``space``, for every config of its tuning space."""
    out = Plan()
    gpu = [t for t in targets if not t.is_tpu]
    tpus = [t for t in targets if t.is_tpu]
    if tpus:
        _plan_pallas(out, ops, tpus, dtypes, shape_set)
    if not gpu:
        return out
    for op in ops:
        if op.launches is None:
            out.skipped.append(f"{op.name}: declares no launches (nothing to compile)")
            continue
        if space and op.tuning_space is None:
            out.skipped.append(f"{op.name}: declares no tuning space; default configs only")
        # A plan that takes the target is described per target (its default config is the
        # target's); one that does not, once for all of them.
        per = _per_target(op)
        for dtype in _dtypes(op, dtypes):
            for shape in op.shapes(shape_set):
                configs = [None]
                if space and op.tuning_space is not None:
                    configs = list(op.tuning_space(shape, dtype)) or [None]
                n_el = _max_elements(op, shape, dtype)
                label = f"{shape.label} {dtype_name(dtype)}"
                tail = f"{dtype_name(dtype)}/{shape.key}"
                for tgts in [[t] for t in gpu] if per else [gpu]:
                    where = tgts[0].name if per else None
                    try:
                        sets = [(c, "", _launches(op, shape, dtype, c, where)) for c in configs]
                        sets += _configured(op, shape, dtype, where) if not space else []
                    except Exception as exc:
                        out.skipped.append(
                            f"{op.name} {label}: launches failed: {type(exc).__name__}: {exc}"
                        )
                        continue
                    _add_jobs(out, op, sets, tgts, n_el, label, tail)
    return out


def _per_target(op) -> bool:
    return bool(getattr(op, "plans_per_target", False)) or any(
        getattr(v, "configure", None) is not None for v in _variants(op)
    )


def _variants(op) -> list:
    return list((getattr(op, "variants", None) or {}).values())


def _launches(op, shape, dtype, config, target: str | None) -> list:
    """``op.launches``, on ``target`` where the op's plan takes one."""
    if target is not None and getattr(op, "plans_per_target", False):
        return op.launches(shape, dtype, config, target=target)
    return op.launches(shape, dtype, config)


def _configured(op, shape, dtype, target: str | None) -> list:
    """(config, variant name, launches) of each Triton variant that is the op's plan under a
    config of its own choosing (``Variant.configure``), where it compiles for ``target``:
    the persistent GEMM, say, which the default plan never picks."""
    out, inputs = [], None
    for v in _variants(op):
        if getattr(v, "configure", None) is None or (target and not v.compiles_for(target)):
            continue
        if inputs is None:  # meta tensors, made once for every such variant
            inputs = op.inputs(shape, dtype, "meta")
        config = v.configure(inputs, target)
        out.append((config, v.name, _launches(op, shape, dtype, config, target)))
    return out


def _add_jobs(out: Plan, op, sets, targets, n_el, label: str, tail: str) -> None:
    """One job per launch per target of ``sets`` ((config, variant, launches)); a variant's
    launch that the default plan already makes is not added twice."""
    seen_specs: set[str] = set()
    for config, variant, launches in sets:
        seen: dict[str, int] = {}
        for launch in launches:
            try:
                spec = from_launch(launch, n_el, label)
            except TypeError as exc:
                out.skipped.append(f"{op.name}: {exc}")
                continue
            base = f"{op.name}/{spec.name}"
            n = seen[base] = seen.get(base, 0) + 1
            if variant and spec.identity() in seen_specs:
                continue
            seen_specs.add(spec.identity())
            kname = spec.name if n == 1 else f"{spec.name}#{n}"
            key_tail = tail
            if variant:
                key_tail += f"/{variant}"
            elif config is not None:
                key_tail += f"/{spec.config_text()}"
            compiles_for = get_backend(spec.backend).targets
            for t in targets:
                if t.name not in compiles_for:
                    continue  # another backend's target (a TPU for a GPU kernel)
                out.jobs.append(Job(spec, t, f"{op.name}/{kname}/{t.name}/{key_tail}", op.name))


def _pallas_variants(op) -> list:
    # the variants whose plans make calls a TPU target lowers (a Pallas plan)
    return [
        v
        for v in _variants(op)
        if v.plan is not None and any(t in TPU_TARGETS for t in v.backend.targets)
    ]


def _plan_pallas(out: Plan, ops, targets: Sequence[Target], dtypes, shape_set: str) -> None:
    """Jobs for every Pallas call each op's Pallas variants make, per TPU target: a variant's
    config is chosen per TPU generation, so each target lowers its own calls."""
    from kernelab.core.runtime import pallas

    without = [op.name for op in ops if not _pallas_variants(op)]
    if without:
        out.skipped.append(
            f"no Pallas variant (nothing to lower for {', '.join(t.name for t in targets)}): "
            + ", ".join(without)
        )
    with_pallas = [op for op in ops if _pallas_variants(op)]
    if not with_pallas:
        return
    ok, why = pallas.available()
    if not ok:
        out.skipped.append(
            f"{', '.join(op.name for op in with_pallas)}: Pallas variants not lowered: {why}"
        )
        return
    for op in with_pallas:
        for variant in _pallas_variants(op):
            vtag = "" if variant.name == "pallas" else f"[{variant.name}]"
            for dtype in _dtypes(op, dtypes):
                for shape in op.shapes(shape_set):
                    if variant.unsupported(shape):
                        continue
                    n_el = _max_elements(op, shape, dtype)
                    label = f"{shape.label} {dtype_name(dtype)}"
                    for t in targets:
                        try:
                            calls = pallas.launches(op, shape, dtype, target=t.name,
                                                    variant=variant.name)  # fmt: skip
                        except Exception as exc:
                            out.skipped.append(
                                f"{op.name} {variant.name} {label} {t.name}: launches failed: "
                                f"{type(exc).__name__}: {exc}"
                            )
                            continue
                        seen: dict[str, int] = {}
                        for call in calls:
                            spec = from_launch(call, n_el, label)
                            n = seen[spec.name] = seen.get(spec.name, 0) + 1
                            kname = spec.name + vtag + ("" if n == 1 else f"#{n}")
                            key = f"{op.name}/{kname}/{t.name}/{dtype_name(dtype)}/{shape.key}"
                            out.jobs.append(Job(spec, t, key, op.name))
