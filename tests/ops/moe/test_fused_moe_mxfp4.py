"""fused_moe_mxfp4 through the interpreter against the float64 expert loop on the dequantized
weights; the e2m1 decode is exact; planted defects in the kernels are caught by verify and one
in the packer by the packer's own check; bad arguments are refused naming the argument."""

import importlib

import pytest
import torch
import triton.language as tl

from kernelab.core.runtime.triton import kernel
from kernelab.ops import FUSED_MOE_MXFP4, Shape, fused_moe_mxfp4
from kernelab.ops import packing as _packing
from kernelab.ops.moe.fused_moe_mxfp4 import (
    MoEConfig,
    fused_moe_mxfp4_ref,
    fused_moe_mxfp4_torch,
    fused_moe_mxfp4_triton,
)
from kernelab.verify import verify_candidate
from kernelab.verify._case import derive_seed
from tests.mutants import mutate
from tests.opcheck import check, clone

mc = importlib.import_module("kernelab.ops.moe._common")
kernels = importlib.import_module("kernelab.ops.moe._kernels")
OP = FUSED_MOE_MXFP4
EDGE = {s.label.split(" T=")[0]: s for s in OP.shapes("edge")}


@pytest.mark.parametrize(
    "name",
    [
        "an expert gets no tokens",
        "all tokens to one expert",
        "top-k = experts",
        "counts not a multiple of the block",
        "empty",
    ],
)
def test_kernel_matches_reference_on_edge_shapes(name):
    inputs = OP.inputs(EDGE[name], torch.bfloat16, "cpu", seed=5)
    check(OP, inputs, fused_moe_mxfp4_triton, torch.bfloat16)


def test_prefill_tiles_and_k_steps_of_128_over_a_partial_tile():
    """K = 96 in steps of 128 (a partly masked tile, three scale groups), 64-row tiles."""
    shape = Shape("t", {"tokens": 13, "experts": 3, "topk": 2, "hidden": 96, "intermediate": 96})
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=2)
    config = MoEConfig(64, 32, 128, 4, 2)
    check(OP, inputs, lambda **kw: fused_moe_mxfp4_triton(**kw, config=config), torch.float16)


def _first_call_inputs(run_seed, name, dist):
    """The inputs of verify's first trial of edge case ``name`` in float16 under ``run_seed``."""
    shape = EDGE[name]
    seed = derive_seed(run_seed, OP.name, shape.key, str(torch.float16), 0)
    return OP.inputs(shape, torch.float16, "cpu", seed=seed, dist=dist)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_float16_intermediate_past_its_range_is_the_references_too():
    """verify's seed 307963437, edge "top-k = experts", huge inputs: one silu(gate)·up value
    of token 2 is 1.14e5, past float16's range, so the stored intermediate holds +Inf there
    (as every kernel that feeds the down GEMM 16-bit operands does) and out[2, 9] is Inf, where
    an exact intermediate gives -18993.4. The reference rounds the intermediate as the kernels
    store it, so verify expects that Inf."""
    inputs = _first_call_inputs(307963437, "top-k = experts", "huge")
    exact = fused_moe_mxfp4_ref(**{k: v.double() if k == "x" else v for k, v in inputs.items()})
    assert abs(exact[2, 9].item() + 18993.43) < 0.01
    (ref,), _ = OP.run_reference(inputs)
    assert not ref[2, 9].isfinite()
    check(OP, inputs, fused_moe_mxfp4_triton, torch.float16)


def test_float16_parts_keep_float32_where_one_part_overflows_and_their_sum_does_not():
    """Edge "an expert gets no tokens", seed 18, huge inputs: out[3, 45] = -57620.5 is the
    sum of the parts -66211.3 and 8590.8; the first rounded to float16 is -Inf, which made
    that output -Inf."""
    inputs = OP.inputs(EDGE["an expert gets no tokens"], torch.float16, "cpu", seed=18,
                       dist="huge")  # fmt: skip
    (ref,), _ = OP.run_reference(inputs)
    assert abs(ref[3, 45].item() + 57620.53) < 0.01
    check(OP, inputs, fused_moe_mxfp4_triton, torch.float16)


@kernel
def _decode_kernel(Out, Q, S, n):
    r = tl.arange(0, 512)
    q = tl.load(Q + r, mask=r < n, other=0).to(tl.int32)
    s = tl.load(S + r, mask=r < n, other=127).to(tl.int32)
    tl.store(Out + r, kernels._e2m1_twice(q) * kernels._ue8m0_half(s), mask=r < n)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # ±inf on purpose
