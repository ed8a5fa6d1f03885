"""The autotuner: search finds the known best, pruning is counted, winners are verified, the
tuned-config cache round-trips and ignores stale entries."""

import dataclasses
from collections import Counter

import orjson
import pytest
import torch

from kernelab import ops
from kernelab.core.runtime import tuned as _tuned
from kernelab.ops.norm.rmsnorm import RMSNORM, RMSNormConfig
from kernelab.tune import exhaustive, export, store_winner, successive_halving, tune


def _synthetic(best):
    """Time in seconds: distance from ``best`` in config space, plus noise that shrinks with
    effort (so a brief look can be misleading but a long one is not)."""
    gen = torch.Generator().manual_seed(0)

    def measure(config, effort):
        d = sum(
            abs(a - b)
            for a, b in zip(
                dataclasses.astuple(config)[:3], dataclasses.astuple(best)[:3], strict=True
            )
        )
        noise = torch.rand((), generator=gen).item() * 0.5 / effort
        return 1.0 + d + noise

    return measure


SPACE = [
    RMSNormConfig(m, n, w) for m in (1, 2, 4, 8) for n in (64, 128, 256, 512) for w in (1, 2, 4, 8)
]


def test_exhaustive_and_successive_halving_find_the_known_best():
    best = RMSNormConfig(4, 256, 2)
    assert exhaustive(SPACE[:16], _synthetic(SPACE[5]))[0].config == SPACE[5]
    ranked = successive_halving(SPACE, _synthetic(best), eta=3)
    assert ranked[0].config == best
    assert max(ranked[0].times) > 1  # the winner was timed at higher effort than the rest
    assert sum(1 for t in ranked if max(t.times) == 1) > len(SPACE) // 2


def test_a_failing_config_is_dropped_not_fatal():
    def measure(config, effort):
        if config.block_m == 1:
            raise RuntimeError("out of resources")
        return float(config.block_n)

    ranked = exhaustive(SPACE[:20], measure)
    assert ranked[0].config.block_m != 1
    assert all(t.error for t in ranked if t.config.block_m == 1)


def _shape():
    return ops.Shape("t", {"rows": 5, "cols": 96}, {"residual": True}, batch_dim="rows")


def test_tune_prunes_statically_and_reports_counts_without_timing_on_cpu():
    def prune(launch, target):
        return "spills" if launch.num_warps >= 2 else None

    (result,) = tune(RMSNORM, [_shape()], torch.float32, "cpu", prune=prune)
    space = RMSNORM.tuning_space(_shape(), torch.float32)
    assert result.space == len(space)
    assert result.pruned["spills"] == sum(1 for c in space if c.num_warps >= 2)
    assert result.winner is None and "not timed" in result.note


def test_tune_verifies_the_winner_and_falls_back_when_it_is_wrong(monkeypatch):
    space = RMSNORM.tuning_space(_shape(), torch.float32)
    bad = space[0]
    real = RMSNORM.variants["kernelab"]

    def sometimes_wrong(config=None, **inputs):  # the fastest config computes garbage
        out = real.fn(**inputs, config=config)
        return out * 2 if config == bad else out

    monkeypatch.setitem(RMSNORM.variants, "kernelab", dataclasses.replace(real, fn=sometimes_wrong))

    def measure(op, shape, dtype, config, effort):
        return 0.1 if config == bad else 1.0 + space.index(config)

    (result,) = tune(RMSNORM, [_shape()], torch.float32, "cpu", measure=measure, use_inspect=False)
    assert result.winner == space[1]
    assert result.verified is True


def test_cache_round_trips_and_ignores_stale_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_tuned, "_table", None)  # another cache dir: read the files anew
    shape, winner = _shape(), RMSNormConfig(2, 128, 1)

    def measure(op, s, dtype, config, effort):
        return 0.5 if config == winner else 1.0

    (result,) = tune(
        RMSNORM,
        [shape],
        torch.float32,
        "cpu",
        measure=measure,
        use_inspect=False,
        store=store_winner(RMSNORM),
    )
    assert result.stored and result.verified
    from kernelab.hardware import detect

    key = detect("cpu").key
    found = _tuned.lookup(
        "rmsnorm", RMSNORM.kernels, {"rows": 7, "cols": 96}, "rows", "float32", key
    )  # 7 rows falls in the same bucket as 5 (8)
    assert RMSNormConfig(**found) == winner
    assert (
        _tuned.lookup("rmsnorm", RMSNORM.kernels, {"rows": 9, "cols": 96}, "rows", "float32", key)
        is None
    )  # another bucket

    # a stale entry (another kernel source, or another Triton) is ignored
    path = tmp_path / "tuned.json"
    data = orjson.loads(path.read_bytes())
    data["entries"][0]["kernel_hash"] = "0" * 16
    path.write_bytes(orjson.dumps(data))
    _tuned.reload()  # written behind the table's back
    assert (
        _tuned.lookup("rmsnorm", RMSNORM.kernels, {"rows": 5, "cols": 96}, "rows", "float32", key)
        is None
    )
    data["entries"][0]["kernel_hash"] = _tuned.kernel_hash(RMSNORM.kernels)
    data["entries"][0]["triton"] = "0.0.0"
    path.write_bytes(orjson.dumps(data))
    _tuned.reload()  # written behind the table's back
    assert (
        _tuned.lookup("rmsnorm", RMSNORM.kernels, {"rows": 5, "cols": 96}, "rows", "float32", key)
        is None
    )


