"""merge_attention_states: the Triton kernel through the interpreter against the float64
reference, the −inf rules, a planted missing rescale, bad inputs, static checks."""

import importlib
import math

import pytest
import torch

from kernelab.ops import MERGE_ATTENTION_STATES, Shape, merge_attention_states_ref
from kernelab.ops.attention.merge_attention_states import (
    merge_attention_states_torch,
    merge_attention_states_triton,
)
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check
from tests.ops.attention.static import assert_static

merge_module = importlib.import_module("kernelab.ops.attention.merge_attention_states")
EDGE = MERGE_ATTENTION_STATES.shapes("edge")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = MERGE_ATTENTION_STATES.inputs(shape, dtype, "cpu", seed=7)
    check(MERGE_ATTENTION_STATES, inputs, merge_attention_states_triton, dtype)


def test_merging_the_halves_of_a_softmax_gives_the_whole():
    # Two disjoint halves of the keys of one attention row: merged, they are the whole.
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 2, 40, generator=g, dtype=torch.float64) * 3
    values = torch.randn(3, 2, 40, 64, generator=g, dtype=torch.float64)
    parts, lses = [], []
    for keys in (slice(0, 17), slice(17, 40)):
        s, v = scores[..., keys], values[..., keys, :]
        parts.append((torch.softmax(s, -1)[..., None] * v).sum(-2))
        lses.append(torch.logsumexp(s, -1))
    whole = (torch.softmax(scores, -1)[..., None] * values).sum(-2)
    states, lse = torch.stack(parts).float(), torch.stack(lses).float()
    out, out_lse = merge_attention_states_triton(states, lse)
    torch.testing.assert_close(out.double(), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_lse.double(), torch.logsumexp(scores, -1), rtol=1e-6, atol=1e-5)


def test_parts_without_keys_contribute_nothing_and_no_keys_at_all_gives_zeros():
    states = torch.randn(3, 2, 1, 8)
    states[1] = float("nan")  # an empty part's values may be anything: unwritten, say
    lse = torch.tensor([[[0.5], [-math.inf]], [[-math.inf], [-math.inf]], [[1.5], [-math.inf]]])
    out, out_lse = merge_attention_states_triton(states, lse)
    w = torch.softmax(torch.tensor([0.5, 1.5]), 0)
    torch.testing.assert_close(out[0, 0], w[0] * states[0, 0, 0] + w[1] * states[2, 0, 0])
    assert torch.equal(out[1], torch.zeros(1, 8))
    assert out_lse[1, 0].item() == -math.inf
    ref_out, ref_lse = merge_attention_states_ref(states.double(), lse.double())
    assert torch.equal(ref_out[1], torch.zeros(1, 8, dtype=torch.float64))
    assert ref_lse[1, 0].item() == -math.inf


def test_one_part_is_the_identity_and_out_may_be_narrower_than_the_parts():
    states = torch.randn(1, 4, 3, 64)
    lse = torch.randn(1, 4, 3)
    out = torch.empty(4, 3, 64, dtype=torch.bfloat16)
    out_lse = torch.empty(4, 3)
    got, got_lse = merge_attention_states_triton(states, lse, out=out, out_lse=out_lse)
    assert got is out and got_lse is out_lse
    assert torch.equal(out, states[0].to(torch.bfloat16)) and torch.equal(out_lse, lse[0])


@pytest.mark.parametrize(
    ("over", "exc", "words"),
    [
        ({"states": torch.randn(2, 3, 4, 8).int()}, TypeError, "states: expected dtype"),
        ({"states": torch.randn(3, 4, 8)}, ValueError, "states: expected 4 dimensions"),
        ({"lse": torch.randn(2, 3, 4).double()}, TypeError, "lse: expected dtype"),
        ({"lse": torch.randn(2, 3, 5)}, ValueError, "lse: expected shape (2, 3, 4)"),
        (
            {"states": torch.randn(0, 3, 4, 8), "lse": torch.randn(0, 3, 4)},
            ValueError,
            "states: expected at least one part",
        ),
        ({"out": torch.empty(3, 4, 9)}, ValueError, "out: expected shape (3, 4, 8)"),
        ({"out_lse": torch.empty(3, 4).half()}, TypeError, "out_lse: expected dtype"),
        ({"out_lse": torch.empty(4, 3)}, ValueError, "out_lse: expected shape (3, 4)"),
    ],
)
@pytest.mark.parametrize(
    "fn", [merge_attention_states_triton, merge_attention_states_torch], ids=["triton", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, over, exc, words):
    args = {"states": torch.randn(2, 3, 4, 8), "lse": torch.randn(2, 3, 4), **over}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


# --- planted defect: a reduce without its rescale --------------------------------------------


def test_a_missing_rescale_is_caught(tmp_path):
    # every part weighted 1: a plain average of the parts
    mutant = mutate(
        merge_module._merge_attention_states_kernel,
        "w = tl.exp(lse.to(tl.float32) - m_safe)",
        "w = tl.where(lse == float('-inf'), 0.0, 1.0)",
        tmp_path,
    )

    def candidate(states, lse, out=None, out_lse=None):
        saved = merge_module._merge_attention_states_kernel
        merge_module._merge_attention_states_kernel = mutant
        try:
            return merge_attention_states_triton(states, lse, out, out_lse)
        finally:
            merge_module._merge_attention_states_kernel = saved

    shape = Shape("t", {"parts": 4, "tokens": 3, "heads": 2, "head_dim": 64}, {}, "tokens")
    report = verify_candidate(
        candidate, "merge_attention_states", shapes=[shape], dtypes=[torch.bfloat16], seed=3
    )
    assert {c.failure_class for c in report.cases} == {"wrong values"}


# --- static checks -----------------------------------------------------------------------------


def _launch():
    shape = next(
        s for s in MERGE_ATTENTION_STATES.shapes("representative") if "llama3-8b split" in s.label
    )
    return MERGE_ATTENTION_STATES.launches(shape, torch.float32)[0]


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "gfx942"])
def test_launch_compiles_with_wide_loads_and_no_spills(arch):
    assert_static(_launch(), arch)
