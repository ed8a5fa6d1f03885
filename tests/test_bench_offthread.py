"""Planted cheats that the fresh-input and new-thread checks miss, each caught in the timed loop
with its class named: caches keyed on version counters or sampled elements (rotating input
sets), work on a thread that already existed and load left running between calls (CPU time
per thread), for rmsnorm, gemm, rope, silu_and_mul and softmax. The honest candidates, written
differently from the references, are never flagged.

Cold mode rotates copies of the inputs holding twice a small cache here (the runner's cache
size is patched): what is checked does not depend on the cache's size, and copies of twice
this machine's last-level cache would take most of each test's time."""

import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kernelab._loader import load_callable
from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject, rotation, runner, threads
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import GEMM, RMSNORM, ROPE, SILU_AND_MUL, SOFTMAX, Shape

CANDIDATES = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates"
RULE = StopRule(rel_ci=0.5, min_samples=5, min_time=0.05, max_time=0.3, max_samples=60)
GENEROUS = Ceilings("test", 250e9, "test: 250 GB/s", {}, {})
NORM = Shape("norm 64x1024", {"rows": 64, "cols": 1024}, {"residual": False}, "rows")
NORM_RES = Shape("norm 16x512 +res", {"rows": 16, "cols": 512}, {"residual": True}, "rows")
MM = Shape("mm 32x256x512", {"M": 32, "N": 256, "K": 512},
           {"bias": False, "layout": "nk", "residual": False}, "M")  # fmt: skip
MM_POOL = Shape("mm 64x512x1024", {"M": 64, "N": 512, "K": 1024},
                {"bias": False, "layout": "nk", "residual": False}, "M")  # fmt: skip
ROT = Shape("rope 32x(4+2)x64 rot64", {"tokens": 32, "heads_q": 4, "heads_k": 2, "head_dim": 64,
            "rot": 64}, {"is_neox": True}, "tokens")  # fmt: skip
ROT_GPTJ = Shape("rope 7x(2+1)x64 rot32 gptj", {"tokens": 7, "heads_q": 2, "heads_k": 1,
                 "head_dim": 64, "rot": 32}, {"is_neox": False}, "tokens")  # fmt: skip
ACT = Shape("act 64x2x512", {"rows": 64, "d": 512}, {}, "rows")
SOFT = Shape("softmax 64x1000", {"rows": 64, "cols": 1000}, {"scale": 1.0}, "rows")
CASES = {
    "rmsnorm": (RMSNORM, NORM, torch.float32),
    "gemm": (GEMM, MM, torch.bfloat16),
    "rope": (ROPE, ROT, torch.bfloat16),
    "silu_and_mul": (SILU_AND_MUL, ACT, torch.float16),
    "softmax": (SOFTMAX, SOFT, torch.float32),
}

CACHED = "results cached by version counter or sampled elements"
OFF_THREAD = "work on another thread"


@pytest.fixture(autouse=True)
def small_flush(monkeypatch):
    monkeypatch.setattr(runner, "cache_bytes", lambda info: (1 << 20, "test"))


def _bench(file, fn, op_name, shape=None, mode="auto"):
    """Bench the candidate ``file:fn`` against eager torch; cases by variant. The candidate's
    module is stopped afterwards (its threads ended)."""
    op, default, dtype = CASES[op_name]
    fn = load_callable(f"{CANDIDATES / file}:{fn}")
    try:
        subjects = [
            Subject("candidate", fn, "candidate"),
            Subject("torch", op.variants["torch"].fn, "torch"),
        ]
        cfg = BenchConfig(rule=RULE, energy_window_s=0, mode=mode)
        cases = bench_case(
            op, shape or default, dtype, subjects, detect("cpu"), HostTimer(), GENEROUS, cfg
        )
    finally:
        stop = getattr(sys.modules[fn.__module__], "stop", None)
        if stop is not None:
            stop()
    return {c["variant"]: c for c in cases}


def _flags(case, prefix):
    return [f for f in case["flags"] if f.startswith(prefix)]


@pytest.mark.parametrize(
    "file, fn, op, mode",
    [
        ("rmsnorm_version_cache.py", "rmsnorm_candidate", "rmsnorm", "auto"),
        ("gemm_version_cache.py", "gemm_candidate", "gemm", "auto"),
        ("rmsnorm_version_cache.py", "rmsnorm_candidate", "rmsnorm", "hot"),
        # one entry, keyed on the address: in cold mode each sample is at another address, so
        # it never hits (and is timed honestly); hot mode is where it cheats
        ("rmsnorm_sampled_cache.py", "rmsnorm_candidate", "rmsnorm", "hot"),
        ("gemm_sampled_cache.py", "gemm_candidate", "gemm", "auto"),
        ("rope_version_cache.py", "rope_candidate", "rope", "auto"),  # in place, integer positions
        ("silu_sampled_cache.py", "silu_and_mul_candidate", "silu_and_mul", "hot"),
    ],
)
def test_caches_that_survive_fresh_inputs_are_caught_in_the_timed_loop(file, fn, op, mode):
    cases = _bench(file, fn, op, mode=mode)
    cand = cases["candidate"]
    # the fresh-input checks alone do not see them: they recompute on a copy_ of new values
    assert not _flags(cand, "results cached by pointer"), cand["flags"]
    assert not _flags(cand, "results cached by shape"), cand["flags"]
    assert _flags(cand, CACHED), cand["flags"]
    assert not cand["metrics"]["valid"] and "speedup_vs_torch" not in cand["metrics"]
    assert cases["torch"]["metrics"]["valid"], cases["torch"]["flags"]


