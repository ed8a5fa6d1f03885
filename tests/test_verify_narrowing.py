"""Derived 16-bit tolerances: one rounding of partial results too many fails verify, while eager
torch, kernelab's own kernels (through the interpreter) and honest re-implementations pass.

The candidates are benchmarks/candidates/narrowed.py's (benchmarks/bench_tolerance_margin.py
prints each one's margin on every shape of its op)."""

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kernelab.core import Contract
from kernelab.numerics import error
from kernelab.ops import GEMM, Shape, get
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul import _kernels as mk
from kernelab.ops.matmul.gemm import GemmConfig, gemm_triton
from kernelab.verify import verify_candidate
from kernelab.verify._case import Subject, derive_seed, distributions_of, expected, run_case
from kernelab.verify._runner import shapes_for
from kernelab.verify._tolerance import derived_bound, effective_elements, tolerance, worst_case
from tests.mutants import mutate

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates" / "narrowed.py"
_spec = importlib.util.spec_from_file_location("narrowed_candidates", _PATH)
narrowed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(narrowed)

SEED = 20261202
DTYPES = (torch.bfloat16, torch.float16)


def _gemm(label, m, n, k, layout="nk"):
    return Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, {"layout": layout}, "M")


def _rows(label, rows, cols, **params):
    return Shape(f"{label} {rows}x{cols}", {"rows": rows, "cols": cols}, params, "rows")


def _paged(label, kv_lens, q_lens=None, **params):
    return Shape(
        f"{label} ({'/'.join(map(str, kv_lens))} kv)",
        {"batch": len(kv_lens), "heads_q": 8, "heads_kv": 2, "head_dim": 64, "block_size": 16},
        {"kv_lens": tuple(kv_lens), "q_lens": tuple(q_lens or [1] * len(kv_lens)), **params},
    )


def _merge(label, parts, tokens, heads, head_dim):
    dims = {"parts": parts, "tokens": tokens, "heads": heads, "head_dim": head_dim}
    return Shape(f"{label} {parts}x{tokens}x{heads}x{head_dim}", dims, {}, "tokens")


#: Small cases with outputs large enough (hundreds of elements) that one case's error is a
#: steady statistic, and reductions long enough for several chunks or slices.
SHAPES = {
    "gemm": [_gemm("split-K", 3, 40, 520), _gemm("tiles", 16, 64, 256, "kn")],
    "rmsnorm": [_rows("rows", 6, 1024), _rows("with residual", 5, 1000, residual=True)],
    "layernorm": [_rows("rows", 6, 1024), _rows("with residual", 5, 1000, residual=True)],
    "softmax": [_rows("rows", 6, 1000), _rows("key mask", 4, 512, mask="keys")],
    "merge_attention_states": [_merge("decode", 16, 4, 4, 64), _merge("cascade", 4, 8, 2, 64)],
    "paged_attention": [
        _paged("decode", [200, 70]),
        _paged("mixed, window 64", [150, 90], [5, 1], window=64),
    ],
}


#: Where a planted candidate must fail on every case: no fused residual add (whose rounded
#: stream eager torch normalises, an extra rounding that puts eager over the bound and the
#: tolerance at twice its error), and norm rows of many 64-column chunks (the rsqrt halves a
#: relative error of the sum of squares).
PLANTED_SHAPES = {
    **SHAPES,
    "gemm": [_gemm("split-K", 3, 40, 520), _gemm("tiles", 16, 64, 256, "kn")],
    "rmsnorm": [_rows("rows", 16, 1024), _rows("model width", 8, 4096)],
    "layernorm": [_rows("rows", 16, 1024), _rows("model width", 8, 4096)],
    "softmax": [_rows("rows", 16, 1000), _rows("key mask", 8, 512, mask="keys")],
}


def _report(fn, op, shapes=None):
    return verify_candidate(
        fn, op, shapes=shapes or SHAPES[op], dtypes=DTYPES, device="cpu", seed=SEED, trials=2
    )


def _lines(report):
    return [f.line()[:200] for c in report.cases for f in c.failures]


PLANTED = [(op, name) for op, group in narrowed.PLANTED.items() for name in group]
HONEST = [(op, name) for op, group in narrowed.HONEST.items() for name in group]


