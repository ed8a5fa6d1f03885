"""kv_cache_write: the Triton kernel through the interpreter against the float64 reference,
planted defects caught by verify's in-place region check, bad inputs, static checks."""

import importlib

import pytest
import torch

from kernelab.ops import KV_CACHE_WRITE, Shape, kv_cache_write, kv_cache_write_ref
from kernelab.ops.attention.kv_cache_write import kv_cache_write_torch, kv_cache_write_triton
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check, every_other
from tests.ops.attention.static import assert_static

kvw_module = importlib.import_module("kernelab.ops.attention.kv_cache_write")
EDGE = KV_CACHE_WRITE.shapes("edge")
REGION = "wrote outside its in-place region"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = KV_CACHE_WRITE.inputs(shape, dtype, "cpu", seed=7)
    before = {n: inputs[n].clone() for n in ("k_cache", "v_cache")}
    k_cache, v_cache = check(KV_CACHE_WRITE, inputs, kv_cache_write_triton, dtype)
    # exact: a copy, or eager torch's float8 cast bit for bit
    eager = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    e_k, e_v = kv_cache_write_torch(**eager)
    assert torch.equal(k_cache.view(torch.uint8), e_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), e_v.view(torch.uint8))
    if shape.params.get("all_padding"):
        assert torch.equal(k_cache.view(torch.uint8), before["k_cache"].view(torch.uint8))


def test_padding_writes_nothing_and_slots_address_block_and_offset():
    k = torch.randn(3, 2, 64)
    v = torch.randn(3, 2, 64)
    k_cache, v_cache = torch.randn(4, 16, 2, 64), torch.randn(4, 16, 2, 64)
    slots = torch.tensor([17, -1, 63])
    before = k_cache.clone()
    kv_cache_write_triton(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[3, 15], v[2])
    changed = (k_cache != before).any(dim=(2, 3))
    assert changed.nonzero().tolist() == [[1, 1], [3, 15]]


def test_fp8_cache_is_quantized_with_the_given_scale():
    k, v = torch.randn(5, 2, 64, dtype=torch.bfloat16), torch.randn(5, 2, 64, dtype=torch.bfloat16)
    f8 = torch.float8_e4m3fn
    k_cache = torch.zeros(2, 16, 2, 64, dtype=f8)
    v_cache = torch.zeros(2, 16, 2, 64, dtype=f8)
    ks, vs = torch.tensor([0.01]), torch.tensor([0.02])
    kv_cache_write_triton(k, v, k_cache, v_cache, torch.arange(5), ks, vs)
    want = (k.float() / ks).clamp(-448, 448).to(f8)
    assert torch.equal(k_cache[0, :5].view(torch.uint8), want.view(torch.uint8))
    # values past the format saturate, as the GPU's cvt.satfinite does
    big = torch.full((1, 2, 64), 1e4, dtype=torch.bfloat16)
    kv_cache_write_triton(big, big, k_cache, v_cache, torch.tensor([20]), ks, vs)
    assert (k_cache[1, 4].float() == 448).all()


def test_public_op_runs_the_kernel_when_interpreting(interpret):
    inputs = KV_CACHE_WRITE.inputs(EDGE[1], torch.float16, "cpu", seed=2)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = kv_cache_write(**inputs)
    ref_k, _ = kv_cache_write_ref(**ref)
    assert out[0] is inputs["k_cache"] and torch.equal(out[0], ref_k)


def _args(**over):
    args = {
        "k": torch.randn(3, 2, 64),
        "v": torch.randn(3, 2, 64),
        "k_cache": torch.randn(4, 16, 2, 64),
        "v_cache": torch.randn(4, 16, 2, 64),
        "slot_mapping": torch.tensor([0, 5, -1]),
    }
    args.update(over)
    return args


F8 = torch.float8_e4m3fn


