"""RoPE: the Triton kernel, in place on query and key, against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.ops import ROPE, Shape, rope, rope_ref
from kernelab.ops.rotary.rope import RopeConfig, _cache, rope_torch, rope_triton
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

rope_module = importlib.import_module("kernelab.ops.rotary.rope")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ROPE.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = ROPE.inputs(shape.reduced(40), dtype, "cpu", seed=7)
    check(ROPE, inputs, rope_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_reduced_representative_shapes(dtype):
    # llama3-70b (64 query heads, 8 key heads), both layouts, 3 tokens.
    for shape in [s for s in ROPE.shapes("representative") if s.dims["heads_q"] == 64][-2:]:
        check(ROPE, ROPE.inputs(shape.reduced(3), dtype, "cpu", seed=2), rope_triton, dtype)


@pytest.mark.parametrize("config", [RopeConfig(2, 2, 1), RopeConfig(4, 1, 2)], ids=str)
def test_tuning_configs_split_heads_and_tokens_correctly(config):
    shape = Shape(
        "t", {"tokens": 7, "heads_q": 5, "heads_k": 3, "head_dim": 64, "rot": 48}, {"is_neox": 0}
    )
    inputs = ROPE.inputs(shape, torch.float32, "cpu", seed=1)
    check(ROPE, inputs, lambda **kw: rope_triton(**kw, config=config), torch.float32)


def test_rotation_is_in_place_preserves_norms_and_leaves_the_tail_untouched():
    q, k = torch.randn(4, 3, 64), torch.randn(4, 1, 64)
    q0, k0 = q.clone(), k.clone()
    cache = _cache(32, torch.float32, "cpu")
    positions = torch.tensor([0, 5, 700, 8191])
    out_q, out_k = rope_triton(positions, q, k, cache, is_neox=True)
    assert out_q is q and out_k is k
    torch.testing.assert_close(q[..., 32:], q0[..., 32:], rtol=0, atol=0)  # partial rotary
    torch.testing.assert_close(q[0], q0[0], rtol=0, atol=1e-6)  # position 0: identity
    torch.testing.assert_close(q[..., :32].norm(dim=-1), q0[..., :32].norm(dim=-1))
    ref_q, ref_k = rope_ref(positions, q0.double(), k0.double(), cache.double())
    torch.testing.assert_close(q.double(), ref_q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k.double(), ref_k, rtol=1e-5, atol=1e-6)


def test_layouts_pair_the_documented_elements():
    # One token at a position where cos = 0, sin = 1 for every pair (a quarter turn), so
    # x1 <- -x2 and x2 <- x1: the pairing is visible element by element.
    cache = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    x = torch.arange(1.0, 5.0).view(1, 1, 4)
    q, k = x.clone(), x.clone()
    rope_triton(torch.tensor([0]), q, k, cache, is_neox=True)
    assert q.flatten().tolist() == [-3.0, -4.0, 1.0, 2.0]
    rope_triton(torch.tensor([0]), q := x.clone(), x.clone(), cache, is_neox=False)
    assert q.flatten().tolist() == [-2.0, 1.0, -4.0, 3.0]


def test_public_op_dispatch_and_int32_positions(interpret, monkeypatch):
    q, k = torch.randn(3, 2, 16), torch.randn(3, 1, 16)
    cache = _cache(16, torch.float32, "cpu")
    pos = torch.tensor([1, 2, 3], dtype=torch.int32)
    eq, ek = rope_torch(pos, q.clone(), k.clone(), cache)
    gq, gk = rope(pos, q, k, cache)
    torch.testing.assert_close(gq, eq)
    torch.testing.assert_close(gk, ek)
    calls = []
    monkeypatch.setattr(rope_module, "rope_triton", lambda *a: calls.append("triton"))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    rope(pos, q, k, cache)
    assert calls == []


def _args(**kw):
    args = {
        "positions": torch.tensor([0, 1]),
        "query": torch.randn(2, 4, 16),
        "key": torch.randn(2, 2, 16),
        "cos_sin_cache": torch.randn(10, 16),
    }
    return {**args, **kw}


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"query": torch.randn(2, 64)}, ValueError, "query: expected 3 dimensions"),
        ({"key": torch.randn(2, 2, 16).half()}, TypeError, "key: expected dtype"),
        ({"key": torch.randn(3, 2, 16)}, ValueError, "key: expected shape (2, heads_k, 16)"),
        ({"positions": torch.tensor([0.0, 1.0])}, TypeError, "positions: expected dtype"),
        ({"positions": torch.tensor([0, 1, 2])}, ValueError, "positions: expected shape (2,)"),
        ({"cos_sin_cache": torch.randn(10, 15)}, ValueError, "cos_sin_cache: expected an even"),
        ({"cos_sin_cache": torch.randn(10, 32)}, ValueError, "cos_sin_cache: expected an even"),
        (
            {"query": torch.randn(2, 16, 4).transpose(1, 2)},
            ValueError,
            "query: expected unit stride",
        ),
    ],
)
@pytest.mark.parametrize("fn", [rope_triton, rope_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**_args(**kwargs))
    assert words in str(info.value)


def test_prefill_launches_compile_to_wide_accesses_without_spills_for_sm90():
    for shape in ROPE.shapes("representative")[-2:]:  # qwen2.5 prefill, NeoX and GPT-J
        for launch in ROPE.launches(shape, torch.bfloat16):
            assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "count"),
    [
        # wrong rotation pairing: each layout pairs elements as the other one does
        ("if IS_NEOX:", "if not IS_NEOX:", 1),
        # rotation in the wrong direction
        ("o2 = x2 * cos + x1 * sin", "o2 = x2 * cos - x1 * sin", 2),
        # cos/sin taken at the token's index instead of its position
        ("pos = tl.load(Pos + t, mask=t_ok, other=0).to(tl.int64)", "pos = t", 1),
        # key left unrotated
        ("for which in tl.static_range(2):", "for which in tl.static_range(1):", 1),
    ],
    ids=["wrong-pairing", "wrong-direction", "index-not-position", "key-skipped"],
)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new, count, is_neox):
    mutant = mutate(rope_module._rope_kernel, old, new, tmp_path, count)
    monkeypatch.setattr(rope_module, "_rope_kernel", mutant)
    dims = {"tokens": 5, "heads_q": 4, "heads_k": 2, "head_dim": 64, "rot": 64}
    inputs = ROPE.inputs(Shape("t", dims, {"is_neox": is_neox}), torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match="rel L2"):
        check(ROPE, inputs, rope_triton, torch.float32)