def test_the_register_decode_is_exact_for_every_code_and_scale_byte(interpret):
    scales = torch.tensor([0, 1, 2, 3, 100, 126, 127, 128, 200, 253, 254, 255], dtype=torch.uint8)
    q = torch.arange(16, dtype=torch.uint8).repeat(len(scales))
    s = scales.repeat_interleave(16)
    out = torch.empty(q.shape, dtype=torch.float32)
    _decode_kernel[(1,)](out, q, s, q.numel())
    want = _packing.e2m1_values(q) * torch.exp2(s.double() - 127)
    # in float32, as the kernel holds it: exact (2^-127 · 0.5 is a subnormal), ±inf only past
    # float32's range (|v| >= 2 at scale byte 254, |v| >= 4 at 253: 12 values; the quantizer
    # gives no finite weight a scale byte above 252)
    want = torch.where(s == _packing.MX_NAN_SCALE, torch.nan, want).float()
    assert torch.equal(out.isnan(), want.isnan()) and int(want.isinf().sum()) == 12
    assert torch.equal(out.nan_to_num(), want.nan_to_num())


def _nearest_even_e2m1(w, values, scales) -> bool:
    """Whether the mxfp4 ``values`` of ``w`` [E, N, K] are its nearest e2m1 grid points under
    ``scales`` (ties to the even code), saturating at ±6: the rule checked on its own, from the
    grid, not from the packer's thresholds."""
    y = w.double() / torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)
    grid = torch.tensor(_packing.E2M1_VALUES, dtype=torch.float64)
    dist = (y.abs().clamp(max=6.0)[..., None] - grid).abs()
    best = dist.min(dim=-1, keepdim=True).values
    # the even code among the nearest: the lowest even index that attains the minimum
    codes = torch.arange(8)
    even_pick = torch.where((dist == best) & (codes % 2 == 0), codes, 99).min(dim=-1).values
    any_pick = torch.where(dist == best, codes, 99).min(dim=-1).values
    want = torch.where(even_pick < 99, even_pick, any_pick)
    got = _packing.unpack_fp4(values).long()
    return bool(((got & 7) == want).all())


def test_quantize_mxfp4_experts_is_quantize_mx_per_row_and_rounds_to_nearest_even(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 40, 96, generator=g) * torch.logspace(-3, 2, 40)[None, :, None]
    values, scales = _packing.quantize_mxfp4_experts(w)
    assert values.shape == (3, 40, 48) and scales.shape == (3, 40, 3)
    one_v, one_s = _packing.quantize_mx(w[2], "mxfp4")
    assert torch.equal(values[2], one_v) and torch.equal(scales[2], one_s)
    deq = _packing.dequantize_mxfp4_experts(values, scales)
    assert torch.equal(deq[2], _packing.dequantize_mx(one_v, one_s, "mxfp4"))
    assert _nearest_even_e2m1(w, values, scales)
    # planted: e2m1 rounding toward zero in the packer (thresholds at the grid values)
    grid = torch.tensor(_packing.E2M1_VALUES)

    def toward_zero(y):
        code = (y.abs()[..., None] >= grid[1:]).sum(-1).to(torch.uint8)
        return code | ((y < 0).to(torch.uint8) << 3)

    monkeypatch.setattr(_packing, "e2m1_codes", toward_zero)
    bad_v, bad_s = _packing.quantize_mxfp4_experts(w)
    assert torch.equal(bad_s, scales) and not _nearest_even_e2m1(w, bad_v, bad_s)
    with pytest.raises(ValueError, match="w: K = 48 is not a multiple"):
        _packing.quantize_mxfp4_experts(w[..., :48])


def test_public_function_on_cpu_is_the_eager_loop():
    inputs = OP.inputs(EDGE["one token"], torch.float16, "cpu", seed=1)
    assert torch.equal(fused_moe_mxfp4(**clone(inputs)), fused_moe_mxfp4_torch(**clone(inputs)))


