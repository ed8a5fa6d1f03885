"""fused_moe_fp8 through the interpreter against the float64 recipe (the activations quantized
as the kernels quantize them); planted defects in the fp8 path are caught by verify; bad
arguments are refused naming the argument."""

import importlib
import importlib.util

import pytest
import torch

from kernelab.ops import FUSED_MOE_FP8, Shape, fp8_quant, fused_moe_fp8
from kernelab.ops import packing as _packing
from kernelab.ops.moe.fused_moe_fp8 import (
    MoEConfig,
    fused_moe_fp8_ref,
    fused_moe_fp8_torch,
    fused_moe_fp8_triton,
    quantize_activations,
)
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check, clone

mc = importlib.import_module("kernelab.ops.moe._common")
kernels = importlib.import_module("kernelab.ops.moe._kernels")
fused_moe_fp8_module = importlib.import_module("kernelab.ops.moe.fused_moe_fp8")
OP = FUSED_MOE_FP8
EDGE = {s.label.split(" T=")[0]: s for s in OP.shapes("edge")}
E4M3 = torch.float8_e4m3fn
FNUZ = torch.float8_e4m3fnuz


@pytest.mark.parametrize(
    "name",
    [
        "an expert gets no tokens",
        "all tokens to one expert",
        "top-k = experts",
        "counts not a multiple of the block",
        "non-contiguous x",
        "empty",
        "H and I past one block, not multiples of 128",
        "shared expert past one block",
        "ue8m0 scales",
    ],
)
def test_kernel_matches_reference_on_edge_shapes(name):
    inputs = OP.inputs(EDGE[name], torch.bfloat16, "cpu", seed=5)
    check(OP, inputs, fused_moe_fp8_triton, torch.bfloat16)


@pytest.mark.slow
def test_deepseek_v3_decode_shape_at_interpreter_size():
    """DeepSeek-V3 at 16 tokens (top-8 and the shared expert), cut to 16 experts, H = I = 128."""
    shape = next(s for s in OP.shapes("representative") if "deepseek-v3 decode T=16" in s.label)
    inputs = OP.inputs(shape.reduced(3), torch.float16, "cpu", seed=8)
    check(OP, inputs, fused_moe_fp8_triton, torch.float16)


def test_a_config_with_narrow_tiles_and_k_steps_of_32():
    config = MoEConfig(16, 32, 32, 4, 2)  # 16-row tiles: several blocks per expert's run
    inputs = OP.inputs(EDGE["counts not a multiple of the block"], torch.float16, "cpu")
    check(OP, inputs, lambda **kw: fused_moe_fp8_triton(**kw, config=config), torch.float16)


def test_the_reference_quantizes_the_activations_as_fp8_quant_does():
    x = torch.randn(5, 200, dtype=torch.bfloat16) * 3
    v, s = fp8_quant(x, group_size=128)
    want = v.double() * s.double().repeat_interleave(128, dim=1)[:, :200]
    assert torch.equal(quantize_activations(x.double(), E4M3, torch.float64), want)
    # and it is a quantization: not the identity
    assert not torch.equal(want, x.double())


def test_quantize_fp8_block_experts_is_quantize_fp8_block_per_expert():
    w = torch.randn(3, 200, 130)
    values, scales = _packing.quantize_fp8_block_experts(w, ue8m0=True)
    assert values.shape == (3, 200, 130) and values.dtype == E4M3
    assert scales.shape == (3, 2, 2) and scales.dtype == torch.float32
    one_v, one_s = _packing.quantize_fp8_block(w[2], ue8m0=True)
    assert torch.equal(values[2].view(torch.uint8), one_v.view(torch.uint8))
    assert torch.equal(scales[2], one_s)
    back = _packing.dequantize_fp8_block_experts(values, scales)
    assert torch.equal(back[2], _packing.dequantize_fp8_block(one_v, one_s))
    with pytest.raises(ValueError, match="w: expected 3 dimensions"):
        _packing.quantize_fp8_block_experts(w[0])


