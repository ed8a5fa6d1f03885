"""Every registered op benches on this machine: a representative case of each is timed, or the
op is named here with the reason it cannot be. A new op without coverage fails."""

import math

import pytest
import torch

from kernelab import ops
from kernelab.bench.roofline import Ceilings
from kernelab.bench.runner import BenchConfig, bench_case, plan_cases, subjects_for
from kernelab.bench.stats import StopRule
from kernelab.bench.timers import timer_for
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, Op, Shape, Variant

#: Ops that no instrument can bench on a CPU, each with why. Empty: every op benches here.
NOT_BENCHED_HERE: dict[str, str] = {}

#: A short stopping rule: the test asks whether a case is timed, not how well.
QUICK = StopRule(rel_ci=0.5, min_samples=3, min_time=0.0, max_time=0.02)


def bench_one(op) -> list[dict]:
    """The smallest representative case of ``op`` that bench plans on the CPU, timed in its first
    dtype; the cases it gave (empty: none could be timed). Raises ValueError when bench
    selects nothing, as the command does."""
    info = detect("cpu")
    cfg = BenchConfig(rule=QUICK, energy_window_s=0, max_rows=8, mode="hot")
    plan, _ = plan_cases([op], info.type, cfg)
    plan.sort(key=lambda case: math.prod(max(v, 1) for v in case[1].dims.values()))  # small first
    skipped: list[str] = []
    for op_, shape, dtype, subjects in plan:
        cases = bench_case(
            op_,
            shape,
            dtype,
            subjects,
            info,
            timer_for("cpu"),
            Ceilings(info.key),
            cfg,
            None,
            skipped,
        )
        if cases:
            return cases
    return []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(o.name for o in ops.all_ops()))
def test_every_op_benches_a_representative_case_here(name):
    if name in NOT_BENCHED_HERE:
        pytest.skip(NOT_BENCHED_HERE[name])
    cases = bench_one(ops.get(name))
    assert cases, f"{name}: no representative case was timed on the CPU"
    assert all(c["op"] == name and c["shape_key"] and c["metrics"]["n"] >= 3 for c in cases)


def test_not_benched_here_names_registered_ops_only():
    assert set(NOT_BENCHED_HERE) <= {o.name for o in ops.all_ops()}


def _planted(name, shapes, variant_kind="torch"):
    op = Op(
        name,
        description="planted: a shape set bench cannot run",
        reference=RMSNORM.reference,
        make_inputs=RMSNORM._make_inputs,
        shapes={"representative": lambda: shapes, "edge": lambda: shapes},
        cost=RMSNORM.cost,
        dtypes=RMSNORM.dtypes,
    )
    op.add_variant(Variant(variant_kind, RMSNORM.variants["torch"].fn, variant_kind))
    return op


def test_the_walk_fails_for_an_op_whose_shapes_bench_cannot_run():
    """Planted ops: every representative shape empty (no work to time), and an op whose only
    variant is not timed on a CPU. Neither gives a case, so the walk above would fail."""
    empty = [Shape("empty 0x128", {"rows": 0, "cols": 128}, {"residual": False}, "rows")]
    assert bench_one(_planted("planted_empty", empty)) == []
    fine = RMSNORM.shapes("representative")[:1]
    with pytest.raises(ValueError, match="no variant selected can be timed on cpu"):
        bench_one(_planted("planted_untimed", fine, variant_kind="pallas"))
    # and the same shapes with a torch variant are covered: the check can pass
    assert bench_one(_planted("planted_fine", fine))


def test_zero_sizes_that_switch_a_feature_off_are_benched():
    """paged_attention's representative shapes carry window 0 and chunk 0 (no window, no
    chunked prefill): each is selected, by a set and by sizes given by hand."""
    from kernelab.bench.shapes import parse_dims, select_shapes

    paged = ops.get("paged_attention")
    shapes = select_shapes(paged, BenchConfig(), 128)
    assert len(shapes) == len(paged.shapes("representative"))
    assert any(s.dims["window"] == 0 and s.dims["chunk"] == 0 for s in shapes)
    dims = parse_dims(
        "batch=2,heads_q=8,heads_kv=2,head_dim=64,block_size=16,context=40,window=0,chunk=0"
    )
    by_hand = select_shapes(paged, BenchConfig(dims=(dims,)), None)
    assert by_hand and all(s.dims["window"] == 0 for s in by_hand)


def test_an_empty_shape_is_skipped_saying_so():
    info, skipped = detect("cpu"), []
    cfg = BenchConfig(rule=QUICK, energy_window_s=0)
    (shape,) = [s for s in RMSNORM.shapes("edge") if s.label == "empty 0x128"]
    subjects, _ = subjects_for(RMSNORM, "cpu", BenchConfig(variants=("torch",)))
    timer, ceilings = timer_for("cpu"), Ceilings(info.key)
    got = bench_case(
        RMSNORM, shape, torch.float32, subjects, info, timer, ceilings, cfg, None, skipped
    )
    assert got == [] and "not timed: an empty shape (x without elements" in skipped[0]


@pytest.mark.parametrize("cpu", [True, False])
def test_the_report_card_benches_every_op_with_shapes(cpu):
    """The bench stage of ``kernelab run`` (CPU and GPU check) has shapes for every op,
    paged_attention's window-0 shapes among them."""
    from kernelab.bench.stage import CPU_SHAPES, stage_shapes

    for op in ops.all_ops():
        shapes = stage_shapes(op, cpu)
        want = min(CPU_SHAPES, len(op.shapes("representative"))) if cpu else None
        assert shapes and (not cpu or len(shapes) == want), op.name
    assert any(s.dims["window"] == 0 for s in stage_shapes(ops.get("paged_attention"), cpu))
