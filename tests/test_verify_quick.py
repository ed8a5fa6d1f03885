"""The report card's quick tier: what it keeps of each op's shape sets, and its budget."""

import pytest

from kernelab.ops import all_ops, get
from kernelab.verify._runner import (
    QUICK_BUDGET,
    _elements,
    quick_cases,
    quick_over_budget,
    shapes_for,
    verify,
)


@pytest.mark.parametrize("op", [o.name for o in all_ops()])
def test_every_ops_quick_tier_is_within_its_share(op):
    assert quick_over_budget(get(op)) == []


@pytest.mark.parametrize("op", [o.name for o in all_ops()])
def test_the_quick_tier_keeps_every_edge_shape_every_dtype_and_the_representative_ends(op):
    o = get(op)
    cases = quick_cases(o, list(o.shape_sets), "cpu", None)
    edge = {s.key for s in shapes_for(o, "edge", "cpu", None)}
    assert {s.key for n, s, _ in cases if n == "edge"} == edge
    rep = shapes_for(o, "representative", "cpu", None)
    sizes = [_elements(o, s) for s in rep]
    kept = [_elements(o, s) for n, s, _ in cases if n == "representative"]
    assert min(kept) == min(sizes) and max(kept) == max(sizes)
    if len(cases) >= len(o.dtypes):
        assert {d for *_, d in cases} == set(o.dtypes)
    # one dtype per shape
    assert len({(n, s.key) for n, s, _ in cases}) == len(cases)


def test_an_op_over_its_share_is_named():
    op = get("paged_attention")
    over = quick_over_budget(op, {"cases": 3, "elements": 1000})
    assert len(over) == 2 and all(line.startswith("paged_attention: ") for line in over)
    assert QUICK_BUDGET["cases"] >= 3


def test_the_quick_tier_runs_one_dtype_per_shape_and_no_full_size_cases():
    report = verify("rmsnorm", variants=["torch"], device="cpu", seed=1, tier="quick")
    want = quick_cases(get("rmsnorm"), ["representative", "edge"], "cpu", None)
    got = [(c.shape_set, c.shape_key, c.dtype) for c in report.cases]
    assert got == [(n, s.key, str(d).removeprefix("torch.")) for n, s, d in want]
    assert report.passed


def test_a_bad_tier_is_refused():
    with pytest.raises(ValueError, match="tier"):
        verify("rmsnorm", device="cpu", tier="fast")


def test_the_stage_prints_its_seed_and_a_command_repeating_each_failure(monkeypatch):
    from kernelab.verify import _stage
    from kernelab.verify._types import CaseResult, Failure, Report

    report = Report(4242, "cpu", 2, ["representative", "edge"])
    bad = CaseResult("rmsnorm", "kernelab", "edge", "one row 1x7", "k", "float16")
    bad.failures.append(Failure("wrong values", "out", "off"))
    report.cases += [bad, CaseResult("rmsnorm", "torch", "edge", "one row 1x7", "k", "float16")]
    seen = {}

    def fake(ops, **kw):
        seen.update(kw)
        return report

    monkeypatch.setattr(_stage, "verify", fake)
    out = _stage.stage(["rmsnorm"], "cpu")
    assert seen["tier"] == "quick" and seen["seed"] is None
    assert out.notes[0] == "verify seed 4242 (quick tier; kernelab run --seed 4242 repeats it)"
    assert out.notes[1:] == [
        "  wrong values: kernelab verify rmsnorm --variant kernelab --device cpu --seed 4242 "
        "--quick  # edge 'one row 1x7' float16"
    ]
    out = _stage.stage(["rmsnorm"], "cpu", full=True, seed=4242)
    assert seen["tier"] == "full" and seen["seed"] == 4242
    assert out.notes[0].endswith("(full tier; kernelab run --full --seed 4242 repeats it)")


def test_the_stage_sums_up_the_interpreters_warnings_in_one_note(monkeypatch):
    """numpy's warnings inside interpreted launches reach the card as one counted line."""
    from kernelab.verify import _stage
    from kernelab.verify._types import CaseResult, Report

    report = Report(7, "cpu", 2, ["edge"])
    report.cases.append(CaseResult("paged_attention", "kernelab", "edge", "s", "k", "float16"))
    monkeypatch.setattr(_stage, "verify", lambda ops, **kw: report)
    assert not any("numpy warnings" in n for n in _stage.stage(["paged_attention"], "cpu").notes)
    report.interpreter_warnings["All-NaN slice encountered"] = 3
    notes = _stage.stage(["paged_attention"], "cpu").notes
    assert notes[1:] == [
        "the interpreter's numpy warnings, counted (NaN and Inf propagating through a kernel): "
        "All-NaN slice encountered ×3"
    ]


def test_the_repeat_command_repeats_the_cases_inputs():
    """Same op, variant, seed and tier: the same trials (seeds and distributions)."""
    from click.testing import CliRunner

    from kernelab.cli import app

    first = verify("silu_and_mul", variants=["torch"], device="cpu", seed=77, tier="quick")
    args = "verify silu_and_mul --variant torch --device cpu --seed 77 --quick --json"
    result = CliRunner().invoke(app, args.split())
    import json

    again = json.loads(result.stdout)["cases"]
    assert [c["trials"] for c in again] == [c.trials for c in first.cases]


def test_the_quick_tier_takes_the_dtypes_asked_for_in_turn():
    report = verify(
        "rmsnorm", variants=["torch"], device="cpu", seed=1, tier="quick", dtypes=["float16"]
    )
    want = quick_cases(get("rmsnorm"), ["representative", "edge"], "cpu", None)
    assert len(report.cases) == len(want)
    assert {c.dtype for c in report.cases} == {"float16"}
