"""fused_moe through the interpreter against the float64 per-expert loop; planted defects in
its kernels are caught by verify."""

import importlib

import pytest
import torch

from kernelab.ops import FUSED_MOE, Shape, fused_moe
from kernelab.ops.moe import _spec as mc_spec
from kernelab.ops.moe.fused_moe import MoEConfig, fused_moe_ref, fused_moe_torch, fused_moe_triton
from kernelab.verify import verify_candidate
from tests.mutants import mutate
from tests.opcheck import check, clone

mc = importlib.import_module("kernelab.ops.moe._common")
kernels = importlib.import_module("kernelab.ops.moe._kernels")
OP = FUSED_MOE
EDGE = OP.shapes("edge")


@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    check(OP, OP.inputs(shape, torch.bfloat16, "cpu", seed=5), fused_moe_triton, torch.bfloat16)


REPRESENTATIVE = [s.reduced(3) for s in OP.shapes("representative") if s.dims["tokens"] == 16]


@pytest.mark.parametrize(
    "shape",
    [
        p if "mixtral" in p.label else pytest.param(p, marks=pytest.mark.slow)
        for p in REPRESENTATIVE
    ],
    ids=lambda s: s.label,
)
def test_representative_shapes_at_interpreter_size(shape):
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=8, dist="heavy")
    check(OP, inputs, fused_moe_triton, torch.float16)


def test_a_config_with_two_blocks_per_run_and_narrow_tiles():
    config = MoEConfig(16, 16, 32, 4, 2)
    shape = Shape("t", {"tokens": 13, "experts": 3, "topk": 2, "hidden": 64, "intermediate": 48})
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=2)
    check(OP, inputs, lambda **kw: fused_moe_triton(**kw, config=config), torch.float16)


def _f64(v):
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_float16_intermediates_past_their_range_are_the_references_too():
    """Edge "shared expert", seed 10, huge inputs: values of silu(gate)·up (routed and shared)
    past 65504 are ±Inf as the kernels store them in float16; an exact intermediate gives
    finite outputs there. The reference rounds both intermediates as the kernels do."""
    shape = next(s for s in EDGE if s.params.get("shared"))
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=10, dist="huge")
    exact = fused_moe_ref(**{k: _f64(v) for k, v in inputs.items()})
    (ref,), _ = OP.run_reference(inputs)
    assert int((exact.isfinite() & ~ref.isfinite()).sum()) == 64
    check(OP, inputs, fused_moe_triton, torch.float16)


def test_float16_parts_keep_float32_where_one_part_overflows_and_their_sum_does_not():
    """Every token through all four experts, each weighted 1/4: expert 1's down projection is
    −1/2 of expert 0's, so the parts p and −p/2 sum to p/2; scaled so that |p| reaches 1e5
    (past 65504) and |p/2| stays below 65504."""
    shape = next(s for s in EDGE if s.label.startswith("top-k = experts"))
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=3)
    w1, w2 = inputs["w1"], inputs["w2"]
    w1[:] = w1[0]
    inputs["topk_ids"] = torch.arange(4, dtype=torch.int32).repeat(shape.dims["tokens"], 1)
    inputs["topk_weights"] = torch.full((shape.dims["tokens"], 4), 0.25)
    inputs["x"] *= 16  # exact
    x = inputs["x"].double()
    inner = mc_spec.silu_mul(x @ w1[0].double().t(), w2.shape[2], torch.float16)
    p = 0.25 * (inner @ w2[0].double().t())
    w2[0] = (w2[0].double() * 1e5 / p.abs().max()).half()
    w2[1] = -w2[0] / 2  # exact: a power of two
    w2[2:] = w2[2:] / 64
    part = 0.25 * (inner @ w2[0].double().t())
    (ref,), _ = OP.run_reference(inputs)
    assert ref.abs().max() < 60000 and part.abs().max() > 65504
    check(OP, inputs, fused_moe_triton, torch.float16)


def _small(**params):
    dims = {"tokens": 6, "experts": 4, "topk": 2, "hidden": 32, "intermediate": 32}
    if params.get("shared"):
        dims["shared_intermediate"] = 16
    return OP.inputs(Shape("t", dims, params), torch.bfloat16, "cpu", seed=4)


def test_ids_outside_the_experts_are_refused_or_masked():
    inputs = _small()
    inputs["topk_ids"][1, 0] = 4
    inputs["topk_ids"][3, 1] = -2
    with pytest.raises(ValueError, match=r"topk_ids: expected expert ids in \[0, 4\)"):
        fused_moe_triton(**clone(inputs))
    got = fused_moe_triton(**{**clone(inputs), "check": False})
    # the pairs with a bad id contribute nothing: the reference with their weight zeroed
    masked = clone(inputs)
    masked["topk_weights"][1, 0] = masked["topk_weights"][3, 1] = 0.0
    masked["topk_ids"][1, 0] = masked["topk_ids"][3, 1] = 0
    (ref,), _ = OP.run_reference(masked)
    assert (got.double() - ref).norm() / ref.norm() < 1e-2


def test_int64_ids_and_out_buffer():
    inputs = _small()
    out = torch.empty(6, 32, dtype=torch.bfloat16)
    got = fused_moe_triton(**{**clone(inputs), "topk_ids": inputs["topk_ids"].long(), "out": out})
    assert got is out
    assert torch.equal(got, fused_moe_triton(**clone(inputs)))


