"""verify on ops of every shape the op model allows: several outputs, float8 and integer
outputs, in-place arguments, integer inputs; seeds, tolerances, the report, the run stage."""

import pytest
import torch

from kernelab.numerics import bits
from kernelab.ops import Variant
from kernelab.verify import CLASSES, audit, stage, verify, verify_candidate, verify_custom
from kernelab.verify._buffers import PAD, guard, output, poison, poison_value
from tests.flawed import toy_ops

SEED = 7


def _classes(report):
    return {c.failure_class for c in report.cases if not c.passed}


# --- buffers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32, torch.int64]
)
def test_two_poisons_differ_and_floats_poison_with_nan(dtype):
    t = torch.empty(3, dtype=dtype)
    poison(t, 0)
    first = bits(t).clone()
    poison(t, 1)
    assert not torch.equal(first, bits(t))
    if dtype.is_floating_point:
        assert torch.isnan(torch.full((1,), poison_value(dtype, 0), dtype=dtype).float()).all()


def test_guard_keeps_strides_and_reports_writes_past_the_end_and_in_gaps():
    base = torch.randn(3, 8)
    strided = base[:, :5]
    g = guard("x", strided, around_input=False)
    assert g.view.stride() == strided.stride() and torch.equal(g.view, strided)
    assert g.broken_canaries()[0] == 0
    flat = g.buffer
    flat[PAD + 6] = 0.0  # a gap between rows
    flat[PAD + 2 * 8 + 5] = 0.0  # just past the last element
    count, offsets, _ = g.broken_canaries()
    assert count == 2 and offsets == [6, 21]


def test_output_buffer_detects_a_write_before_the_start():
    o = output("out", (2, 3), torch.float32, "cpu")
    o.buffer[PAD - 1] = 1.0
    assert o.broken_canaries()[:2] == (1, [-1])


# --- several outputs, float8, integers, in place --------------------------------------------


def test_float8_values_and_scales_pass_when_right():
    op = toy_ops.quant_op()
    report = verify(ops=[op], device="cpu", seed=SEED, trials=2)
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
    measures = report.cases[0].measures
    assert set(measures) == {"values", "scales"}
    assert measures["values"].tolerance_source.endswith("eager torch")


def test_unwritten_float8_values_and_float32_scales_are_caught():
    def tail_unwritten(x, out=None):
        q, s = toy_ops.quant_torch(x)
        out[0][:-1].copy_(q[:-1])
        out[1][:-1].copy_(s[:-1])
        return out

    report = verify_candidate(tail_unwritten, toy_ops.quant_op(), device="cpu", seed=SEED)
    failures = [f for c in report.cases for f in c.failures if f.cls == "unwritten elements"]
    assert {f.target for f in failures} == {"values", "scales"}
    assert _classes(report) == {"unwritten elements"}


def test_wrong_output_dtype_is_a_contract_failure():
    def bf16_values(x, out=None):
        q, s = toy_ops.quant_torch(x)
        return q.to(torch.bfloat16), s

    report = verify_candidate(bf16_values, toy_ops.quant_op(), device="cpu", seed=SEED)
    assert _classes(report) == {"contract"}
    msgs = [f.message for c in report.cases for f in c.failures]
    assert any("dtype bfloat16, expected float8_e4m3fn" in m for m in msgs)


def test_integer_outputs_are_poisoned_with_sentinels():
    def last_unwritten(x, out=None):
        out[:-1].copy_(x.argmax(dim=-1)[:-1])
        return out

    assert verify(ops=[toy_ops.argmax_op()], device="cpu", seed=SEED).passed
    report = verify_candidate(last_unwritten, toy_ops.argmax_op(), device="cpu", seed=SEED)
    assert _classes(report) == {"unwritten elements"}


def test_in_place_argument_with_integer_input():
    op = toy_ops.scale_rows_op()
    assert verify(ops=[op], device="cpu", seed=SEED).passed

    def not_in_place(q, pos):
        return q * (pos[:, None].to(q.dtype) + 0.5)

    def bumps_positions(q, pos):
        toy_ops.scale_rows_ref(q, pos)
        pos.add_(1)
        return q

    report = verify_candidate(not_in_place, op, device="cpu", seed=SEED)
    assert {(f.cls, f.target) for c in report.cases for f in c.failures} == {("wrong values", "q")}
    report = verify_candidate(bumps_positions, op, device="cpu", seed=SEED)
    assert _classes(report) == {"mutated input"}
    assert {f.target for c in report.cases for f in c.failures} == {"pos"}


# --- in-place regions: what a call may write in an in-place argument ---------------------------

