"""paged_attention: the Triton kernels through the interpreter against the float64 reference
(edge shapes, cut representative shapes), the log-sum-exp, the reduce rule, planted defects
caught by verify, bad inputs, and the static checks of the GQA-packed decode launch."""

import importlib
import math
import re
import warnings

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import (
    PAGED_ATTENTION,
    attention_prefill_ref,
    paged_attention,
    paged_attention_ref,
)
from kernelab.ops.attention.paged_attention import (
    PagedConfig,
    paged_attention_torch,
    paged_attention_triton,
)
from kernelab.verify import verify_candidate
from kernelab.verify._runner import shapes_for
from tests.mutants import mutate
from tests.opcheck import check, clone, compile_launch, every_other
from tests.ops.attention.static import TARGETS, assert_static, facts

pa = importlib.import_module("kernelab.ops.attention.paged_attention")
EDGE = PAGED_ATTENTION.shapes("edge")
REPRESENTATIVE = shapes_for(PAGED_ATTENTION, "representative", "cpu", None)  # cut as verify does


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = PAGED_ATTENTION.inputs(shape, dtype, "cpu", seed=7, dist="shifted")
    check(PAGED_ATTENTION, inputs, paged_attention_triton, dtype)


def test_the_long_sequence_beside_a_one_token_one_is_right_on_its_own():
    # Over the whole output the 1-key sequence (exactly v) dominates the relative L2 error and
    # would hide the 32k-key one: judge the long sequence's rows alone.
    shape = next(s for s in EDGE if "32k" in s.label)
    inputs = PAGED_ATTENTION.inputs(shape, torch.bfloat16, "cpu", seed=5)
    ref = PAGED_ATTENTION.run_reference(inputs)[0][0][1]
    got = paged_attention_triton(**clone(inputs))[1]
    eager = paged_attention_torch(**clone(inputs))[1]
    tol, _ = PAGED_ATTENTION.contract.tolerance_for(torch.bfloat16, error(eager, ref).rel_l2)
    assert error(got, ref).rel_l2 <= tol


PICKED = ("b1 ctx32768", "b64 ctx8192 bs64 fp8", "mistral-7b decode b8", "gemma2-9b decode b8",
          "gpt-oss-20b decode b8", "qwen2.5-7b decode b8", "mixed")  # fmt: skip


@pytest.mark.parametrize(
    "shape",
    [next(s for s in REPRESENTATIVE if p in s.label) for p in PICKED],
    ids=lambda s: s.label,
)
def test_kernel_matches_reference_on_cut_representative_shapes(shape):
    inputs = PAGED_ATTENTION.inputs(shape, torch.bfloat16, "cpu", seed=3)
    check(PAGED_ATTENTION, inputs, paged_attention_triton, torch.bfloat16)


@pytest.mark.parametrize(
    "label",
    ["sinks window 8", "more queries than keys", "split-KV with empty splits", "mixed: decodes"],
)
def test_lse_matches_reference_and_rows_without_keys_are_zero(label):
    shape = next(s for s in EDGE if s.label.startswith(label))
    inputs = PAGED_ATTENTION.inputs(shape, torch.float16, "cpu", seed=4)
    out, lse = paged_attention_triton(**clone(inputs), return_lse=True)
    ref = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
           for k, v in inputs.items()}  # fmt: skip
    ref_out, ref_lse = paged_attention_ref(**ref, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == inputs["q"].shape[:2]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], rtol=2e-3, atol=2e-3)
    if label.startswith("more queries"):  # positions −2 and −1: no key to see
        assert torch.equal(out[:2], torch.zeros_like(out[:2]))
        assert (lse[:2] == -math.inf).all() and torch.isfinite(lse[2:]).all()
    torch.testing.assert_close(out.double(), ref_out, rtol=2e-2, atol=2e-3)


