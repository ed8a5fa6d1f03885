"""Linear projections on kernelab GEMMs, dense and quantized: parity against the
quantize-dequantized original, reversibility, refusal of a wrong GEMM, the custom ops."""

import gc
import weakref

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelab import ops  # noqa: E402
from kernelab.models import (  # noqa: E402
    PatchError,
    _linear,
    _parity,
    build,
    patch,
    patched,
    state_of,
    unpatch,
)
from kernelab.models._arch import blueprint_for  # noqa: E402
from kernelab.numerics import error  # noqa: E402

ALL = ("rmsnorm", "fused_residual", "mlp", "rope", "linear")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# bfloat16: the Triton GEMMs through the interpreter; float32: the ops' torch references (the
# kernels take 16-bit activations), which check the prepared weights' layout and plumbing.
CASES = [
    ("tiny-llama", "w8a16", torch.bfloat16),
    ("tiny-qwen3", "w4a16", torch.bfloat16),
    ("tiny-llama", "w4a16", torch.float32),
    ("tiny-qwen3", "w8a16", torch.float32),
]


@pytest.mark.parametrize(("name", "quantize", "dtype"), CASES)
def test_quantized_patch_matches_the_quantize_dequantized_original(
    name, quantize, dtype, interpret
):
    model = build(name, dtype=dtype)
    ids = _parity.probe_inputs(model, tokens=4)
    original = _parity.logits(model, ids)
    with _linear.reference_forwards(model, blueprint_for(model), quantize):
        fake_quant = _parity.logits(model, ids)
    patch(model, quantize=quantize, check_tokens=4)  # the parity check runs inside
    state = state_of(model)
    # 4 attention projections and down_proj per layer, plus one fused gate/up per MLP
    assert len(state.linears) == 2 * 6
    assert {p.kind for _, _, p in state.linears} == {quantize}
    got = _parity.logits(model, ids)
    tol = _parity.tolerance(dtype, quantize)
    assert error(got, fake_quant).rel_l2 <= tol
    if dtype == torch.float32:
        # the quantization is real: the original is farther away than the contract allows
        assert error(got, original).rel_l2 > 100 * error(got, fake_quant).rel_l2
        assert error(got, original).rel_l2 > tol
    unpatch(model)


def test_dense_linear_and_fp8_patches_hold_their_contract(interpret):
    for quantize in (None, "fp8"):
        model = build("tiny-llama", dtype=torch.bfloat16)
        patch(model, ops=ALL, quantize=quantize, check_tokens=4)
        kinds = {p.kind for _, _, p in state_of(model).linears}
        assert kinds == {"dense" if quantize is None else "fp8"}
        unpatch(model)


def test_unpatch_restores_dense_weights_bitwise_and_frees_the_packed_ones():
    model = build("tiny-qwen2", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    patch(model, quantize="w4a16")
    packed = weakref.ref(state_of(model).linears[0][2].tensors["qweight"])
    unpatch(model)
    gc.collect()
    assert packed() is None
    assert torch.equal(_parity.logits(model, ids), before)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert not any("_kernelab" in a or a == "forward" for m in model.modules() for a in vars(m))


def test_a_wrong_int8_gemm_is_refused_and_named(monkeypatch):
    model = build("tiny-llama", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    real = ops.w8a16_gemm

    def wrong(x, qweight, scales, bias=None, out=None):  # scales of the wrong columns
        return real(x, qweight, scales.roll(1), bias, out)

    monkeypatch.setattr(ops, "w8a16_gemm", wrong)
    with pytest.raises(PatchError, match=r"quantize='w8a16'.*model\.layers\.0\.self_attn\.q_proj"):
        patch(model, quantize="w8a16")
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)


def test_a_wrong_int4_zero_point_is_refused(monkeypatch):
    model = build("tiny-qwen3", dtype=torch.bfloat16)
    real = ops.w4a16_gemm

    def wrong(x, qweight, scales, zeros, group_size, bias=None, out=None, check=True):
        # zero point off by one
        return real(x, qweight, scales, (zeros + 1).clamp(max=15), group_size, bias, out, check)

    monkeypatch.setattr(ops, "w4a16_gemm", wrong)
    with pytest.raises(PatchError, match=r"first module that differs: model\.layers\.0\."):
        patch(model, quantize="w4a16")
    assert state_of(model) is None


def test_bad_quantize_arguments(monkeypatch):
    model = build("tiny-llama")
    with pytest.raises(ValueError, match=r"quantize: expected one of None, 'w4a16'.*got 'int3'"):
        patch(model, quantize="int3")
    with pytest.raises(ValueError, match=r"K \(in_features\) a multiple of 64.*proj has K=96"):
        _linear.prepare(torch.randn(8, 96), None, "w4a16", "proj")
    monkeypatch.setattr(_linear._fp8, "fp8_supported", lambda device: False)
    with pytest.raises(ValueError, match="'fp8' needs an fp8-capable device"):
        patch(model, quantize="fp8")
    assert state_of(model) is None


def test_quantized_greedy_decoding_with_static_cache_equals_the_fake_quantized_original():
    model = build("tiny-llama", dtype=torch.float32)
    ids = _parity.probe_inputs(model, tokens=4, seed=3)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    kwargs["cache_implementation"] = "static"
    with _linear.reference_forwards(model, blueprint_for(model), "w8a16"):
        want = model.generate(ids, **kwargs)
    with patched(model, quantize="w8a16"):
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want)


def test_quantized_model_compiles_without_graph_breaks():
    model = build("tiny-qwen3", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    with patched(model, quantize="w4a16"):
        explained = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.cuda
def test_quantized_patches_on_a_gpu_hold_their_contract_and_compile_as_custom_ops():
    fp8 = _linear._fp8.fp8_supported(torch.device("cuda"))
    for quantize in (None, "w8a16", "w4a16") + (("fp8",) if fp8 else ()):
        model = build("tiny-llama", dtype=torch.bfloat16, device="cuda")
        ids = _parity.probe_inputs(model)
        with patched(model, ALL, quantize=quantize):  # parity-checked on the GPU kernels
            explained = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
        assert explained.graph_break_count == 0, explained.break_reasons
        name = {None: "gemm"}.get(quantize, f"{quantize}_gemm")
        targets = {str(n.target) for g in explained.graphs for n in g.graph.nodes}
        assert any(f"kernelab.{name}" in t for t in targets), (quantize, sorted(targets)[:20])
        torch._dynamo.reset()