@pytest.mark.parametrize(
    "file, fn, op",
    [
        ("rmsnorm_import_pool.py", "rmsnorm_candidate", "rmsnorm"),
        ("gemm_first_call_pool.py", "gemm_candidate", "gemm"),
        ("softmax_first_call_pool.py", "softmax_candidate", "softmax"),
    ],
)
def test_work_handed_to_an_existing_thread_is_caught(file, fn, op):
    # the GEMM handed to the pool only on a copy's second visit: on 32x256x512 its thread's
    # CPU over the run sat at 2-4 ms, against the class's 2 ms floor (caught by its stale
    # outputs anyway, its class not always named)
    cases = _bench(file, fn, op, MM_POOL if op == "gemm" else None)
    cand = cases["candidate"]
    assert _flags(cand, OFF_THREAD), cand["flags"]
    assert not cand["metrics"]["valid"] and "speedup_vs_torch" not in cand["metrics"]
    assert cand["metrics"]["cpu"]["other_cpu_s"] > 0


@pytest.mark.parametrize(
    "file, fn, op",
    [
        ("rmsnorm_spinner.py", "rmsnorm_candidate", "rmsnorm"),
        ("gemm_spin_between_calls.py", "gemm_candidate", "gemm"),
        ("silu_spinner.py", "silu_and_mul_candidate", "silu_and_mul"),
    ],
)
def test_load_left_running_between_calls_is_caught(file, fn, op):
    cases = _bench(file, fn, op)
    cand, base = cases["candidate"], cases["torch"]
    assert _flags(cand, "background load"), cand["flags"]
    assert _flags(base, "slowed by background load"), base["flags"]
    assert not cand["metrics"]["valid"] and not base["metrics"]["valid"]


@pytest.mark.parametrize(
    "file, fn, op, shape",
    [
        ("rmsnorm_same.py", "rmsnorm_candidate", "rmsnorm", None),
        ("rmsnorm_chunked.py", "rmsnorm_candidate", "rmsnorm", None),
        ("rmsnorm_chunked.py", "rmsnorm_candidate", "rmsnorm", NORM_RES),
        ("gemm_float32.py", "gemm_candidate", "gemm", None),
        ("softmax_exp2.py", "softmax_candidate", "softmax", None),
        ("rope_complex.py", "rope_candidate", "rope", None),
        ("rope_complex.py", "rope_candidate", "rope", ROT_GPTJ),
    ],
)
def test_honest_candidates_are_never_flagged(file, fn, op, shape):
    cases = _bench(file, fn, op, shape)
    for name, case in cases.items():
        assert case["metrics"]["valid"], (name, case["flags"])
        cpu = case["metrics"]["cpu"]
        assert cpu["timing_thread_cpu_s"] > 0 and cpu["window_s"] > 0


# --- the pieces -------------------------------------------------------------------------------


def test_a_state_is_written_without_moving_the_version_counter():
    op, shape, dtype = CASES["rmsnorm"]
    inputs = op.inputs(shape, dtype, "cpu", seed=0)
    ref = __import__("kernelab.bench.integrity", fromlist=["Reference"]).Reference.build(
        op, inputs, dtype
    )

    class _R:
        subject = Subject("torch", op.variants["torch"].fn, "torch")
        args = inputs

    (rot,) = rotation.build(op, shape, dtype, "cpu", inputs, ref, [_R()], 0, cold=False)
    x0, v0 = inputs["x"].clone(), inputs["x"]._version
    args = rot.advance()  # first state: the inputs as written
    assert args is inputs and torch.equal(inputs["x"], x0)
    rot.advance()  # second state: a partial update at the same address
    changed = int((inputs["x"] != x0).sum())
    assert 0 < changed < 0.1 * x0.numel()
    assert inputs["x"]._version == v0
    rot.reset()
    assert torch.equal(inputs["x"], x0)


def test_torch_workers_exclude_a_thread_busy_while_idle():
    if threads.cpu_times() is None or torch.get_num_threads() < 2:
        pytest.skip("needs /proc and torch with two or more threads")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            time.sleep(0)
            sum(range(2000))

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        workers = threads.torch_workers()
    finally:
        stop.set()
        t.join()
    assert t.native_id not in workers
    assert threading.get_native_id() not in workers