def test_split_and_unsplit_agree_and_the_workspace_is_sized_from_shapes():
    shape = next(s for s in EDGE if s.label.startswith("prime lengths"))
    inputs = PAGED_ATTENTION.inputs(shape, torch.float16, "cpu", seed=1)
    one = paged_attention_triton(**{**clone(inputs), "num_splits": 1})
    five = paged_attention_triton(**{**clone(inputs), "num_splits": 5})
    torch.testing.assert_close(one, five, rtol=2e-3, atol=2e-3)
    meta = PAGED_ATTENTION.inputs(shape, torch.float16, "meta")
    plan = pa._plan(**{**meta, "num_splits": 5})  # meta tensors: nothing is read
    attention, reduce = plan.calls
    assert attention.grid == (4 // attention.config.block_q + 4, 2, 5)
    assert tuple(attention.args["O"].shape) == (5, 4, 8, 64)
    assert reduce.args["States"] is attention.args["O"]
    assert len(pa._plan(**{**meta, "num_splits": 1}).calls) == 1


def test_split_kv_is_chosen_only_when_batch_and_heads_cannot_fill_the_device():
    cfg = PagedConfig.default_for(4, 128, 1, 1)
    assert PagedConfig.splits_for(1, 1, 8, 131072, cfg.block_q) == PagedConfig.MAX_SPLITS
    assert PagedConfig.splits_for(64, 64, 8, 8192, cfg.block_q) == 1
    assert 1 < PagedConfig.splits_for(8, 8, 8, 4096, cfg.block_q) < PagedConfig.MAX_SPLITS
    assert PagedConfig.splits_for(1, 1, 8, 512, cfg.block_q) == 1  # too few keys to split


def test_gqa_packing_gives_tensor_core_sized_tiles_at_decode():
    for shape in PAGED_ATTENTION.shapes("representative"):
        c = PAGED_ATTENTION.launches(shape, torch.bfloat16)[0].constexprs
        assert c["BLOCK_Q"] * c["GROUP_PAD"] >= 16, shape.label
        assert c["GROUP_PAD"] >= c["GROUP"]


def test_cut_shapes_keep_what_each_program_does():
    """The interpreter's cut (batch, context, window, chunk) changes the grid and the loop's
    length, never the program: the same constexprs (tiles, split count, features) and warps."""
    full = {s.label: s for s in PAGED_ATTENTION.shapes("representative")}
    for cut in REPRESENTATIVE:
        if cut.declared == {}:
            continue
        original = full[cut.label.split(" [")[0]]
        assert cut.full_dims == original.dims
        a = PAGED_ATTENTION.launches(original, torch.bfloat16)
        b = PAGED_ATTENTION.launches(cut, torch.bfloat16)
        assert [x.constexprs for x in a] == [x.constexprs for x in b], cut.label
        assert [x.num_warps for x in a] == [x.num_warps for x in b]
        assert cut.dims["context"] >= a[0].constexprs["NUM_SPLITS"] * a[0].constexprs["BLOCK_N"]


def test_public_op_runs_the_kernel_when_interpreting(interpret):
    inputs = PAGED_ATTENTION.inputs(EDGE[1], torch.bfloat16, "cpu", seed=2)
    got = paged_attention(**clone(inputs))
    torch.testing.assert_close(got, paged_attention_triton(**clone(inputs)), rtol=0, atol=0)


def test_out_and_lse_buffers_are_written_and_returned():
    inputs = PAGED_ATTENTION.inputs(EDGE[3], torch.float16, "cpu", seed=2)
    out = torch.empty_like(inputs["q"])
    lse = torch.empty(inputs["q"].shape[:2])
    got, got_lse = paged_attention_triton(**inputs, out=out, lse=lse)
    assert got is out and got_lse is lse and torch.isfinite(lse).all()


# --- bad inputs -------------------------------------------------------------------------------


def _args(**over):
    args = {
        "q": torch.randn(3, 8, 64, dtype=torch.float16),
        "k_cache": torch.randn(6, 16, 2, 64, dtype=torch.float16),
        "v_cache": torch.randn(6, 16, 2, 64, dtype=torch.float16),
        "block_tables": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "seq_lens": torch.tensor([20, 9], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 2, 3], dtype=torch.int32),
    }
    args.update(over)
    return args


