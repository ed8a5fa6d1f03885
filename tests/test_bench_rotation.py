"""Cold samples on the CPU: rotating copies of the arguments instead of a flush, and the
record of which samples each round took (what compare judges run-to-run spread from)."""

import pytest
import torch

from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject
from kernelab.bench import cache as cache_mod
from kernelab.bench import runner as runner_mod
from kernelab.bench.cache import Rotation, rotation_copies
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, SILU_AND_MUL, Shape
from kernelab.ops.norm.rmsnorm import rmsnorm_torch

RULE = StopRule(rel_ci=0.5, min_samples=5, min_time=0.0, max_time=0.3, max_samples=60)
GENEROUS = Ceilings("test", 250e9, "test: 250 GB/s", {}, {})
PLAIN = Shape("r 4x512", {"rows": 4, "cols": 512}, {"residual": False}, "rows")
FUSED = Shape("res 4x512", {"rows": 4, "cols": 512}, {"residual": True}, "rows")
CACHE = 1 << 20  # a 1 MiB "last-level cache": a few hundred copies, not thousands


@pytest.fixture
def small_cache(monkeypatch):
    monkeypatch.setattr(runner_mod, "cache_bytes", lambda info: (CACHE, "test"))


def run(op, shape, *subjects, timer=None, mode="cold"):
    cases = bench_case(
        op,
        shape,
        torch.float32,
        list(subjects),
        detect("cpu"),
        timer or HostTimer(),
        GENEROUS,
        BenchConfig(mode=mode, rule=RULE, energy_window_s=0),
    )
    return {c["variant"]: c for c in cases}


def test_rotation_keeps_values_and_layout_at_new_addresses():
    base = torch.randn(8, 64)
    args = {"x": base[:, ::2], "w": torch.randn(32), "eps": 1e-6, "residual": torch.randn(8, 32)}
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    rot = Rotation(args, 4, pristine, ["residual"])
    assert rot.current is args
    ptrs = {s["x"].data_ptr() for s in rot.sets}
    assert len(ptrs) == 4 and len({s["w"].data_ptr() for s in rot.sets}) == 4
    for s in rot.sets:
        assert s["x"].stride() == args["x"].stride() and torch.equal(s["x"], args["x"])
        assert s["eps"] == 1e-6
    rot.current["residual"].add_(1.0)  # a call updates the set in use in place
    nxt = rot.advance()
    assert nxt is rot.sets[1] and torch.equal(rot.sets[0]["residual"], pristine["residual"])
    for _ in range(3):
        rot.advance()
    assert rot.current is rot.sets[0]
    with pytest.raises(ValueError, match="copies"):
        Rotation(args, 1, pristine, [])


def test_rotation_copies_hold_twice_the_cache_between_the_subjects():
    assert rotation_copies(16 << 10, 480 << 20, 2) == 30720
    assert rotation_copies(16 << 10, 480 << 20, 1) == 61440
    assert rotation_copies(1 << 30, 480 << 20, 2) == 2  # never fewer than two
    assert rotation_copies(0, 480 << 20, 2) == 2


def test_cold_cpu_samples_call_a_new_copy_each_time(small_cache):
    """A candidate that notes the address of its input: the timed calls of a cold case must
    see the copies in turn (a rotation not wired into the timed loop sees one address)."""
    seen = []

    def noting(x, weight, eps=1e-6, residual=None, out=None):
        seen.append(x.data_ptr())
        return rmsnorm_torch(x, weight, eps)

    cases = run(RMSNORM, PLAIN, Subject("noting", noting, "candidate"))
    case = cases["noting"]
    copies = rotation_copies(4 * 512 * 4 + 512 * 4, CACHE, 1)
    assert case["cold_cache"].startswith("rotating input copies")
    assert case["metrics"]["valid"], case["flags"]
    assert len(set(seen)) >= min(copies, case["metrics"]["n"]) > 10
    hot = run(RMSNORM, PLAIN, Subject("noting", noting, "candidate"), mode="hot")
    assert hot["noting"]["cold_cache"] == "none (hot)"


def test_in_place_arguments_are_restored_in_every_copy(monkeypatch):
    """The fused norm updates its residual in place: each copy must be restored before it
    comes round again, or the timed outputs are wrong. Planted: an advance that forgets.
    A 64 KiB cache: 8 copies, each used several times in the timed loop."""
    monkeypatch.setattr(runner_mod, "cache_bytes", lambda info: (64 << 10, "test"))
    torch_subject = Subject("torch", RMSNORM.variants["torch"].fn, "torch")
    ok = run(RMSNORM, FUSED, torch_subject)["torch"]
    assert ok["metrics"]["valid"], ok["flags"]

    def forgetful(self):
        self.index = (self.index + 1) % len(self.sets)
        return self.sets[self.index]

    monkeypatch.setattr(cache_mod.Rotation, "advance", forgetful)
    bad = run(RMSNORM, FUSED, torch_subject)["torch"]
    assert any(f.startswith("wrong output of timed calls") for f in bad["flags"]), bad["flags"]


def test_every_sample_belongs_to_one_round_of_interleaved_batches(small_cache):
    subjects = [Subject(v, SILU_AND_MUL.variants[v].fn, "torch") for v in ("torch",)]

    def other(x):
        return SILU_AND_MUL.variants["torch"].fn(x.clone())

    subjects.append(Subject("other", other, "candidate"))
    shape = SILU_AND_MUL.shapes("representative")[0].reduced(4)
    cases = run(SILU_AND_MUL, shape, *subjects)
    rounds = {}
    for name, case in cases.items():
        batches = case["metrics"]["batches"]
        starts = [s for _, s in batches]
        assert starts[0] == 0 and starts == sorted(starts) and starts[-1] < case["metrics"]["n"]
        assert len({r for r, _ in batches}) == len(batches)  # one batch a round
        rounds[name] = [r for r, _ in batches]
    # both subjects took a batch in the same rounds while both were sampling
    shared = set(rounds["torch"]) & set(rounds["other"])
    assert len(shared) >= min(len(rounds["torch"]), len(rounds["other"])) - 1


class _DeviceLikeTimer(HostTimer):
    """A timer that is not the host clock: bench must flush, as on a GPU."""

    kind = "device-events"


def test_a_device_timer_still_flushes_twice_the_cache(small_cache):
    case = run(RMSNORM, PLAIN, Subject("torch", RMSNORM.variants["torch"].fn, "torch"),
               timer=_DeviceLikeTimer())["torch"]  # fmt: skip
    assert case["cold_cache"] == f"flush {2 * CACHE / 2**20:.0f} MiB between samples"
