"""Cold mode without a flush: copies of the inputs at new addresses, holding twice the cache.

Each sample reads a copy that twice the cache's worth of other copies was read through since
its last use; every copy moves to its input set's other state after its visit, so a cache keyed
on addresses, version counters or sampled values still meets inputs it has not seen. Planted
content-keyed caches (several ops) are caught with many more copies than samples, where each
copy is met once; honest candidates are not flagged. The cache size is patched small."""

from pathlib import Path

import pytest
import torch

from kernelab._loader import load_callable
from kernelab.bench import (
    BenchConfig,
    Ceilings,
    StopRule,
    Subject,
    cache,
    integrity,
    rotation,
    runner,
)
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import GEMM, RMSNORM, SILU_AND_MUL, Shape

CANDIDATES = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates"
RULE = StopRule(rel_ci=0.5, min_samples=5, min_time=0.05, max_time=0.3, max_samples=40)
GENEROUS = Ceilings("test", 250e9, "test: 250 GB/s", {}, {})
NORM = Shape("norm 64x1024", {"rows": 64, "cols": 1024}, {"residual": False}, "rows")
MM = Shape("mm 32x256x512", {"M": 32, "N": 256, "K": 512},
           {"bias": False, "layout": "nk", "residual": False}, "M")  # fmt: skip
ACT = Shape("act 64x2x512", {"rows": 64, "d": 512}, {}, "rows")
CASES = {
    "rmsnorm": (RMSNORM, NORM, torch.float32),
    "gemm": (GEMM, MM, torch.bfloat16),
    "silu_and_mul": (SILU_AND_MUL, ACT, torch.float16),
}
CACHED = rotation.FLAG
CACHE = 8 << 20  # copies of ~64-260 KiB inputs holding 16 MiB: 60-250 copies, 40 samples


@pytest.fixture(autouse=True)
def small_cache(monkeypatch):
    monkeypatch.setattr(runner, "cache_bytes", lambda info: (CACHE, "test"))


# --- copies -----------------------------------------------------------------------------------


def test_copies_keep_shapes_strides_values_and_aliasing():
    base = torch.randn(6, 10)
    e4m3 = torch.randn(8, 16).to(torch.float8_e4m3fn)
    args = {
        "x": base,
        "xt": base.t(),  # a strided view
        "tail": base[2:, 3:],  # an offset into its storage
        "bcast": torch.randn(1, 5).expand(4, 5),  # stride 0
        "scalar": torch.tensor(1.5),
        "fp8": e4m3,
        "empty": torch.empty(0, 3),
        "same": base,  # the same tensor under two names
        "eps": 1e-6,
    }
    copies = cache.replicate(args, 3)
    assert len(copies) == 3
    ptrs = {args["x"].data_ptr()}
    for c in copies:
        for name, t in args.items():
            if not isinstance(t, torch.Tensor):
                assert c[name] == t
                continue
            u = c[name]
            assert (u.shape, u.stride(), u.dtype) == (t.shape, t.stride(), t.dtype), name
            assert torch.equal(integrity.bits(u), integrity.bits(t)) if t.numel() else True, name
        assert c["same"] is c["x"]
        assert c["x"].data_ptr() not in ptrs
        ptrs.add(c["x"].data_ptr())
    step = copies[1]["fp8"].data_ptr() - copies[0]["fp8"].data_ptr()
    assert step > 0 and step % cache.COPY_ALIGN == 0
    copies[0]["x"][0, 0] = 99.0  # copies are independent of the original and of each other
    assert base[0, 0] != 99.0 and copies[1]["x"][0, 0] != 99.0


def test_a_tensor_that_requires_grad_is_refused_by_name():
    with pytest.raises(ValueError, match="w: a tensor that requires grad"):
        cache.replicate({"w": torch.ones(3, requires_grad=True)}, 2)


def test_copies_hold_twice_the_cache_or_give_way_to_a_flush(monkeypatch):
    assert cache.copies_for_cold([1000, 2000], 10_000, "cpu") == 20  # ceil(2 * 10000 / 1000)
    assert cache.copies_for_cold([10**9], 10_000, "cpu") == 2  # at least two
    assert cache.copies_for_cold([16], 10**9, "cpu") is None  # more than MAX_COPIES
    monkeypatch.setattr(cache, "free_memory", lambda device: 10**6)
    assert cache.copies_for_cold([10_000], 10**6, "cpu") is None  # over the memory share


# --- the rotation over copies -----------------------------------------------------------------


def _rotation(op_name, copies, runs=1):
    """Rotations of ``runs`` subjects on the case's own inputs, the cache sized so that the
    places number ``copies``."""
    op, shape, dtype = CASES[op_name]
    inputs = op.inputs(shape, dtype, "cpu", seed=3)
    ref = integrity.Reference.build(op, inputs, dtype)

    class _Run:
        subject = Subject("torch", op.variants["torch"].fn, "torch")
        args = inputs

    size = cache.tensor_bytes(inputs) * copies // 2 if copies > 1 else 0
    rots = rotation.build(op, shape, dtype, "cpu", inputs, ref, [_Run()] * runs, 3, True, size)
    return op, inputs, rots if runs > 1 else rots[0]