@pytest.mark.parametrize(("op", "name"), PLANTED, ids=[f"{o}: {n}" for o, n in PLANTED])
def test_one_rounding_too_many_fails_with_wrong_values(op, name):
    report = _report(narrowed.PLANTED[op][name], op, PLANTED_SHAPES[op])
    failing = [c for c in report.cases if not c.passed]
    # every case but at most one fails (float16 softmax rows whose rounded exponentials sit
    # at 1.0-1.1x the bound), on its values only, against the derived bound
    assert len(report.cases) == len(PLANTED_SHAPES[op]) * len(DTYPES)
    assert len(failing) >= len(report.cases) - 1, _lines(report)
    assert {c.failure_class for c in failing} == {"wrong values"}
    assert all("derived" in f.message for c in failing for f in c.failures), _lines(report)


@pytest.mark.parametrize(("op", "name"), HONEST, ids=[f"{o}: {n}" for o, n in HONEST])
def test_honest_reimplementations_pass(op, name):
    report = _report(narrowed.HONEST[op][name], op)
    assert report.passed, _lines(report)
    # and they are judged by the derived bound, not a fixed floor
    sources = {m.tolerance_source.split(":")[0] for c in report.cases for m in c.measures.values()}
    assert "derived" in sources


@pytest.mark.parametrize("op", list(SHAPES))
def test_eager_torch_passes(op):
    report = _report(get(op).variants["torch"].fn, op)
    assert report.passed, _lines(report)
    assert max(c.worst_ratio for c in report.cases) <= 1.0


