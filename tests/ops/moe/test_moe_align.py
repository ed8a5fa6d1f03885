"""moe_align through the interpreter: exactly the reference's lists; planted defects caught by
verify."""

import importlib

import pytest
import torch

from kernelab.ops import MOE_ALIGN, Shape, moe_align, moe_align_ref
from kernelab.ops.moe.moe_align import moe_align_torch, moe_align_triton
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check

mc = importlib.import_module("kernelab.ops.moe._common")
OP = MOE_ALIGN


@pytest.mark.parametrize("shape", OP.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    inputs = OP.inputs(shape, torch.float32, "cpu", seed=3)
    got = check(OP, inputs, moe_align_triton, torch.float32)
    for g, r, e in zip(got, moe_align_ref(**inputs), moe_align_torch(**inputs), strict=True):
        assert torch.equal(g, r) and torch.equal(e, r)


def test_layout_of_a_small_case():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32)
    sorted_ids, experts, total = moe_align_triton(ids, 4, 16)
    s = 6  # the sentinel: T·k
    assert sorted_ids[:48].tolist() == [1, 4] + [s] * 14 + [3] + [s] * 15 + [0, 2, 5] + [s] * 13
    assert experts.tolist()[:3] == [0, 1, 2] and set(experts.tolist()[3:]) == {-1}
    assert total.tolist() == [48]
    assert torch.equal(moe_align(ids, 4, 16)[0], sorted_ids)


def test_ids_outside_the_experts_are_never_placed():
    ids = torch.tensor([[0, 7], [-1, 1]], dtype=torch.int64)
    sorted_ids, experts, total = moe_align_triton(ids, 2, 16)
    assert sorted(v for v in sorted_ids.tolist() if v < 4) == [0, 3]
    assert experts.tolist()[:2] == [0, 1]
    assert total.tolist() == [32]


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"topk_ids": torch.zeros(3, 2)}, TypeError, "topk_ids: expected dtype"),
        ({"num_experts": 0}, ValueError, "num_experts: expected an int >= 1"),
        ({"block_size": 24}, ValueError, "block_size: expected a power of two >= 16"),
        ({"block_size": 16.0}, TypeError, "block_size: expected an int"),
    ],
)
@pytest.mark.parametrize("fn", [moe_align_triton, moe_align_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {"topk_ids": torch.zeros(3, 2, dtype=torch.int32), "num_experts": 4, "block_size": 16}
    with pytest.raises(exc) as info:
        fn(**{**args, **kwargs})
    assert words in str(info.value)


MUTANTS = {
    "partial block dropped": (
        "padded = tl.cdiv(counts, BLOCK_SIZE) * BLOCK_SIZE",
        "padded = (counts // BLOCK_SIZE) * BLOCK_SIZE",
    ),
    "last block's expert": (
        "expert = tl.where(rb < total // BLOCK_SIZE, expert, -1)",
        "expert = tl.where(rb < total // BLOCK_SIZE - 1, expert, -1)",
    ),
    # pairs of one expert in reverse order of arrival within a chunk
    "order within an expert": (
        "rank = tl.cumsum(hit, axis=0) - hit",
        "rank = tl.sum(hit, axis=0)[None, :] - tl.cumsum(hit, axis=0)",
    ),
}
SHAPES = [Shape("T=21 E=3 k=2 block 16", {"tokens": 21, "experts": 3, "topk": 2},
                {"block_size": 16}, "tokens")]  # fmt: skip


def _verify():
    return verify_candidate(moe_align_triton, "moe_align", shapes=SHAPES, dtypes=[torch.float32],
                            device="cpu", seed=5, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    monkeypatch.setattr(mc, "_moe_align_kernel",
                        mutate(mc._moe_align_kernel, old, new, tmp_path))  # fmt: skip
    assert not _verify().passed


def test_the_kernel_passes_verify_on_the_same_cases():
    report = _verify()
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