def _small(**params):
    dims = {"tokens": 6, "experts": 4, "topk": 2, "hidden": 160, "intermediate": 64}
    if params.get("shared"):
        dims["shared_intermediate"] = 32
    return OP.inputs(Shape("t", dims, params), torch.bfloat16, "cpu", seed=4)


def test_public_function_on_cpu_is_the_eager_recipe():
    inputs = _small(shared=True)
    assert torch.equal(fused_moe_fp8(**clone(inputs)), fused_moe_fp8_torch(**clone(inputs)))


def test_ids_outside_the_experts_are_refused_or_masked():
    inputs = _small()
    inputs["topk_ids"][1, 0] = 4
    inputs["topk_ids"][3, 1] = -2
    for fn in (fused_moe_fp8_triton, fused_moe_fp8_torch):
        with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 4\)"):
            fn(**clone(inputs))
    got = fused_moe_fp8_triton(**{**clone(inputs), "check": False})
    masked = clone(inputs)
    masked["topk_weights"][1, 0] = masked["topk_weights"][3, 1] = 0.0
    masked["topk_ids"][1, 0] = masked["topk_ids"][3, 1] = 0
    (ref,), _ = OP.run_reference(masked)
    assert (got.double() - ref).norm() / ref.norm() < 1e-2


def _bad(inputs):
    return [
        ({"w1_scale": inputs["w1_scale"].half()}, TypeError, "w1_scale: expected dtype"),
        ({"w2_scale": inputs["w2_scale"].double()}, TypeError, "w2_scale: expected dtype"),
        (
            {"w1_scale": inputs["w1_scale"][:, :, :1]},
            ValueError,
            "w1_scale: expected shape (4, 1, 2)",
        ),
        ({"w2_scale": inputs["w2_scale"][:, :, :0]}, ValueError, "w2_scale: expected shape"),
        ({"w1": inputs["w1"].float().bfloat16()}, TypeError, "w1: expected dtype"),
        ({"w2": inputs["w2"][:, :, :32]}, ValueError, "w2: expected shape (4, 160, 64)"),
        ({"x": inputs["x"].float()}, TypeError, "x: expected dtype"),
        ({"shared_w1": inputs["w1"][:1]}, ValueError, "expected all four"),
        ({"topk_ids": inputs["topk_ids"].float()}, TypeError, "topk_ids: expected dtype"),
        ({"fp8_dtype": FNUZ}, TypeError, "fp8_dtype: expected None or w1's dtype"),
    ]


@pytest.mark.parametrize("case", range(10))
@pytest.mark.parametrize("fn", [fused_moe_fp8_triton, fused_moe_fp8_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, case):
    inputs = _small()
    change, exc, words = _bad(inputs)[case]
    with pytest.raises(exc) as info:
        fn(**{**inputs, **change})
    assert words in str(info.value)


def test_cost_counts_e4m3_weights_and_float32_scales_of_the_experts_hit():
    shape = EDGE["an expert gets no tokens"]
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=1)
    t, e, k, h, i = (shape.dims[n] for n in ("tokens", "experts", "topk", "hidden", "intermediate"))
    cost = OP.cost(inputs)
    assert cost.flops == 6 * t * k * h * i and cost.compute == "float8_e4m3fn"
    hit = len(set(inputs["topk_ids"].flatten().tolist()))
    assert hit == e - 1
    # 64x32: one 128-block each way per projection, so 2 float32 scales an expert
    assert cost.bytes == hit * (3 * h * i + 2 * 4) + 2 * t * h * 2 + t * k * 8
    meta = OP.cost(OP.inputs(shape, torch.bfloat16, "meta"))
    assert (meta.flops, meta.bytes) == (cost.flops, cost.bytes)
    ds = next(s for s in OP.shapes("representative") if "deepseek" in s.label)
    big = OP.cost(OP.inputs(ds, torch.bfloat16, "meta"))
    # an expert of DeepSeek-V3: 3·7168·2048 bytes of e4m3, (32·56 + 56·16)·4 bytes of scales
    per_expert = 3 * 7168 * 2048 + (32 * 56 + 56 * 16) * 4
    assert big.bytes == 8 * per_expert + per_expert + 2 * 7168 * 2 + 8 * 8