def test_the_old_floors_let_a_split_k_gemm_with_16_bit_partials_through():
    """Why the bound is derived: under max(2x eager, floor) the planted GEMM passes."""
    fixed = Contract(special_inputs=GEMM.contract.special_inputs)
    fn = narrowed.split_k_gemm(4, "running")
    shape = SHAPES["gemm"][0]
    for dtype in DTYPES:
        inputs = GEMM.inputs(shape, dtype, "cpu", seed=SEED)
        ref = GEMM.run_reference(inputs)[0][0]
        got = fn(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        eager = GEMM.variants["torch"].fn(**inputs)
        err, eager_err = error(got, ref).rel_l2, error(eager, ref).rel_l2
        old, _ = fixed.tolerance_for(dtype, eager_err)
        new, source = tolerance(GEMM.contract, dtype, dtype, eager_err, ref, inputs)
        assert err <= old / 3  # far inside the fixed floor
        assert err > new and source.startswith("derived"), (err, new, source)


# --- kernelab's own kernels through the interpreter -----------------------------------------


def _split_k(reduce_kernel=None):
    """kernelab's split-K GEMM (4 slices), optionally with another reduction kernel."""

    def gemm(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
        n = b.shape[1] if b_layout == "kn" else b.shape[0]
        cfg = GemmConfig.default_for(1, n, a.shape[1], a.dtype, a.device)
        cfg = replace(cfg, split_k=4, block_k=32)
        saved = gc._splitk_reduce_kernel
        if reduce_kernel is not None:
            gc._splitk_reduce_kernel = reduce_kernel
        try:
            return gemm_triton(a, b, bias, residual, activation, b_layout, out, config=cfg)
        finally:
            gc._splitk_reduce_kernel = saved

    return gemm


SPLIT = [_gemm("split-K", 3, 40, 520)]


def test_kernelab_split_k_gemm_passes_the_derived_bound():
    report = _report(_split_k(), "gemm", SPLIT)
    assert report.passed, _lines(report)
    assert all(
        m.tolerance_source.startswith("derived") for c in report.cases for m in c.measures.values()
    )


def test_kernelab_split_k_gemm_with_16_bit_partial_sums_is_caught(tmp_path):
    # the reduction's running sum rounded to the output's format after each slice
    mutant = mutate(
        mk._splitk_reduce_kernel,
        "acc += tl.load(Part + s * stride_ps + offs, mask=mask, other=0.0)",
        "acc = (acc + tl.load(Part + s * stride_ps + offs, mask=mask, other=0.0))"
        ".to(C.dtype.element_ty).to(tl.float32)",
        tmp_path,
    )
    mutant.fn.__globals__["_epilogue"] = mk._epilogue
    report = _report(_split_k(mutant), "gemm", SPLIT)
    assert {c.failure_class for c in report.cases} == {"wrong values"}, _lines(report)


@pytest.mark.parametrize("op", ["rmsnorm", "softmax"])
def test_kernelab_row_kernels_pass_the_derived_bound(op):
    report = verify_candidate(
        get(op).variants["kernelab"].fn,
        op,
        shapes=SHAPES[op][:1],
        dtypes=DTYPES,
        device="cpu",
        seed=SEED,
        trials=1,
    )
    assert report.passed, _lines(report)
    assert max(c.worst_ratio for c in report.cases) <= 1.0


# --- the bound itself -----------------------------------------------------------------------


def test_bound_follows_rounding_narrowings_and_length():
    ref = torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    inputs = {"x": torch.zeros(64, 4096)}
    once = Contract(reduction=lambda inp: inp["x"].shape[-1])
    twice = Contract(reduction=lambda inp: inp["x"].shape[-1], narrowings=1)
    b0, r, n, few = derived_bound(once, torch.bfloat16, ref, inputs)
    b1, _, _, _ = derived_bound(twice, torch.bfloat16, ref, inputs)
    assert few is None  # 4096 normal values: the statistics hold
    assert n == 4096 and 1e-3 < r < 3e-3  # bfloat16's rounding of normal values
    assert b0 == pytest.approx(1.1 * r + 2 * 2**-24 * 64)
    assert b1 == pytest.approx(1.1 * r * 2**0.5 + 2 * 2**-24 * 64)
    # float32 targets and ops without a reduction keep the floor
    assert derived_bound(once, torch.float32, ref, inputs) is None
    assert derived_bound(Contract(), torch.bfloat16, ref, inputs) is None
    assert tolerance(Contract(), torch.bfloat16, torch.bfloat16, None, ref, inputs) == (
        1e-2,
        "floor",
    )


def test_eager_torch_over_the_bound_gets_twice_its_error():
    ref = torch.randn(32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    inputs = {"x": torch.zeros(32, 32)}
    c = Contract(reduction=lambda inp: 32)
    bound, _, _, _ = derived_bound(c, torch.float16, ref, inputs)
    tol, source = tolerance(c, torch.float16, torch.float16, 3 * bound, ref, inputs)
    assert tol == pytest.approx(6 * bound) and source.startswith("2x eager torch")
    tol, source = tolerance(c, torch.float16, torch.float16, 0.5 * bound, ref, inputs)
    assert tol == pytest.approx(bound) and source.startswith("derived")


def _tiny_with_a_few_huge(few: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(2048, dtype=torch.float64, generator=gen) * 1e-3
    ref[torch.randperm(2048, generator=gen)[:few]] = 3.0 + torch.rand(
        few, generator=gen, dtype=torch.float64
    )
    return ref


def test_effective_elements():
    assert effective_elements(torch.ones(100, dtype=torch.float64)) == pytest.approx(100)
    assert effective_elements(_tiny_with_a_few_huge(4)) == pytest.approx(4, rel=0.2)
    one = torch.zeros(50, dtype=torch.float64)
    one[7] = -2.0
    assert effective_elements(one) == pytest.approx(1)
    assert effective_elements(torch.zeros(5, dtype=torch.float64)) == 0.0
    with_specials = torch.tensor([1.0, float("inf"), float("nan"), -1.0], dtype=torch.float64)
    assert effective_elements(with_specials) == pytest.approx(2)


def test_worst_case_rounds_each_value_moved_by_the_narrowings_either_way():
    x = torch.tensor([3.452623271131673], dtype=torch.float64)  # the paged attention output
    # no narrowing, a short accumulation: the reference's own rounding (3.453125)
    assert worst_case(x, torch.float16, 0, 70) == pytest.approx((3.453125 - x[0]) / x[0])
    # one narrowing moves it by up to 2^-11 of itself: 3.45094..3.45431, which round to
    # 3.451171875 and 3.455078125; the farther one counts
    assert worst_case(x, torch.float16, 1, 70) == pytest.approx((3.455078125 - x[0]) / x[0])
    # in L2 over the elements, zeros and specials left out; the largest value does not round
    # to infinity
    both = torch.tensor([3.452623271131673, 0.0, float("nan"), 65504.0], dtype=torch.float64)
    e0 = 3.455078125 - 3.452623271131673
    e1 = 65504.0 - 65472.0  # 65504 moved down by 2^-11 of itself rounds to 65472
    norm = (3.452623271131673**2 + 65504.0**2) ** 0.5
    assert worst_case(both, torch.float16, 1, 1) == pytest.approx((e0**2 + e1**2) ** 0.5 / norm)
    assert worst_case(torch.zeros(3, dtype=torch.float64), torch.float16, 1, 1) == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_norm_on_a_few_elements_takes_the_worst_case(dtype):
    """A few huge values among tiny ones (a partial update from the 'huge' draw): one
    element's rounding decides the case, so the bound is at least the worst case per element,
    and says so; spread values keep the statistical bound."""
    c = Contract(reduction=lambda inp: 70, narrowings=1)
    inputs = {"x": torch.zeros(1)}
    ref = _tiny_with_a_few_huge(4)
    bound, r, _, few = derived_bound(c, dtype, ref, inputs)
    assert few == pytest.approx(4, rel=0.2)
    assert bound == pytest.approx(worst_case(ref, dtype, 1, 70))
    assert bound > r * 2**0.5 * 1.1
    tol, source = tolerance(c, dtype, dtype, None, ref, inputs)
    assert tol == bound and f"worst case per element ({few:.1f} elements" in source, source
    spread = torch.randn(2048, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert derived_bound(c, dtype, spread, inputs)[3] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_a_few_elements_one_spacing_off_fails_without_a_narrowing_only(dtype):
    """Four elements carry the norm, each a quarter spacing above a value of the format: the
    reference rounded passes either way; one of them a spacing above its rounding fails an op
    with no narrowing (nothing honest moves it there) and passes one whose declared narrowing
    can (3.5 moved up by 2^-11 or 2^-8 of itself is 7/8 of a spacing)."""
    spacing = 2.0 * torch.finfo(dtype).eps  # in [2, 4)
    ref = torch.randn(2048, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref *= 1e-3
    ref[[5, 700, 1400, 2000]] = 3.5 + spacing / 4
    inputs = {"x": torch.zeros(1)}
    rounded = ref.to(dtype)
    off = rounded.clone()
    off[700] = 3.5 + spacing
    for k, off_passes in ((0, False), (1, True)):
        c = Contract(reduction=lambda inp: 64, narrowings=k)
        bound, _, _, few = derived_bound(c, dtype, ref, inputs)
        assert few == pytest.approx(4, rel=0.01)
        assert error(rounded, ref).rel_l2 <= bound
        assert (error(off, ref).rel_l2 <= bound) == off_passes, (k, error(off, ref), bound)


def test_paged_attention_softcap_window_partial_update_passes():
    """Found by a whole default verify run: kernelab's paged attention, float16, the softcap
    and window edge shape, on a partial update that took a few values from the 'huge' draw
    into tiny inputs. Four outputs carry the norm; P in float16 (the declared narrowing) put
    one of them one spacing off the nearest value, 1.18x the statistical bound (P in float32:
    exactly the reference's rounding). Judged by the worst case per element, it passes."""
    op = get("paged_attention")
    shape = next(s for s in shapes_for(op, "edge", "cpu", 32) if "softcap 50 window 32" in s.label)
    v = op.variants["kernelab"]
    subject = Subject(v.name, v.fn, v.prepare, v.supports, interpreted=True)
    tiny = distributions_of(op).index("tiny")  # the case's place in that run
    case = run_case(
        op, subject, shape, "edge", torch.float16, "cpu", 0, 2, op.variants["torch"].fn, tiny
    )
    assert [t["dist"] for t in case.trials][:2] == ["tiny", "tiny, changed from huge"]
    assert case.passed, [f.line() for f in case.failures]


def _verify_trial(op, seed: int, label: str, t: int, trials: int, dtype):
    """Trial ``t`` of a representative case as ``kernelab verify OP --dtype D --shapes
    representative --trials T --seed S`` draws it: (inputs, expected)."""
    shapes = shapes_for(op, "representative", "cpu", None)
    i = next(i for i, s in enumerate(shapes) if s.label.startswith(label))
    dists = distributions_of(op)
    dist = dists[(i * trials + t) % len(dists)]
    tseed = derive_seed(seed, op.name, shapes[i].key, str(dtype), t)
    inputs = op.inputs(shapes[i], dtype, "cpu", seed=tseed, dist=dist)
    assert t < trials - 1  # no NaN/Inf planted
    return dist, inputs, expected(op, inputs, op.variants["torch"].fn, dtype, "cpu")


#: ``kernelab verify paged_attention --variant kernelab --device cpu --dtype fp16 --shapes
#: representative --trials 4 --seed 880022203``: kernelab's kernel at 3.33x the bound on this
#: case's third trial. Huge inputs (float16 values near 10²) make scores near 2.8·10⁴, where
#: float32 rounds by 2·10⁻³; two keys 1.4 apart share the weight, and the float32 dot's
#: rounding moved it by 10⁻³: an output 4 spacings off (183.0 for 182.48).
HUGE_CASE = (880022203, "llama3-70b decode b8 ctx4096", 2, 4, torch.float16)


def test_float32_scores_of_huge_inputs_are_in_the_bound():
    """An honest paged attention summing its float32 scores one term at a time (the order
    with the most rounding) erred 3.95x the bound that counted only the output's format; the
    declared spread of the float32 scores counts it."""
    op = get("paged_attention")
    dist, inputs, exp = _verify_trial(op, *HUGE_CASE)
    assert dist == "huge"
    _, ref, _, (tol, source), _ = exp.targets[0]
    assert "amplified" in source
    err = error(narrowed.paged_tiles("sequential")(**inputs), ref).rel_l2
    assert err <= tol, (err, tol)
    # without the spread the bound is the output's rounding alone: the honest error is over it
    unamplified, _, _, _ = derived_bound(
        replace(op.contract, amplified=None), torch.float16, ref, inputs
    )
    assert err > 2 * unamplified


def test_kernelab_paged_attention_on_huge_inputs_passes():
    """The kernel on the case above (through the interpreter): 9.65e-5 against the bound
    2.9e-5 of the output's rounding (3.33x), within the bound with the scores' spread."""
    op = get("paged_attention")
    _, inputs, exp = _verify_trial(op, *HUGE_CASE)
    _, ref, _, (tol, _), _ = exp.targets[0]
    err = error(op.variants["kernelab"].fn(**inputs), ref).rel_l2
    assert err <= tol, (err, tol)


def test_the_spread_is_negligible_on_scores_of_order_one():
    """On normal inputs the scores' spread adds under 1 % to the bound: a planted rounding is
    judged as before."""
    op = get("paged_attention")
    shape = SHAPES["paged_attention"][0]
    inputs = op.inputs(shape, torch.float16, "cpu", seed=SEED, dist="normal")
    (ref,), _ = op.run_reference(inputs)
    with_spread = derived_bound(op.contract, torch.float16, ref, inputs, None, inputs)[0]
    without = derived_bound(op.contract, torch.float16, ref, inputs)[0]
    assert without < with_spread < 1.01 * without


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"reduction": len, "amplified": 3}, TypeError, "amplified: expected a callable"),
        ({"amplified": len}, ValueError, "amplified"),
        ({"narrowings": -1}, ValueError, "narrowings"),
        ({"narrowings": 1.0}, TypeError, "narrowings"),
        ({"narrowings": True}, TypeError, "narrowings"),
        ({"reduction": 5}, TypeError, "reduction"),
    ],
)
def test_contract_rejects_bad_reduction_declarations(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        Contract(**kwargs)


DECLARED = {
    "gemm": ("a", -1),
    "w8a16_gemm": ("x", -1),
    "w4a16_gemm": ("x", -1),
    "fp8_gemm": ("a", -1),
    "fp8_block_gemm": ("a", -1),
    "mx_gemm": ("a", -1),
    "rmsnorm": ("x", -1),
    "layernorm": ("x", -1),
    "softmax": ("x", -1),
    "merge_attention_states": ("states", 0),
}


@pytest.mark.parametrize("name", [*DECLARED, "paged_attention"])
def test_the_16_bit_ops_declare_their_reduction(name):
    op = get(name)
    shape = op.shapes("edge")[0]
    inputs = op.inputs(shape, op.dtypes[-1], "meta", seed=0)
    n = op.contract.reduction(inputs)
    if name == "paged_attention":
        assert op.contract.narrowings == 1  # P rounded to the cache's format before P·V
        assert n == int(inputs["seq_lens"].max())
    else:
        arg, dim = DECLARED[name]
        assert op.contract.narrowings == 0
        assert n == inputs[arg].shape[dim]