I32 = torch.int32
F8 = torch.float8_e4m3fn
BAD = [
    ({"q": torch.randn(3, 8, 64).double()}, TypeError, "q: expected dtype"),
    ({"k_cache": torch.randn(6, 16, 2, 64)}, TypeError, "k_cache: expected dtype"),
    ({"q": torch.randn(3, 5, 64).half()}, ValueError, "k_cache: expected a number of KV heads"),
    (
        {
            "q": torch.randn(3, 8, 80).half(),
            "k_cache": torch.randn(6, 16, 2, 80).half(),
            "v_cache": torch.randn(6, 16, 2, 80).half(),
        },
        ValueError,
        "q: expected head_dim in (64, 96, 128, 256)",
    ),
    ({"q": torch.randn(3, 8, 128).half()}, ValueError, "k_cache: expected head_dim 128"),
    ({"block_tables": torch.tensor([[0, 1], [2, 3]])}, TypeError, "block_tables: expected dtype"),
    (
        {"seq_lens": torch.tensor([20, 9, 1], dtype=I32)},
        ValueError,
        "seq_lens: expected shape (2,)",
    ),
    (
        {"cu_seqlens_q": torch.tensor([0, 3], dtype=I32)},
        ValueError,
        "cu_seqlens_q: expected shape (3,)",
    ),
    (
        {"cu_seqlens_q": torch.tensor([0, 2, 4], dtype=I32)},
        ValueError,
        "cu_seqlens_q: expected to start at 0 and end at num_tokens = 3",
    ),
    (
        {"cu_seqlens_q": torch.tensor([0, 4, 3], dtype=I32)},
        ValueError,
        "cu_seqlens_q: expected non-decreasing",
    ),
    (
        {"seq_lens": torch.tensor([33, 9], dtype=I32)},
        ValueError,
        "seq_lens: expected lengths in [0, max_blocks × block_size = 32]",
    ),
    (
        {"block_tables": torch.tensor([[0, 6], [2, 3]], dtype=I32)},
        ValueError,
        "block_tables: entry [0, 1] = 6 is not a block",
    ),
    ({"window_left": -2}, ValueError, "window_left: expected an int ≥ 0"),
    ({"window_left": 15.0}, TypeError, "window_left: expected an int ≥ 0"),
    ({"window_left": None}, TypeError, "window_left: expected an int ≥ 0"),
    ({"softmax_scale": 0.0}, ValueError, "softmax_scale: expected a finite positive float"),
    ({"softcap": -1.0}, ValueError, "softcap: expected a finite float ≥ 0"),
    ({"softcap": "50"}, TypeError, "softcap: expected a float"),
    ({"num_splits": 2.0}, TypeError, "num_splits: expected a positive int"),
    ({"return_lse": 1}, TypeError, "return_lse: expected a bool"),
    ({"check": "yes"}, TypeError, "check: expected a bool"),
    ({"sinks": torch.zeros(4)}, ValueError, "sinks: expected shape (8,)"),
    ({"num_splits": 0}, ValueError, "num_splits: expected a positive int"),
    (
        {
            "k_cache": torch.zeros(6, 16, 2, 64, dtype=F8),
            "v_cache": torch.zeros(6, 16, 2, 64, dtype=F8),
        },
        ValueError,
        "k_scale: required for a float8 cache",
    ),
    ({"out": torch.empty(3, 8, 32).half()}, ValueError, "out: expected shape (3, 8, 64)"),
    ({"lse": torch.empty(3, 4)}, ValueError, "lse: expected shape (3, 8)"),
]


