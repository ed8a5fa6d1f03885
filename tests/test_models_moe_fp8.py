"""quantize="fp8-block" puts the MoE blocks of Mixtral and Qwen3-MoE on fused_moe_fp8 with the
experts quantized once at patch time, parity-checked against the block's quantize-dequantize
reference; a wrong kernel is refused and named; unpatch restores the model bitwise."""

import functools

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


def _block_input(model, name, ids):
    """The hidden states the block ``name`` receives on ``ids``."""
    seen = {}
    block = model.get_submodule(name)
    handle = block.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    try:
        _parity.logits(model, ids)
    finally:
        handle.remove()
    return seen["x"]


@pytest.mark.parametrize("name", MOE)
def test_moe_blocks_run_fused_moe_fp8_on_experts_quantized_once(name, monkeypatch):
    model = build(name, dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    before = _parity.logits(model, ids)
    calls = []
    real = ops.fused_moe_fp8

    @functools.wraps(real)
    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "fused_moe_fp8", counted)
    patch(model, ("moe",), quantize="fp8-block")  # the parity check runs inside
    blocks = _moe_blocks(model)
    assert blocks and {n for n, _ in blocks} <= set(state_of(model).names)
    assert len(calls) >= len(blocks)  # the check's forward went through fused_moe_fp8
    for _, block in blocks:
        w1, s1, w2, s2 = vars(block)["_kernelab_fp8_experts"]
        e, two_i, h = block.experts.gate_up_proj.shape
        assert w1.dtype == torch.float8_e4m3fn and w1.shape == (e, two_i, h)
        assert s1.shape == (e, -(-two_i // 128), -(-h // 128)) and s1.dtype == torch.float32
        assert w2.shape == block.experts.down_proj.shape and s2.dtype == torch.float32
    unpatch(model)
    assert all("_kernelab_fp8_experts" not in vars(b) for _, b in _moe_blocks(model))
    assert torch.equal(_parity.logits(model, ids), before)


def test_the_block_reference_holds_the_format_error_the_patch_does_not_hide():
    """The patched block sits far closer to its quantize-dequantize reference than to the
    original block: the reference carries the format's error (experts and activations in
    e4m3), so the contract measures the kernel."""
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    name, block = _moe_blocks(model)[0]
    x = _block_input(model, name, ids)
    original = type(block).forward(block, x)
    patch(model, ("moe",), quantize="fp8-block")
    got = block(x)
    with _patch.reference_forwards(model, state_of(model).blueprint, "fp8-block") as refs:
        ref = refs[id(block)](x)
    to_ref, to_original = error(got, ref).rel_l2, error(got, original).rel_l2
    assert to_ref < to_original / 4, (to_ref, to_original)
    assert to_original > 1e-2  # e4m3 experts and activations: a visible format error
    unpatch(model)


@pytest.mark.parametrize(
    "wrong",
    [
        # the routing weights applied twice
        lambda real: (
            lambda x, w1, w2, s1, s2, tw, ti, *a, **k: real(x, w1, w2, s1, s2, tw * tw, ti, *a, **k)
        ),
        # the down projection's block scales lost (all ones)
        lambda real: (
            lambda x, w1, w2, s1, s2, tw, ti, *a, **k: real(
                x, w1, w2, s1, torch.ones_like(s2), tw, ti, *a, **k
            )
        ),
    ],
    ids=["weights twice", "down scales lost"],
)
def test_a_wrong_fused_moe_fp8_is_refused_and_named(monkeypatch, wrong):
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    monkeypatch.setattr(ops, "fused_moe_fp8", wrong(ops.fused_moe_fp8))
    with pytest.raises(PatchError, match=r"first module that differs: model\.layers\.0\.mlp"):
        patch(model, ("moe",), quantize="fp8-block")
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)


@pytest.mark.slow
def test_moe_blocks_within_the_contract_through_the_interpreter(interpret):
    model = build("tiny-qwen3-moe", dtype=torch.bfloat16)
    patch(model, ("moe",), quantize="fp8-block")  # the Triton kernels interpreted
    assert _moe_blocks(model)[0][0] in state_of(model).names
    unpatch(model)
