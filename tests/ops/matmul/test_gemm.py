"""Dense GEMM: every Triton path through the interpreter against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import GEMM, Shape, gemm, gemm_ref
from kernelab.ops.matmul.gemm import GemmConfig, gemm_torch, gemm_triton, tma_available
from tests.mutants import mutate
from tests.opcheck import check, every_other
from tests.opcheck import clone as _clone

gemm_module = importlib.import_module("kernelab.ops.matmul.gemm")
common = importlib.import_module("kernelab.ops.matmul._common")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")
MODULES = (gemm_module, kernels, common)

DTYPES = (torch.float16, torch.bfloat16)
TRITON_VARIANTS = [n for n, v in GEMM.variants.items() if v.kind == "triton"]
SMALL = GemmConfig(16, 32, 16, group_m=2, num_warps=4, num_stages=2)
SPLIT = GemmConfig(16, 32, 16, group_m=2, split_k=3)
TMA = GemmConfig(16, 16, 32, group_m=2, kind="tma")


def _check(inputs, fn, dtype):
    return check(GEMM, inputs, fn, dtype)


@pytest.mark.parametrize("variant", TRITON_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GEMM.shapes("edge"), ids=lambda s: s.label)
def test_every_path_matches_reference_on_edge_shapes(shape, dtype, variant):
    inputs = GEMM.inputs(shape, dtype, "cpu", seed=11)
    _check(inputs, GEMM.variants[variant], dtype)


REPRESENTATIVE = GEMM.shapes("representative")


@pytest.mark.parametrize("variant", TRITON_VARIANTS)
@pytest.mark.parametrize(
    "shape",
    # decode with bias (Qwen qkv), prefill with residual (down projection)
    [
        next(s for s in REPRESENTATIVE if s.params["bias"]).reduced(4),
        next(s for s in REPRESENTATIVE if s.params["residual"] and s.dims["M"] > 16).reduced(8),
    ],
    ids=lambda s: s.label,
)
def test_representative_shapes_at_interpreter_size(shape, variant):
    assert "→" in shape.label  # the reduction is labelled
    inputs = GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    _check(inputs, GEMM.variants[variant], torch.bfloat16)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_hard_distributions(dist):
    shape = Shape("t", {"M": 9, "N": 40, "K": 72}, {"layout": "nk", "residual": True})
    for dtype in DTYPES:
        _check(GEMM.inputs(shape, dtype, "cpu", seed=4, dist=dist), gemm_triton, dtype)


@pytest.mark.parametrize(
    "config",
    [
        SMALL,  # 5x3 tiles in groups of two row-tiles: grouped order must cover every tile
        GemmConfig(16, 32, 16, group_m=3, split_k=3),  # uneven K slices (K=88 over 3)
        GemmConfig(32, 16, 32, group_m=1, kind="persistent"),
        GemmConfig(16, 32, 16, group_m=4, kind="tma"),  # no TMA here: the tiled kernel runs
    ],
    ids=str,
)
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_configs_and_epilogues(config, activation):
    shape = Shape("t", {"M": 70, "N": 90, "K": 88}, {"bias": True, "activation": activation})
    inputs = GEMM.inputs(shape, torch.float16, "cpu", seed=3)
    _check(inputs, lambda **kw: gemm_triton(**kw, config=config), torch.float16)


def test_kn_and_nk_layouts_give_the_same_product():
    a = torch.randn(5, 24, dtype=torch.float16)
    w = torch.randn(40, 24, dtype=torch.float16)
    by_weight = gemm_triton(a, w, b_layout="nk", config=SMALL)
    by_kn = gemm_triton(a, w.t().contiguous(), b_layout="kn", config=SMALL)
    torch.testing.assert_close(by_weight, by_kn, rtol=0, atol=0)


def test_interpreter_multiplies_bf16_beyond_the_float16_range():
    """Interpreted tl.dot widens bf16 tiles exactly to float32 (Triton's own interpreter would
    multiply their raw bits, or pass through float16, which overflows at 65504)."""
    a = (torch.randn(4, 32) * 1e5).bfloat16()
    b = (torch.randn(32, 8) * 1e3).bfloat16()
    out = gemm_triton(a, b, config=SMALL)
    assert torch.isfinite(out).all()
    assert error(out, a.double() @ b.double()).rel_l2 < 4e-3


def test_out_argument_and_k_zero():
    a, b = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16)
    out = torch.full((3, 8), float("nan"), dtype=torch.bfloat16)
    assert gemm_triton(a, b, out=out) is out and torch.isfinite(out).all()
    empty_k = gemm_triton(torch.empty(3, 0, dtype=torch.float16), torch.empty(0, 8).half())
    assert torch.equal(empty_k, torch.zeros(3, 8, dtype=torch.float16))


def test_public_op_dispatches_to_torch_on_cpu_and_to_triton_when_interpreting(monkeypatch):
    calls = []
    monkeypatch.setattr(gemm_module, "gemm_triton", lambda *a: calls.append("triton"))
    monkeypatch.setattr(gemm_module, "gemm_torch", lambda *a: calls.append("torch"))
    a, b = torch.randn(2, 8).half(), torch.randn(8, 4).half()
    monkeypatch.delenv("KERNELAB_INTERPRET", raising=False)
    gemm_module.gemm(a, b)
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    gemm_module.gemm(a, b)
    assert calls == ["torch", "triton"]


def test_public_op_is_right_through_the_interpreter(interpret):
    a, w = torch.randn(3, 32).half(), torch.randn(20, 32).half()
    out = gemm(a, w, b_layout="nk", activation="silu")
    ref = gemm_ref(a.double(), w.double(), b_layout="nk", activation="silu")
    assert error(out, ref).rel_l2 < 2e-3


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"a": torch.randn(2, 8)}, TypeError, "a: expected dtype"),
        ({"b": torch.randn(9, 4).half()}, ValueError, "b: expected K = 8"),
        ({"b_layout": "kn", "b": torch.randn(4, 8).half()}, ValueError, "b: expected K = 8"),
        ({"b_layout": "t"}, ValueError, "b_layout: expected 'kn'"),
        ({"activation": "relu"}, ValueError, "activation: expected one of"),
        ({"bias": torch.randn(5).half()}, ValueError, "bias: expected shape (4,)"),
        ({"residual": torch.randn(2, 5).half()}, ValueError, "residual: expected shape (2, 4)"),
        ({"out": torch.empty(2, 4)}, TypeError, "out: expected dtype"),
    ],
)
@pytest.mark.parametrize("fn", [gemm_triton, gemm_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {"a": torch.randn(2, 8).half(), "b": torch.randn(8, 4).half(), **kwargs}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


# --- the Hopper path's guard --------------------------------------------------------------------


def test_tma_is_unavailable_off_hopper_and_without_triton_support(monkeypatch):
    assert not tma_available(torch.device("cpu"))
    assert not tma_available("sm_80")
    real_import = importlib.import_module

    def no_descriptors(name, *a):
        if name == "triton.tools.tensor_descriptor":
            raise ImportError(name)
        return real_import(name, *a)

    monkeypatch.setattr(gemm_module.importlib, "import_module", no_descriptors)
    assert not tma_available("sm_90")  # checked when asked, not when kernelab was imported
    assert GemmConfig.default_for(4096, 4096, 4096, device="sm_90").kind == "tiled"
    monkeypatch.undo()
    assert tma_available("sm_90")
    assert GemmConfig.default_for(4096, 4096, 4096, device="sm_90").kind == "tma"


def test_tma_kernel_itself_is_right_through_the_interpreter(monkeypatch):
    """Forcing the guard open on CPU runs the descriptor kernel in the interpreter, where
    Triton supports host tensor descriptors; the result must match the reference."""
    monkeypatch.setattr(gemm_module, "tma_available", lambda device=None: True)
    shape = Shape("t", {"M": 40, "N": 48, "K": 80}, {"layout": "nk", "residual": True})
    for layout in ("nk", "kn"):
        s = Shape("t", shape.dims, {**shape.params, "layout": layout})
        inputs = GEMM.inputs(s, torch.bfloat16, "cpu", seed=8)
        try:
            _check(inputs, lambda **kw: gemm_triton(**kw, config=TMA), torch.bfloat16)
        except (NotImplementedError, AttributeError) as exc:  # older interpreters
            pytest.skip(f"this Triton's interpreter has no tensor descriptors: {exc}")


# --- heuristics as data -------------------------------------------------------------------------


def test_defaults_pick_split_k_for_decode_and_big_tiles_for_prefill():
    decode = GemmConfig.default_for(1, 4096, 4096)
    assert decode.block_m == 16 and decode.split_k > 1
    assert GemmConfig.default_for(1, 4096, 4096).split_k * 4096 // decode.block_n >= 132
    prefill = GemmConfig.default_for(8192, 4096, 4096, device="sm_80")
    assert (prefill.block_m, prefill.block_n, prefill.split_k) == (128, 128, 1)
    assert GemmConfig.default_for(8192, 4096, 4096, device="gfx942").num_stages == 2


def test_tuning_space_is_data_and_launches_describe_every_argument():
    shape = REPRESENTATIVE[0]
    space = GEMM.tuning_space(shape, torch.bfloat16)
    assert len(space) > 10 and all(isinstance(c, GemmConfig) for c in space)
    assert all(c.block_m <= 16 for c in space)  # M = 1: no 128-row tiles
    for cfg in (None, space[0], GemmConfig(64, 64, 32, kind="persistent")):
        for launch in GEMM.launches(shape, torch.bfloat16, cfg):
            assert set(launch.signature) == set(launch.kernel.arg_names)
            assert all(launch.signature[c] == "constexpr" for c in launch.constexprs)
    big = REPRESENTATIVE[-1]
    assert not any(c.kind == "tma" for c in GemmConfig.tuning_space(8192, 4096, 4096))
    hopper = GemmConfig.tuning_space(8192, 4096, 4096, device="sm_90")
    assert any(c.kind == "tma" for c in hopper) and big.dims["M"] == 8192
    split = GEMM.launches(shape, torch.bfloat16)
    assert [x.name for x in split] == ["_gemm_kernel", "_splitk_reduce_kernel"]


def test_cost_counts_flops_and_bytes():
    shape = Shape("t", {"M": 4, "N": 6, "K": 8}, {"bias": True})
    cost = GEMM.cost(GEMM.inputs(shape, torch.bfloat16, "meta"))
    assert cost.flops == 2 * 4 * 6 * 8 + 4 * 6
    assert cost.bytes == 2 * (4 * 8 + 8 * 6 + 4 * 6 + 6)


def test_interpreter_reduction_keeps_what_each_program_does():
    s = REPRESENTATIVE[-1].reduced(8)
    assert s.dims == {"M": 8, "N": 160, "K": 256}
    assert s.label.endswith("[M→8, N→160, K→256]")


# --- null-kernel audit and planted defects ------------------------------------------------------


def test_trivial_candidates_fail_the_contract():
    shape = REPRESENTATIVE[2].reduced(16)
    inputs = GEMM.inputs(shape, torch.bfloat16, "cpu", seed=9)
    (ref,), _ = GEMM.run_reference(inputs)
    fp8 = torch.float8_e4m3fn
    low = {k: v.to(fp8).to(torch.bfloat16) if k in ("a", "b") else v for k, v in inputs.items()}
    caught = []
    candidates = {
        "zeros": torch.zeros_like(ref).bfloat16(),
        "one row dropped": torch.cat([ref[:-1], torch.zeros_like(ref[-1:])]).bfloat16(),
        "fp8 inputs": gemm_torch(**low),
    }
    for name, out in candidates.items():
        with pytest.raises(AssertionError, match="rel L2"):
            _check(inputs, lambda got=out, **kw: got, torch.bfloat16)
        caught.append(name)
    assert caught == list(candidates)


MUTANTS = {
    # the K loop stops one tile early: the tail of K is never accumulated
    "k-tail-skipped": (
        "_gemm_tile",
        "range(k_start, k_stop, BLOCK_K)",
        "range(k_start, k_stop - BLOCK_K, BLOCK_K)",
        SMALL,
    ),
    # grouped ordering maps two programs to one tile (and leaves another unwritten)
    "group-order": (
        "_tile_coords",
        "pid_n = (tile % width) // size_m",
        "pid_n = tile // num_m",
        SMALL,
    ),
    # the split-K reduction forgets the last slice
    "split-k-drops-slice": ("_splitk_reduce_kernel", "range(SPLIT_K)", "range(SPLIT_K - 1)", SPLIT),
    # the residual read with the column stride as its row stride
    "residual-stride": (
        "_epilogue",
        "rm[:, None].to(tl.int64) * stride_rm",
        "rm[:, None].to(tl.int64) * stride_rn",
        SMALL,
    ),
    # the Hopper kernel reads B's tile at the row offset
    "tma-wrong-box": (
        "_gemm_tma_kernel",
        "b_desc.load([off_n, k0])",
        "b_desc.load([off_m, k0])",
        TMA,
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    fn_name, old, new, config = MUTANTS[name]
    if config.kind == "tma":
        monkeypatch.setattr(gemm_module, "tma_available", lambda device=None: True)
    module = next(m for m in MODULES if hasattr(m, fn_name))
    mutant = mutate(getattr(module, fn_name), old, new, tmp_path)
    # the mutant's module needs the helpers its kernel calls
    helpers = ("_epilogue", "_tile_coords", "_gemm_tile")
    mutant.fn.__globals__.update({h: getattr(kernels, h) for h in helpers})
    for mod in MODULES:  # every module that calls the mutated function by name
        if hasattr(mod, fn_name):
            monkeypatch.setattr(mod, fn_name, mutant)
    params = {"residual": True, "activation": "silu", "bias": True, "layout": "nk"}
    shape = Shape("t", {"M": 40, "N": 70, "K": 88}, params)
    inputs = GEMM.inputs(shape, torch.float16, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(inputs, lambda **kw: gemm_triton(**kw, config=config), torch.float16)


@pytest.mark.parametrize("op_name", ["gemm", "w4a16_gemm", "w8a16_gemm", "fp8_gemm"])
def test_strided_out_is_fully_written_and_canaries_survive(op_name):
    """The output as a view into a larger poisoned buffer: every element written, twice with
    different poison the same bits, and the padding around it untouched."""
    from kernelab.ops import get

    op = get(op_name)
    dims = {"M": 5, "N": 40, "K": 128}
    shape = next(s for s in op.shapes("edge") if s.dims["M"] > 0)
    shape = Shape("t", dims, {k: v for k, v in shape.params.items() if k == "group_size"})
    inputs = op.inputs(shape, op.dtypes[-1], "cpu", seed=1)
    results = []
    for poison in (float("nan"), -7.0):
        buf = torch.full((7, 48), poison, dtype=torch.bfloat16)
        out = buf[1:6, 3:43]
        got = op.variants["kernelab"](**_clone(inputs), out=out)
        assert got.data_ptr() == out.data_ptr() and torch.isfinite(out).all()
        outside = torch.ones_like(buf, dtype=torch.bool)
        outside[1:6, 3:43] = False
        canaries = buf[outside].float()
        assert (canaries.isnan() if poison != poison else canaries == poison).all()
        results.append(out.clone())
    assert torch.equal(results[0], results[1])


#: The edge shape of each GEMM whose inputs include per-row or per-column vectors.
VECTORS = {
    "gemm": ("M just over a tile", ["bias"]),
    "fp8_gemm": ("primes, per-row", ["scale_a", "scale_b", "bias"]),
    "w4a16_gemm": ("decode batch", ["bias"]),
    "w8a16_gemm": ("decode batch", ["bias"]),
}


@pytest.mark.parametrize(
    ("op_name", "name"), [(op, n) for op, (_, names) in VECTORS.items() for n in names]
)
def test_strided_bias_and_scale_vectors_are_read_through_their_strides(op_name, name):
    """A bias or scale vector as every other element of a larger tensor (the skipped ones
    large): the kernel reads it as the values it holds, not as contiguous memory."""
    from kernelab.ops import get

    op = get(op_name)
    label = VECTORS[op_name][0]
    shape = next(s for s in op.shapes("edge") if s.label.startswith(label))
    inputs = op.inputs(shape, op.dtypes[-1], "cpu", seed=2)
    assert inputs[name] is not None and inputs[name].numel() > 1
    run = op.variants["kernelab"]
    want = run(**_clone(inputs))
    strided = {**_clone(inputs), name: every_other(inputs[name], 1e3)}
    assert torch.equal(run(**strided), want)
