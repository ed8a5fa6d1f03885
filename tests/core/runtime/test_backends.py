"""The Backend interface: variants name a backend, and the instruments ask it, not the name."""

from __future__ import annotations

import pytest
import torch

from kernelab.bench.runner import BenchConfig, subjects_for
from kernelab.core.runtime import backends
from kernelab.core.runtime.backends import INTERPRETED, get_backend, register_backend
from kernelab.inspect import ops as inspect_ops
from kernelab.inspect.targets import TARGETS
from kernelab.ops import RMSNORM, Launch, Op, Variant
from kernelab.ops.norm._kernels import _norm_kernel
from tests.flawed import toy_ops


class ToyBackend:
    """A backend that runs on CPU tensors through a simulator (not timeable there), and compiles
    for one target of its own."""

    name = "toy"
    targets = ("toy_chip",)

    def __init__(self):
        self.compiled = []

    def runs_on(self, device_type):
        return True, "simulator: correctness only"

    def timed_on(self, device_type):
        return (False, "toy simulator: never timed") if device_type == "cpu" else (True, "")

    def compile(self, launch, target):
        self.compiled.append((launch, target))
        return {"target": target.name}

    def version(self):
        return "toy-1"


@pytest.fixture
def toy():
    backend = register_backend(ToyBackend())
    yield backend
    del backends._BACKENDS["toy"]


def test_the_builtin_backends_and_what_they_say():
    assert {b.name for b in backends.backends()} >= {"triton", "torch", "compile", "external"}
    assert get_backend("triton").timed_on("cpu") == (False, INTERPRETED)
    assert get_backend("triton").timed_on("cuda") == (True, "")
    assert get_backend("triton").runs_on("cpu")[0]
    assert get_backend("external").runs_on("cpu") == (False, "needs a GPU")
    assert get_backend("torch").timed_on("cpu") == (True, "")
    assert set(get_backend("triton").targets) == {t for t in TARGETS if not TARGETS[t].is_tpu}
    assert set(get_backend("pallas").targets) == {t for t in TARGETS if TARGETS[t].is_tpu}


def test_unknown_and_duplicate_backends_are_errors(toy):
    with pytest.raises(ValueError, match=r"kind: expected a backend, one of .*'toy'.*got 'tpu'"):
        Variant("v", lambda **kw: None, "tpu")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(ToyBackend())
    with pytest.raises(TypeError, match="expected a Backend adapter"):
        register_backend(object())


def test_bench_asks_the_variants_backend_whether_it_may_time_it(toy):
    op = toy_ops.double_op()
    op.add_variant(Variant("sim", lambda x, out=None: x * 2, "toy"))
    subjects, skipped = subjects_for(op, "cpu", BenchConfig())
    names = [s.name for s in subjects]
    assert "sim" not in names and "toy_double/sim: toy simulator: never timed" in skipped
    subjects, _ = subjects_for(op, "cuda", BenchConfig())
    assert "sim" in [s.name for s in subjects]
    assert op.variants["sim"].runs_on("cpu") == (True, "simulator: correctness only")


def test_bench_leaves_out_triton_variants_on_cpu_through_the_backend(monkeypatch):
    subjects, skipped = subjects_for(RMSNORM, "cpu", BenchConfig())
    assert "kernelab" not in [s.name for s in subjects]
    assert f"rmsnorm/kernelab: {INTERPRETED}" in skipped
    # The decision is the backend's: a Triton backend that could time on CPU would be asked.
    monkeypatch.setattr(backends.Triton, "timed_on", lambda self, device_type: (True, ""))
    subjects, _ = subjects_for(RMSNORM, "cpu", BenchConfig())
    assert "kernelab" in [s.name for s in subjects]


def _op_with_launches(launches):
    op = toy_ops.double_op()
    return Op(
        "toy_launching",
        description="launches of two backends",
        reference=op.reference,
        make_inputs=op._make_inputs,
        shapes=op.shape_sets,
        cost=op.cost,
        launches=lambda shape, dtype, config=None: launches,
    )


def test_inspect_sends_each_launch_to_its_own_backends_targets(toy):
    triton_launch = RMSNORM.launches(RMSNORM.shapes("representative")[0], torch.bfloat16)[0]
    toy_launch = Launch(_norm_kernel, {}, {}, 1, 1, (1,), backend="toy")
    op = _op_with_launches([triton_launch, toy_launch])
    toy_target = type(TARGETS["sm_90"])("toy_chip", "toy", 0, 1, (), False)
    plan = inspect_ops.plan([op], [TARGETS["sm_90"], toy_target])
    pairs = {(j.spec.backend, j.target.name) for j in plan.jobs}
    assert ("triton", "sm_90") in pairs and ("toy", "toy_chip") in pairs
    assert ("toy", "sm_90") not in pairs and ("triton", "toy_chip") not in pairs


def test_inspect_compiles_through_the_backend(toy):
    from kernelab.inspect.compile import compile_artifacts
    from kernelab.inspect.spec import from_launch

    spec = from_launch(Launch(_norm_kernel, {}, {}, 1, 1, (1,), backend="toy"))
    toy_target = type(TARGETS["sm_90"])("toy_chip", "toy", 0, 1, (), False)
    assert compile_artifacts(spec, toy_target) == {"target": "toy_chip"}
    assert toy.compiled and toy.compiled[0][0] is spec
    with pytest.raises(ValueError, match=r"backend 'toy' compiles for \['toy_chip'\]"):
        compile_artifacts(spec, TARGETS["sm_90"])
    assert from_launch(Launch(_norm_kernel, {}, {}, 1, 1, (1,))).identity() != spec.identity()
