"""The corpus of flawed kernels: each is caught, with its failure class named; correct
kernels on the same cases never are."""

from collections import Counter

import pytest
import torch

from kernelab.ops import RMSNORM, Shape
from kernelab.verify import verify_candidate
from tests.flawed.rmsnorm_flaws import TORCH_FLAWS, TRITON_FLAWS, triton_flaw

#: Small cases that still reach every path a flaw hides in: a partial block (300 and 96 columns
#: in blocks of 512 and 128), several rows, the fused residual, a single row.
SHAPES = [
    Shape("5x300 +res", {"rows": 5, "cols": 300}, {"residual": True}, batch_dim="rows"),
    Shape("3x96", {"rows": 3, "cols": 96}, {}, batch_dim="rows"),
    Shape("1x40", {"rows": 1, "cols": 40}, {}, batch_dim="rows"),
]
DTYPES = (torch.float32, torch.bfloat16)
SEED = 20261130


def _verdict(fn):
    report = verify_candidate(
        fn, "rmsnorm", shapes=SHAPES, dtypes=DTYPES, device="cpu", seed=SEED, trials=2
    )
    failing = [c for c in report.cases if not c.passed]
    return report, failing, Counter(c.failure_class for c in failing)


def _assert_caught_as(fn, expected):
    report, failing, primary = _verdict(fn)
    assert not report.passed and failing
    # The class named is the flaw's, on most failing cases; details name it too.
    assert primary.most_common(1)[0][0] == expected, primary
    failure = next(f for c in failing for f in c.failures if f.cls == expected)
    assert failure.message and failure.target
    if expected not in ("contract", "wrong values"):
        assert failure.indices, failure  # the first offending elements are shown


@pytest.mark.parametrize("name", list(TRITON_FLAWS))
def test_triton_flaw_is_caught_with_its_class(name, tmp_path):
    expected, fn = triton_flaw(name, tmp_path)
    _assert_caught_as(fn, expected)


@pytest.mark.parametrize("name", list(TORCH_FLAWS))
def test_torch_flaw_is_caught_with_its_class(name):
    expected, factory = TORCH_FLAWS[name]
    _assert_caught_as(factory(), expected)


@pytest.mark.parametrize("variant", ["kernelab", "torch"])
def test_correct_kernels_on_the_same_cases_pass(variant):
    report, failing, _ = _verdict(RMSNORM.variants[variant].fn)
    assert report.passed, [f.line() for c in failing for f in c.failures]
    assert 0.0 < max(c.worst_ratio for c in report.cases) <= 1.0


def test_unmutated_launcher_through_the_swap_passes(tmp_path):
    # The swap used by the Triton flaws is itself harmless: an identity "mutation" passes.
    from tests.flawed.rmsnorm_flaws import rmsnorm_module, with_kernel
    from tests.mutants import mutate

    same = mutate(
        rmsnorm_module._rmsnorm_kernel, "row_ok = rows < n_rows", "row_ok = rows < n_rows", tmp_path
    )
    report, failing, _ = _verdict(with_kernel(same))
    assert report.passed, [f.line() for c in failing for f in c.failures]


# --- a guessed layout: every argument that selects a behaviour has a case shapes cannot answer --


def _guesses_layout(torch_fn):
    """A GEMM that reads the weight's layout off its shape (K matches a's columns: [K, N]),
    ignoring ``b_layout``: right on every non-square weight."""

    def candidate(a, b, *args, b_layout=None, **kwargs):
        guessed = "kn" if b.shape[0] == a.shape[1] else "nk"
        return torch_fn(a, b, *args, b_layout=guessed, **kwargs)

    return candidate


@pytest.mark.parametrize("op_name", ["gemm", "fp8_gemm"])
def test_a_gemm_guessing_the_weight_layout_from_its_shape_is_caught(op_name):
    from kernelab.ops import get

    op = get(op_name)
    shapes = [s for s in op.shapes("edge") if s.label.startswith("square weight")]
    assert len(shapes) == 2 and {s.params["layout"] for s in shapes} == {"nk", "kn"}
    dtype = op.dtypes[0]
    report = verify_candidate(
        _guesses_layout(op.variants["torch"].fn), op_name, shapes=shapes, dtypes=(dtype,),
        device="cpu", seed=SEED, trials=1,
    )  # fmt: skip
    failing = {c.shape_key for c in report.cases if not c.passed}
    assert len(failing) == 1, [c.shape_key for c in report.cases]  # the layout it gets wrong
    honest = verify_candidate(
        op.variants["torch"].fn, op_name, shapes=shapes, dtypes=(dtype,), device="cpu",
        seed=SEED, trials=1,
    )  # fmt: skip
    assert honest.passed


# --- a flaw the common distributions cannot show: a one-pass variance ---------------------------


def _one_pass_layernorm(x, weight, bias=None, eps=1e-5, residual=None, out=None):
    """LayerNorm with var = E[h²] − E[h]² in float32: exact algebra, catastrophic cancellation
    under a common offset."""
    h = x if residual is None else (x + residual)
    if residual is not None:
        residual.copy_(h)
    f = h.float()
    mean = f.mean(-1, keepdim=True)
    var = (f * f).mean(-1, keepdim=True) - mean * mean
    y = (f - mean) * torch.rsqrt(var.clamp_min(0) + eps) * weight.float()
    y = (y + bias.float() if bias is not None else y).to(x.dtype)
    return y if out is None else out.copy_(y)


def test_a_one_pass_variance_is_caught_on_many_shapes_with_every_seed():
    from kernelab.ops import LAYERNORM

    assert "offset" in LAYERNORM.contract.distributions
    for seed in (0, 1, 2):
        report = verify_candidate(
            _one_pass_layernorm, "layernorm", dtypes=(torch.float32,), device="cpu", seed=seed
        )
        failing = {c.shape for c in report.cases if not c.passed}
        assert len(failing) >= 8, (seed, failing)  # of 26 float32 cases
        offset = [c for c in report.cases if "offset" in [t["dist"] for t in c.trials]]
        assert sum(not c.passed for c in offset) >= 8  # where the offset shows it


def test_layernorm_is_at_least_as_accurate_as_eager_torch_under_an_offset(monkeypatch):
    """Both paths of the kernel (through the interpreter) sum about each row's first value: a
    common offset of 1000σ costs them nothing, where a mean summed about zero lost ~2× eager
    torch's error on long rows."""
    from kernelab.numerics import error
    from kernelab.ops import LAYERNORM

    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    shapes = [
        Shape("one pass 5x1021", {"rows": 5, "cols": 1021}, {"bias": True}, batch_dim="rows"),
        Shape("looped 3x17384 +res", {"rows": 3, "cols": 17384}, {"residual": True},
              batch_dim="rows"),
    ]  # fmt: skip
    for shape in shapes:
        for seed in (0, 1, 2):
            inputs = LAYERNORM.inputs(shape, torch.float32, "cpu", seed=seed, dist="offset")
            (ref,), _ = LAYERNORM.run_reference(inputs)
            errs = {}
            for v in ("kernelab", "torch"):
                args = {k: t.clone() if isinstance(t, torch.Tensor) else t
                        for k, t in inputs.items()}  # fmt: skip
                errs[v] = error(LAYERNORM.variants[v].fn(**args), ref).rel_l2
            assert errs["kernelab"] <= errs["torch"], (shape.label, seed, errs)
