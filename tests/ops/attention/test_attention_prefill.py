"""attention_prefill: the Triton kernel through the interpreter against the float64 reference
(every feature, small tiles that cross block edges), planted defects, bad inputs, the masked-row
semantics, the cost model and the reduce rule, and static checks of the compiled default
launches for sm_90, sm_80 and gfx942 (no GPU needed)."""

import dataclasses
import importlib
import math
import re

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import ATTENTION_PREFILL, attention_prefill, attention_prefill_ref
from kernelab.ops.attention import _ragged
from kernelab.ops.attention.attention_prefill import (
    DEFAULTS,
    PrefillConfig,
    attention_prefill_torch,
    attention_prefill_triton,
)
from tests.mutants import mutate
from tests.opcheck import check, compile_launch, every_other, widths

OP = ATTENTION_PREFILL
module = importlib.import_module("kernelab.ops.attention.attention_prefill")
kernels = importlib.import_module("kernelab.ops.attention._kernels")
DTYPES = (torch.bfloat16, torch.float16)
#: Tiles of 16 rows and 16 keys: short sequences cross many tile and block edges.
SMALL = PrefillConfig(16, 16, 1, 1)


def _shape(q_lens, k_lens, heads=(4, 2, 64), **params):
    return _ragged.ragged_shape("t", q_lens, k_lens, *heads, cut=None, **params)


def _inputs(shape, dtype=torch.bfloat16, seed=0, dist="normal"):
    return OP.inputs(shape, dtype, "cpu", seed=seed, dist=dist)


def _with(config):
    return lambda **kw: attention_prefill_triton(**kw, config=config)


# --- the kernel against the reference -----------------------------------------------------------