def test_launches_and_default_configs():
    shape = next(s for s in OP.shapes("representative") if "deepseek" in s.label)
    names = [x.name for x in OP.launches(shape, torch.bfloat16)]
    gemm, quant, align, add = (
        "_fused_moe_kernel",
        "_fp8_quant_kernel",
        "_moe_align_kernel",
        "_moe_sum_kernel",
    )
    assert names == [quant, align, gemm, quant, gemm, gemm, quant, gemm, add]
    assert MoEConfig.default_for(16 * 8, 256, fp8=True) == MoEConfig(64, 32, 128, 4, 3)
    space = OP.tuning_space(shape, torch.bfloat16)
    assert space and all(c.block_k in (32, 64, 128) for c in space)
    with pytest.raises(ValueError, match="block_k=96 must divide group_size=128"):
        fused_moe_fp8_triton(**_small(), config=MoEConfig(16, 32, 96))


def test_the_vllm_variant_is_listed_only_when_vllm_imports():
    assert ("vllm" in OP.variants) == (importlib.util.find_spec("vllm") is not None)
    assert {"kernelab", "torch"} <= set(OP.variants)


#: Three experts, both projections past one 128-block in N and in K (gate+up 2I = 320: a
#: block across the gate/up boundary; down's K = 160, a short last block), partial alignment
#: blocks.
VERIFY_SHAPE = Shape(
    "fp8 blocks T=9 E=3 k=2 256x160",
    {"tokens": 9, "experts": 3, "topk": 2, "hidden": 256, "intermediate": 160},
    batch_dim="tokens",
)

MUTANTS = {
    # scales applied per wrong block: the weight scale of rows n read from block n // 256
    "weight scale of the wrong N block": (
        "_expert_dot",
        "S + (rn // GROUP_SIZE) * stride_sn",
        "S + (rn // (2 * GROUP_SIZE)) * stride_sn",
    ),
    # scales applied per wrong block: every K block takes the first activation group's scale
    "activation scale of the first K group": (
        "_fused_moe_kernel",
        "sa_rows + (k0 // GROUP_SIZE) * stride_sak",
        "sa_rows + 0 * stride_sak",
    ),
    # a K block's scale skipped: the first block's product added unscaled
    "first K block unscaled": (
        "_expert_dot",
        "acc += tl.dot(a, b) * sa[:, None] * sb[None, :]",
        "acc += tl.dot(a, b) * tl.where(k0 > 0, sa[:, None] * sb[None, :], 1.0)",
    ),
    # the weight's block scale skipped on the last K block (a shorter block: K = 160)
    "last K block's weight scale skipped": (
        "_expert_dot",
        "acc += tl.dot(a, b) * sa[:, None] * sb[None, :]",
        "acc += tl.dot(a, b) * sa[:, None] * tl.where(k0 + GROUP_SIZE < K, sb[None, :], 1.0)",
    ),
    # an expert's run rounded down to whole blocks: its last, partial block of pairs is lost
    "partial block dropped": (
        "_moe_align_kernel",
        "padded = tl.cdiv(counts, BLOCK_SIZE) * BLOCK_SIZE",
        "padded = (counts // BLOCK_SIZE) * BLOCK_SIZE",
    ),
    # the routing weight multiplied in twice
    "routing weight twice": (
        "_fused_moe_kernel",
        "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]",
        "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]"
        " * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]",
    ),
}