@pytest.mark.parametrize("op_name", ["rmsnorm", "silu_and_mul"])
def test_each_cycle_visits_every_copy_once_each_in_its_next_state(op_name):
    op, inputs, rot = _rotation(op_name, 9)
    order = rot.places.order
    assert len(rot.copies) == 9 and sorted(order) == list(range(9)) and order[0] == 0
    assert rot.held_bytes() == 9 * cache.tensor_bytes(inputs)  # twice the (patched) cache
    versions = {}
    seen = []
    for cycle in range(3):
        visits = []
        for _ in range(9):
            args = rot.advance()
            if not seen:
                assert args is inputs  # the subject's own buffers first, as written
            state = rot.current
            x = next(t for t in args.values() if isinstance(t, torch.Tensor))
            visits.append((x.data_ptr(), (state.slot, state.index)))
            versions.setdefault(x.data_ptr(), x._version)
            assert x._version == versions[x.data_ptr()]  # states written under the counter
            out = op.variants["torch"](**integrity.clone_inputs(args))
            assert state.ref.check(out, args) is None  # the copy holds its state's values
            seen.append(visits[-1])
        assert len({p for p, _ in visits}) == 9  # every copy once a cycle
        if cycle == 0:
            first = dict(visits)
            assert {s for _, s in visits} == {(k, i) for k in range(len(rot.slots)) for i in (0, 1)}
        else:  # each copy in the other state of its slot than a cycle before
            assert all(first[p][1] != s[1] if cycle % 2 else first[p] == s for p, s in visits)
    rot.reset()
    assert rot.args is inputs and (rot.current.slot, rot.current.index) == (0, 0)


@pytest.mark.parametrize("op_name", ["rmsnorm", "silu_and_mul"])
@pytest.mark.parametrize("places", [9, 40])
def test_consecutive_samples_read_different_states(op_name, places):
    """A loop that stops after three samples (a slow host, a short time limit) still checks
    outputs of both states: the order takes them in turn, as far as their counts allow."""
    _, _, rot = _rotation(op_name, places)
    index = []
    for _ in range(2 * len(rot.copies)):
        rot.advance()
        index.append(rot.current.index)
    n = len(rot.copies)
    held1 = sum(1 for i in index[:n] if i)
    turns = 2 * held1 + 1  # copy 0 in state 0, then one of each until the state-1 copies end
    assert index[:turns] == [i % 2 for i in range(turns)], index[:n]
    assert n - turns <= len(rot.slots)  # at most one more state-0 start per slot
    # a cycle later every copy is in its other state: the turns go on
    assert index[n : n + turns] == [1 - i % 2 for i in range(turns)], index[n:]


def test_hot_mode_keeps_the_subjects_own_buffers():
    _, _, rot = _rotation("rmsnorm", 1)
    assert len(rot.copies) == len(rot.slots)
    assert rot.summary()["copies"] == len(rot.slots)


def test_subjects_on_the_same_arguments_share_one_cycle():
    """Between two visits of a copy every other copy is read, whichever subject reads it."""
    _, _, (a, b) = _rotation("rmsnorm", 8, runs=2)
    assert a.places is b.places and len(a.copies) == 8
    seen = [id((a if i % 3 < 2 else b).advance()) for i in range(16)]  # a, a, b, a, a, b, ...
    assert len(set(seen[:8])) == 8 and seen[8:] == seen[:8]


# --- bench in cold mode -----------------------------------------------------------------------


def _bench(file, fn, op_name):
    op, shape, dtype = CASES[op_name]
    fn = load_callable(f"{CANDIDATES / file}:{fn}")
    try:
        subjects = [
            Subject("candidate", fn, "candidate"),
            Subject("torch", op.variants["torch"].fn, "torch"),
        ]
        cfg = BenchConfig(rule=RULE, energy_window_s=0, mode="cold")
        cases = bench_case(op, shape, dtype, subjects, detect("cpu"), HostTimer(), GENEROUS, cfg)
    finally:
        stop = getattr(__import__("sys").modules[fn.__module__], "stop", None)
        if stop is not None:
            stop()
    return {c["variant"]: c for c in cases}


@pytest.mark.parametrize("op_name, fn", [("rmsnorm", "rmsnorm_candidate"),
                                         ("gemm", "gemm_candidate"),
                                         ("silu_and_mul", "silu_and_mul_candidate")])  # fmt: skip
def test_a_cache_keyed_on_sampled_values_is_caught_across_copies(op_name, fn):
    cases = _bench("content_cache.py", fn, op_name)
    cand, torch_case = cases["candidate"], cases["torch"]
    rot = cand["metrics"]["rotation"]
    assert cand["cold_cache"].startswith("rotate") and rot["copies"] > cand["metrics"]["n"]
    assert rot == {**rot, "copies": torch_case["metrics"]["rotation"]["copies"]}  # one cycle
    assert any(f.startswith(CACHED) for f in cand["flags"]), cand["flags"]
    assert not cand["metrics"]["valid"]
    assert torch_case["metrics"]["valid"], torch_case["flags"]


@pytest.mark.parametrize("file, fn, op_name", [
    ("rmsnorm_chunked.py", "rmsnorm_candidate", "rmsnorm"),
    ("gemm_float32.py", "gemm_candidate", "gemm"),
])  # fmt: skip
def test_honest_candidates_are_not_flagged_in_cold_mode(file, fn, op_name):
    cases = _bench(file, fn, op_name)
    for case in cases.values():
        assert case["cold_cache"].startswith("rotate")
        assert case["metrics"]["valid"], (case["variant"], case["flags"])
        assert case["metrics"]["rotation"]["checked_states"] >= 2
