"""The null-kernel audit: every op's checks reject trivial kernels; a loose contract is named."""

import torch

from kernelab.verify import NULLS, audit
from kernelab.verify._audit import lower_precision
from tests.flawed import toy_ops


def test_rmsnorm_is_sound_every_null_rejected_by_its_values():
    report = audit(["rmsnorm"], device="cpu", seed=5, trials=2)
    assert report.passed and report.broken_ops == []
    entries = {(a.null, a.target, a.dtype) for a in report.audit}
    assert len(entries) == len(NULLS) * 2 * 3  # nulls x (out, residual) x dtypes
    assert all(a.caught and a.failure_class == "wrong values" for a in report.audit)


def test_a_loose_contract_is_reported_as_a_broken_op_definition():
    loose = toy_ops.double_op(tolerance={"float32": 10.0})
    report = audit([loose, toy_ops.double_op()], device="cpu", seed=5)
    assert report.broken_ops == ["toy_double_loose"]
    assert not report.passed
    passing = {a.null for a in report.audit if not a.caught}
    assert {"zeros", "lower precision", "row dropped"} <= passing
    assert all("cannot reject" in a.note for a in report.audit if not a.caught)


def test_audit_covers_several_outputs_and_in_place_arguments():
    report = audit([toy_ops.quant_op(), toy_ops.scale_rows_op()], device="cpu", seed=5)
    assert report.passed, [a for a in report.audit if not a.caught]
    targets = {(a.op, a.target) for a in report.audit}
    assert {("toy_quant", "values"), ("toy_quant", "scales"), ("toy_scale_rows", "q")} <= targets


def test_lower_precision_keeps_half_the_significant_bits():
    x = torch.tensor([1.0 + 2**-20, 3.0, -0.1], dtype=torch.float64)
    y = lower_precision(x, torch.float32)
    assert y[0] == 1.0 and y[1] == 3.0 and abs(y[2] + 0.1) < 2**-12 and y[2] != -0.1