def test_export_writes_a_shippable_file_and_a_broken_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(tmp_path))
    entry = {
        "device": "H200|132|140GB",
        "op": "rmsnorm",
        "kernel_hash": "x",
        "triton": "3.6",
        "dtype": "bfloat16",
        "bucket": "cols=4096,rows=1",
        "config": {"block_m": 1},
    }
    _tuned.write_file(tmp_path / "tuned.json", [entry, {**entry, "device": "other"}])
    assert export(tmp_path / "ship.json", "H200|132|140GB") == 1
    assert _tuned.read_file(tmp_path / "ship.json") == [entry]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON"):
        _tuned.read_file(tmp_path / "bad.json")
    (tmp_path / "foreign.json").write_text('{"entries": []}')
    with pytest.raises(ValueError, match="not a kernelab tuned-config file"):
        _tuned.read_file(tmp_path / "foreign.json")


def test_bucket_rounds_only_the_batch_size():
    assert _tuned.bucket({"rows": 33, "cols": 4096}, "rows") == "cols=4096,rows=64"
    assert _tuned.bucket({"M": 1, "N": 4096, "K": 4096}, "M") == "K=4096,M=1,N=4096"


def test_cli_tune_on_cpu_reports_pruning_without_timing():
    from click.testing import CliRunner

    from kernelab.cli import app

    result = CliRunner().invoke(
        app, ["tune", "rmsnorm", "--limit", "1", "--json", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["results"][0]["space"] > 0 and "not timed" in data["results"][0]["note"]
    bad = CliRunner().invoke(app, ["tune", "rmsnorm", "--dtype", "int8"])
    assert bad.exit_code == 2 and "dtype:" in bad.output


def test_prune_reasons_are_counted_by_kind():
    from kernelab.tune.tuner import _category

    assert _category("spills 44 bytes per thread") == "spills bytes per thread"
    assert _category("cannot reach one block per SM (none (cannot launch): shared)") == (
        "cannot reach one block per SM"
    )
    assert _category("does not compile: out of resources") == "does not compile"


def _planted_reports(plant):
    """Stand-in for inspect's batch analysis: each job's report from ``plant(config)``."""
    from kernelab.inspect.findings import Finding
    from kernelab.inspect.report import KernelReport

    def analyze_jobs(jobs, progress=None, counterfactuals=True, **_):
        assert counterfactuals is False  # the ranking needs no aligned recompilation
        reps = []
        for job in jobs:
            warps = job.spec.num_warps
            facts, occ, kinds = plant(warps)
            reps.append(
                KernelReport(
                    key=job.key,
                    op=job.op,
                    kernel=job.spec.name,
                    target=job.target.name,
                    label=job.spec.label,
                    config="",
                    facts=facts,
                    occupancy=None if occ is None else {"occupancy": occ, "blocks_per_sm": 1},
                    findings=[Finding(k, "warn", k) for k in kinds],
                    cached=warps == 1,
                )
            )
        if progress:
            progress(len(jobs), len(jobs))
        return reps

    return analyze_jobs


def _facts(regs=32, spills=0, bits=128, shared=0):
    return {
        "registers": regs,
        "spill_bytes": spills,
        "loads": {str(bits): 1},
        "stores": {str(bits): 1},
        "shared_bytes": shared,
    }


def test_static_ranking_prunes_by_reason_and_prefers_occupancy_then_width(monkeypatch):
    import kernelab.inspect as _inspect

    def plant(warps):
        if warps == 8:  # planted: spills
            return _facts(spills=44), 0.5, ["spills"]
        if warps == 4:  # planted: too much shared memory
            return _facts(shared=1 << 20), 0.5, ["shared-limit"]
        if warps == 2:  # narrow accesses, best occupancy
            return _facts(bits=32), 1.0, []
        return _facts(regs=40), 1.0 if warps == 1 else 0.25, []

    monkeypatch.setattr(_inspect, "analyze_jobs", _planted_reports(plant))
    shape = ops.Shape("t", {"rows": 5, "cols": 96}, {"residual": False}, batch_dim="rows")
    space = RMSNORM.tuning_space(shape, torch.float32)
    analysis = []
    (result,) = tune(RMSNORM, [shape], torch.float32, "cpu", analysis=analysis)
    by_warps = Counter(c.num_warps for c in space)
    assert result.pruned["spills bytes per thread"] == by_warps[8]
    assert result.pruned["needs bytes of shared memory"] == by_warps[4]
    assert {r.config.num_warps for r in result.ranked} <= {1, 2, 16, 32}
    keys = [r.key() for r in result.ranked]
    assert keys == sorted(keys)  # preferred first
    first = result.ranked[0]
    # full occupancy and 128-bit beats full occupancy at 32-bit; low occupancy comes last
    assert first.occupancy == 1.0 and first.widest_bits == 128 and first.config.num_warps == 1
    assert [r.config.num_warps for r in result.ranked[-by_warps[16] :]] == [16] * by_warps[16]
    assert result.ranked[by_warps[1]].widest_bits == 32  # then the narrow one at full occupancy
    assert result.winner is None and "not timed" in result.note
    assert result.as_dict()["ranked"][0]["widest_bits"] == 128
    (a,) = analysis
    assert a.compiled + a.cached == len(space) and a.compiled == len(space) - by_warps[1]


def test_cli_tune_on_cpu_names_the_preferred_configs_and_the_gpu_command(monkeypatch):
    from click.testing import CliRunner

    import kernelab.inspect as _inspect
    from kernelab.cli import app

    def plant(warps):
        return (_facts(spills=8), 0.5, ["spills"]) if warps > 2 else (_facts(), 1.0, [])

    monkeypatch.setattr(_inspect, "analyze_jobs", _planted_reports(plant))
    args = ["tune", "rmsnorm", "--limit", "1", "--device", "cpu", "--dtype", "fp32"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    (r,) = data["results"]
    assert r["ranked"] and all(x["config"]["num_warps"] <= 2 for x in r["ranked"])
    assert r["pruned"]["spills bytes per thread"] == r["space"] - len(r["ranked"])
    assert (
        data["gpu_command"]
        == "kernelab tune rmsnorm --shapes representative --dtype float32 --limit 1"
    )
    text = CliRunner(env={"COLUMNS": "80"}).invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "inspect prefers 1)" in text.stdout and data["gpu_command"] in text.stdout
    assert "spills bytes per thread" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 80


def test_a_space_of_plain_values_tunes_ranks_and_reports(monkeypatch):
    """moe_topk's configs are one number (tokens per program): ranked, timed and reported as
    JSON values; a winner is not written to a tuned file (the op reads none)."""
    from kernelab.inspect import report as _report

    op = ops.get("moe_topk")
    shape = op.shapes("representative")[0]
    dtype = op.dtypes[0]
    values = op.tuning_space(shape, dtype)
    assert values and all(type(v) is int for v in values)
    monkeypatch.setattr(_report, "analyze_jobs", _planted_reports(lambda w: (_facts(), 1.0, [])))
    (ranked,) = tune(op, [shape], dtype, "cpu")
    d = orjson.loads(orjson.dumps(ranked.as_dict()))
    assert sorted(r["config"] for r in d["ranked"]) == sorted(values)
    stored = []
    (timed,) = tune(
        op, [shape], dtype, "cpu", measure=lambda o, s, t, c, e: float(c), use_inspect=False,
        verify=False, store=lambda result, key: stored.append(result),
    )  # fmt: skip
    assert timed.as_dict()["winner"] == min(values) and not stored and not timed.stored
    assert "not stored" in timed.note


def test_inspect_compiles_in_one_process_inside_a_daemonic_worker(monkeypatch):
    """A sweep's workers are daemonic, and a daemonic process may not start a pool: there the
    compilations run one at a time instead of failing."""
    import multiprocessing

    from kernelab.inspect import runner

    class Spec:
        def __init__(self, i):
            self.i = i

        def source_key(self):
            return f"s{self.i}"

        def identity(self):
            return f"i{self.i}"

        def compiler_version(self):
            return "v"

    class Target:
        name = "sm_90"

    monkeypatch.setattr(runner, "compile_one", lambda spec, target: {"i": spec.i})
    monkeypatch.setattr(runner, "_write", lambda key, data: None)
    pairs = [(Spec(i), Target()) for i in range(3)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def work():
        try:
            queue.put([r["i"] for r in runner.run(pairs, jobs=2, use_cache=False)])
        except BaseException as exc:  # reported to the test, not lost in the child
            queue.put(repr(exc))

    child = ctx.Process(target=work, daemon=True)
    child.start()
    got = queue.get(timeout=60)
    child.join(60)
    assert got == [0, 1, 2]
