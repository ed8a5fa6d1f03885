"""The op model and registry."""

import pytest
import torch

from kernelab import ops
from kernelab.core.op import _REGISTRY
from kernelab.ops import Contract, Op, Shape, Variant


def _op(name="toy"):
    return Op(
        name,
        description="toy",
        reference=lambda x: x * 2,
        make_inputs=lambda s, d, dev, g, dist: {"x": torch.randn(s.dims["n"], generator=g)},
        shapes={
            "representative": lambda: [Shape("a", {"n": 4})],
            "edge": lambda: [Shape("b", {"n": 1})],
        },
        cost=lambda inp: ops.Cost(inp["x"].numel(), 8 * inp["x"].numel()),
    )


def test_duplicate_op_name_is_an_error(monkeypatch):
    monkeypatch.setattr("kernelab.core.op._REGISTRY", dict(_REGISTRY))
    with pytest.raises(ValueError, match="already registered"):
        ops.register(_op("rmsnorm"))


def test_duplicate_variant_name_is_an_error():
    op = _op()
    op.add_torch(lambda x: x * 2)
    with pytest.raises(ValueError, match="already has a variant named 'torch'"):
        op.add_variant(Variant("torch", lambda x: x, "torch"))


def test_unknown_op_and_shape_set_errors_name_the_choices():
    with pytest.raises(ValueError, match=r"op: expected one of .*rmsnorm"):
        ops.get("nope")
    with pytest.raises(ValueError, match="shape_set: expected one of"):
        ops.RMSNORM.shapes("huge")


def test_op_must_declare_both_shape_sets():
    with pytest.raises(ValueError, match="must declare shape sets"):
        Op(
            "x",
            description="",
            reference=None,
            make_inputs=None,
            shapes={"edge": lambda: []},
            cost=None,
        )


def test_external_variant_registers_only_when_its_package_imports():
    op = _op()
    op.add_external("ghost", "kernelab_no_such_package", lambda: None)
    op.add_external("numpy_based", "numpy", lambda: lambda x: x * 2)
    assert "ghost" not in op.variants
    assert op.variants["numpy_based"](x=torch.ones(2)).tolist() == [2.0, 2.0]


