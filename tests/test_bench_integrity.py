"""Planted cheats on the CPU: each must be flagged and none reported as fast."""

import threading
import time

import pytest
import torch

from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject, rotation
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, Shape
from kernelab.ops.norm.rmsnorm import rmsnorm_torch

RULE = StopRule(rel_ci=0.5, min_samples=5, min_time=0.0, max_time=0.3, max_samples=40)
SMALL = Shape("small 64x1024", {"rows": 64, "cols": 1024}, {"residual": False}, "rows")
# 8 MiB in + 8 MiB out: the floor at 250 GB/s is ~67 µs.
LARGE = Shape("large 512x4096", {"rows": 512, "cols": 4096}, {"residual": False}, "rows")
# 250 GB/s: many times what this kind of 2-core host copies, yet within reach of a cheat.
GENEROUS = Ceilings("test", 250e9, "test: 250 GB/s", {}, {})


def run(shape, *subjects, mode="hot", ceilings=GENEROUS, variants=("torch",)):
    subs = [*subjects] + [
        Subject(v, RMSNORM.variants[v].fn, "torch") for v in variants if v in RMSNORM.variants
    ]
    cases = bench_case(
        RMSNORM,
        shape,
        torch.float32,
        subs,
        detect("cpu"),
        HostTimer(),
        ceilings,
        BenchConfig(mode=mode, rule=RULE, energy_window_s=0),
    )
    return {c["variant"]: c for c in cases}


def flagged(case, prefix):
    return [f for f in case["flags"] if f.startswith(prefix)]


def test_honest_variant_is_valid_and_reported():
    case = run(SMALL)["torch"]
    m = case["metrics"]
    assert m["valid"], case["flags"]
    assert m["n"] >= 3 and len(case["samples"]) == m["n"]  # 3: the rule timed out
    assert m["q1_s"] <= m["median_s"] <= m["q3_s"] and m["min_s"] <= m["q1_s"]
    assert m["gbps"] > 0 and m["floor_s"] > 0 and m["bound"] == "memory"
    assert m["ceiling_source"].startswith("memory: test")
    assert case["mode"] == "hot" and case["timer"] == "host" and case["threads"] >= 1


def test_thread_left_running_after_return_is_flagged():
    def early_return(x, weight, eps=1e-6, residual=None, out=None):
        out = torch.empty_like(x)

        def work():
            time.sleep(0.03)
            out.copy_(rmsnorm_torch(x, weight, eps))

        threading.Thread(target=work, daemon=True).start()
        return out

    case = run(SMALL, Subject("early", early_return, "candidate"), mode="cold")["early"]
    assert not case["metrics"]["valid"]
    assert flagged(case, "work left running after return")
    assert flagged(case, "threads left running after return")
    # The host-clock cross-check is exercised alone below: in this loop the early returns'
    # threads sleep in parallel, so how far the two clocks part depends on the host's load.
    assert "speedup_vs_torch" not in case["metrics"]


def test_host_clock_disagrees_with_the_timer_when_work_is_left_on_a_thread():
    from kernelab.bench import integrity

    timer = HostTimer()

    def hidden():  # returns at once; the work finishes 50 ms later on another thread
        threading.Thread(target=time.sleep, args=(0.05,)).start()

    def honest():
        time.sleep(0.001)

    calls = 3
    timed = timer.samples(hidden, 1, calls)[0][0]
    host, left = integrity.host_clock(hidden, timer, calls)
    assert host >= 0.05 / calls and left >= 1
    assert integrity.host_disagrees(host, timed, 0.0)
    # Noise only adds time: the fastest of a few tries, as the runner takes them.
    timed = min(timer.samples(honest, 1, calls)[0][0] for _ in range(5))
    host = min(integrity.host_clock(honest, timer, calls)[0] for _ in range(5))
    assert not integrity.host_disagrees(host, timed, 0.0)


def test_results_cached_by_pointer_are_flagged():
    cache = {}

    def by_pointer(x, weight, eps=1e-6, residual=None, out=None):
        key = (x.data_ptr(), weight.data_ptr())
        if key not in cache:
            cache[key] = rmsnorm_torch(x, weight, eps)
        return cache[key]

    cases = run(SMALL, Subject("cache", by_pointer, "candidate"))
    case = cases["cache"]
    assert not flagged(case, "wrong output")  # the timed outputs themselves are right
    assert flagged(case, "results cached by pointer")
    assert not case["metrics"]["valid"] and "speedup_vs_torch" not in case["metrics"]
    assert cases["torch"]["metrics"]["valid"], cases["torch"]["flags"]


def test_result_cached_once_for_all_calls_is_flagged():
    first = []

    def once(x, weight, eps=1e-6, residual=None, out=None):
        if not first:
            first.append(rmsnorm_torch(x, weight, eps))
        return first[0]

    case = run(SMALL, Subject("once", once, "candidate"), variants=())["once"]
    assert flagged(case, "results cached by shape or call count")
    assert not case["metrics"]["valid"]


def test_skipping_work_is_below_the_floor_and_invalid():
    def skip(x, weight, eps=1e-6, residual=None, out=None):
        return x

    case = run(LARGE, Subject("skip", skip, "candidate"), mode="cold", variants=())["skip"]
    assert flagged(case, "below-floor: invalid")
    assert flagged(case, "wrong output of timed calls")
    assert not case["metrics"]["valid"]


def test_honest_variant_is_not_below_a_generous_floor():
    case = run(LARGE, mode="cold")["torch"]
    assert not flagged(case, "below-floor")
    assert case["metrics"]["pct_roofline"] < 100