def test_public_function_on_cpu_is_the_eager_loop():
    inputs = _small(shared=True)
    assert torch.equal(fused_moe(**clone(inputs)), fused_moe_torch(**clone(inputs)))


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(6, 32)}, TypeError, "x: expected dtype"),
        ({"w1": torch.randn(4, 31, 32).bfloat16()}, ValueError, "w1: expected (E >= 1, 2·I"),
        ({"w2": torch.randn(4, 32, 8).bfloat16()}, ValueError, "w2: expected shape (4, 32, 16)"),
        ({"topk_ids": torch.zeros(5, 2, dtype=torch.int32)}, ValueError, "topk_ids: expected 6"),
        ({"topk_ids": torch.zeros(6, 2)}, TypeError, "topk_ids: expected dtype"),
        ({"topk_weights": torch.ones(6, 3)}, ValueError, "topk_weights: expected shape (6, 2)"),
        ({"shared_w1": torch.randn(1, 8, 32).bfloat16()}, ValueError, "expected both"),
        ({"check": 1}, TypeError, "check: expected a bool"),
    ],
)
@pytest.mark.parametrize("fn", [fused_moe_triton, fused_moe_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {
        "x": torch.randn(6, 32).bfloat16(),
        "w1": torch.randn(4, 32, 32).bfloat16(),
        "w2": torch.randn(4, 32, 16).bfloat16(),
        "topk_weights": torch.ones(6, 2),
        "topk_ids": torch.zeros(6, 2, dtype=torch.int32),
        **kwargs,
    }
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


def test_cost_counts_only_the_experts_hit_and_the_routed_flops():
    shape = EDGE[0]  # expert 1 gets no tokens
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=1)
    t, e, k, h, i = (shape.dims[n] for n in ("tokens", "experts", "topk", "hidden", "intermediate"))
    cost = OP.cost(inputs)
    assert cost.flops == 6 * t * k * h * i
    hit = len(set(inputs["topk_ids"].flatten().tolist()))
    assert hit == e - 1
    assert cost.bytes == hit * 3 * h * i * 2 + 2 * t * h * 2 + t * k * 8
    meta = OP.cost(OP.inputs(shape, torch.bfloat16, "meta"))  # the ids stay on the CPU
    assert (meta.flops, meta.bytes) == (cost.flops, cost.bytes)
    ids = torch.empty_like(inputs["topk_ids"], device="meta")  # a caller's own meta ids
    unknown = OP.cost({**inputs, "topk_ids": ids})
    assert unknown.bytes == cost.bytes + 3 * h * i * 2  # unknown ids: min(E, T·k) experts


def test_launches_and_default_configs():
    shape = next(s for s in OP.shapes("representative") if "deepseek" in s.label)
    names = [x.name for x in OP.launches(shape, torch.bfloat16)]
    assert names == ["_moe_align_kernel"] + ["_fused_moe_kernel"] * 4 + ["_moe_sum_kernel"]
    assert MoEConfig.default_for(16 * 8, 128).block_m == 16
    assert MoEConfig.default_for(4096 * 2, 8).block_m == 64
    assert all(64 % c.block_k == 0 for c in MoEConfig.tuning_space(64, 8, w4=True))


# --- planted defects, caught by verify ----------------------------------------------------------

#: 42 pairs over 3 experts in blocks of 16 (the default config): runs that end in partial
#: blocks, several blocks per expert.
VERIFY_SHAPE = Shape(
    "partial blocks T=21 E=3 k=2 32x32",
    {"tokens": 21, "experts": 3, "topk": 2, "hidden": 32, "intermediate": 32},
    batch_dim="tokens",
)

MUTANTS = {
    # an expert's run rounded down to whole blocks: its last, partial block of pairs is lost
    "partial block dropped": (
        "_moe_align_kernel",
        "padded = tl.cdiv(counts, BLOCK_SIZE) * BLOCK_SIZE",
        "padded = (counts // BLOCK_SIZE) * BLOCK_SIZE",
    ),
    # the routing weight multiplied in twice
    "routing weight twice": (
        "_fused_moe_kernel",
        "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]",
        "acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]"
        " * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]",
    ),
    # the last block named no expert: the pairs of the last expert hit are lost
    "last block's expert": (
        "_moe_align_kernel",
        "expert = tl.where(rb < total // BLOCK_SIZE, expert, -1)",
        "expert = tl.where(rb < total // BLOCK_SIZE - 1, expert, -1)",
    ),
    # the up half read from the gate rows
    "up read as gate": ("_fused_moe_kernel", "ru = rn + up_offset", "ru = rn"),
}


def _verify(shapes):
    return verify_candidate(fused_moe_triton, "fused_moe", shapes=shapes,
                            dtypes=[torch.bfloat16], device="cpu", seed=17, trials=1)  # fmt: skip


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught_by_verify(monkeypatch, tmp_path, name):
    kernel_name, old, new = MUTANTS[name]
    mutant = mutate(getattr(kernels, kernel_name), old, new, tmp_path)
    mutant.fn.__globals__["_expert_dot"] = kernels._expert_dot
    monkeypatch.setattr(mc, kernel_name, mutant)
    report = _verify([VERIFY_SHAPE])
    assert not report.passed
    failures = [f for c in report.cases for f in c.failures]
    assert failures and all(f.target == "out" for f in failures), [f.line() for f in failures]


def test_the_kernels_pass_verify_on_the_same_cases():
    report = _verify([VERIFY_SHAPE])
    assert report.passed, [f.line() for c in report.cases for f in c.failures]