REGION = "wrote outside its in-place region"


def _scatter_wrong_slot(rows, cache, slots):
    """Each row one slot past its own (a slot computed off by one)."""
    keep = slots >= 0
    cache[(slots[keep].long() + 1) % cache.shape[0]] = rows[keep].to(cache.dtype)
    return cache


def _scatter_padding_too(rows, cache, slots):
    """Right rows, and every padding row written to a free slot (as a dummy slot would be)."""
    toy_ops.scatter_rows_ref(rows, cache, slots)
    used = set(slots.tolist())
    free = next(s for s in range(cache.shape[0]) if s not in used)
    for i in torch.nonzero(slots < 0).flatten().tolist():
        cache[free] = rows[i].to(cache.dtype)
    return cache


def _scatter_nudges_a_neighbour(rows, cache, slots):
    """Right rows, and one element of an unwritten row changed by one unit in the last place."""
    toy_ops.scatter_rows_ref(rows, cache, slots)
    used = set(slots.tolist())
    free = next(s for s in range(cache.shape[0]) if s not in used)
    cache[free, 0] = torch.nextafter(cache[free, 0], torch.tensor(float("inf"), dtype=cache.dtype))
    return cache


def test_correct_in_place_region_write_passes():
    report = verify(ops=[toy_ops.scatter_rows_op()], device="cpu", seed=SEED)
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
    assert all(0.0 <= c.worst_ratio <= 1.0 for c in report.cases)


@pytest.mark.parametrize(
    "candidate", [_scatter_wrong_slot, _scatter_padding_too, _scatter_nudges_a_neighbour]
)
def test_write_outside_the_in_place_region_is_caught_with_its_class(candidate):
    report = verify_candidate(candidate, toy_ops.scatter_rows_op(), device="cpu", seed=SEED)
    assert not report.passed
    assert all(c.failure_class == REGION for c in report.cases if not c.passed)
    failure = next(f for c in report.cases for f in c.failures if f.cls == REGION)
    assert failure.target == "cache" and failure.indices
    # indices into the whole cache (rows, cols), not into the region's elements
    assert all(len(i) == 2 for i in failure.indices), failure.indices


def test_values_inside_the_region_are_judged_against_the_reference():
    def rows_halved(rows, cache, slots):
        return toy_ops.scatter_rows_ref(rows * 0.5, cache, slots)

    report = verify_candidate(rows_halved, toy_ops.scatter_rows_op(), device="cpu", seed=SEED)
    assert _classes(report) == {"wrong values"}
    measure = report.cases[0].measures["cache"]
    assert len(measure.worst_index) == 2  # an element of the whole cache


def test_without_a_region_the_whole_argument_is_compared_as_before():
    report = verify_candidate(
        _scatter_wrong_slot, toy_ops.scatter_rows_op(region=False), device="cpu", seed=SEED
    )
    assert _classes(report) == {"wrong values"}
    assert verify_candidate(
        _scatter_nudges_a_neighbour, toy_ops.scatter_rows_op(region=False), device="cpu", seed=SEED
    ).passed  # one ulp in a row nobody wrote: invisible without a region


def test_a_region_must_name_an_in_place_argument():
    from kernelab.ops import Contract

    with pytest.raises(ValueError, match="regions"):
        Contract(inplace=("cache",), regions={"rows": lambda inputs: None})


def test_audit_rejects_nulls_of_a_region_argument():
    report = audit([toy_ops.scatter_rows_op()], device="cpu", seed=SEED)
    assert not report.broken_ops, [a.as_dict() for a in report.audit if not a.caught]


def test_declared_nondeterminism_is_not_a_failure():
    from dataclasses import replace

    op = toy_ops.double_op()

    calls = [0]

    def noisy(x, out=None):
        # every other call off by 3e-7 (relative): two calls on the same inputs always differ,
        # where a random factor rounded to the same float32 values now and then
        calls[0] += 1
        y = 2 * x * (1 + 3e-7 * (calls[0] % 2))
        return y if out is None else out.copy_(y)

    assert _classes(verify_candidate(noisy, op, device="cpu", seed=SEED)) == {"nondeterministic"}
    op.contract = replace(op.contract, nondeterministic=True)
    assert verify_candidate(noisy, op, device="cpu", seed=SEED).passed


# --- seeds, selection, report ------------------------------------------------------------------


