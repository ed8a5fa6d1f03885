"""bench's rotating timed loop and its CPU accounting never flag eager torch, on every op.

Each op's eager variant is benched (as kernelab's "torch" and once more as a user's candidate,
which is charged for threads from before its first call) on its smallest edge shape, in up to
two float dtypes, with a tiny stopping rule and a small cache (so that cold mode adds input
sets and copies of them at new addresses). Every state of the rotation is an input set the
op can be called with (prepared parameters keep their values; 0-dim and float8 inputs are
written like any other),
so an honest implementation is never called a cache, never wrong, never off-thread."""

import copy
import dataclasses

import pytest
import torch

import kernelab.ops  # noqa: F401  (registers the ops)
from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject, rotation, runner
from kernelab.bench.cache import tensor_bytes
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import NVFP4_GEMM, RMSNORM, Shape, all_ops
from kernelab.ops.norm.rmsnorm import rmsnorm_torch

#: At least the six states of three input sets, each sample's output kept and checked.
RULE = StopRule(rel_ci=0.5, min_samples=8, min_time=0.0, max_time=0.02, max_samples=12)
GENEROUS = Ceilings("test", 250e9, "test: 250 GB/s", {}, {})
SMALL_CACHE = 1 << 20  # copies holding 2 MiB: cold mode without a second of copies per case

#: Flags of the rotating timed loop and the CPU accounting (classes 8, 9, 10).
FALSE_ALARMS = (
    rotation.FLAG,
    "wrong output of timed calls",
    "work on another thread",
    "background load",
    "slowed by background load",
    "rotation:",
)


@pytest.fixture
def small_flush(monkeypatch):
    monkeypatch.setattr(runner, "cache_bytes", lambda info: (SMALL_CACHE, "test"))


def _smallest_edge(op) -> Shape:
    shapes = [s for s in op.shapes("edge") if all(s.dims.values())]  # not an empty case
    return min(shapes, key=lambda s: tensor_bytes(op.inputs(s, op.dtypes[0], "meta")))


def _dtypes(op) -> list[torch.dtype]:
    floats = [d for d in op.dtypes if d in (torch.float16, torch.bfloat16)]
    return floats or list(op.dtypes[:1])


def _eager(op, shape, dtype) -> dict:
    fn = op.variants["torch"].fn
    subjects = [Subject("candidate", fn, "candidate"), Subject("torch", fn, "torch")]
    cfg = BenchConfig(rule=RULE, energy_window_s=0, mode="cold")
    cases = bench_case(op, shape, dtype, subjects, detect("cpu"), HostTimer(), GENEROUS, cfg)
    return {c["variant"]: c for c in cases}


def _alarms(case) -> list[str]:
    return [f for f in case["flags"] if f.startswith(FALSE_ALARMS)]


@pytest.mark.parametrize("name", [op.name for op in all_ops()])
def test_eager_torch_is_never_flagged_by_the_timed_loop_checks(name, small_flush):
    op = next(o for o in all_ops() if o.name == name)
    shape = _smallest_edge(op)
    for dtype in _dtypes(op):
        inputs = op.inputs(shape, dtype, "cpu")
        data = set(rotation.changeable(op, inputs))
        assert data, f"{name}: a partial update has nothing to change"
        for variant, case in _eager(op, shape, dtype).items():
            where = (name, shape.label, str(dtype), variant)
            assert not _alarms(case), (where, case["flags"])
            rot = case["metrics"]["rotation"]
            if case["cold_cache"].startswith(("flush", "rotate")):  # cold: sets at new addresses
                assert rot["input_sets"] >= 2, (where, rot)
            assert rot["states"] == 2 * rot["input_sets"], (where, rot)
            assert rot["changed_elements"] > 0, (where, rot)
            # prepared parameters (scales, packed weights, rotary tables) are never changed
            assert set(rot["changed_inputs"]) <= data, (where, rot)
            assert rot["checked_outputs"] >= 2 and rot["checked_states"] >= 2, (where, rot)