@pytest.mark.parametrize(("over", "exc", "words"), BAD, ids=[b[2][:40] for b in BAD])
@pytest.mark.parametrize(
    "fn", [paged_attention_triton, paged_attention_torch], ids=["triton", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, over, exc, words):
    with pytest.raises(exc) as info:
        fn(**_args(**over))
    assert words in str(info.value)


def test_content_checks_can_be_turned_off_for_the_serving_loop(monkeypatch):
    # entries past a sequence's length may be anything: not checked, never read
    paged_attention_triton(**_args(block_tables=torch.tensor([[0, 1], [2, -7]], dtype=I32)))
    calls = []
    monkeypatch.setattr(pa._paged, "check_batch", lambda *a: calls.append(a))
    paged_attention_triton(**_args(), check=False)
    assert not calls  # no host synchronisation: the contents are the caller's to keep right
    paged_attention_triton(**_args())
    assert len(calls) == 1


# --- strided metadata, unchecked metadata -------------------------------------------------------

#: Each index tensor (and the sinks) as every other element of a larger tensor, the skipped
#: ones valid values of the wrong kind: other sequences' blocks, short lengths, repeated
#: offsets (a read of the view as if contiguous stays inside the tensors, and is wrong).
STRIDED = {
    "block_tables": lambda t: every_other(t, t.roll(1, dims=0)),
    "seq_lens": lambda t: every_other(t, 1),
    "cu_seqlens_q": lambda t: every_other(t, t),
    "sinks": lambda t: every_other(t, 5.0),
}


@pytest.mark.parametrize("name", list(STRIDED))
def test_strided_metadata_is_read_through_its_strides(name, interpret):
    shape = next(s for s in EDGE if s.label.startswith("sinks window 8"))
    inputs = PAGED_ATTENTION.inputs(shape, torch.float16, "cpu", seed=6)
    want = paged_attention(**clone(inputs))
    strided = {**clone(inputs), name: STRIDED[name](inputs[name])}
    assert not strided[name].is_contiguous()
    torch.testing.assert_close(paged_attention(**strided), want, rtol=0, atol=0)


def _guarded(t: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """``t`` as the first rows of a larger tensor whose last ``rows`` rows hold NaN."""
    big = torch.full((t.shape[0] + rows, *t.shape[1:]), float("nan"), dtype=t.dtype)
    big[: t.shape[0]] = t
    return big[: t.shape[0]]


@pytest.mark.parametrize("num_splits", [1, 3])
def test_unchecked_offsets_past_the_tokens_write_only_inside_out(num_splits, interpret):
    # cu_seqlens_q ends at 5 for 3 tokens: the last sequence's rows are clamped to the
    # tokens (as if it ended at 3), nothing is read past q or written past out
    args = _args(q=_guarded(torch.randn(3, 8, 64, dtype=torch.float16)), num_splits=num_splits)
    want = paged_attention(**args)
    out = _guarded(torch.empty(3, 8, 64, dtype=torch.float16))
    past = torch.tensor([0, 2, 5], dtype=I32)
    paged_attention(**{**args, "cu_seqlens_q": past, "out": out, "check": False})
    assert torch.equal(out, want)
    assert out.as_strided((4, 8, 64), out.stride(), out.numel()).isnan().all()  # past its end


def test_unchecked_lengths_past_the_block_table_stay_in_their_row(interpret):
    # 40 keys for a row of two 16-key blocks: the length is taken as the row's 32, never
    # read on into the next row's blocks (another sequence's keys)
    args = _args()
    want = paged_attention(**{**args, "seq_lens": torch.tensor([32, 9], dtype=I32)})
    got = paged_attention(**{**args, "seq_lens": torch.tensor([40, 9], dtype=I32)}, check=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")], ids=str)
@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
@pytest.mark.parametrize(
    "fn", [paged_attention_triton, paged_attention_torch], ids=["triton", "torch"]
)
def test_float8_cache_scales_must_be_finite_and_positive(fn, name, value):
    scales = {"k_scale": torch.ones(1), "v_scale": torch.ones(1), name: torch.tensor([value])}
    cache = {n: torch.zeros(6, 16, 2, 64, dtype=F8) for n in ("k_cache", "v_cache")}
    with pytest.raises(ValueError, match=f"{name}: expected a finite positive scale"):
        fn(**_args(**cache, **scales))


# --- planted defects: verify must catch them --------------------------------------------------

E = pa._edge_shape
MUTANT_SHAPES = {
    "block edges": E("t", [16, 17, 40], [1, 1, 3]),
    "window": E("t", [40, 33], [3, 1], window=16),  # W = 16 keys: window_left = 15
    "several tiles": E("t", [200, 70], num_splits=1),
    "splits": E("t", [200, 70], num_splits=4),
}
MUTANTS = {
    # the causal bound off by one: the query's own key (the first of a block) left out...
    "mask one key short at a block edge": (
        "block edges",
        "visible = kk[None, :] <= pos[:, None]",
        "visible = kk[None, :] < pos[:, None]",
    ),
    # ...or the next query's key let in (chunked prefill rows)
    "mask one key long": (
        "block edges",
        "visible = kk[None, :] <= pos[:, None]",
        "visible = kk[None, :] <= pos[:, None] + 1",
    ),
    "window off by one": (
        "window",
        "visible = visible & (pos[:, None] - kk[None, :] < window)",
        "visible = visible & (pos[:, None] - kk[None, :] <= window)",
    ),
    # query head h read against KV head h % Hkv instead of h // (Hq / Hkv)
    "wrong KV head for a query head": (
        "block edges",
        "head = (kvh * GROUP + g).to(tl.int64)",
        "head = (g * tl.num_programs(1) + kvh).to(tl.int64)",
    ),
    "missing online-softmax rescale": (
        "several tiles",
        "acc = acc * alpha[:, None] + tl.dot(",
        "acc = acc + tl.dot(",
    ),
    "page read from the wrong table row": (
        "block edges",
        "table = BlockTables + seq.to(tl.int64) * stride_bt",
        "table = BlockTables + ((seq + 1) % batch).to(tl.int64) * stride_bt",
    ),
}


def _swapped(**kernels):
    def candidate(**inputs):
        saved = {name: getattr(pa, name) for name in kernels}
        for name, kern in kernels.items():
            setattr(pa, name, kern)
        try:
            return paged_attention_triton(**inputs)
        finally:
            for name, kern in saved.items():
                setattr(pa, name, kern)

    return candidate


def _report(fn, shape):
    return verify_candidate(
        fn, "paged_attention", shapes=[shape], dtypes=[torch.float16], device="cpu", seed=17
    )


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(name, tmp_path):
    shape, old, new = MUTANTS[name]
    mutant = mutate(pa._paged_attention_kernel, old, new, tmp_path)
    report = _report(_swapped(_paged_attention_kernel=mutant), MUTANT_SHAPES[shape])
    assert not report.passed
    assert {c.failure_class for c in report.cases} == {"wrong values"}, [
        f.line()[:200] for c in report.cases for f in c.failures
    ]


def test_a_missing_rescale_in_the_split_kv_reduce_is_caught(tmp_path):
    merge = importlib.import_module(
        "kernelab.ops.attention._kernels"
    )._merge_attention_states_kernel
    mutant = mutate(
        merge,
        "w = tl.exp(lse.to(tl.float32) - m_safe)",
        "w = tl.where(lse == float('-inf'), 0.0, 1.0)",
        tmp_path,
    )
    report = _report(_swapped(_merge_attention_states_kernel=mutant), MUTANT_SHAPES["splits"])
    assert {c.failure_class for c in report.cases} == {"wrong values"}


@pytest.mark.parametrize("shape", ["block edges", "splits"])
def test_the_unmutated_kernels_through_the_swap_pass(shape, tmp_path):
    same = mutate(
        pa._paged_attention_kernel, "d_ok = d < HEAD_DIM", "d_ok = d < HEAD_DIM", tmp_path
    )
    report = _report(_swapped(_paged_attention_kernel=same), MUTANT_SHAPES[shape])
    assert report.passed, [f.line()[:200] for c in report.cases for f in c.failures]


# --- static checks: the GQA-packed decode as the compiler makes it -----------------------------


def _decode_launch(label="llama3-8b decode b64 ctx8192 bs16", dtype=torch.bfloat16):
    shape = next(s for s in PAGED_ATTENTION.shapes("representative") if s.label == label)
    return PAGED_ATTENTION.launches(shape, dtype)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "gfx942"])
def test_gqa_decode_uses_tensor_cores_wide_kv_loads_and_no_spills(arch):
    (launch,) = _decode_launch()
    assert_static(launch, arch, tensor_cores=True)
    code = compile_launch(launch, TARGETS[arch])
    if arch.startswith("sm"):
        # every copy of a K or V tile into shared memory moves 16 bytes; no 16-bit loads
        ptx = code.asm["ptx"]
        sizes = re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], (\w+)", ptx)
        assert sizes and set(sizes) == {"0x10"}, set(sizes)
        assert not re.search(r"ld\.global(?:\.\w+)*\.(?:b|u)16", ptx)
        ttir = code.asm["ttir"]
        assert re.search(r"arith\.muli [^\n]*: (tensor<[^>]*xi64>|i64)", ttir), "no 64-bit offsets"
    else:
        assert not re.search(r"global_load_(?:ushort|short|ubyte)", code.asm["amdgcn"])