def _small(seed):
    op = toy_ops.double_op()
    return verify([op], variants=["torch"], shape_sets="all", seed=seed, trials=2, device="cpu")


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k != "seconds"}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def test_a_seed_repeats_a_run_exactly_and_another_seed_draws_other_inputs():
    a, b, c = _small(11), _small(11), _small(12)
    assert _strip(a.as_dict()) == _strip(b.as_dict())
    seeds = lambda r: [t["seed"] for case in r.cases for t in case.trials]  # noqa: E731
    assert seeds(a) != seeds(c)
    dists = {t["dist"] for case in a.cases for t in case.trials}
    assert len(dists) >= 4  # distributions are spread across cases and trials


def test_report_json_shape_and_tolerance_source():
    d = _small(3).as_dict()
    assert d["schema"] == "kernelab.verify/1" and d["passed"] is True and d["seed"] == 3
    assert d["versions"]["torch"] == torch.__version__
    case = d["cases"][0]
    assert {"op", "variant", "shape_set", "shape", "dtype", "passed", "failure_class"} <= set(case)
    m = case["measures"][0]
    assert {"rel_l2", "max_abs", "max_rel", "worst_index", "tolerance", "tolerance_source"} <= set(
        m
    )
    assert sum(g["cases"] for g in d["groups"]) == len(d["cases"])
    assert {g["shape_set"] for g in d["groups"]} == {"representative", "edge"}


def test_cpu_threads_are_restored_after_a_run():
    before = torch.get_num_threads()
    seen = []
    op = toy_ops.double_op()
    op.add_variant(
        Variant(
            "probe",
            lambda x, out=None: (
                seen.append(torch.get_num_threads()) or (2 * x if out is None else out.copy_(2 * x))
            ),
            "torch",
        )
    )
    assert verify([op], variants=["probe"], device="cpu", seed=1).passed
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_compile_is_skipped_on_cpu_unless_named():
    op = toy_ops.double_op(compile_variant=True)
    report = verify([op], device="cpu", seed=1, trials=1)
    assert any(
        "toy_double/compile" in line and "--variant compile" in line for line in report.skipped
    )
    assert {c.variant for c in report.cases} == {"torch"}


def test_representative_shapes_are_capped_on_cpu_and_labelled():
    report = verify(
        ["rmsnorm"],
        variants=["torch"],
        shape_sets="representative",
        dtypes=["bfloat16"],
        trials=1,
        device="cpu",
        seed=2,
    )
    assert all("[rows→4]" in c.shape or "x" in c.shape for c in report.cases)
    assert any("[rows→4]" in c.shape for c in report.cases)
    keys = [c.shape_key for c in report.cases]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"variants": ["nosuch"]}, "variants: expected names among"),
        ({"shape_sets": "huge"}, "shape_sets: expected 'all' or one of"),
        ({"dtypes": ["float99"]}, "dtypes: expected dtype names"),
        ({"trials": 0}, "trials: expected a positive integer"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, words):
    with pytest.raises(ValueError, match=words):
        verify(["rmsnorm"], device="cpu", **kwargs)


def test_failure_classes_are_the_documented_ones():
    assert CLASSES == (
        "race",
        "interpreter error",
        "contract",
        "out-of-bounds write",
        "mutated input",
        "wrote outside its in-place region",
        "unwritten elements",
        "nondeterministic",
        "cached result",
        "full size",
        "wrong values",
        "NaN mismatch",
    )


def test_custom_reference_and_inputs_for_an_unknown_op():
    def make_inputs(seed, dist="normal"):
        g = torch.Generator().manual_seed(seed)
        return {"a": torch.randn(5, 7, generator=g), "b": torch.randn(5, 7, generator=g)}

    def ref(a, b):
        return a * b + a

    def good(a, b):
        return torch.addcmul(a, a, b)

    def bad(a, b):
        return (a * b + a).half().float()

    assert verify_custom(good, ref, make_inputs, device="cpu", seed=1).passed
    report = verify_custom(bad, ref, make_inputs, device="cpu", seed=1)
    assert _classes(report) == {"wrong values"}


# --- the run stage ----------------------------------------------------------------------------


def test_run_stage_cells_say_pass_or_the_failure_class():
    op = toy_ops.double_op()
    op.add_variant(Variant("zeros", lambda x, out=None: out.zero_(), "triton"))
    report = stage([op], torch.device("cpu"))
    ok, bad = report.cells[("toy_double", "torch")], report.cells[("toy_double", "zeros")]
    assert ok.status == "pass" and "× tol" in ok.text
    assert bad.status == "fail" and "wrong values" in bad.text and "× tol" in bad.text
    assert report.failed


