"""Full-size cases: a candidate wrong only above a size, or on the last partial tile of a
large grid, is caught on CPU with the class "full size"; honest candidates pass; the sample
derives from the seed; interpreted kernels keep the cap, never below two tiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kernelab.core.sampling import two_tiles
from kernelab.ops import all_ops, get
from kernelab.verify import verify, verify_candidate
from kernelab.verify._full import sample_indices
from kernelab.verify._runner import shapes_for

ROOT = Path(__file__).resolve().parents[1]


def _candidates():
    path = ROOT / "benchmarks" / "candidates" / "above_a_size.py"
    spec = importlib.util.spec_from_file_location("above_a_size", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C = _candidates()

#: (op, shape set, substrings of the labels kept): one or two shapes each, to stay quick.
PICKS = {
    "rmsnorm": ("representative", ["prefill 4096x4096"]),
    "rmsnorm-edge": ("edge", ["many short rows 1000x96"]),
    "silu_and_mul": ("representative", ["prefill 4096x2x14336"]),
    "silu_and_mul-edge": ("edge", ["many short rows 1000x2x48"]),
    "gemm": ("representative", ["qkv prefill M=2048 6144x4096"]),
}


def _run(monkeypatch, key, fn, seed=7):
    name = key.split("-")[0]
    shape_set, wanted = PICKS[key]
    op = get(name)
    chosen = [
        s
        for s in op.shapes(shape_set)
        if any(w in s.label for w in wanted) and not s.params.get("residual")
        and not s.params.get("bias") and s.params.get("activation", "none") == "none"
    ]  # fmt: skip
    assert chosen, f"no shape of {name} {shape_set} matches {wanted}"
    monkeypatch.setitem(op.shape_sets, shape_set, lambda: chosen)
    dtype = "bfloat16" if name == "gemm" else "float32"
    return verify_candidate(
        fn, name, shape_sets=shape_set, dtypes=[dtype], device="cpu", seed=seed, trials=1
    )


FLAWED = [
    ("rmsnorm", "rmsnorm_zero_above_33"),
    ("rmsnorm", "rmsnorm_zero_above_1000"),
    ("rmsnorm", "rmsnorm_zero_above_3000"),
    ("rmsnorm-edge", "rmsnorm_bad_last_tile"),
    ("silu_and_mul", "silu_and_mul_stale_above_100"),
    ("silu_and_mul", "silu_and_mul_stale_above_4000"),
    ("silu_and_mul-edge", "silu_and_mul_bad_last_tile"),
    ("gemm", "gemm_half_k_above_64"),
    ("gemm", "gemm_half_k_above_1000"),
    ("gemm", "gemm_bad_last_column_tile"),
]


@pytest.mark.parametrize(("key", "candidate"), FLAWED)
def test_a_candidate_wrong_above_a_size_is_caught_as_full_size(monkeypatch, key, candidate):
    report = _run(monkeypatch, key, getattr(C, candidate))
    capped = [c for c in report.cases if c.sample is None]
    full = [c for c in report.cases if c.sample is not None]
    assert capped and all(c.passed for c in capped), "capped cases alone cannot see the flaw"
    assert full and any(c.failure_class == "full size" for c in full), [
        (c.shape, c.failure_class, c.worst_ratio) for c in full
    ]
    assert not report.passed


HONEST = [
    ("rmsnorm", "rmsnorm_chunked"),
    ("rmsnorm-edge", "rmsnorm_chunked"),
    ("silu_and_mul", "silu_and_mul_chunked"),
    ("silu_and_mul-edge", "silu_and_mul_chunked"),
    ("gemm", "gemm_chunked"),
]


@pytest.mark.parametrize(("key", "candidate"), HONEST)
def test_honest_rewrites_and_eager_torch_pass_at_full_size(monkeypatch, key, candidate):
    for fn in (getattr(C, candidate), get(key.split("-")[0]).variants["torch"].fn):
        report = _run(monkeypatch, key, fn)
        full = [c for c in report.cases if c.sample is not None]
        assert full, "the picked shapes were cut: each needs a full-size case"
        failed = [(c.shape, c.failure_class, c.worst_ratio) for c in report.cases if not c.passed]
        assert not failed


def test_the_sample_is_drawn_from_the_seed_and_recorded(monkeypatch):
    a = _run(monkeypatch, "rmsnorm", C.rmsnorm_chunked, seed=11)
    b = _run(monkeypatch, "rmsnorm", C.rmsnorm_chunked, seed=11)
    c = _run(monkeypatch, "rmsnorm", C.rmsnorm_chunked, seed=12)
    (sa,) = [k.sample for k in a.cases if k.sample]
    (sb,) = [k.sample for k in b.cases if k.sample]
    (sc,) = [k.sample for k in c.cases if k.sample]
    assert sa == sb and sa["rows"] != sc["rows"]
    assert sa["of_rows"] == 4096 and sa["rows"][-1] == 4095 and len(sa["rows"]) == 64
    assert [k.as_dict()["sample"] for k in a.cases if k.sample] == [sa]
    # one row in each of 64 equal strata
    assert [r // 64 for r in sa["rows"]] == list(range(64))
    # too big to be cheap: cut (columns, not rows) and listed
    assert any("4096x4096" in line and "cols 4096→" in line for line in a.cut), a.cut


def test_sample_indices_cover_every_stratum_and_the_last_row():
    gen = torch.Generator().manual_seed(0)
    picks = sample_indices(1000, 64, gen)
    assert picks[-1] == 999 and picks.unique().numel() == 64
    edges = torch.linspace(0, 1000, 65).floor().to(torch.int64)
    assert bool(((picks >= edges[:-1]) & (picks < edges[1:])).all())
    assert sample_indices(10, 64, gen).tolist() == list(range(10))


@pytest.mark.parametrize(
    ("full", "cap", "tile", "expected"),
    [(1000, 32, 128, 232), (1000, 32, 32, 40), (33, 32, 64, 33), (1001, 32, 4, 29),
     (4096, 32, 128, 256), (20, 32, 128, 20)],
)  # fmt: skip
def test_an_interpreted_edge_shape_keeps_two_tiles_and_its_remainder(full, cap, tile, expected):
    got = two_tiles(full, cap, tile)
    assert got == expected
    # a grid of at least two tiles, the last as partial as at full size
    assert got == full or (-(-got // tile) >= 2 and got % tile == full % tile)


def test_interpreted_variants_keep_the_cap_and_run_no_full_size_case(monkeypatch):
    op = get("rmsnorm")
    labels = [s.label for s in shapes_for(op, "edge", "cpu", None)]
    assert "many short rows 1000x96 [rows→40]" in labels
    chosen = [s for s in op.shapes("edge") if s.label == "many short rows 1000x96"]
    monkeypatch.setitem(op.shape_sets, "edge", lambda: chosen)
    report = verify(
        "rmsnorm", variants=["kernelab", "torch"], shape_sets="edge", dtypes=["float32"],
        device="cpu", seed=3, trials=1,
    )  # fmt: skip
    by_variant = {v: [c for c in report.cases if c.variant == v] for v in ("kernelab", "torch")}
    assert by_variant["kernelab"] and all(c.sample is None for c in by_variant["kernelab"])
    assert [c.sample is not None for c in by_variant["torch"]] == [False, True]
    assert report.passed


def _small(op, shape_set="edge"):
    """The edge shape with the most rows, cut to at most 96 of them (and N to 200)."""
    shapes = [s for s in op.shapes(shape_set) if s.batch_dim and s.dims[s.batch_dim] > 1]
    best = max(shapes, key=lambda s: s.dims[s.batch_dim])
    return best.reduced(96)


@pytest.mark.parametrize("name", [op.name for op in all_ops() if op.sampling is not None])
def test_each_declaration_matches_the_reference_on_sampled_rows(name):
    """The reference on the sampled rows (× columns) equals the sampled rows of the
    reference on everything: the op's rows really are independent as declared."""
    op = get(name)
    smp = op.sampling
    shape = _small(op)
    dtype = op.dtypes[0]
    inputs = op.inputs(shape, dtype, "cpu", seed=5)
    assert smp.holds(inputs)
    n_rows = shape.dims[shape.batch_dim]
    n_cols = shape.dims[smp.col_dim] if smp.col_dim else None
    gen = torch.Generator().manual_seed(1)
    rows = sample_indices(n_rows, max(2, n_rows // 3), gen)
    cols = sample_indices(n_cols, max(2, n_cols // 3), gen) if n_cols else None
    full_out, full_inplace = op.run_reference(inputs)
    sub_out, sub_inplace = op.run_reference(smp.sub_inputs(inputs, rows, cols, n_rows, n_cols))
    names = list(op.outputs)
    pairs = list(zip(names, full_out, sub_out, strict=True))
    pairs += [(k, full_inplace[k], sub_inplace[k]) for k in full_inplace]
    for target, whole, part in pairs:
        picked = smp.take(target, whole, inputs, rows, cols, n_rows, n_cols, output=True)
        assert picked.shape == part.shape, target
        assert torch.equal(picked.isnan(), part.isnan()), target
        assert torch.allclose(picked.double(), part.double(), rtol=1e-12, atol=0, equal_nan=True)


def test_ops_with_global_reductions_declare_no_sampling():
    for name in ("attention_prefill", "paged_attention", "kv_cache_write", "moe_align",
                 "fused_moe", "fused_moe_w4a16"):  # fmt: skip
        assert get(name).sampling is None
    fp8 = get("fp8_quant")
    per_tensor = {"per_token": False, "group_size": None, "scale": None}
    assert not fp8.sampling.holds(per_tensor)
    assert fp8.sampling.holds({**per_tensor, "per_token": True})
