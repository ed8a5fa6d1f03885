"""Block-scaled fp8 and mxfp4 projections: parity against the quantize-dequantized original,
planted defects refused, layers that cannot take the format kept dense and said so, MoE experts
left in 16 bits under mxfp4 and said so."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelab import ops  # noqa: E402
from kernelab.models import PatchError, _linear, _parity, build, patch, state_of, unpatch  # noqa: E402
from kernelab.models._arch import blueprint_for  # noqa: E402
from kernelab.numerics import error  # noqa: E402
from kernelab.ops import packing  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# bfloat16 through the interpreter (fp8_quant's groups, fp8_block_gemm, mx_gemm); float32 and
# float16 on the CPU path (the ops' torch references; float16 through bfloat16 for mx_gemm).
CASES = [
    ("tiny-llama", "fp8-block", torch.bfloat16, True),
    ("tiny-qwen2", "mxfp4", torch.bfloat16, True),  # q/k/v biases
    ("tiny-qwen3", "fp8-block", torch.float32, False),
    ("tiny-llama", "mxfp4", torch.float32, False),
    ("tiny-qwen2", "mxfp4", torch.float16, False),
]


@pytest.mark.parametrize(("name", "quantize", "dtype", "interpreted"), CASES)
def test_block_fp8_and_mxfp4_patches_match_the_quantize_dequantized_original(
    name, quantize, dtype, interpreted, monkeypatch
):
    if interpreted:
        monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    model = build(name, dtype=dtype)
    ids = _parity.probe_inputs(model, tokens=4)
    original = _parity.logits(model, ids)
    with _linear.reference_forwards(model, blueprint_for(model), quantize):
        fake_quant = _parity.logits(model, ids)
    state = patch(model, quantize=quantize, check_tokens=4)  # the parity check runs inside
    # 4 attention projections and down_proj per layer, plus one fused gate/up per MLP; K and N
    # of 32 to 384 (fp8-block: every 128-block partial somewhere), none kept dense
    assert len(state.linears) == 2 * 6 and not state.notes
    assert {p.kind for _, _, p in state.linears} == {quantize}
    got = _parity.logits(model, ids)
    assert error(got, fake_quant).rel_l2 <= _parity.tolerance(dtype, quantize)
    if dtype == torch.float32:  # the ops' torch code on both sides: float32's own contract (a
        # fused gate/up quantized in blocks straddling gate and up was 3.2e-2 away)
        assert error(got, fake_quant).rel_l2 <= _parity.TOLERANCE[torch.float32]
    # the quantization is real: the original is much farther away than the fake-quantized one
    # (not asserted for bfloat16 fp8-block: bfloat16 rounding upstream moves some activations
    # by a whole e4m3 step, as for "fp8", and the contract alone holds there)
    if not (dtype == torch.bfloat16 and quantize == "fp8-block"):
        assert error(got, original).rel_l2 > 5 * error(got, fake_quant).rel_l2
    assert error(got, original).rel_l2 > error(got, fake_quant).rel_l2
    unpatch(model)


def _blocky(model):
    """Layer 0's gate projection with its first 128 rows 16x larger: its 128 x 128 blocks' scales
    differ by 16x (random weights give blocks of nearly equal scales, where a misplaced scale
    would hide)."""
    with torch.no_grad():
        model.model.layers[0].mlp.gate_proj.weight[:128] *= 16
    return model


def _shifted(real):
    def wrong(a, b, scale_a, scale_b, out=None):  # the weight's block scales one block off
        return real(a, b, scale_a, scale_b.flatten().roll(1).view_as(scale_b), out)

    return wrong


def _nibbles_swapped(real):
    def wrong(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None):
        return real(a, (b << 4) | (b >> 4), b_scale, fmt, quantize_a, out)

    return wrong


@pytest.mark.parametrize(
    ("quantize", "fn", "wrong", "where"),
    [
        ("fp8-block", "fp8_block_gemm", _shifted, r"model\.layers\.0\.mlp"),
        ("mxfp4", "mx_gemm", _nibbles_swapped, r"model\.layers\.0\.self_attn\.q_proj"),
    ],
    ids=["fp8-block scales shifted by one block", "mxfp4 nibbles swapped"],
)
def test_a_wrong_block_scaled_gemm_is_refused_and_named(monkeypatch, quantize, fn, wrong, where):
    model = _blocky(build("tiny-llama", dtype=torch.bfloat16))
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    patch(model, quantize=quantize)  # honest: accepted on the same model
    unpatch(model)
    monkeypatch.setattr(ops, fn, wrong(getattr(ops, fn)))
    with pytest.raises(PatchError, match=rf"quantize='{quantize}'.*differs: {where}"):
        patch(model, quantize=quantize)
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)


def test_fp8_block_scales_read_transposed_are_outside_the_contract(monkeypatch, interpret):
    """A 256 x 256 projection (2 x 2 scale blocks, one 16x larger): the GEMM reading its scale
    grid transposed errs far beyond the fp8 contract; the honest call is within it."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(256, 256, generator=gen)
    w[:128, 128:] *= 16
    prepared = _linear.prepare(w.to(torch.bfloat16), None, "fp8-block", "proj")
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    tol = _parity.tolerance(torch.bfloat16, "fp8-block")
    want = prepared.reference(x)
    assert error(prepared(x), want).rel_l2 <= tol / 10
    real = ops.fp8_block_gemm
    monkeypatch.setattr(
        ops, "fp8_block_gemm", lambda a, b, sa, sb, out=None: real(a, b, sa, sb.t().contiguous())
    )
    assert error(prepared(x), want).rel_l2 > tol


