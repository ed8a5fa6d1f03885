"""Microscaled (mxfp4 / mxfp8) GEMM through the interpreter against float64 on the dequantized
operands, the MX quantizer against an independent rounding, and planted defects in the
kernel's on-the-fly quantization and scale indexing."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import MX_GEMM, Shape, mx_gemm, packing
from kernelab.ops.matmul.mx_gemm import MxConfig, mx_gemm_torch, mx_gemm_triton
from tests.mutants import mutate
from tests.opcheck import check
from tests.opcheck import clone as _clone

module = importlib.import_module("kernelab.ops.matmul.mx_gemm")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")
SMALL = MxConfig(32, 32, 64, group_m=2, num_warps=4, num_stages=2)


def _check(inputs, fn):
    return check(MX_GEMM, inputs, fn, torch.bfloat16)


@pytest.mark.parametrize("shape", MX_GEMM.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    _check(MX_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=13, dist="heavy"), mx_gemm_triton)


@pytest.mark.parametrize("dist", ["huge", "tiny"])
def test_representative_shapes_at_interpreter_size(dist):
    shapes = MX_GEMM.shapes("representative")
    for m, fmt in ((1, "mxfp4"), (128, "mxfp8")):
        shape = next(s for s in shapes if s.dims["M"] == m and s.params["fmt"] == fmt)
        inputs = MX_GEMM.inputs(shape.reduced(8), torch.bfloat16, "cpu", seed=1, dist=dist)
        _check(inputs, mx_gemm_triton)


def test_kernel_output_equals_eager_to_the_bit_where_sums_are_exact():
    # Quantized activations and weights: every product is a power of two times a small
    # integer, so the float32 sums are exact in any order and the outputs must be identical.
    shape = Shape("t", {"M": 20, "N": 40, "K": 96}, {"fmt": "mxfp4", "quantize_a": True})
    inputs = MX_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=3)
    out = mx_gemm_triton(**_clone(inputs), config=SMALL)
    assert torch.equal(out, mx_gemm_torch(**_clone(inputs)))


def test_public_op_through_the_interpreter_and_on_torch(interpret, monkeypatch):
    shape = Shape("t", {"M": 3, "N": 24, "K": 64}, {"fmt": "mxfp4"})
    inputs = MX_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=4)
    interpreted = mx_gemm(**_clone(inputs))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    eager = mx_gemm(**_clone(inputs))
    (ref,), _ = MX_GEMM.run_reference(inputs)
    assert error(interpreted, ref).rel_l2 < 1e-2 and error(eager, ref).rel_l2 < 1e-2


@pytest.mark.parametrize(("fmt", "weight_bytes"), [("mxfp4", 64 * 128 // 2), ("mxfp8", 64 * 128)])
def test_cost_counts_packed_weight_and_scale_bytes(fmt, weight_bytes):
    shape = Shape("t", {"M": 4, "N": 64, "K": 128}, {"fmt": fmt})
    cost = MX_GEMM.cost(MX_GEMM.inputs(shape, torch.bfloat16, "meta"))
    assert cost.bytes == 2 * 4 * 128 + weight_bytes + 64 * 128 // 32 + 2 * 4 * 64
    assert cost.flops == 2 * 4 * 64 * 128


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        ({"a": torch.randn(2, 64)}, TypeError, "a: expected dtype"),
        ({"a": torch.randn(2, 48).to(torch.bfloat16)}, ValueError, "a: K = 48 is not a multiple"),
        ({"b": torch.zeros(8, 64, dtype=torch.uint8)}, ValueError, "b: expected [N, K/2]"),
        ({"b_scale": torch.zeros(8, 1, dtype=torch.uint8)}, ValueError, "b_scale: expected shape"),
        ({"fmt": "nvfp4"}, ValueError, "fmt: expected one of"),
        ({"fmt": "mxfp8"}, TypeError, "b: expected dtype"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, exc, words):
    args = {
        "a": torch.randn(2, 64).to(torch.bfloat16),
        "b": torch.zeros(8, 32, dtype=torch.uint8),
        "b_scale": torch.full((8, 2), 127, dtype=torch.uint8),
        **change,
    }
    with pytest.raises(exc) as info:
        mx_gemm_triton(**args)
    assert words in str(info.value)


# --- the quantizer ------------------------------------------------------------------------------


def _nearest_even_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Independent rounding: the nearest e2m1 magnitude by distance, ties to the even code,
    magnitudes above 6 saturating."""
    grid = torch.tensor(packing.E2M1_VALUES, dtype=torch.float64)
    d = (y.abs().clamp(max=6.0)[..., None] - grid).abs()
    best = d.min(dim=-1, keepdim=True).values
    ties = d == best
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.int().argmax(-1), ties.int().argmax(-1))
    return code.to(torch.uint8) | ((y < 0).to(torch.uint8) << 3)


def test_e2m1_rounding_is_nearest_even_and_saturating():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    assert packing.e2m1_values(packing.e2m1_codes(ties)).tolist() == [0, 1, 1, 2, 2, 4, 4]
    y = torch.cat([ties, -ties, torch.linspace(-9, 9, 1001, dtype=torch.float64)])
    assert torch.equal(packing.e2m1_codes(y), _nearest_even_e2m1(y))
    assert packing.e2m1_values(packing.e2m1_codes(torch.tensor([7.0, -100.0]))).tolist() == [6, -6]


