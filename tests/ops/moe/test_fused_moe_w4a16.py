"""fused_moe_w4a16 through the interpreter against the float64 expert loop on the dequantized
weights; planted defects in the int4 path are caught."""

import importlib

import pytest
import torch

from kernelab.ops import FUSED_MOE_W4A16, Shape, fused_moe_w4a16
from kernelab.ops import packing as _packing
from kernelab.ops.moe.fused_moe_w4a16 import (
    MoEConfig,
    fused_moe_w4a16_torch,
    fused_moe_w4a16_triton,
    quantize_experts,
)
from tests.mutants import mutate
from tests.opcheck import check, clone

kernels = importlib.import_module("kernelab.ops.moe._kernels")
OP = FUSED_MOE_W4A16
EDGE = {s.label.split(" T=")[0]: s for s in OP.shapes("edge")}


@pytest.mark.parametrize(
    "name", ["an expert gets no tokens", "counts not a multiple of the block", "empty"]
)
def test_kernel_matches_reference_on_edge_shapes(name):
    inputs = OP.inputs(EDGE[name], torch.bfloat16, "cpu", seed=5)
    check(OP, inputs, fused_moe_w4a16_triton, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("shape", OP.shapes("representative")[1::4], ids=lambda s: s.label)
def test_representative_shapes_at_interpreter_size(shape):
    inputs = OP.inputs(shape.reduced(3), torch.float16, "cpu", seed=8, dist="heavy")
    check(OP, inputs, fused_moe_w4a16_triton, torch.float16)


def test_quantize_experts_is_the_int4_layout_per_expert():
    w = torch.randn(3, 24, 128)
    q, s, z = quantize_experts(w, 64, torch.float16)
    assert q.shape == (3, 64, 24) and s.shape == z.shape == (3, 2, 24)
    one = _packing.quantize_int4(w[1].t(), 64, torch.float16)
    assert torch.equal(q[1], one.qweight) and torch.equal(s[1], one.scales)
    inputs = OP.inputs(EDGE["one token"], torch.float16, "cpu", seed=1)
    assert torch.equal(fused_moe_w4a16(**clone(inputs)), fused_moe_w4a16_torch(**clone(inputs)))


def test_cost_counts_the_packed_weights_of_the_experts_hit():
    shape = EDGE["an expert gets no tokens"]
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=1)
    t, k, h, i = (shape.dims[n] for n in ("tokens", "topk", "hidden", "intermediate"))
    per_expert = 3 * h * i // 2 + (2 * i * h // 64 + h * i // 64) * 3  # codes, scales + zeros
    assert OP.cost(inputs).bytes == 3 * per_expert + 2 * t * h * 2 + t * k * 8
    assert OP.cost(inputs).flops == 6 * t * k * h * i


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        ({"group_size": 32}, ValueError, "group_size: expected one of"),
        ({"group_size": 64.0}, TypeError, "group_size: expected an int"),
        ({"w1_qweight": torch.zeros(4, 16, 128, dtype=torch.uint8)}, ValueError, "w1_qweight"),
        ({"w2_scales": torch.ones(4, 1, 64)}, TypeError, "w2_scales: expected dtype"),
        ({"w1_zeros": torch.zeros(4, 2, 64, dtype=torch.uint8)}, ValueError, "w1_zeros"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, exc, words):
    inputs = OP.inputs(EDGE["one token"], torch.bfloat16, "cpu", seed=1)
    with pytest.raises(exc) as info:
        fused_moe_w4a16_triton(**{**inputs, **change})
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["w1_zeros", "w2_zeros"])
def test_zero_points_outside_int4_are_refused_under_check(name):
    inputs = OP.inputs(EDGE["one token"], torch.bfloat16, "cpu", seed=1)
    zeros = inputs[name].clone()
    zeros[0, 0, 0] = 16
    with pytest.raises(ValueError, match=f"{name}: expected int4 zero points in \\[0, 15\\]"):
        fused_moe_w4a16_triton(**{**inputs, name: zeros})
    fused_moe_w4a16_triton(**{**inputs, name: zeros, "check": False})


def test_block_k_must_divide_the_group():
    inputs = OP.inputs(EDGE["one token"], torch.bfloat16, "cpu", seed=1)
    with pytest.raises(ValueError, match="block_k=128 must divide group_size=64"):
        fused_moe_w4a16_triton(**inputs, config=MoEConfig(16, 64, 128))


MUTANTS = {
    "nibble order": ("w_lo = ((q & 15) - z", "w_lo = ((q >> 4) - z"),
    "zero point sign": ("w_hi = ((q >> 4) - z[None, :])", "w_hi = ((q >> 4) + z[None, :])"),
    "group scale of the packed row": ("g = k0 // GROUP_SIZE", "g = (k0 // 2) // GROUP_SIZE"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    monkeypatch.setattr(kernels, "_expert_dot", mutate(kernels._expert_dot, old, new, tmp_path))
    shape = Shape(
        "t",
        {"tokens": 5, "experts": 3, "topk": 2, "hidden": 256, "intermediate": 64},
        {"group_size": 64},
    )
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=3)
    with pytest.raises(AssertionError, match="rel L2"):
        check(
            OP,
            inputs,
            lambda **kw: fused_moe_w4a16_triton(**kw, config=MoEConfig(16, 32, 64)),
            torch.float16,
        )
