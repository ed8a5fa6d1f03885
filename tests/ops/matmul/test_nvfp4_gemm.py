"""nvfp4 GEMM through the interpreter against float64 on the dequantized operands, the nvfp4
quantizer against an independent rounding, and planted defects in the kernel's on-the-fly
quantization, scale indexing and per-tensor scales."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import NVFP4_GEMM, Shape, nvfp4_gemm, packing
from kernelab.ops.matmul.nvfp4_gemm import Nvfp4Config, nvfp4_gemm_torch, nvfp4_gemm_triton
from tests.mutants import mutate
from tests.opcheck import check
from tests.opcheck import clone as _clone

module = importlib.import_module("kernelab.ops.matmul.nvfp4_gemm")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")
SMALL = Nvfp4Config(32, 32, 64, group_m=2, num_warps=4, num_stages=2)
E4M3 = torch.float8_e4m3fn


def _check(inputs, fn):
    return check(NVFP4_GEMM, inputs, fn, torch.bfloat16)


@pytest.mark.parametrize("shape", NVFP4_GEMM.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    _check(
        NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=13, dist="heavy"), nvfp4_gemm_triton
    )


@pytest.mark.parametrize("dist", ["huge", "tiny"])
def test_representative_shapes_at_interpreter_size(dist):
    shapes = NVFP4_GEMM.shapes("representative")
    for m in (1, 128):
        shape = next(s for s in shapes if s.dims["M"] == m)
        inputs = NVFP4_GEMM.inputs(shape.reduced(8), torch.bfloat16, "cpu", seed=1, dist=dist)
        _check(inputs, nvfp4_gemm_triton)


@pytest.mark.parametrize("dist", ["normal", "heavy", "huge", "tiny"])
@pytest.mark.parametrize("quantize_a", [False, True])
def test_kernel_output_equals_eager_to_the_bit_where_sums_are_exact(quantize_a, dist):
    # e2m1 values times e4m3 scales have at most 4 significant bits; a bf16 activation times
    # one has at most 12, and their float32 sums at these sizes are exact in any order: the
    # kernel's quantizer must match packing's to the bit, and the scales apply as eager's do.
    shape = Shape("t", {"M": 20, "N": 40, "K": 192}, {"quantize_a": quantize_a})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=3, dist=dist)
    out = nvfp4_gemm_triton(**_clone(inputs), config=SMALL)
    assert torch.equal(out, nvfp4_gemm_torch(**_clone(inputs)))


def test_activation_scale_defaults_to_the_activations_max():
    shape = Shape("t", {"M": 9, "N": 24, "K": 64}, {"quantize_a": True})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=5)
    given = nvfp4_gemm_triton(**_clone(inputs), config=SMALL)
    inputs["a_global"] = None
    assert torch.equal(nvfp4_gemm_triton(**_clone(inputs), config=SMALL), given)
    # a calibrated scale that is too small saturates instead of overflowing
    inputs["a_global"] = packing.nvfp4_global_scale(inputs["a"]) / 64
    _check(inputs, lambda **kw: nvfp4_gemm_triton(**kw, config=SMALL))


def test_public_op_through_the_interpreter_and_on_torch(interpret, monkeypatch):
    shape = Shape("t", {"M": 3, "N": 24, "K": 64}, {})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=4)
    interpreted = nvfp4_gemm(**_clone(inputs))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    eager = nvfp4_gemm(**_clone(inputs))
    (ref,), _ = NVFP4_GEMM.run_reference(inputs)
    assert error(interpreted, ref).rel_l2 < 1e-2 and error(eager, ref).rel_l2 < 1e-2


@pytest.mark.parametrize("quantize_a", [False, True])
def test_cost_counts_packed_weight_and_scale_bytes(quantize_a):
    shape = Shape("t", {"M": 4, "N": 64, "K": 128}, {"quantize_a": quantize_a})
    cost = NVFP4_GEMM.cost(NVFP4_GEMM.inputs(shape, torch.bfloat16, "meta"))
    scalars = 8 if quantize_a else 4
    assert cost.bytes == 2 * 4 * 128 + 64 * 128 // 2 + 64 * 128 // 16 + scalars + 2 * 4 * 64
    assert cost.flops == 2 * 4 * 64 * 128


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        ({"a": torch.randn(2, 64)}, TypeError, "a: expected dtype"),
        ({"a": torch.randn(2, 40).to(torch.bfloat16)}, ValueError, "a: K = 40 is not a multiple"),
        ({"b": torch.zeros(8, 64, dtype=torch.uint8)}, ValueError, "b: expected [N, K/2]"),
        ({"b_scale": torch.zeros(8, 2).to(E4M3)}, ValueError, "b_scale: expected shape"),
        ({"b_scale": torch.zeros(8, 4, dtype=torch.uint8)}, TypeError, "b_scale: expected dtype"),
        ({"b_global": 1.0}, TypeError, "b_global: expected a one-element float32"),
        ({"b_global": torch.ones(2)}, TypeError, "b_global: expected a one-element float32"),
        ({"a_global": torch.ones(())}, ValueError, "a_global: the activation's scale is used"),
        ({"quantize_a": 1}, TypeError, "quantize_a"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, exc, words):
    args = {
        "a": torch.randn(2, 64).to(torch.bfloat16),
        "b": torch.zeros(8, 32, dtype=torch.uint8),
        "b_scale": torch.ones(8, 4).to(E4M3),
        "b_global": torch.ones(()),
        **change,
    }
    with pytest.raises(exc) as info:
        nvfp4_gemm_triton(**args)
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


def test_quantize_nvfp4_rounds_ties_to_even_and_saturates():
    one = torch.ones(())  # global scale 1: block scale amax / 6, here 1.0 with a 6 in the block
    x = torch.zeros(1, 16, dtype=torch.float64)
    x[0, :9] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 6.0])
    values, scales, _ = packing.quantize_nvfp4(x, one)
    assert scales.float().tolist() == [[1.0]]
    deq = packing.dequantize_nvfp4(values, scales, one)[0, :9].tolist()
    assert deq == [0, 1, 1, 2, 2, 4, 4, -4, 6]
    # a block whose max rounds down in e4m3 (6.3 / 6 → 1.0): its max saturates at 6 · scale
    x[0, 8] = 6.3
    values, scales, _ = packing.quantize_nvfp4(x, one)
    assert scales.float().item() == 1.0 and packing.dequantize_nvfp4(values, scales, one)[0, 8] == 6
    # block scales saturate at 448 under a global scale too small for the block
    big = torch.full((1, 16), 1e6, dtype=torch.float64)
    values, scales, _ = packing.quantize_nvfp4(big, one)
    assert scales.float().item() == 448 and (packing.unpack_fp4(values) == 7).all()
    # against the independent rounding, through the scale the quantizer chose
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 256, generator=g, dtype=torch.float64) * 10.0 ** torch.arange(-3, 5)[:, None]
    values, scales, gs = packing.quantize_nvfp4(w)
    sg = (scales.float() * gs).repeat_interleave(16, 1)
    # rows 10^7 below the largest leave e4m3's range: their scales are 0, and so their values
    assert (scales[0].float() == 0).all() and (scales[-1].float() > 0).all()
    y = torch.where(sg > 0, w.float() / sg, 0.0).double()
    assert torch.equal(packing.unpack_fp4(values), _nearest_even_e2m1(y))


def test_quantize_nvfp4_nibble_order_scales_and_round_trip():
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, 0], x[0, 1] = 1.0, 6.0  # codes 2 and 7: byte 0x72, element 0 in the low nibble
    values, scales, gs = packing.quantize_nvfp4(x, torch.ones(()))
    assert values[0, 0].item() == 0x72 and scales.float().tolist() == [[1.0, 0.0]]
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 256, generator=g, dtype=torch.float64)
    w = w * torch.randn(8, 16, generator=g, dtype=torch.float64).exp().repeat_interleave(16, 1)
    values, scales, gs = packing.quantize_nvfp4(w)
    # the global scale puts the largest block scale at e4m3's top
    assert gs.item() == pytest.approx(w.abs().max().item() / (448 * 6), rel=1e-6)
    assert scales.float().max().item() == 448
    # each block's scale is the e4m3 value nearest to its max / (6 · g), ties to the even byte
    grid = torch.arange(127, dtype=torch.uint8).view(E4M3).double()  # every finite e4m3 ≥ 0
    t = (w.float().reshape(8, 16, 16).abs().amax(-1) / (gs * 6)).double()
    d = (t[..., None] - grid).abs()
    nearest = (d == d.min(-1, keepdim=True).values) & (torch.arange(127) % 2 == 0)
    nearest = torch.where(nearest.any(-1), nearest.int().argmax(-1), d.argmin(-1))
    assert torch.equal(scales.view(torch.uint8).long(), nearest)
    deq = packing.dequantize_nvfp4(values, scales, gs)
    step = (scales.double() * gs.double()).repeat_interleave(16, 1)
    # half of e2m1's spacing is at most a quarter of the value, or 0.25 below 1; a block max
    # whose e4m3 scale rounded down (by at most 2^-4) saturates at most 0.4 past 6
    bound = 0.25 * w.abs() + 0.75 * step
    assert ((deq - w).abs() <= bound).all()
    assert error(deq, w).rel_l2 < 0.12


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: packing.quantize_nvfp4(torch.ones(2, 24)), ValueError, "x: K = 24"),
        (lambda: packing.quantize_nvfp4(torch.ones(16)), ValueError, "x: expected"),
        (lambda: packing.quantize_nvfp4(torch.ones(2, 16, dtype=torch.int32)), TypeError, "x:"),
        (lambda: packing.quantize_nvfp4(torch.ones(2, 16), 0.5), TypeError, "global_scale:"),
        (lambda: packing.quantize_nvfp4(torch.ones(2, 16), torch.zeros(())), ValueError,
         "global_scale: expected a positive finite"),
        (lambda: packing.dequantize_nvfp4(torch.zeros(2, 8, dtype=torch.uint8),
                                          torch.ones(2, 1), "1"), TypeError, "global_scale:"),
    ],
)  # fmt: skip
def test_quantizer_bad_input_errors_name_the_argument(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN on purpose
def test_nan_or_inf_in_a_block_gives_the_nan_scale_and_nan_rows():
    from kernelab.numerics import special_mismatch

    shape = Shape("t", {"M": 4, "N": 8, "K": 64}, {"quantize_a": True})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    inputs["a"][1, 3] = float("nan")
    inputs["a"][2, 40] = float("inf")
    _, scales, _ = packing.quantize_nvfp4(inputs["a"], inputs["a_global"])
    assert scales[1, 0].float().isnan() and scales[2, 2].float().isnan()
    assert not scales[[0, 3]].float().isnan().any()
    (ref,), _ = NVFP4_GEMM.run_reference(inputs)
    out = nvfp4_gemm_triton(**_clone(inputs), config=SMALL)
    assert not special_mismatch(out, ref).any()
    assert out[1:3].isnan().all() and torch.isfinite(out[[0, 3]]).all()


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
        "_nvfp4_quantize",
        (
            (
                "return (lo | (hi << 4)).to(tl.uint8), scale",
                "return (hi | (lo << 4)).to(tl.uint8), scale",
            ),
        ),
    ),
    "e2m1-rounding-toward-zero": ("_nvfp4_quantize", RTZ),
    "values-against-the-unrounded-scale": (
        "_nvfp4_quantize",
        (("sg = scale.to(tl.float32) * g", "sg = t * g"),),
    ),
    "block-scale-without-global": (
        "_nvfp4_quantize",
        (("tl.div_rn(amax, g * 6.0)", "tl.div_rn(amax, 6.0)"),),
    ),
    "weight-scale-per-wrong-block": (
        "_nvfp4_gemm_kernel",
        (("ks = k0 // 16 + rks", "ks = k0 // 32 + rks"),),
    ),
    "weight-block-scale-skipped": (  # the last scale block of each row read as 0
        "_nvfp4_gemm_kernel",
        (
            (
                "mask=n_ok[:, None] & (ks[None, :] < K // 16),",
                "mask=n_ok[:, None] & (ks[None, :] < K // 16 - 1),",
            ),
        ),
    ),
    "activation-global-scale-dropped": (
        "_nvfp4_gemm_kernel",
        (("        g = g * ga\n", "        g = g * 1.0\n"),),
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    target, edits = MUTANTS[name]
    mutant = getattr(kernels, target)
    for old, new in edits:
        mutant = mutate(mutant, old, new, tmp_path)
    if target == "_nvfp4_quantize":
        monkeypatch.setitem(kernels._nvfp4_gemm_kernel.fn.__globals__, "_nvfp4_quantize", mutant)
    else:
        mutant.fn.__globals__.update(
            _tile_coords=kernels._tile_coords, _nvfp4_quantize=kernels._nvfp4_quantize
        )
        monkeypatch.setattr(module, "_nvfp4_gemm_kernel", mutant)
    shape = Shape("t", {"M": 24, "N": 40, "K": 192}, {"quantize_a": True})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=6)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(inputs, lambda **kw: nvfp4_gemm_triton(**kw, config=SMALL))


# --- what the compiler makes of tl.dot_scaled (no GPU needed) ------------------------------------


@pytest.mark.slow
def test_quantized_prefill_is_native_on_sm100_and_weight_only_is_emulated():
    import re

    from triton.backends.compiler import GPUTarget

    from tests.opcheck import compile_launch

    reps = NVFP4_GEMM.shapes("representative")
    prefill = next(s for s in reps if s.dims["M"] == 2048)
    decode = next(s for s in reps if s.dims["M"] == 1)
    mma = re.compile(r"\btcgen05\.mma\S*")
    for shape, native in ((prefill, True), (decode, False)):
        (launch,) = NVFP4_GEMM.launches(shape, torch.bfloat16)
        ptx = compile_launch(launch, GPUTarget("cuda", 100, 32)).asm["ptx"]
        found = set(mma.findall(ptx))
        assert found, f"no tcgen05 MMA for {shape.label}"
        assert any(".kind::mxf4nvf4.block_scale.block16" in i for i in found) == native, found
        assert ".local" not in ptx


@pytest.mark.slow
def test_inspect_names_the_block_scaled_mma_on_sm100_and_says_emulated_elsewhere():
    from kernelab.inspect.stage import inspect_ops

    result = inspect_ops([NVFP4_GEMM], "sm_80,sm_90,sm_100,gfx942", dtypes=["bfloat16"], jobs=1)
    by_target = {}
    for r in result.reports:
        if "M=2048,N=4096,K=4096" in r.key:  # llama3-8b o, quantized a
            by_target[r.target] = r
    assert sorted(by_target) == ["gfx942", "sm_100", "sm_80", "sm_90"]
    for target, rep in by_target.items():
        notes = [f.message for f in rep.findings if f.kind == "dot-scaled"]
        if target == "sm_80":  # Triton has no float8e4nv there: not compiled, and said so
            assert rep.facts is None and not notes and "fp8e4nv" in rep.unsupported
            continue
        elif target == "sm_100":
            assert notes == [
                "tl.dot_scaled native: tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16"
            ]
        else:
            assert len(notes) == 1 and notes[0].startswith(f"tl.dot_scaled emulated on {target}")
        assert rep.ok and rep.facts["spill_bytes"] == 0


@pytest.mark.parametrize("fn", [nvfp4_gemm_triton, nvfp4_gemm_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("bad", [0.0, -2.0, float("inf"), float("nan")])
@pytest.mark.parametrize("name", ["b_global", "a_global"])
def test_a_global_scale_that_is_not_finite_and_positive_is_refused_when_checked(fn, bad, name):
    shape = Shape("t", {"M": 4, "N": 16, "K": 32}, {"quantize_a": True})
    inputs = NVFP4_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    inputs[name] = torch.full((), bad)
    with pytest.raises(ValueError, match=rf"^{name}: expected finite positive scales, got"):
        fn(**_clone(inputs))
    if fn is nvfp4_gemm_triton or name == "b_global":  # the eager path's quantizer checks
        assert fn(**_clone(inputs), check=False).shape == (4, 16)  # a_global itself, always
