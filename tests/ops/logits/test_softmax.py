"""Softmax: the Triton kernel (one-pass and online paths) against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.ops import Shape, get
from kernelab.ops.logits.softmax import SoftmaxConfig, softmax, softmax_torch, softmax_triton
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

sm_module = importlib.import_module("kernelab.ops.logits.softmax")
SOFTMAX = get("softmax")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ONLINE = SoftmaxConfig(2, 128, 2)  # forces the online path on rows wider than 128

# The online path evaluates exp(-inf - -inf) in lanes that have seen only -inf and discards it
# with tl.where; numpy, under the interpreter, warns about the discarded NaN.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SOFTMAX.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = SOFTMAX.inputs(shape.reduced(64), dtype, "cpu", seed=7)
    check(SOFTMAX, inputs, softmax_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_reduced_representative_shapes(dtype):
    shapes = SOFTMAX.shapes("representative")
    logits = next(s for s in shapes if s.dims["cols"] == 32768)  # mistral vocabulary, online
    scores = next(s for s in shapes if s.params.get("mask") == "keys")
    for shape in (logits.reduced(1), scores.reduced(2)):
        check(SOFTMAX, SOFTMAX.inputs(shape, dtype, "cpu", seed=2), softmax_triton, dtype)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
@pytest.mark.parametrize("config", [None, ONLINE], ids=["one-pass", "online"])
def test_kernel_matches_reference_on_hard_distributions(dist, config):
    shape = Shape("t", {"rows": 3, "cols": 1000}, {"mask": "full", "scale": 0.3})
    inputs = SOFTMAX.inputs(shape, torch.float32, "cpu", seed=3, dist=dist)
    check(SOFTMAX, inputs, lambda **kw: softmax_triton(**kw, config=config), torch.float32)


def test_online_path_survives_a_maximum_that_grows_late_and_masked_leading_blocks():
    # The first 300 columns are masked off, and the row's maximum sits in the last block: the
    # running sums must rescale without NaN from exp(-inf - -inf) and without overflow.
    x = torch.randn(2, 1000) * 30
    x[:, -5] = 400.0
    mask = torch.zeros(1000)
    mask[:300] = float("-inf")
    got = softmax_triton(x, 1.0, mask, config=ONLINE)
    ref = torch.softmax(x.double() + mask.double(), -1)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-7)
    assert torch.isfinite(got).all() and (got[:, :300] == 0).all()


def test_rows_sum_to_one_and_shift_invariance():
    x = torch.randn(4, 3000)
    for config in (None, ONLINE):
        y = softmax_triton(x, config=config)
        torch.testing.assert_close(y.sum(-1), torch.ones(4), rtol=0, atol=1e-5)
        torch.testing.assert_close(softmax_triton(x + 1000.0, config=config), y)


def test_broadcast_masks_and_out_argument(interpret):
    x = torch.randn(2, 3, 50)
    mask = torch.randn(2, 1, 50)
    out = torch.empty_like(x)
    assert softmax(x, 0.5, mask, out=out) is out
    torch.testing.assert_close(out, softmax_torch(x, 0.5, mask))
    torch.testing.assert_close(softmax(x, mask=mask[0, 0]), softmax_torch(x, mask=mask[0, 0]))
    assert softmax(torch.empty(0, 5)).shape == (0, 5)


def test_public_op_dispatches_to_torch_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(sm_module, "softmax_triton", lambda *a: calls.append("triton"))
    monkeypatch.delenv("KERNELAB_INTERPRET", raising=False)
    softmax(torch.randn(2, 8))
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    softmax(torch.randn(2, 8))
    assert calls == ["triton"]


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 8).long()}, TypeError, "x: expected dtype"),
        ({"scale": "2"}, TypeError, "scale: expected a float"),
        ({"scale": float("inf")}, ValueError, "scale: expected a finite float"),
        ({"scale": float("-inf")}, ValueError, "scale: expected a finite float"),
        ({"scale": float("nan")}, ValueError, "scale: expected a finite float, got nan"),
        ({"scale": True}, TypeError, "scale: expected a float, got bool"),
        ({"scale": torch.tensor(2.0)}, TypeError, "scale: expected a float, got Tensor"),
        ({"mask": torch.randn(3, 8)}, ValueError, "mask: expected a shape that broadcasts"),
        ({"mask": torch.randn(1, 2, 8)}, ValueError, "mask: expected a shape that broadcasts"),
        ({"mask": torch.ones(8).bool()}, TypeError, "mask: expected dtype"),
        ({"out": torch.empty(2, 9)}, ValueError, "out: expected shape (2, 8)"),
    ],
)
@pytest.mark.parametrize("fn", [softmax_triton, softmax_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), **kwargs})
    assert words in str(info.value)


def test_launches_compile_to_wide_accesses_without_spills_for_sm90():
    shapes = SOFTMAX.shapes("representative")
    logits = next(s for s in shapes if s.dims["cols"] == 152064)  # online path
    for shape in (logits, shapes[-1]):  # and the one-pass prefill scores with a full mask
        for launch in SOFTMAX.launches(shape, torch.bfloat16):
            assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "config"),
    [
        # the scale applied after the mask instead of before (one-pass path)
        (
            "z = tl.load(x_rows + cols[None, :], mask=inb, other=0.0).to(tl.float32) * scale",
            "z = tl.load(x_rows + cols[None, :], mask=inb, other=0.0).to(tl.float32)",
            None,
        ),
        # the online sum not rescaled when the running maximum grows
        ("s_i = s_i * alpha + ", "s_i = s_i + ", ONLINE),
        # padding lanes not excluded: they count as z = 0 in the sum (one-pass path)
        ('z = tl.where(inb, z, float("-inf"))\n        m =', "m =", None),
    ],
    ids=["scale-order", "online-no-rescale", "padding-in-sum"],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new, config):
    mutant = mutate(sm_module._softmax_kernel, old, new, tmp_path)
    monkeypatch.setattr(sm_module, "_softmax_kernel", mutant)
    shape = Shape("t", {"rows": 3, "cols": 1000}, {"mask": "full", "scale": 0.5})
    inputs = SOFTMAX.inputs(shape, torch.float32, "cpu", seed=5, dist="shifted")
    with pytest.raises(AssertionError, match="rel L2"):
        check(SOFTMAX, inputs, lambda **kw: softmax_triton(**kw, config=config), torch.float32)


@pytest.mark.parametrize("config", [None, SoftmaxConfig(1, 64, 1)], ids=["one-pass", "online"])
def test_a_nan_makes_its_row_nan_on_both_paths(config):
    # The GPU's max drops NaN unless asked to propagate it; the online path's running maximum
    # must keep it, or the row comes out finite with the NaN lane silently at zero.
    x = torch.randn(3, 300)
    x[1, 123] = float("nan")
    out = softmax_triton(x, config=config)
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()