def test_hot_data_in_cache_is_not_held_to_the_memory_floor():
    def skip(x, weight, eps=1e-6, residual=None, out=None):
        return x

    case = run(LARGE, Subject("skip", skip, "candidate"), variants=())["skip"]
    assert case["mode"] == "hot" and not flagged(case, "below-floor")
    assert flagged(case, "wrong output of timed calls")  # still caught, by its outputs


@pytest.mark.parametrize("mode", ["cold", "auto"])
def test_memory_bound_defaults_to_cold_with_rotating_copies(mode):
    case = run(SMALL, mode=mode)["torch"]
    assert case["mode"] == "cold" and case["cold_cache"].startswith("rotate")
    assert case["metrics"]["calls_per_sample"] == 1
    assert case["metrics"]["rotation"]["copies"] >= 2


def test_cold_mode_flushes_where_copies_cannot_do(monkeypatch):
    monkeypatch.setattr(rotation, "copies_for_cold", lambda *a: None)  # too many, or no memory
    case = run(SMALL, mode="cold")["torch"]
    assert case["cold_cache"].startswith("flush") and case["metrics"]["valid"]
    assert case["metrics"]["rotation"]["copies"] == case["metrics"]["rotation"]["input_sets"]


def test_in_place_residual_is_restored_and_checked():
    shape = Shape("res 16x512", {"rows": 16, "cols": 512}, {"residual": True}, "rows")
    case = run(shape, mode="cold")["torch"]
    assert case["metrics"]["valid"], case["flags"]

    def forgets_residual(x, weight, eps=1e-6, residual=None, out=None):
        return rmsnorm_torch(x + residual, weight, eps)  # never writes the residual

    bad = run(shape, Subject("nores", forgets_residual, "candidate"), mode="cold", variants=())
    assert flagged(bad["nores"], "wrong output of timed calls: residual")


class _LazyNorm(torch.Tensor):
    """A tensor subclass that computes RMSNorm only when something first reads it."""

    @staticmethod
    def __new__(cls, x, weight, eps):
        t = torch.Tensor._make_subclass(cls, torch.empty_like(x))
        t._pending = (x.clone(), weight.clone(), eps)
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            for a in args:
                if isinstance(a, _LazyNorm) and getattr(a, "_pending", None):
                    x, weight, eps = a._pending
                    a._pending = None
                    a.copy_(rmsnorm_torch(x, weight, eps))
            return func(*args, **(kwargs or {}))


class _Deferred:
    """Not a tensor at all: a tensor-like object that computes when torch touches it."""

    def __init__(self, x, weight, eps):
        self.args = (x, weight, eps)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = [rmsnorm_torch(*a.args) if isinstance(a, _Deferred) else a for a in args]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda x, w, eps: _LazyNorm(x, w, eps), "_LazyNorm"),
        (lambda x, w, eps: _Deferred(x, w, eps), "_Deferred"),
        (lambda x, w, eps: rmsnorm_torch(x, w, eps).to("meta"), "meta"),
    ],
)
def test_lazy_or_wrapped_timed_outputs_are_invalid(make, what):
    def lazy(x, weight, eps=1e-6, residual=None, out=None):
        return make(x, weight, eps)

    cases = run(SMALL, Subject("lazy", lazy, "candidate"))
    case = cases["lazy"]
    assert any(what in f for f in flagged(case, "wrong output of timed calls")), case["flags"]
    assert not case["metrics"]["valid"] and "speedup_vs_torch" not in case["metrics"]
    assert cases["torch"]["metrics"]["valid"], cases["torch"]["flags"]


# --- in-place regions: a cache write is checked slot by slot, not by L2 over the cache ---------


def _kv_cases(*subjects):
    from kernelab.ops import KV_CACHE_WRITE

    shape = next(s for s in KV_CACHE_WRITE.shapes("edge") if s.label.startswith("padding"))
    cases = bench_case(
        KV_CACHE_WRITE, shape, KV_CACHE_WRITE.dtypes[0], list(subjects), detect("cpu"),
        HostTimer(), GENEROUS, BenchConfig(mode="hot", rule=RULE, energy_window_s=0),
    )  # fmt: skip
    return {c["variant"]: c for c in cases}


def _kv_planted(edit):
    from kernelab.ops.attention.kv_cache_write import kv_cache_write_torch

    def write(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True):
        kv_cache_write_torch(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check)
        edit(k, k_cache, slot_mapping)
        return k_cache, v_cache

    return write


def _one_slot_off(k, k_cache, slots):
    """The first real token also lands one slot further on (a block-edge off-by-one)."""
    t = int((slots >= 0).nonzero()[0])
    s = int(slots[t]) + 1
    k_cache.view(-1, *k_cache.shape[2:])[s % (k_cache.shape[0] * k_cache.shape[1])] = k[t]


def _padding_written(k, k_cache, slots):
    """A padding token (slot -1) written to the cache's last slot, as Python indexing does."""
    t = int((slots < 0).nonzero()[0])
    k_cache.view(-1, *k_cache.shape[2:])[-1] = k[t]


@pytest.mark.parametrize("edit", [_one_slot_off, _padding_written], ids=lambda f: f.__name__)
def test_a_cache_write_outside_its_slots_is_a_wrong_output(edit):
    from kernelab.ops.attention.kv_cache_write import kv_cache_write_torch

    cases = _kv_cases(
        Subject("planted", _kv_planted(edit), "candidate"),
        Subject("torch", kv_cache_write_torch, "torch"),
    )
    assert cases["torch"]["metrics"]["valid"], cases["torch"]["flags"]
    wrong = flagged(cases["planted"], "wrong output")
    assert wrong and "changed outside the region it may write" in wrong[0], cases["planted"]
    assert not cases["planted"]["metrics"]["valid"]