def test_quantize_mx_nibble_order_scales_and_round_trip():
    x = torch.zeros(1, 64, dtype=torch.float64)
    x[0, 0], x[0, 1] = 1.0, 6.0  # codes 2 and 7: byte 0x72, element 0 in the low nibble
    values, scales = packing.quantize_mx(x, "mxfp4")
    assert values[0, 0].item() == 0x72 and scales[0].tolist() == [127, 0]
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 256, generator=g, dtype=torch.float64) * 10.0 ** torch.arange(-3, 5)[:, None]
    for fmt, rel in (("mxfp4", 0.25), ("mxfp8", 2.0**-4)):
        values, scales = packing.quantize_mx(w, fmt)
        deq = packing.dequantize_mx(values, scales, fmt)
        blocks = w.reshape(8, 8, 32)
        amax = blocks.abs().amax(-1)
        # the scale is 2^(⌊log2 amax⌋ − emax): the block's max lands in [2^emax, 2^(emax+1))
        top = amax / torch.exp2(scales.double() - 127)
        assert (
            (top >= 2.0 ** packing.MX_EMAX[fmt]) & (top < 2.0 ** (packing.MX_EMAX[fmt] + 1))
        ).all()
        step = torch.exp2(scales.double() - 127).repeat_interleave(32, 1)
        bound = rel * w.abs() + (0.25 if fmt == "mxfp4" else 2.0**-9) * step
        clipped = w.abs() > step * (6.0 if fmt == "mxfp4" else 448.0)
        assert ((deq - w).abs() <= bound)[~clipped].all()


# --- planted defects ----------------------------------------------------------------------------

RTZ = (  # e2m1 rounding toward zero: thresholds at the grid values, not at the midpoints
    ("(ay > 0.25).to(tl.int32) + (ay >= 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)",
     "(ay >= 0.5).to(tl.int32) + (ay >= 1.0).to(tl.int32) + (ay >= 1.5).to(tl.int32)"),
    ("(ay >= 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay >= 3.5).to(tl.int32)",
     "(ay >= 2.0).to(tl.int32) + (ay >= 3.0).to(tl.int32) + (ay >= 4.0).to(tl.int32)"),
    ("code += (ay > 5.0).to(tl.int32)", "code += (ay >= 6.0).to(tl.int32)"),
)  # fmt: skip
MUTANTS = {
    "nibble-order-swapped": (
        "_mx_quantize",
        (("values = (lo | (hi << 4)).to(tl.uint8)", "values = (hi | (lo << 4)).to(tl.uint8)"),),
    ),
    "e2m1-rounding-toward-zero": ("_mx_quantize", RTZ),
    "weight-scale-per-wrong-block": (
        "_mx_gemm_kernel",
        (("ks = k0 // 32 + rks", "ks = k0 // BLOCK_K + rks"),),
    ),
    "shared-exponent-off-by-one": (
        "_mx_quantize",
        (("exponent - (2 if FP4 else 8)", "exponent - (3 if FP4 else 9)"),),
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    target, edits = MUTANTS[name]
    mutant = getattr(kernels, target)
    for old, new in edits:
        mutant = mutate(mutant, old, new, tmp_path)
    if target == "_mx_quantize":
        monkeypatch.setitem(kernels._mx_gemm_kernel.fn.__globals__, "_mx_quantize", mutant)
    else:
        mutant.fn.__globals__.update(
            _tile_coords=kernels._tile_coords, _mx_quantize=kernels._mx_quantize
        )
        monkeypatch.setattr(module, "_mx_gemm_kernel", mutant)
    shape = Shape("t", {"M": 24, "N": 40, "K": 192}, {"fmt": "mxfp4", "quantize_a": True})
    inputs = MX_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=6)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(inputs, lambda **kw: mx_gemm_triton(**kw, config=SMALL))


# --- what the compiler makes of tl.dot_scaled (no GPU needed) ------------------------------------


@pytest.mark.slow
def test_quantized_prefill_is_native_on_sm100_and_weight_only_is_emulated():
    import re

    from triton.backends.compiler import GPUTarget

    from tests.opcheck import compile_launch

    reps = MX_GEMM.shapes("representative")
    prefill = next(s for s in reps if s.dims["M"] == 2048 and s.params["fmt"] == "mxfp4")
    decode = next(s for s in reps if s.dims["M"] == 1)
    mma = re.compile(r"\btcgen05\.mma\S*")
    for shape, native in ((prefill, True), (decode, False)):
        (launch,) = MX_GEMM.launches(shape, torch.bfloat16)
        ptx = compile_launch(launch, GPUTarget("cuda", 100, 32)).asm["ptx"]
        found = set(mma.findall(ptx))
        assert found, f"no tcgen05 MMA for {shape.label}"
        assert any(".kind::mxf4.block_scale" in i for i in found) == native, found
        assert ".local" not in ptx


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN on purpose
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_nan_or_inf_in_a_block_gives_the_nan_scale_and_nan_rows(fmt):
    from kernelab.numerics import special_mismatch

    shape = Shape("t", {"M": 4, "N": 8, "K": 64}, {"fmt": fmt, "quantize_a": True})
    inputs = MX_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    inputs["a"][1, 3] = float("nan")
    inputs["a"][2, 40] = float("inf")
    _, scales = packing.quantize_mx(inputs["a"], fmt)
    assert scales[1, 0] == scales[2, 1] == packing.MX_NAN_SCALE and scales[0].max() < 255
    (ref,), _ = MX_GEMM.run_reference(inputs)
    out = mx_gemm_triton(**_clone(inputs), config=SMALL)
    assert not special_mismatch(out, ref).any()
    assert out[1:3].isnan().all() and torch.isfinite(out[[0, 3]]).all()
