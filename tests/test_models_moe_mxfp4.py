"""quantize="mxfp4" puts the MoE blocks of Mixtral and Qwen3-MoE on fused_moe_mxfp4 with the
experts quantized once at patch time (weight-only, as the projections), parity-checked against
the block's quantize-dequantize reference; a wrong kernel is refused and named; experts whose
sizes are not multiples of 32 stay 16-bit and the patch says so; unpatch restores the model
bitwise."""

import functools
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelab import ops  # noqa: E402
from kernelab.models import PatchError, _parity, _patch, build, patch, state_of, unpatch  # noqa: E402
from kernelab.numerics import error  # noqa: E402

MOE = ("tiny-mixtral", "tiny-qwen3-moe")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _moe_blocks(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("SparseMoeBlock")]


@pytest.mark.parametrize("name", MOE)
def test_moe_blocks_run_fused_moe_mxfp4_on_experts_quantized_once(name, monkeypatch):
    model = build(name, dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    before = _parity.logits(model, ids)
    calls = []
    real = ops.fused_moe_mxfp4

    @functools.wraps(real)
    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "fused_moe_mxfp4", counted)
    state = patch(model, ("moe",), quantize="mxfp4")  # the parity check runs inside
    blocks = _moe_blocks(model)
    assert blocks and {n for n, _ in blocks} <= set(state.names)
    assert len(calls) >= len(blocks)  # the check's forward went through fused_moe_mxfp4
    assert not any("experts" in note for note in state.notes), state.notes
    for _, block in blocks:
        w1, s1, w2, s2 = vars(block)["_kernelab_mxfp4_experts"]
        e, two_i, h = block.experts.gate_up_proj.shape
        assert w1.dtype == s1.dtype == w2.dtype == torch.uint8
        assert w1.shape == (e, two_i, h // 2) and s1.shape == (e, two_i, h // 32)
        i = block.experts.down_proj.shape[2]
        assert w2.shape == (e, h, i // 2) and s2.shape == (e, h, i // 32)
        w = ops.packing.dequantize_mxfp4_experts(w1, s1, torch.float32)
        gate_up = block.experts.gate_up_proj.float()
        assert 0 < error(w, gate_up).rel_l2 < 0.2  # e2m1's error, not another matrix
    unpatch(model)
    assert all("_kernelab_mxfp4_experts" not in vars(b) for _, b in _moe_blocks(model))
    assert torch.equal(_parity.logits(model, ids), before)


def test_the_block_reference_holds_the_format_error_the_patch_does_not_hide():
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    _, block = _moe_blocks(model)[0]
    seen = {}
    handle = block.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    _parity.logits(model, ids)
    handle.remove()
    x = seen["x"]
    original = type(block).forward(block, x)
    patch(model, ("moe",), quantize="mxfp4")
    got = block(x)
    with _patch.reference_forwards(model, state_of(model).blueprint, "mxfp4") as refs:
        ref = refs[id(block)](x)
    to_ref, to_original = error(got, ref).rel_l2, error(got, original).rel_l2
    assert to_ref < to_original / 4, (to_ref, to_original)
    assert to_original > 1e-2  # e2m1 experts: a visible format error
    unpatch(model)


@pytest.mark.parametrize(
    "wrong",
    [
        # the routing weights applied twice
        lambda real: (
            lambda x, w1, w2, s1, s2, tw, ti, *a, **k: real(x, w1, w2, s1, s2, tw * tw, ti, *a, **k)
        ),
        # every scale of the down projection one power of two too large
        lambda real: (
            lambda x, w1, w2, s1, s2, tw, ti, *a, **k: real(x, w1, w2, s1, s2 + 1, tw, ti, *a, **k)
        ),
    ],
    ids=["weights twice", "down scales off by one"],
)
def test_a_wrong_fused_moe_mxfp4_is_refused_and_named(monkeypatch, wrong):
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    monkeypatch.setattr(ops, "fused_moe_mxfp4", wrong(ops.fused_moe_mxfp4))
    with pytest.raises(PatchError, match=r"first module that differs: model\.layers\.0\.mlp"):
        patch(model, ("moe",), quantize="mxfp4")
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)


def test_experts_whose_sizes_are_not_multiples_of_32_stay_16_bit_and_say_so():
    experts = types.SimpleNamespace(
        gate_up_proj=torch.zeros(4, 80, 64, dtype=torch.bfloat16),
        down_proj=torch.zeros(4, 64, 40, dtype=torch.bfloat16),
    )
    block = torch.nn.Module()
    block.experts = experts
    state = _patch.PatchState(blueprint=None, replacements=("moe",))
    _patch._quantize_experts(state, "model.layers.0.mlp", block, "mxfp4")
    assert "_kernelab_mxfp4_experts" not in vars(block)
    assert state.notes == [
        "model.layers.0.mlp: experts not quantized under mxfp4: hidden 64 or intermediate 40 "
        "is not a multiple of 32; fused_moe runs on the 16-bit expert weights"
    ]


@pytest.mark.slow
def test_moe_blocks_within_the_contract_through_the_interpreter(interpret):
    model = build("tiny-qwen3-moe", dtype=torch.bfloat16)
    patch(model, ("moe",), quantize="mxfp4")  # the Triton kernels interpreted
    assert _moe_blocks(model)[0][0] in state_of(model).names
    unpatch(model)