#: Representative launches beyond the Llama-3-8B decode, on every GPU target: spills (on
#: gfx942 also scalar registers spilled into vector lanes) and tensor cores.
OTHERS = [
    "llama3-8b decode b1 ctx131072 bs16",  # split-KV: attention, then the merge
    "llama3-8b decode b8 ctx4096 bs16",  # sm_100: 8 bytes spilled by one mask form
    "gemma2-9b decode b8 ctx8192 bs16 window 4096 softcap 50",  # head_dim 256, split-KV
    "gpt-oss-20b decode b64 ctx8192 bs16 window 128 sinks",
    "llama3-8b decode b8 ctx4096 bs16 fp8",  # gfx942 float16: 2 SGPR spills before
    "llama3-8b decode b64 ctx8192 bs64 fp8",
    "qwen2.5-7b decode b8 ctx4096 bs16",
    "llama3-8b mixed b9 ctx4096 bs16 chunk 512",  # 64-row tiles; gfx942: 8-9 SGPR spills before
]


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "sm_100", "gfx942"])
@pytest.mark.parametrize("label", OTHERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_other_representative_launches_use_tensor_cores_without_spills(label, arch, dtype):
    if arch == "sm_80" and "fp8" in label:
        pytest.skip("no float8 e4m3 before sm_89")
    launches = _decode_launch(label, dtype)
    assert len(launches) == (2 if launches[0].constexprs["NUM_SPLITS"] > 1 else 1)
    for launch in launches:
        f = facts(launch, arch)
        assert f["spill_bytes"] == 0 and f["spill_instructions"] == 0, (launch.name, f)
    assert facts(launches[0], arch)["tensor_cores"]


# --- one convention for every attention op: softmax_scale and window_left = W - 1 -----------


@pytest.mark.parametrize(
    "fn", [paged_attention, paged_attention_triton, paged_attention_torch],
    ids=["public", "triton", "torch"],
)  # fmt: skip
def test_old_spellings_are_deprecated_aliases_with_the_old_meaning(fn):
    args = _args()
    want = fn(**clone(args), softmax_scale=0.2, window_left=7)
    with pytest.warns(DeprecationWarning) as caught:
        got = fn(**clone(args), scale=0.2, window=8)  # W = 8 keys seen
    said = sorted(str(w.message).split(" is ")[0] for w in caught)
    assert said == ["scale=", "window="]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(want, fn(**clone(args), softmax_scale=0.2, window_left=8))


@pytest.mark.parametrize(
    ("over", "exc", "words"),
    [
        ({"window": 8, "window_left": 7}, ValueError, "window: given with window_left"),
        ({"scale": 0.2, "softmax_scale": 0.2}, ValueError, "scale: given with softmax_scale"),
        ({"window": 0}, ValueError, "window: expected a positive int"),
        ({"windw_left": 3}, TypeError, "windw_left: unexpected keyword"),
    ],
)
def test_old_and_new_spellings_together_or_unknown_names_are_refused(over, exc, words):
    with pytest.raises(exc, match=words), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        paged_attention(**_args(), **over)


def test_a_window_means_the_same_in_prefill_and_paged_attention():
    # one sequence of 40 keys, its last 3 as queries: the same attention both ways
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, 64, generator=gen).half()
    k = torch.randn(40, 2, 64, generator=gen).half()
    v = torch.randn(40, 2, 64, generator=gen).half()
    k_cache, v_cache = k.view(5, 8, 2, 64), v.view(5, 8, 2, 64)
    table = torch.arange(5, dtype=I32)[None]
    for window_left in (-1, 0, 9):
        paged = paged_attention_torch(
            q, k_cache, v_cache, table, torch.tensor([40], dtype=I32),
            torch.tensor([0, 3], dtype=I32), window_left=window_left,
        )  # fmt: skip
        cu_q, cu_k = torch.tensor([0, 3], dtype=I32), torch.tensor([0, 40], dtype=I32)
        prefill = attention_prefill_ref(q, k, v, cu_q, cu_k, window_left=window_left)
        torch.testing.assert_close(paged, prefill, rtol=2e-3, atol=2e-3)


def test_float32_cache_runs_the_kernel_to_float32_accuracy(interpret):
    args = {k: (v.float() if v.is_floating_point() else v) for k, v in _args().items()}
    got = paged_attention(**clone(args), window_left=9)
    want = paged_attention_ref(
        **{k: (v.double() if v.is_floating_point() else v) for k, v in args.items()},
        window_left=9,
    )
    assert got.dtype == torch.float32
    assert error(got, want).rel_l2 < 1e-5