def _verify():
    return verify_candidate(fused_moe_fp8_triton, "fused_moe_fp8", shapes=[VERIFY_SHAPE],
                            dtypes=[torch.bfloat16], device="cpu", seed=17, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    kernel_name, old, new = MUTANTS[name]
    mutant = mutate(getattr(kernels, kernel_name), old, new, tmp_path)
    if kernel_name == "_expert_dot":
        monkeypatch.setattr(kernels, "_expert_dot", mutant)
    else:
        mutant.fn.__globals__["_expert_dot"] = kernels._expert_dot
        monkeypatch.setattr(mc, kernel_name, mutant)
    report = _verify()
    assert not report.passed
    failures = [f for c in report.cases for f in c.failures]
    assert failures and all(f.target == "out" for f in failures), [f.line() for f in failures]


def test_the_kernels_pass_verify_on_the_same_cases():
    report = _verify()
    assert report.passed, [f.line() for c in report.cases for f in c.failures]


# --- AMD's flavour: float8_e4m3fnuz (largest value 240) -----------------------------------------

#: gfx942's recipe on the CPU: the weights in e4m3fnuz (the shape names it), so the activations
#: are quantized to it too; H = 160: a full and a short activation group.
FNUZ_SHAPE = Shape(
    "fnuz T=6 E=4 k=2 160x64",
    {"tokens": 6, "experts": 4, "topk": 2, "hidden": 160, "intermediate": 64},
    {"fp8": "e4m3fnuz"},
    batch_dim="tokens",
)


def _fnuz_inputs():
    inputs = OP.inputs(FNUZ_SHAPE, torch.bfloat16, "cpu", seed=3)
    inputs["x"][:3].mul_(400.0)  # groups whose activations exceed 240 (and 448)
    return inputs


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_the_reference_quantizes_activations_to_the_flavour_of_the_inputs():
    inputs = _fnuz_inputs()
    assert inputs["w1"].dtype == FNUZ and inputs["fp8_dtype"] == FNUZ
    assert float(inputs["x"].abs().amax()) > 448
    (ref,), _ = OP.run_reference(inputs)  # on float64 copies: the flavour comes by fp8_dtype
    f64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
           for k, v in inputs.items()}  # fmt: skip
    assert torch.equal(ref, fused_moe_fp8_ref(**{**f64, "fp8_dtype": FNUZ}))
    fn_ref = fused_moe_fp8_ref(**{**f64, "fp8_dtype": E4M3})
    assert torch.equal(fused_moe_fp8_ref(**{**f64, "fp8_dtype": None}), fn_ref)
    # eager torch and the kernels make fnuz's quantization: near the fnuz reference, and the
    # e4m3fn recipe (what the reference made of float64 weights) is 10x further off
    for fn in (fused_moe_fp8_torch, fused_moe_fp8_triton):
        got = fn(**clone(inputs))
        assert _rel(got, ref) < 1e-2
        assert _rel(got, fn_ref) > 10 * _rel(got, ref), fn.__name__
    # without fp8_dtype the eager recipe takes the weights' own flavour
    no_arg = {**clone(inputs), "fp8_dtype": None}
    assert torch.equal(fused_moe_fp8_torch(**no_arg), fused_moe_fp8_torch(**clone(inputs)))


def _fn_recipe_on_fnuz_weights(**kw):
    """A planted candidate: the e4m3fn activation quantization on e4m3fnuz weights (the
    reference's old recipe for float64 copies of AMD's weights)."""
    x, w1 = kw["x"], kw["w1"]
    shared = (kw["shared_w1"], kw["shared_w2"], kw["shared_w1_scale"], kw["shared_w2_scale"])
    args = (x, w1, kw["w2"], kw["w1_scale"], kw["w2_scale"], kw["topk_weights"])
    ids = kw["topk_ids"].long()
    y = fused_moe_fp8_module._loop(*args, ids, shared, torch.float32, E4M3).to(x.dtype)
    return y if kw.get("out") is None else kw["out"].copy_(y)


def _verify_fnuz(fn):
    return verify_candidate(fn, "fused_moe_fp8", shapes=[FNUZ_SHAPE], dtypes=[torch.bfloat16],
                            device="cpu", seed=23, trials=1)  # fmt: skip


@pytest.mark.parametrize("fn", [fused_moe_fp8_torch, fused_moe_fp8_triton], ids=["torch", "triton"])
def test_verify_holds_fnuz_inputs_to_the_fnuz_recipe(fn):
    report = _verify_fnuz(fn)
    assert report.passed, [f.line() for c in report.cases for f in c.failures]


def test_verify_refuses_the_e4m3fn_recipe_on_fnuz_weights():
    report = _verify_fnuz(_fn_recipe_on_fnuz_weights)
    failures = [f for c in report.cases for f in c.failures]
    assert not report.passed and failures
    assert {f.cls for f in failures} == {"wrong values"}, [f.line() for f in failures]