@pytest.mark.parametrize("shape", OP.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    # bfloat16 here; float16 on the small-tile cases below, which hold every feature.
    check(OP, _inputs(shape, torch.bfloat16, seed=7), attention_prefill_triton, torch.bfloat16)


SMALL_TILE_CASES = {
    # chunked prefill (bottom-right), GQA 2:1, window with both edges inside the sequence,
    # softcap, sinks, D 96 (padded to 128): every loop phase of the kernel
    "everything": _shape(
        [45, 3, 30], [83, 3, 30], (4, 2, 96), window_left=37, softcap=20.0, sinks=True
    ),
    "block mask over tiles": _shape([70, 40], [90, 40], (2, 1, 64), block_sparse=True),
    "block mask, window": _shape([70], [70], (2, 2, 64), block_sparse=True, window_left=40),
    "not causal, ragged": _shape([33, 17], [50, 70], (2, 1, 128), causal=False),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(SMALL_TILE_CASES))
def test_small_tiles_cross_every_block_edge(case, dtype):
    check(OP, _inputs(SMALL_TILE_CASES[case], dtype, seed=3), _with(SMALL), dtype)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_hard_distributions(dist):
    shape = SMALL_TILE_CASES["everything"]
    check(OP, _inputs(shape, torch.float16, seed=4, dist=dist), _with(SMALL), torch.float16)


def test_representative_shape_reduced_for_the_interpreter():
    shape = next(s for s in OP.shapes("representative") if "mistral" in s.label).reduced(4)
    check(OP, _inputs(shape, torch.bfloat16, seed=1), attention_prefill_triton, torch.bfloat16)


def test_nan_and_inf_in_q_propagate_as_in_the_reference():
    inputs = _inputs(_shape([20, 9], [20, 9]), seed=2)
    q = inputs["q"]
    q[0, 0, 3], q[5, 1, 0], q[21, 3, 7] = float("nan"), float("inf"), float("-inf")
    out, lse = check(OP, inputs, _with(SMALL), torch.bfloat16)
    assert out[0, 0].isnan().all() and lse[0, 0].isnan()
    assert not out[1:5].isnan().any()  # other rows are untouched


def test_key_tiles_no_row_can_see_are_never_read():
    # 16 queries at positions 184-199 with a window of 15 keys see keys 169-199: the tiles of
    # keys 0-159 are outside every window. NaN there would reach the output through P·V
    # (0 · NaN) if the kernel loaded them.
    inputs = _inputs(_shape([16], [200], (2, 1, 64), window_left=15))
    expected = attention_prefill_triton(**inputs, config=SMALL)
    inputs["k"][:160], inputs["v"][:160] = float("nan"), float("nan")
    out, lse = attention_prefill_triton(**inputs, config=SMALL)
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


# --- rows that see no key -----------------------------------------------------------------------


def test_rows_that_see_no_key_return_zeros_and_minus_infinity():
    # 20 queries over 5 keys, bottom-right: rows 0-14 sit before the first key; the second
    # sequence has no keys at all.
    inputs = _inputs(_shape([20, 6], [5, 0]))
    out, lse = attention_prefill_triton(**inputs, config=SMALL)
    assert not out[:15].any() and not out[20:].any()
    assert torch.isneginf(lse[:15]).all() and torch.isneginf(lse[20:]).all()
    assert torch.isfinite(lse[15:20]).all() and out[15:20].abs().sum() > 0
    ref_out, ref_lse = attention_prefill_ref(**{k: _f64(v) for k, v in inputs.items()})
    assert torch.isneginf(ref_lse[:15]).all() and not ref_out[:15].any()


def test_block_mask_rows_masked_whole_and_sinks_give_the_sink_logit():
    inputs = _inputs(_shape([70], [70], (2, 2, 64), block_sparse=True, sinks=True))
    inputs["block_mask"][0, :, 1] = False  # rows 32-63 see nothing
    out, lse = attention_prefill_triton(**inputs, config=SMALL)
    assert not out[32:64].any()
    torch.testing.assert_close(lse[32:64], inputs["sinks"].expand(32, 2), rtol=1e-6, atol=0)
    check(OP, inputs, _with(SMALL), torch.bfloat16)


def _f64(v):
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


# --- planted defects: the comparison must catch them --------------------------------------------


def _helper_mutant(old, new, tmp_path):
    """The kernel calling a mutated ``_prefill_tile``."""
    tile = mutate(kernels._prefill_tile, old, new, tmp_path)
    tile.fn.__globals__["_prefill_load"] = kernels._prefill_load
    kern = mutate(
        kernels._attention_prefill_kernel, "_prefill_tile(", "_prefill_tile(", tmp_path, 3
    )
    kern.fn.__globals__.update(_prefill_tile=tile, _prefill_load=kernels._prefill_load)
    return kern


def _kernel_mutant(old, new, tmp_path):
    kern = mutate(kernels._attention_prefill_kernel, old, new, tmp_path)
    kern.fn.__globals__.update(
        _prefill_tile=kernels._prefill_tile, _prefill_load=kernels._prefill_load
    )
    return kern


#: (where, old, new, case): each defect with a case where it changes the answer.
DEFECTS = {
    # the unmasked tiles extend one key past the diagonal when it falls on a tile edge
    # (sequence 1: 40 queries over 54 keys, the first block's last visible key is 15)
    "causal off by one at a block edge": (
        "kernel",
        "tl.minimum(m0 + off + 1, k_len), 0) // BLOCK_N",
        "tl.minimum(m0 + off + 2, k_len), 0) // BLOCK_N",
        _shape([40], [54]),
    ),
    "causal off by one on the diagonal": (
        "kernel",
        "hi_r = tl.minimum(pos + 1, k_len)",
        "hi_r = tl.minimum(pos + 2, k_len)",
        _shape([40], [54]),
    ),
    "window off by one": (
        "kernel",
        "lo_r = tl.maximum(pos - window, 0)",
        "lo_r = tl.maximum(pos - window + 1, 0)",
        _shape([50], [50], window_left=20),
    ),
    "wrong KV head for a query head": (
        "kernel",
        "kv_head = head // GROUP",
        "kv_head = head % GROUP",
        _shape([30], [30], (4, 2, 64)),
    ),
    "wrong cu_seqlens offset for keys": (
        "kernel",
        "tl.maximum(tl.load(CuK + seq * stride_ck), 0)",
        "tl.maximum(tl.load(CuQ + seq * stride_ck), 0)",
        _shape([20, 12], [30, 40]),
    ),
    "missing online-softmax rescale": (
        "helper",
        "acc = acc * alpha[:, None] + tl.dot",
        "acc = acc + tl.dot",
        _shape([64], [64]),
    ),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_planted_defects_are_caught(defect, monkeypatch, tmp_path):
    where, old, new, shape = DEFECTS[defect]
    build = _helper_mutant if where == "helper" else _kernel_mutant
    monkeypatch.setattr(module, "_attention_prefill_kernel", build(old, new, tmp_path))
    inputs = _inputs(shape, torch.float16, seed=9)
    with pytest.raises(AssertionError):
        check(OP, inputs, _with(SMALL), torch.float16)


def test_a_launch_grid_without_the_per_sequence_slack_is_caught(monkeypatch):
    # ⌊total_q / BLOCK_M⌋ programs alone miss the last block of some sequences.
    plan = module._plan

    def short(*args, **kwargs):
        p = plan(*args, **kwargs)
        call = p.calls[0]
        grid = (call.grid[0] - (args[3].shape[0] - 1), call.grid[1])
        return dataclasses.replace(p, calls=(dataclasses.replace(call, grid=grid),))

    monkeypatch.setattr(module, "_plan", short)
    inputs = _inputs(_shape([20, 30, 7], [20, 30, 7]))
    poisoned = (torch.full_like(inputs["q"], float("nan")), torch.full((57, 4), float("nan")))
    out, _ = attention_prefill_triton(**inputs, out=poisoned, config=SMALL)
    assert out.isnan().any()  # rows never written keep the poison: verify's check catches it


# --- arguments ---------------------------------------------------------------------------------


def _args(**over):
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(12, 2, 64, dtype=torch.bfloat16)
    args = {
        "q": q,
        "k": k,
        "v": torch.randn_like(k),
        "cu_seqlens_q": torch.tensor([0, 4, 10], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 5, 12], dtype=torch.int32),
    }
    return {**args, **over}


BAD = [
    ({"q": torch.randn(10, 4, 64).double()}, TypeError, "q: expected dtype"),
    ({"k": torch.randn(12, 2, 64, dtype=torch.float16)}, TypeError, "k: expected dtype"),
    ({"q": torch.randn(10, 4, 80, dtype=torch.bfloat16)}, ValueError, "q: expected a head dim"),
    ({"q": torch.randn(10, 3, 64, dtype=torch.bfloat16)}, ValueError, "k: expected a KV head"),
    ({"v": torch.randn(11, 2, 64, dtype=torch.bfloat16)}, ValueError, "v: expected shape"),
    ({"cu_seqlens_q": torch.tensor([0, 4, 10])}, TypeError, "cu_seqlens_q: expected dtype"),
    ({"cu_seqlens_k": torch.tensor([0, 12], dtype=torch.int32)}, ValueError, "cu_seqlens_k:"),
    ({"cu_seqlens_q": torch.tensor([1, 4, 10], dtype=torch.int32)}, ValueError, "start at 0"),
    ({"cu_seqlens_q": torch.tensor([0, 6, 4], dtype=torch.int32)}, ValueError, "non-decreasing"),
    ({"cu_seqlens_k": torch.tensor([0, 5, 11], dtype=torch.int32)}, ValueError, "end at the 12"),
    ({"window_left": -2}, ValueError, "window_left: expected"),
    ({"window_left": 3.0}, TypeError, "window_left: expected an int"),
    ({"causal": 1}, TypeError, "causal: expected a bool"),
    ({"return_lse": "no"}, TypeError, "return_lse: expected a bool"),
    ({"softcap": "30"}, TypeError, "softcap: expected a float"),
    ({"block_mask": torch.ones(2, 1, 1, 1, dtype=torch.bool), "mask_block": 64.0}, TypeError,
     "mask_block: expected an int"),
    ({"mask_block": 128.0}, TypeError, "mask_block: expected an int, got float"),  # unused too
    ({"mask_block": True}, TypeError, "mask_block: expected an int, got bool"),
    ({"window_left": 3, "causal": False}, ValueError, "window_left: a sliding window"),
    ({"softcap": -1.0}, ValueError, "softcap: expected"),
    ({"softmax_scale": 0.0}, ValueError, "softmax_scale: expected"),
    ({"sinks": torch.randn(2)}, ValueError, "sinks: expected shape (4,)"),
    ({"block_mask": torch.ones(2, 4, 1, 1, dtype=torch.float32)}, TypeError, "block_mask"),
    ({"block_mask": torch.ones(3, 4, 1, 1, dtype=torch.bool)}, ValueError, "block_mask:"),
    ({"block_mask": torch.ones(2, 1, 1, 1, dtype=torch.bool), "mask_block": 48}, ValueError,
     "mask_block: expected a power of two"),
    ({"block_mask": torch.ones(2, 1, 0, 1, dtype=torch.bool), "mask_block": 16}, ValueError,
     "block_mask: expected at least (1, 1) blocks of 16"),
    ({"out": torch.empty(10, 4, 64)}, TypeError, "out: expected dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "exc", "words"), BAD, ids=[b[2][:40] for b in BAD])
@pytest.mark.parametrize(
    "fn", [attention_prefill_triton, attention_prefill_torch], ids=["kernelab", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, over, exc, words):
    with pytest.raises(exc) as info:
        fn(**_args(**over))
    assert words in str(info.value)


def test_content_checks_are_skipped_with_check_false(monkeypatch):
    def refuse(*a):
        raise AssertionError("values read")

    monkeypatch.setattr(_ragged, "check_cu_values", refuse)
    with pytest.raises(AssertionError, match="values read"):
        attention_prefill_triton(**_args(), config=SMALL)
    args = _args()
    out = attention_prefill_triton(**args, check=False, config=SMALL)
    eager = attention_prefill_torch(**args, check=False)
    torch.testing.assert_close(out, eager, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k", "sinks"])
def test_strided_metadata_is_read_through_its_strides(name, interpret):
    # every other element of a larger tensor; the skipped ones repeat the offsets (a read as
    # if contiguous stays inside q, k and v, and is wrong), or are large logits
    args = _args(sinks=torch.randn(4))
    want = attention_prefill(**args)
    filler = 5.0 if name == "sinks" else args[name]
    strided = {**args, name: every_other(args[name], filler)}
    torch.testing.assert_close(attention_prefill(**strided), want, rtol=0, atol=0)


def _guarded(t: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """``t`` as the first rows of a larger tensor whose last ``rows`` rows hold NaN."""
    big = torch.full((t.shape[0] + rows, *t.shape[1:]), float("nan"), dtype=t.dtype)
    big[: t.shape[0]] = t
    return big[: t.shape[0]]


def _tail(t: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """The ``rows`` rows past the end of ``t`` (a view from ``_guarded``)."""
    return t.as_strided((rows, *t.shape[1:]), t.stride(), t.shape[0] * t.stride(0))


def test_unchecked_offsets_past_the_rows_stay_inside_q_k_v_and_out(interpret):
    # cu_seqlens_q ends at 13 for 10 rows and cu_seqlens_k at 15 for 12 keys: the last
    # sequence is clamped to the rows there are (as if both ended right), nothing is read past
    # q, k or v, nor written past out
    args = _args()
    args.update({n: _guarded(args[n]) for n in ("q", "k", "v")})
    want = attention_prefill(**args)
    out = _guarded(torch.empty_like(want))
    past = {
        "cu_seqlens_q": torch.tensor([0, 4, 13], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 5, 15], dtype=torch.int32),
    }
    attention_prefill(**{**args, **past}, out=out, check=False)
    assert torch.equal(out, want)
    assert _tail(out).isnan().all()


def test_out_and_return_lse_and_the_public_dispatch(monkeypatch):
    args = _args()
    out = (torch.empty(10, 4, 64, dtype=torch.bfloat16), torch.empty(10, 4))
    result = attention_prefill_triton(**args, return_lse=True, out=out, config=SMALL)
    assert result[0] is out[0] and result[1] is out[1]
    monkeypatch.delenv("KERNELAB_INTERPRET", raising=False)
    eager = attention_prefill(**args)  # CPU: the torch implementation
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    interpreted = attention_prefill(**args)
    torch.testing.assert_close(interpreted, eager, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out[0], eager, atol=2e-2, rtol=2e-2)


def test_empty_batch_and_no_queries_launch_nothing():
    empty = _args(
        q=torch.empty(0, 4, 64, dtype=torch.bfloat16),
        k=torch.empty(0, 2, 64, dtype=torch.bfloat16),
        v=torch.empty(0, 2, 64, dtype=torch.bfloat16),
        cu_seqlens_q=torch.zeros(1, dtype=torch.int32),
        cu_seqlens_k=torch.zeros(1, dtype=torch.int32),
    )
    assert not module._plan(**empty).calls
    out, lse = attention_prefill_triton(**empty, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)


# --- cost, shapes, configs ---------------------------------------------------------------------


def test_cost_counts_only_visible_scores():
    causal = _ragged.visible_pairs([4096], [4096], 32, True, -1)
    assert causal == 32 * 4096 * 4097 // 2
    inputs = _inputs(_shape([70, 40], [90, 40], (2, 1, 64), block_sparse=True, window_left=25))
    dense = sum(
        int(_ragged.visible(lq, lk, True, 25, inputs["block_mask"][b], 32).sum())
        for b, (lq, lk) in enumerate([(70, 90), (40, 40)])
    )
    assert OP.cost(inputs).flops == 4 * 64 * dense
    full = _inputs(_shape([64], [64], (2, 1, 64), causal=False))
    assert OP.cost(full).flops == 4 * 64 * 64 * 64 * 2
    nbytes = (2 * 64 * 2 + 64 + 64) * 64 * 2 + 8 * 2 + 4 * 64 * 2  # q, o, k, v; cu; lse
    assert OP.cost(full).bytes == nbytes


def test_reduce_rule_scales_lengths_and_window_alike():
    shape = next(s for s in OP.shapes("representative") if "mistral" in s.label)
    q_lens, k_lens, window = _ragged.lengths(shape.reduced(4))
    f = _ragged.INTERPRETER_CTX / 8192
    assert k_lens == [math.ceil(6144 * f), 256] and q_lens == [math.ceil(1024 * f)] * 2
    assert window == math.ceil(4096 * f) - 1 and window < min(k_lens)  # still active
    assert _ragged.lengths(shape) == ([1024, 1024], [6144, 8192], 4095)
    ragged = next(s for s in OP.shapes("representative") if "qwen" in s.label).reduced(4)
    assert len(_ragged.lengths(ragged)[0]) == 4 and "seqs→4" in ragged.label
    # 28 query heads over 4 KV heads become 14 over 2: the GQA group of 7 is kept
    assert (ragged.dims["heads_q"], ragged.dims["heads_kv"]) == (14, 2)


def test_default_configs_per_target_and_the_tuning_space():
    assert PrefillConfig.default_for(128, device="sm_90") == PrefillConfig(*DEFAULTS["sm_90"][128])
    assert PrefillConfig.default_for(96, device="sm_80") == PrefillConfig(*DEFAULTS["sm_80"][128])
    assert PrefillConfig.default_for(256, device="gfx942") == PrefillConfig(
        *DEFAULTS["gfx942"][256]
    )
    assert PrefillConfig.default_for(64, device=torch.device("cpu")) == PrefillConfig(
        *DEFAULTS["sm_90"][64]
    )
    space = PrefillConfig.tuning_space(128)
    assert PrefillConfig.default_for(128, device="sm_80") in space and len(space) > 20


# --- static checks: what the compiler makes of the default launches -----------------------------

#: Per target: the tensor-core instruction inspect names, the shared memory a block may use.
TARGETS = {
    "sm_90": ("wgmma", 227 * 1024),
    "sm_80": ("mma", 163 * 1024),
    "gfx942": ("mfma", 64 * 1024),
}
STATIC = [
    ("llama3-8b prefill", "sm_90"),
    ("llama3-8b prefill", "sm_80"),
    ("llama3-8b prefill", "gfx942"),
    ("mistral", "sm_90"),  # D 128 with a window: the most registers
    ("mistral", "sm_80"),
    ("mistral", "gfx942"),
    ("gemma2-9b softcap 50 window 4096 chunked", "sm_90"),  # D 256
    ("gpt-oss", "sm_90"),  # D 64, sinks
]


def _default_launch(label, arch):
    shape = next(s for s in OP.shapes("representative") if label in s.label)
    config = PrefillConfig.default_for(shape.dims["head_dim"], device=arch)
    return OP.launches(shape, torch.bfloat16, config)[0]


@pytest.mark.parametrize(("label", "arch"), STATIC, ids=[f"{a}-{t}" for a, t in STATIC])
def test_default_launch_uses_tensor_cores_fits_and_does_not_spill(label, arch):
    from kernelab.inspect import analyze

    launch = _default_launch(label, arch)
    report = analyze(launch, arch, use_cache=False)
    assert report.error is None, report.error
    facts = report.facts
    instruction, shared = TARGETS[arch]
    # Both dots, QK^T and PV, on the target's tensor cores (on sm_90 warpgroup MMA, M = 64
    # rows per warpgroup), nothing else.
    assert set(facts["tensor_cores"]) == {instruction}, facts["tensor_cores"]
    assert not facts.get("spill_bytes"), f"{facts['spill_bytes']} bytes spilled on {arch}"
    assert facts["shared_bytes"] <= shared
    assert report.occupancy["blocks_per_sm"] >= 1


def test_sm90_launch_moves_128_bit_vectors_and_offsets_in_64_bits():
    compiled = compile_launch(_default_launch("llama3-8b ragged", "sm_90"))
    ptx = compiled.asm["ptx"]
    loads, stores, local = widths(ptx)
    assert loads[0] == 128 and stores[0] == 128 and not local
    assert re.search(r"wgmma\.mma_async", ptx)
    assert re.search(r"arith\.muli [^\n]*: (tensor<[^>]*xi64>|i64)", compiled.asm["ttir"])


def test_float32_runs_the_kernel_to_float32_accuracy(interpret):
    # a float32 model is served as it is: the kernel (through the interpreter) against float64
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(9, 4, 64, generator=gen)
    k, v = torch.randn(2, 13, 2, 64, generator=gen)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 13], dtype=torch.int32)
    got = attention_prefill(q, k, v, cu_q, cu_k, window_left=3)
    want = attention_prefill_ref(q.double(), k.double(), v.double(), cu_q, cu_k, window_left=3)
    assert got.dtype == torch.float32
    assert error(got, want).rel_l2 < 1e-5