def test_inputs_are_reproducible_from_the_seed_and_differ_across_seeds():
    shape = ops.RMSNORM.shapes("edge")[2]
    a = ops.RMSNORM.inputs(shape, torch.float16, seed=1)["x"]
    b = ops.RMSNORM.inputs(shape, torch.float16, seed=1)["x"]
    c = ops.RMSNORM.inputs(shape, torch.float16, seed=2)["x"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.std() > 0.5  # not zeros, not a constant


def test_wrong_dtype_for_op_inputs_names_the_argument():
    with pytest.raises(TypeError, match="dtype: op 'rmsnorm' takes"):
        ops.RMSNORM.inputs(ops.RMSNORM.shapes("edge")[0], torch.int32)


def test_reference_runs_in_float64_on_copies():
    shape = ops.RMSNORM.shapes("edge")[3]  # with residual
    inputs = ops.RMSNORM.inputs(shape, torch.bfloat16, seed=0)
    before = inputs["residual"].clone()
    outs, inplace = ops.RMSNORM.run_reference(inputs)
    assert outs[0].dtype == torch.float64 and inplace["residual"].dtype == torch.float64
    assert torch.equal(inputs["residual"], before)  # the caller's inputs are untouched


def test_the_reference_gets_the_dtype_a_contract_holds_intermediates_in():
    seen = []

    def reference(x, intermediate_dtype=None):
        seen.append((x.dtype, intermediate_dtype))
        return x

    op = _op()
    held = Op(
        "toy",
        description="toy",
        reference=reference,
        make_inputs=op._make_inputs,
        shapes=op.shape_sets,
        cost=op.cost,
        contract=Contract(intermediate_dtype="x"),
    )
    held.run_reference({"x": torch.ones(2, dtype=torch.float16)})
    assert seen == [(torch.float64, torch.float16)]
    with pytest.raises(ValueError, match="intermediate_dtype: op 'toy' names 'x', not a tensor"):
        held.run_reference({"x": 1.0})
    with pytest.raises(TypeError, match="intermediate_dtype: expected an input name"):
        Contract(intermediate_dtype=torch.float16)


def test_contract_tolerance_is_derived_with_a_floor_and_can_be_fixed():
    c = Contract(k=2.0, floors={"bfloat16": 1e-2})
    assert c.tolerance_for(torch.bfloat16, 0.02) == (0.04, "2x eager torch")
    assert c.tolerance_for(torch.bfloat16, 1e-4) == (1e-2, "floor")
    fixed = Contract(tolerance={"float32": 1e-3})
    assert fixed.tolerance_for(torch.float32, 0.5) == (1e-3, "contract")


def test_shape_reduction_for_the_interpreter():
    s = Shape("llama", {"rows": 4096, "cols": 8}, batch_dim="rows")
    assert s.reduced(8).dims == {"rows": 8, "cols": 8} and "rows→8" in s.reduced(8).label
    assert s.reduced(10_000) is s
    assert Shape("x", {"n": 5}).reduced(1).dims == {"n": 5}


def test_a_cut_shape_keeps_its_declared_sizes():
    s = Shape(
        "decode", {"batch": 64, "context": 8192}, batch_dim="batch", reduce_to={"context": 99}
    )
    cut = s.reduced(4)
    assert cut.dims == {"batch": 4, "context": 99}
    assert cut.full_dims == s.dims == s.full_dims and s.declared == {}
    assert cut.reduced(2).full_dims == s.dims  # cut twice: still the declared sizes
    assert cut.as_dict()["declared"] == {"batch": 64, "context": 8192}


def test_representative_shapes_come_from_real_models():
    labels = " ".join(s.label for s in ops.RMSNORM.shapes("representative"))
    for model in ("llama3-8b", "llama3-70b", "qwen2.5-7b", "mistral-7b"):
        assert model in labels
    dims = {(s.dims["rows"], s.dims["cols"]) for s in ops.RMSNORM.shapes("representative")}
    assert (4096, 8192) in dims and (1, 3584) in dims


def test_cost_model_counts_minimum_bytes():
    shape = Shape("t", {"rows": 2, "cols": 8}, {"residual": True})
    cost = ops.RMSNORM.cost(ops.RMSNORM.inputs(shape, torch.bfloat16))
    # x, residual read; out, residual written: 4 x 16 elements x 2 bytes; weight 8 x 2 bytes
    assert cost.bytes == 4 * 16 * 2 + 16
    assert cost.floor_seconds(None, 1e9) == pytest.approx(cost.bytes / 1e9)


def test_variant_kind_is_validated():
    with pytest.raises(ValueError, match="kind: expected"):
        Variant("x", lambda: None, "cuda")


@pytest.mark.parametrize("op", ops.all_ops(), ids=lambda o: o.name)
def test_the_cost_of_meta_inputs_is_the_cost_of_real_ones(op):
    """Floors, model-cost, static tuning and inspect build meta inputs (no data): the cost model
    must count on them what it counts on real inputs: the keys a sequence sees, the slots that
    are not padding, the experts a routing reaches. Metadata the count reads (lengths, slots,
    expert ids) stays on the CPU for meta inputs."""
    dtype = op.dtypes[0]
    for shape in op.shapes("edge"):
        meta = op.cost(op.inputs(shape, dtype, "meta"))
        real = op.cost(op.inputs(shape, dtype, "cpu"))
        assert (meta.flops, meta.bytes) == (real.flops, real.bytes), shape.label


def test_a_contract_names_only_distributions_inputs_can_draw():
    assert Contract(distributions=("offset",)).distributions == ("offset",)
    with pytest.raises(ValueError, match=r"distributions: expected names from \('offset',\)"):
        Contract(distributions=("uniform",))
    shape = ops.LAYERNORM.shapes("representative")[0].reduced(2)
    x = ops.LAYERNORM.inputs(shape, torch.float32, dist="offset")["x"]
    assert x.numel() > 1000 and abs(float(x.mean()) - 1000.0) < 0.5 and 0.5 < float(x.std()) < 2
