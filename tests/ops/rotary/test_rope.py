"""RoPE: the Triton kernel, in place on query and key, against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.ops import ROPE, Shape, rope, rope_ref
from kernelab.ops.rotary.rope import RopeConfig, _cache, rope_torch, rope_triton
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check, every_other

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
        "t",
        {"tokens": 7, "heads_q": 5, "heads_k": 3, "head_dim": 64, "rot": 48},
        {"is_neox": False},
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
        ({"is_neox": "no"}, TypeError, "is_neox: expected a bool, got str"),
        ({"is_neox": 1}, TypeError, "is_neox: expected a bool, got int"),
        ({"is_neox": None}, TypeError, "is_neox: expected a bool, got NoneType"),
        ({"check": 1}, TypeError, "check: expected a bool"),
        # positions index cache rows: outside [0, 10) they would read outside the cache
        ({"positions": torch.tensor([0, 10])}, ValueError, "positions: expected values in [0, 10)"),
        ({"positions": torch.tensor([-1, 0])}, ValueError, "got -1 at index 0"),
        ({"positions": torch.tensor([3, 10**7])}, ValueError, "got 10000000 at index 1"),
        ({"positions": torch.tensor([0, -(2**40)])}, ValueError, "positions: expected values"),
        (
            {"positions": torch.tensor([0, 2**31 + 1], dtype=torch.int64)},
            ValueError,
            "positions: expected values in [0, 10)",
        ),
    ],
)
@pytest.mark.parametrize("fn", [rope_triton, rope_torch, rope], ids=["triton", "torch", "public"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = _args(**kwargs)
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)
    for name, value in before.items():  # refused before anything is written
        assert torch.equal(args[name], value), name


def _guarded_cache(rows: int, rot: int, guard: int = 4) -> torch.Tensor:
    """A cos/sin cache of ``rows`` rows inside a larger buffer whose rows before and after it
    hold NaN: a read outside the cache shows up as NaN in the output."""
    backing = torch.full((rows + 2 * guard, rot), float("nan"))
    backing[guard : guard + rows] = _cache(rot, torch.float32, "cpu")[:rows]
    return backing[guard : guard + rows]


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("fn", [rope_triton, rope_torch], ids=["triton", "torch"])
def test_unchecked_positions_outside_the_cache_read_nothing_and_write_zeros(fn, is_neox):
    # check=False (a serving loop skipping the device sync): a position outside the cache
    # must not read outside it (the kernel masks it; no garbage, no NaN, no crash); its
    # rotated dimensions are written as zeros and the rest of the head is left as it is.
    cache = _guarded_cache(10, 32)
    positions = torch.tensor([3, -1, 10, 10**7, -(2**40), 9, 2**62])
    ok = (positions >= 0) & (positions < 10)
    q, k = torch.randn(7, 3, 48), torch.randn(7, 2, 48)
    q0, k0 = q.clone(), k.clone()
    fn(positions, q, k, cache, is_neox=is_neox, check=False)
    for got, orig in ((q, q0), (k, k0)):
        assert torch.isfinite(got).all()
        assert torch.equal(got[..., 32:], orig[..., 32:])  # past rotary_dim: untouched
        assert torch.equal(got[~ok, :, :32], torch.zeros_like(got[~ok, :, :32]))
    ref_q, ref_k = rope_ref(
        positions[ok], q0[ok].double(), k0[ok].double(), cache.double(), is_neox
    )
    torch.testing.assert_close(q[ok].double(), ref_q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k[ok].double(), ref_k, rtol=1e-5, atol=1e-6)


def test_strided_positions_are_read_through_their_stride(interpret):
    # every other position of a larger tensor; the skipped ones are rows of the cache too
    args = _args(positions=torch.tensor([3, 7]))
    want = rope(**{k: v.clone() for k, v in args.items()})
    strided = {**args, "positions": every_other(args["positions"], torch.tensor([0, 9]))}
    got = rope(**strided)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_public_op_checks_positions_unless_told_not_to(interpret):
    args = _args(positions=torch.tensor([1, 12]))
    with pytest.raises(ValueError, match="positions: expected values in"):
        rope(**args)
    q, _ = rope(**args, check=False)  # the kernel (interpreted): token 1 rotated by nothing
    assert torch.equal(q[1], torch.zeros_like(q[1]))


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
        ("pos = tl.load(Pos + t * stride_pos, mask=t_ok, other=0).to(tl.int64)", "pos = t", 1),
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
