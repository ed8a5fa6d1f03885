"""What the Pallas kernel tests share: verify a Pallas variant (or a planted-defect copy of its
plan) through the TPU interpreter on a few given shapes, and read the verdict."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.verify import verify_candidate

jax_ok, jax_why = pallas.available()
needs_jax = pytest.mark.skipif(not jax_ok, reason=jax_why)


def verify(op, fn, shapes, dtype=torch.bfloat16, seed=7):
    """The verify report of ``fn`` on ``shapes`` (one dtype, one trial: two calls per case)."""
    return verify_candidate(
        fn, op, dtypes=[dtype], device="cpu", seed=seed, trials=1, shapes=shapes, name="pallas"
    )


def planted(variant, mutate, **plan_kw):
    """``variant``'s function with each of its plan's calls passed through ``mutate`` (a
    planted defect: a shorter grid, a shifted index map, another kernel)."""

    @functools.wraps(variant.fn)
    def fn(**inputs):
        plan = variant.plan(**inputs, **plan_kw)
        calls = tuple(mutate(c) for c in plan.calls)
        return dataclasses.replace(plan, calls=calls).run()

    return fn


def configured(variant, config):
    """``variant``'s function with its plan run at ``config``."""

    @functools.wraps(variant.fn)
    def fn(**inputs):
        return variant.plan(**inputs, config=config).run()

    return fn


def shifted(block, axis: int, by: int = 1):
    """``block`` with its index along ``axis`` off by ``by``."""

    def index_map(*idx):
        out = list(block.index_map(*idx))
        out[axis] = out[axis] + by
        return tuple(out)

    return dataclasses.replace(block, index_map=index_map)


def passed(report) -> bool:
    return bool(report.cases) and all(c.failure_class is None for c in report.cases)


def classes(report) -> set[str]:
    return {k for c in report.cases for k in c.classes}


def failures(report) -> str:
    return "; ".join(
        f"{c.shape}: {c.classes} {[f.message[:200] for f in c.failures[:2]]}"
        for c in report.cases
        if c.failure_class
    )