@pytest.mark.parametrize(
    ("over", "exc", "words"),
    [
        ({"k": torch.randn(3, 2, 64).int()}, TypeError, "k: expected dtype"),
        ({"v": torch.randn(3, 2, 64).half()}, TypeError, "v: expected dtype"),
        ({"v": torch.randn(3, 2, 32)}, ValueError, "v: expected shape (3, 2, 64)"),
        (
            {"k_cache": torch.randn(4, 16, 3, 64), "v_cache": torch.randn(4, 16, 3, 64)},
            ValueError,
            "k_cache: expected (num_blocks, block_size, 2, 64)",
        ),
        ({"k_cache": torch.randn(4, 16, 2, 64).half()}, TypeError, "k_cache: expected dtype"),
        ({"v_cache": torch.randn(4, 8, 2, 64)}, ValueError, "v_cache: expected shape"),
        ({"k_cache": torch.randn(64, 2, 64)}, ValueError, "k_cache: expected 4 dimensions"),
        ({"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, TypeError, "slot_mapping: expected"),
        ({"slot_mapping": torch.tensor([0, 1])}, ValueError, "slot_mapping: expected shape (3,)"),
        ({"slot_mapping": torch.tensor([0, 64, 1])}, ValueError, "slot_mapping: slot 64 is past"),
        ({"k_scale": torch.ones(1)}, ValueError, "k_scale: given for a float32 cache"),
        (
            {"k_cache": torch.zeros(4, 16, 2, 64, dtype=F8), "v_cache": torch.zeros(4, 16, 2, 64)},
            TypeError,
            "v_cache: expected dtype",
        ),
        (
            {
                "k_cache": torch.zeros(4, 16, 2, 64, dtype=F8),
                "v_cache": torch.zeros(4, 16, 2, 64, dtype=F8),
            },
            ValueError,
            "k_scale: required for a float8 cache",
        ),
        (
            {
                "k_cache": torch.zeros(4, 16, 2, 64, dtype=F8),
                "v_cache": torch.zeros(4, 16, 2, 64, dtype=F8),
                "k_scale": torch.ones(1),
                "v_scale": torch.ones(2),
            },
            ValueError,
            "v_scale: expected one per-tensor scale",
        ),
        ({"k": torch.randn(3, 64, 2).transpose(1, 2)}, ValueError, "k: expected unit stride"),
    ],
)
@pytest.mark.parametrize(
    "fn", [kv_cache_write_triton, kv_cache_write_torch], ids=["triton", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, over, exc, words):
    with pytest.raises(exc) as info:
        fn(**_args(**over))
    assert words in str(info.value)


def test_slot_check_can_be_turned_off_for_the_serving_loop():
    args = _args(slot_mapping=torch.tensor([0, 5, 63]))
    kv_cache_write_triton(**args, check=False)  # the last slot of the cache: in bounds
    with pytest.raises(ValueError, match="slot_mapping"):
        kv_cache_write_triton(**_args(slot_mapping=torch.tensor([0, 5, 64])))


def test_a_strided_slot_mapping_is_read_through_its_stride(interpret):
    # every other slot of a larger mapping; the skipped entries are slots of the cache too
    k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    k_cache, v_cache = torch.randn(4, 16, 2, 64), torch.randn(4, 16, 2, 64)
    slots = every_other(torch.tensor([5, 6, 7]), torch.tensor([40, 41, 42]))
    want = kv_cache_write_ref(k, v, k_cache.clone(), v_cache.clone(), slots)
    got = kv_cache_write(k, v, k_cache, v_cache, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("interpreted", [True, False], ids=["kernel", "torch"])
def test_unchecked_slots_past_the_cache_write_nothing(interpreted, monkeypatch):
    # k_cache and v_cache the first two of three caches in one tensor: a k row written one
    # slot past k_cache lands in v_cache's slot 0, a v row in the third (a guard)
    monkeypatch.setenv("KERNELAB_INTERPRET", "1" if interpreted else "0")
    backing = torch.randn(3, 4, 16, 2, 64)
    before = backing.clone()
    k, v = torch.randn(4, 2, 64), torch.randn(4, 2, 64)
    slots = torch.tensor([64, 3, 127, -1])  # past, in, past, padding
    kv_cache_write(k, v, backing[0], backing[1], slots, check=False)
    changed = (backing != before).any(dim=(3, 4))
    assert changed.nonzero().tolist() == [[0, 0, 3], [1, 0, 3]]
    assert torch.equal(backing[0, 0, 3], k[1]) and torch.equal(backing[1, 0, 3], v[1])


BAD_SCALES = [0.0, -0.5, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("value", BAD_SCALES, ids=str)
@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
@pytest.mark.parametrize(
    "fn", [kv_cache_write_triton, kv_cache_write_torch], ids=["triton", "torch"]
)
def test_float8_scales_must_be_finite_and_positive(fn, name, value):
    # a zero scale writes ±448 everywhere, a negative one flips every sign, NaN writes NaN
    scales = {"k_scale": torch.ones(1), "v_scale": torch.ones(1), name: torch.tensor([value])}
    cache = {n: torch.zeros(4, 16, 2, 64, dtype=F8) for n in ("k_cache", "v_cache")}
    with pytest.raises(ValueError, match=f"{name}: expected a finite positive scale"):
        fn(**_args(**cache, **scales))
    fn(**_args(**cache, **scales), check=False)  # unchecked: the caller's to keep right


@pytest.mark.parametrize(
    "slots", [[0, 5, 5], [7, -1, 7], [-1, 3, 3]], ids=["adjacent", "around padding", "last"]
)
@pytest.mark.parametrize(
    "fn", [kv_cache_write_triton, kv_cache_write_torch], ids=["triton", "torch"]
)
def test_two_tokens_into_one_slot_are_refused_under_check(fn, slots):
    slot = max(slots)
    with pytest.raises(ValueError, match=f"slot_mapping: slot {slot} is given to more than one"):
        fn(**_args(slot_mapping=torch.tensor(slots)))
    fn(**_args(slot_mapping=torch.tensor(slots)), check=False)  # documented: one of them lands
    fn(**_args(slot_mapping=torch.tensor([-1, 4, -1])))  # padding repeats: not a slot


# --- planted defects: verify's in-place region must catch them --------------------------------

SHAPES = [
    Shape(
        "padding",
        {"tokens": 9, "heads_kv": 2, "head_dim": 64, "block_size": 16, "num_blocks": 8},
        {"padding": True},
        batch_dim="tokens",
    ),
    Shape(
        "fp8",
        {"tokens": 6, "heads_kv": 2, "head_dim": 64, "block_size": 16, "num_blocks": 4},
        {"fp8": True, "padding": True},
        batch_dim="tokens",
    ),
]

MUTANTS = {
    # the offset within a block off by one: the next slot (or the next block's first) written
    "write to a wrong slot": (
        "offset = slot % BLOCK_SIZE",
        "offset = (slot + 1) % BLOCK_SIZE",
    ),
    # padding tokens not skipped but clamped to slot 0, a slot of another sequence
    "write to a padding slot": (
        "heads_here = tl.where((slot >= 0) & (slot < n_slots), heads, 0)",
        "heads_here = heads\n    slot = tl.maximum(slot, 0)",
    ),
}


def _with_kernel(kern):
    def candidate(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True):
        saved = kvw_module._kv_cache_write_kernel
        kvw_module._kv_cache_write_kernel = kern
        try:
            return kv_cache_write_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        finally:
            kvw_module._kv_cache_write_kernel = saved

    return candidate


def _report(fn):
    return verify_candidate(
        fn, "kv_cache_write", shapes=SHAPES, dtypes=[torch.bfloat16], device="cpu", seed=11
    )


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_as_writes_outside_the_region(name, tmp_path):
    old, new = MUTANTS[name]
    report = _report(_with_kernel(mutate(kvw_module._kv_cache_write_kernel, old, new, tmp_path)))
    assert not report.passed
    assert {c.failure_class for c in report.cases} == {REGION}, [
        f.line() for c in report.cases for f in c.failures
    ]


def test_the_unmutated_kernel_through_the_swap_passes(tmp_path):
    same = mutate(kvw_module._kv_cache_write_kernel, "offset = slot", "offset = slot", tmp_path)
    report = _report(_with_kernel(same))
    assert report.passed, [f.line() for c in report.cases for f in c.failures]


# --- static checks: what the compiler makes of the representative launches ---------------------


def _launch(label_part: str, fp8: bool = False):
    shape = next(
        s
        for s in KV_CACHE_WRITE.shapes("representative")
        if label_part in s.label and bool(s.params.get("fp8")) == fp8
    )
    return KV_CACHE_WRITE.launches(shape, torch.bfloat16)[0]


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_sm90_launch_moves_128_bit_vectors_without_spills_in_64_bit_offsets(fp8):
    launch = _launch("llama3-8b decode 64x8x128 bs16", fp8)
    ptx = assert_wide_and_unspilled(launch, stores=not fp8)
    if fp8:  # 8 fp8 values of a thread leave in one 64-bit store at least
        assert "st.global.v2.b32" in ptx or "st.global.v4.b32" in ptx


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "gfx942"])
def test_launches_do_not_spill_and_load_128_bits(arch):
    for fp8 in (False, True):
        if fp8 and arch == "sm_80":
            continue  # no float8 e4m3 before sm_89
        f = assert_static(_launch("llama3-8b decode 64x8x128 bs16", fp8), arch)
        assert "128" in f["stores"] or fp8, f["stores"]