@pytest.mark.parametrize("name", ["fp8_block_gemm", "rmsnorm", "silu_and_mul"])
@pytest.mark.parametrize("mode", ["cold", "hot"])
def test_a_loop_stopped_at_three_samples_checks_two_states(name, mode, small_flush, monkeypatch):
    """A slow host: batches of three samples (the least) and the time limit reached by the
    first. One warm-up batch still runs (with no time for it), and the three samples the loop
    takes are checked against two states of the rotation, not one."""
    monkeypatch.setattr(runner, "BATCH_S", 0.0)
    op = next(o for o in all_ops() if o.name == name)
    rule = dataclasses.replace(RULE, max_time=0.0)
    fn = op.variants["torch"].fn
    subjects = [Subject("candidate", fn, "candidate"), Subject("torch", fn, "torch")]
    cfg = BenchConfig(rule=rule, energy_window_s=0, mode=mode)
    shape, dtype = _smallest_edge(op), _dtypes(op)[0]
    cases = bench_case(op, shape, dtype, subjects, detect("cpu"), HostTimer(), GENEROUS, cfg)
    for case in cases:
        assert case["metrics"]["n"] == 3 and not _alarms(case), (case["variant"], case["flags"])
        rot = case["metrics"]["rotation"]
        assert rot["checked_states"] >= 2, (case["variant"], rot)


def test_zero_dim_and_float8_inputs_are_written_and_the_reference_follows(small_flush):
    """nvfp4_gemm with every float input changeable (its e4m3 scales and the 0-dim per-tensor
    scale too): a state is then no weight quantize_nvfp4 would make, but the slot holds exactly
    the values its reference was computed from, so eager torch stays right."""
    op = copy.copy(NVFP4_GEMM)
    op.contract = dataclasses.replace(op.contract, data_inputs=None)
    shape = Shape("one row 1x7x16", {"M": 1, "N": 7, "K": 16}, {}, batch_dim="M")
    for variant, case in _eager(op, shape, torch.bfloat16).items():
        assert not _alarms(case), (variant, case["flags"])
        changed = set(case["metrics"]["rotation"]["changed_inputs"])
        assert {"b_scale", "b_global"} <= changed, changed


def test_nvfp4_gemm_changes_its_activations_only():
    inputs = NVFP4_GEMM.inputs(
        Shape("q", {"M": 3, "N": 7, "K": 32}, {"quantize_a": True}, batch_dim="M"),
        torch.bfloat16,
    )
    assert rotation.changeable(NVFP4_GEMM, inputs) == ["a"]
    other = NVFP4_GEMM.inputs(
        Shape("q", {"M": 3, "N": 7, "K": 32}, {"quantize_a": True}, batch_dim="M"),
        torch.bfloat16,
        seed=5,
    )
    new = rotation.partial(inputs, other, ["a"], torch.Generator().manual_seed(0))
    for n in ("b", "b_scale", "b_global", "a_global"):
        assert new[n] is inputs[n]
    assert 0 < int((new["a"] != inputs["a"]).sum()) < inputs["a"].numel()


def test_an_undeclared_data_input_is_a_clear_error():
    op = copy.copy(RMSNORM)
    op.contract = dataclasses.replace(op.contract, data_inputs=("x", "scale"))
    inputs = op.inputs(Shape("n", {"rows": 2, "cols": 8}, {}, "rows"), torch.float32)
    with pytest.raises(ValueError, match=r"data_inputs: op 'rmsnorm' declares \['scale'\]"):
        rotation.changeable(op, inputs)


def test_data_inputs_must_be_names():
    with pytest.raises(TypeError, match="data_inputs"):
        dataclasses.replace(RMSNORM.contract, data_inputs="x")


def test_a_prepared_form_that_cannot_share_buffers_keeps_one_state(small_flush):
    """A prepare that turns a tensor into a Python number: the partial state cannot be written
    into the same buffers, so it is dropped (said in a warning) rather than checked against a
    reference of values the subject never saw."""

    def prepare(inputs):
        return {**inputs, "x_sum": float(inputs["x"].sum())}

    def fn(x, weight, eps, residual=None, x_sum=None):
        return rmsnorm_torch(x, weight, eps, residual)

    shape = Shape("norm 4x64", {"rows": 4, "cols": 64}, {}, "rows")
    subjects = [Subject("prepared", fn, "candidate", prepare)]
    cfg = BenchConfig(rule=RULE, energy_window_s=0, mode="cold")
    (case,) = bench_case(
        RMSNORM, shape, torch.float32, subjects, detect("cpu"), HostTimer(), GENEROUS, cfg
    )
    notes = [f for f in case["flags"] if f.startswith("rotation:")]
    assert notes and "x_sum" in notes[0], case["flags"]
    assert case["metrics"]["valid"], case["flags"]
    rot = case["metrics"]["rotation"]
    assert rot["states"] == rot["input_sets"] and rot["changed_elements"] == 0, rot