@pytest.mark.slow
def test_rmsnorm_kernel_passes_on_every_dtype_and_both_shape_sets():
    # What `kernelab verify rmsnorm` does by default (the Triton kernel through the interpreter).
    report = verify(["rmsnorm"], variants=["kernelab", "torch"], device="cpu")
    capped = [c for c in report.cases if c.sample is None]
    assert len(capped) == 2 * 3 * (12 + 14)  # 18 representative shapes are 12 once capped
    # eager torch (not interpreted) also runs each shape whose rows were cut at full size
    # once: 12 representative (8 once too big ones are cut to the same columns) and 2 edge
    full = [c for c in report.cases if c.sample is not None]
    assert {c.variant for c in full} == {"torch"} and len(full) == len(report.cases) - len(capped)
    assert any("many short rows 1000x96" in c.shape for c in full)
    assert report.passed, [(c.shape, c.dtype, f.line()) for c in report.cases for f in c.failures]
    assert {c.dtype for c in report.cases} == {"float32", "float16", "bfloat16"}
    assert {c.shape_set for c in report.cases} == {"representative", "edge"}
    assert {c.variant for c in report.cases} == {"kernelab", "torch"}


def test_outputs_passed_under_one_keyword_each():
    op = toy_ops.quant_op()
    op.out_arg = ("values_out", "scales_out")

    def quant(x, values_out=None, scales_out=None):
        q, s = toy_ops.quant_torch(x)
        values_out.copy_(q)
        scales_out[:-1].copy_(s[:-1])
        return values_out, scales_out

    report = verify_candidate(quant, op, device="cpu", seed=SEED)
    assert _classes(report) == {"unwritten elements"}
    assert {f.target for c in report.cases for f in c.failures} == {"scales"}
    assert audit([op], device="cpu", seed=SEED).passed


def test_special_values_go_only_where_the_contract_allows():
    from kernelab.verify._case import inject_specials

    def inputs():
        return {"x": torch.randn(2, 4), "scales": torch.rand(8, 8)}

    assert inject_specials(inputs(), 0) == "scales"  # the largest float input by default
    limited = inputs()
    x = limited["x"]
    assert inject_specials(limited, 0, ("x",)) == "x"
    assert torch.isnan(x).sum() == 1 and torch.isinf(x).sum() == 2
    assert torch.isfinite(limited["scales"]).all()


def test_a_case_whose_float64_reference_would_not_fit_host_memory_is_skipped_and_said(
    monkeypatch,
):
    from kernelab.ops import get
    from kernelab.verify import _runner

    op = get("rmsnorm")
    shape = op.shapes("edge")[2]  # one row 4096 wide: ~64 KB of float64
    assert _runner.reference_too_big(op, shape, torch.float32) is None
    monkeypatch.setattr(_runner, "host_memory_available", lambda: 64 * 1024)
    why = _runner.reference_too_big(op, shape, torch.float32)
    assert why and "GiB of host memory" in why and "not verified here" in why
    report = verify(["rmsnorm"], variants=["torch"], shape_sets="edge", device="cpu", trials=1)
    assert shape.label not in {c.shape for c in report.cases}
    assert any("not verified here" in s and shape.label in s for s in report.skipped)


# --- freed memory before an allocating call -----------------------------------------------------


def test_prime_allocator_fills_each_call_s_poison_and_skips_outputs_glibc_maps_fresh(monkeypatch):
    from kernelab.verify import _buffers

    made = []
    real_full = torch.full

    def full(size, *args, **kwargs):
        t = real_full(size, *args, **kwargs)
        made.append((size, t.dtype, bits(t).unique().tolist()))
        return t

    monkeypatch.setattr(_buffers.torch, "full", full)
    small, big = (3, 301), (_buffers.PRIME_MAX_BYTES // 4 + 1,)  # float32: just over the cap
    for which, dtype in ((0, torch.float32), (1, torch.bfloat16), (0, torch.int32)):
        made.clear()
        specs = [(small, dtype, "cpu"), (big, torch.float32, "cpu")]
        _buffers.prime_allocator(specs, which)
        poison = bits(real_full((1,), poison_value(dtype, which), dtype=dtype)).tolist()
        assert made == [(small, dtype, poison)] * _buffers.PRIMED


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
def test_after_priming_a_cuda_allocation_of_the_same_size_holds_the_poison(dtype):
    from kernelab.verify._buffers import prime_allocator

    shape = (3, 301)
    right = torch.ones(shape, dtype=dtype, device="cuda")  # a freed copy of "the answer"
    del right
    prime_allocator([(shape, dtype, "cuda")])
    got = torch.empty(shape, dtype=dtype, device="cuda")
    poison = torch.full((1,), poison_value(dtype, 0), dtype=dtype, device="cuda")
    assert bool((bits(got) == bits(poison)).all())