def test_fp8_block_fused_gate_up_quantizes_each_projection_as_alone():
    """Intermediate 192: one 128-row block would hold gate and up rows; each part is quantized
    alone (as a checkpoint's gate_proj and up_proj are) and padded to whole blocks."""
    gen = torch.Generator().manual_seed(1)
    gate, up = torch.randn(192, 64, generator=gen), torch.randn(192, 64, generator=gen) * 8
    fused = _linear.prepare(torch.cat([gate, up]), None, "fp8-block", "mlp", parts=(192, 192))
    assert fused.tensors["b"].shape == (256 + 192, 64) and fused.tensors["scale_b"].shape == (4, 1)
    alone = [
        _linear.prepare(w, None, "fp8-block", "p").dequantized(torch.float32) for w in (gate, up)
    ]
    assert torch.equal(fused.dequantized(torch.float32), torch.cat(alone))
    x = torch.randn(3, 64, generator=gen)
    assert fused(x).shape == (3, 384)
    assert error(fused(x), fused.reference(x)).rel_l2 < 1e-6  # float32: the ops' references
    assert fused.nbytes() == (256 + 192) * 64 + 4 * 4
    with pytest.raises(ValueError, match=r"parts: expected sizes > 0 summing to N = 384"):
        _linear.prepare(torch.cat([gate, up]), None, "fp8-block", "mlp", parts=(192, 100))


def test_mxfp4_layers_whose_k_is_not_a_multiple_of_32_stay_dense_and_say_so():
    p = _linear.prepare(torch.randn(8, 48), None, "mxfp4", "proj")
    assert p.kind == "dense" and "proj: kept dense, not mxfp4: K (in_features) = 48" in p.note
    # head_dim 20: o_proj takes K = 4 x 20 = 80; everything else is a multiple of 32
    model = build("tiny-llama", dtype=torch.bfloat16, head_dim=20)
    state = patch(model, quantize="mxfp4")
    dense = [n for n, _, p in state.linears if p.kind == "dense"]
    assert dense == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
    assert len(state.notes) == 2 and "o_proj: kept dense" in state.notes[0]
    assert "K (in_features) = 80 is not a multiple of mxfp4's 32-value scale block" in repr(state)
    unpatch(model)


def test_moe_experts_under_mxfp4_run_fused_moe_mxfp4_and_the_patch_has_nothing_to_say():
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    state = patch(model, quantize="mxfp4")  # parity-checked on the CPU path
    assert state.replaced["moe"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert state.notes == []  # experts and projections all in mxfp4
    blocks = [model.get_submodule(n) for n in state.replaced["moe"]]
    assert all("_kernelab_mxfp4_experts" in vars(b) for b in blocks)
    assert {p.kind for _, _, p in state.linears} == {"mxfp4"}
    unpatch(model)
    assert not patch(model).notes  # unquantized: nothing to say
    unpatch(model)


def test_bad_quantize_values_are_refused_naming_the_argument(monkeypatch):
    model = build("tiny-llama")
    every = "None, 'w4a16', 'w8a16', 'fp8', 'fp8-block', 'mxfp4'"
    for bad in ("fp4", "mxfp8", "FP8-BLOCK", 8):
        with pytest.raises(ValueError, match=rf"quantize: expected one of {every}, got {bad!r}"):
            patch(model, quantize=bad)
    monkeypatch.setattr(_linear._fp8, "fp8_supported", lambda device: False)
    with pytest.raises(ValueError, match="quantize: 'fp8-block' needs an fp8-capable device"):
        patch(model, quantize="fp8-block")
    assert state_of(model) is None
    prepared = _linear.prepare(torch.randn(64, 96), None, "fp8-block", "proj")
    assert prepared.tensors["scale_b"].shape == (1, 1)  # one partial block: no fallback
    assert packing.FP8_BLOCK == _linear.FP8_GROUP == 128
