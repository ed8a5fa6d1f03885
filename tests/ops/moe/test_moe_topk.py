"""moe_topk through the interpreter: the experts exactly, the weights within float32's
contract; planted defects caught by verify."""

import importlib

import pytest
import torch

from kernelab.ops import MOE_TOPK, Shape, moe_topk, moe_topk_ref
from kernelab.ops.moe.moe_topk import moe_topk_torch, moe_topk_triton
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check

topk_module = importlib.import_module("kernelab.ops.moe.moe_topk")
OP = MOE_TOPK


@pytest.mark.parametrize("shape", OP.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=3)
    weights, ids = check(OP, inputs, moe_topk_triton, torch.bfloat16)
    _, ref_ids = moe_topk_ref(**inputs)
    assert ids.dtype == torch.int32 and torch.equal(ids, ref_ids)  # ties to the lower expert
    assert weights.dtype == torch.float32


@pytest.mark.parametrize("shape", OP.shapes("representative")[1::4], ids=lambda s: s.label)
def test_representative_shapes_at_interpreter_size(shape):
    inputs = OP.inputs(shape.reduced(8), torch.float32, "cpu", seed=4, dist="heavy")
    _, ids = check(OP, inputs, moe_topk_triton, torch.float32)
    assert torch.equal(ids, moe_topk_ref(**inputs)[1])


def test_properties_of_the_weights():
    logits = torch.randn(9, 16)
    w, ids = moe_topk_triton(logits, 4, "softmax", True)
    assert torch.allclose(w.sum(-1), torch.ones(9))
    assert (w[:, :-1] >= w[:, 1:]).all()  # decreasing, as the logits
    assert torch.equal(ids.long(), torch.topk(logits, 4).indices)
    w_all, _ = moe_topk_triton(logits, 16, "softmax", False)
    assert torch.allclose(w_all, torch.softmax(logits, -1).sort(-1, descending=True).values)
    assert torch.equal(moe_topk(logits, 3)[1], moe_topk_torch(logits, 3)[1])


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"router_logits": torch.zeros(4, 8, dtype=torch.int32)}, TypeError, "router_logits"),
        ({"top_k": 9}, ValueError, "top_k: expected at most the number of experts (8)"),
        ({"top_k": 0}, ValueError, "top_k: expected an int >= 1"),
        ({"top_k": 2.0}, TypeError, "top_k: expected an int"),
        ({"scoring": "relu"}, ValueError, "scoring: expected one of"),
        ({"renormalize": 1}, TypeError, "renormalize: expected a bool"),
    ],
)
@pytest.mark.parametrize("fn", [moe_topk_triton, moe_topk_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {"router_logits": torch.randn(4, 8), "top_k": 2, **kwargs}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


MUTANTS = {
    # the last token of each program block gets the next expert's id
    "last token's expert": (
        "idx = tl.minimum(idx, E - 1)",
        "idx = tl.where(rt == T - 1, (tl.minimum(idx, E - 1) + 1) % E, tl.minimum(idx, E - 1))",
    ),
    # ties to the higher expert
    "tie order": (
        "idx = tl.min(tl.where(cand, re[None, :], BLOCK_E), axis=1)",
        "idx = tl.max(tl.where(cand, re[None, :], -1), axis=1)",
    ),
    # renormalised by the sum of all but the last weight
    "renormalised over k-1": ("total += w", "total += tl.where(j < TOPK - 1, w, 0.0)"),
}
SHAPES = [
    Shape("ties T=20 E=16 k=3", {"tokens": 20, "experts": 16},
          {"top_k": 3, "scoring": "softmax", "renormalize": True, "ties": True}, "tokens"),
    Shape("sigmoid T=5 E=8 k=2", {"tokens": 5, "experts": 8},
          {"top_k": 2, "scoring": "sigmoid", "renormalize": True}, "tokens"),
]  # fmt: skip


def _verify():
    return verify_candidate(moe_topk_triton, "moe_topk", shapes=SHAPES, dtypes=[torch.bfloat16],
                            device="cpu", seed=5, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    monkeypatch.setattr(topk_module, "_moe_topk_kernel",
                        mutate(topk_module._moe_topk_kernel, old, new, tmp_path))  # fmt: skip
    report = _verify()
    assert not report.passed
    assert {f.cls for c in report.cases for f in c.failures} <= {"wrong values", "contract"}


def test_the_kernel_passes_verify_on_the_same_cases():
    report = _verify()
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