def test_cost_counts_packed_values_and_scales_of_the_experts_hit():
    shape = EDGE["an expert gets no tokens"]
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=1)
    t, e, k, h, i = (shape.dims[n] for n in ("tokens", "experts", "topk", "hidden", "intermediate"))
    hit = len(set(inputs["topk_ids"].flatten().tolist()))
    assert hit == e - 1
    cost = OP.cost(inputs)
    assert cost.flops == 6 * t * k * h * i
    assert cost.bytes == hit * (3 * h * i // 2 + 3 * h * i // 32) + 2 * t * h * 2 + t * k * 8
    meta = OP.cost(OP.inputs(shape, torch.bfloat16, "meta"))
    assert (meta.flops, meta.bytes) == (cost.flops, cost.bytes)
    oss = next(s for s in OP.shapes("representative") if "gpt-oss" in s.label)
    big = OP.cost(OP.inputs(oss, torch.bfloat16, "meta"))
    per_expert = 3 * 2880 * 2880 // 2 + 3 * 2880 * 2880 // 32  # 12.4 MB + 0.78 MB
    assert big.bytes == 4 * per_expert + 2 * 2880 * 2 + 4 * 8


def test_shapes_launches_and_default_configs():
    labels = [s.label for s in OP.shapes("representative")]
    for model in ("mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-120b-like"):
        assert sum(lab.startswith(model) for lab in labels) == 4, labels
    assert not any("deepseek" in lab for lab in labels)
    shape = next(s for s in OP.shapes("representative") if "qwen3" in s.label)
    names = [x.name for x in OP.launches(shape, torch.bfloat16)]
    assert names == [
        "_moe_align_kernel",
        "_fused_moe_kernel",
        "_fused_moe_kernel",
        "_moe_sum_kernel",
    ]
    assert MoEConfig.default_for(16 * 8, 128, mx4=True) == mc.MX4_CONFIGS[0]
    assert MoEConfig.default_for(4096 * 2, 8, mx4=True) == mc.MX4_CONFIGS[2]
    assert all(c.block_k % 32 == 0 for c in OP.tuning_space(shape, torch.bfloat16))
    with pytest.raises(ValueError, match="block_k=16 must be a multiple of 32"):
        fused_moe_mxfp4_triton(
            **OP.inputs(EDGE["one token"], torch.bfloat16, "cpu"), config=MoEConfig(16, 32, 16)
        )


def _bad(inputs):
    x, w1, s1 = inputs["x"], inputs["w1"], inputs["w1_scale"]
    return [
        ({"x": x[:, :48]}, ValueError, "x: hidden size H = 48 is not a multiple"),
        ({"w1": w1[:, :48]}, ValueError, "w1: intermediate size I = 24"),
        ({"w1": w1[:, :, :16]}, ValueError, "w1: expected shape (8, 128, 32)"),
        ({"w1_scale": s1.float()}, TypeError, "w1_scale: expected dtype"),
        ({"w2_scale": inputs["w2_scale"][:, :, :1]}, ValueError, "w2_scale: expected shape"),
        ({"w2": inputs["w2"].view(torch.int8)}, TypeError, "w2: expected dtype"),
        ({"topk_ids": inputs["topk_ids"] + 8}, ValueError, "topk_ids: expected expert ids"),
    ]


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize(
    "fn", [fused_moe_mxfp4_triton, fused_moe_mxfp4_torch], ids=["triton", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, case):
    inputs = OP.inputs(EDGE["one token"], torch.bfloat16, "cpu", seed=1)
    change, exc, words = _bad(inputs)[case]
    with pytest.raises(exc) as info:
        fn(**{**inputs, **change})
    assert words in str(info.value)


#: Three experts, K = 128 and 96 (two K steps of 64, two scale groups each, the last one half
#: masked), partial alignment blocks.
VERIFY_SHAPE = Shape(
    "mx groups T=9 E=3 k=2 128x96",
    {"tokens": 9, "experts": 3, "topk": 2, "hidden": 128, "intermediate": 96},
    batch_dim="tokens",
)

MUTANTS = {
    "nibble order swapped": (
        "_expert_dot",
        (
            ("w_even = (_e2m1_twice(q & 15) * f)", "w_even = (_e2m1_twice(q >> 4) * f)"),
            ("w_odd = (_e2m1_twice(q >> 4) * f)", "w_odd = (_e2m1_twice(q & 15) * f)"),
        ),
    ),
    # the group of k0's byte offset (k0 // 2 // 32) in place of k0's own (k0 // 32)
    "wrong K group's scale": ("_expert_dot", (("kg = k0 // 32 +", "kg = k0 // 64 +"),)),
    "scale exponent off by one": (
        "_ue8m0_half",
        (("tl.where(s >= 2, (s - 1) << 23", "tl.where(s >= 2, s << 23"),),
    ),
    # an expert's run rounded down to whole blocks: its last, partial block of pairs is lost
    "partial block dropped": (
        "_moe_align_kernel",
        (
            (
                "padded = tl.cdiv(counts, BLOCK_SIZE) * BLOCK_SIZE",
                "padded = (counts // BLOCK_SIZE) * BLOCK_SIZE",
            ),
        ),
    ),
    "routing weight twice": (
        "_fused_moe_kernel",
        (
            (
                "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)"
                "[:, None]",
                "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)"
                "[:, None] * tl.load(TopkWeights + rows, mask=row_ok, other=0.0)"
                ".to(tl.float32)[:, None]",
            ),
        ),
    ),
}


def _verify():
    return verify_candidate(fused_moe_mxfp4_triton, "fused_moe_mxfp4", shapes=[VERIFY_SHAPE],
                            dtypes=[torch.bfloat16], device="cpu", seed=17, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    kernel_name, edits = MUTANTS[name]
    mutant = getattr(kernels, kernel_name)
    for old, new in edits:
        mutant = mutate(mutant, old, new, tmp_path)
    if kernel_name == "_ue8m0_half":
        monkeypatch.setattr(kernels, "_ue8m0_half", mutant)
    elif kernel_name == "_expert_dot":
        mutant.fn.__globals__.update(
            _e2m1_twice=kernels._e2m1_twice, _ue8m0_half=kernels._ue8m0_half
        )
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
