"""Crossover studies: where the winner changes, named only between confirmed verdicts."""

import math

import pytest
import torch

from kernelab import ops
from kernelab.bench import crossover as cx
from kernelab.bench.roofline import Ceilings
from kernelab.bench.runner import BenchConfig
from kernelab.bench.stats import StopRule
from kernelab.core import Contract, Cost, Op, Shape, Variant
from kernelab.hardware import detect, lookup


class VirtualClock:
    """Time that the variants below spend by construction; the timer reads it."""

    def __init__(self):
        self.now = 0.0


class ClockTimer:
    """The bench timer interface over a :class:`VirtualClock`. Samples alternate between
    (1 + s) and 1 / (1 + s) times the cost, ``s = spread(n)``: a spread per size, so that one
    point can be made as noisy as wanted, whatever the number of samples taken."""

    kind = "synthetic"
    threads = 1

    def __init__(self, clock, spread):
        self.clock, self.noise = clock, spread
        self.count = 0

    def sync(self):
        return None

    def samples(self, fn, n, calls=1, before=None, after=None):
        out, result = [], None
        for _ in range(n):
            if before is not None:
                before()
            t0 = self.clock.now
            for _ in range(calls):
                result = fn()
            spent = (self.clock.now - t0) / calls
            self.count += 1
            f = 1 + self.noise(self.size)
            out.append(spent * (f if self.count % 2 else 1 / f))
            if after is not None:
                after(result)
        return out, result

    def dispatch(self, fn, calls):
        return 0.0

    def graph(self, fn, calls):
        return None


def _op(clock, timer):
    """out = 2x; "flat" costs 5 ms whatever n, "linear" 0.1 ms per element (far above
    the real time of a call, which the host-clock check compares with): they cross at 50."""

    def make_inputs(shape, dtype, device, gen, dist):
        timer.size = shape.dims["n"]
        return {"x": torch.randn(shape.dims["n"], dtype=dtype, generator=gen)}

    def spend(seconds):
        def fn(x):
            clock.now += seconds(x.numel())
            return x * 2

        return fn

    op = Op(
        "synthetic_scale",
        description="2x, with two variants of known cost",
        reference=lambda x: x * 2,
        make_inputs=make_inputs,
        shapes={"representative": lambda: [Shape("n", {"n": 8})], "edge": lambda: []},
        cost=lambda i: Cost(flops=i["x"].numel(), bytes=16 * i["x"].numel()),
        contract=Contract(),
        dtypes=(torch.float32,),
    )
    op.add_variant(Variant("flat", spend(lambda n: 5e-3), "torch"))
    op.add_variant(Variant("linear", spend(lambda n: 1e-4 * n), "torch"))
    return op


def _study(noise, values=(10, 20, 40, 60, 80, 160)):
    clock = VirtualClock()
    timer = ClockTimer(clock, noise)
    timer.size = 0
    op = _op(clock, timer)
    # a noisy point stops at max_samples, never at max_time (real seconds, which a loaded host
    # reaches after fewer samples): the count of samples taken, on which the next point's noise
    # depends (it alternates), is then fixed
    rule = StopRule(0.01, 10, 0.0, 120.0, max_samples=3000)
    cfg = BenchConfig(mode="hot", rule=rule, energy_window_s=0)
    study, cases, _ = cx.measure(
        op, ("flat", "linear"), "n", values, detect("cpu"), cfg, Ceilings("synthetic"),
        timer=timer,
    )  # fmt: skip
    return study, cases


UNCONFIRMED = ("ambiguous", "unreliable")


def test_measured_crossover_where_the_costs_cross():
    study, cases = _study(lambda n: 0.01)
    verdicts = [p["verdict"] for p in study.points]
    assert verdicts == ["faster"] * 3 + ["slower"] * 3, study.points
    assert study.crossovers == [
        {"low": 40, "high": 60, "from": "faster", "to": "slower", "at": None}
    ]
    assert study.points[0]["speedup"] == pytest.approx(5.0, rel=0.02)  # 5 ms / 1 ms
    assert all(c["metrics"]["valid"] for c in cases)
    assert "between" in study.summary()


def test_unconfirmed_points_stay_inside_the_bracket():
    # 40 and 60 sit 20% either side of the crossover, and their times spread 4x: neither is
    # confirmed (compare calls such a point ambiguous, or unreliable when the run's own
    # stopping rule did not converge)
    study, _ = _study(lambda n: 3.0 if n in (40, 60) else 0.01)
    by = {p["value"]: p["verdict"] for p in study.points}
    assert by[40] in UNCONFIRMED and by[60] in UNCONFIRMED, study.points
    assert study.crossovers[0]["low"] == 20 and study.crossovers[0]["high"] == 80


def test_no_crossover_named_when_nothing_is_confirmed():
    study, _ = _study(lambda n: 9.0, values=(10, 160))
    assert all(p["verdict"] in UNCONFIRMED for p in study.points), study.points
    assert study.crossovers == []
    assert "no crossover named" in study.summary()


def test_floors_w4a16_against_gemm_on_h200():
    """From floors: int4 weights move 4x fewer bytes, so w4a16 wins while the bf16 GEMM is
    memory-bound; the tie begins where the bf16 GEMM's memory and compute times meet."""
    spec = lookup("h200")
    gemm, w4 = ops.get("gemm"), ops.get("w4a16_gemm")
    values = [2**k for k in range(13)]
    study = cx.floors(spec, gemm, w4, "M", values, torch.bfloat16, labels=["gate_up"])
    assert study.points[0]["speedup"] > 3.5
    (c,) = study.crossovers
    assert (c["from"], c["to"]) == ("faster", "tie")
    m = c["at"]
    # consistent with the byte and FLOP counts: at m the bf16 GEMM's memory time is within
    # the tie of its compute time, at m - 1 it is not
    base = cx.base_shape(gemm, "M", labels=["gate_up"])
    for v, inside in ((m, True), (m - 1, False)):
        cost = gemm.cost(gemm.inputs(cx.at(base, "M", v), torch.bfloat16, "meta"))
        t_mem = cost.bytes / spec.hbm_bytes_per_s
        t_flop = cost.flops / spec.peak_for("bf16")
        assert (t_flop / t_mem >= 1 - cx.TIE) == inside  # the floors' ratio, tie or not
    # In closed form: bf16 moves 2(MK + NK + MN) bytes for 2MNK FLOPs, so its floors' ratio
    # reaches 1 - tie where 1/M = 1/((1 - tie) ridge) - 1/N - 1/K (ridge 206 FLOP/B).
    ridge = spec.ridge_point("bf16")
    n, k = base.dims["N"], base.dims["K"]
    assert m == math.ceil(1 / (1 / ((1 - cx.TIE) * ridge) - 1 / n - 1 / k))
    assert f"up to M = {m - 1}" in study.summary()


def test_planted_cost_model_moves_the_floor_crossover(monkeypatch):
    spec = lookup("h200")
    gemm, w4 = ops.get("gemm"), ops.get("w4a16_gemm")
    real = w4.cost
    honest = cx.floors(spec, gemm, w4, "M", [1, 4096], torch.bfloat16, labels=["gate_up"])
    monkeypatch.setattr(w4, "cost", lambda i: Cost(real(i).flops, 4 * real(i).bytes))
    planted = cx.floors(spec, gemm, w4, "M", [1, 4096], torch.bfloat16, labels=["gate_up"])
    assert planted.crossovers[0]["at"] != honest.crossovers[0]["at"]


@pytest.mark.parametrize(
    "text, words",
    [("M", "DIM=v1"), ("M=", "DIM=v1"), ("M=4", "at least two"), ("M=8,4", "increasing"),
     ("M=a,b", "positive integers"), ("M=0..8", "positive integers")],
)  # fmt: skip
def test_parse_sweep_errors(text, words):
    with pytest.raises(ValueError, match=words):
        cx.parse_sweep(text)


def test_parse_sweep_and_bad_dims():
    assert cx.parse_sweep("M=1..16") == ("M", [1, 2, 4, 8, 16])
    assert cx.parse_sweep("M=3, 5,9") == ("M", [3, 5, 9])
    with pytest.raises(ValueError, match="no representative shape with a size 'Q'"):
        cx.base_shape(ops.get("gemm"), "Q")


# --- the command line and the report -------------------------------------------------------


def test_cli_floors_sweep_table_json_and_html(tmp_path):
    import orjson
    from click.testing import CliRunner

    from kernelab.cli import app

    runner = CliRunner()
    args = ["bench", "gemm", "w4a16_gemm", "--sweep", "M=1..4096", "--floors-for", "h200",
            "--shape", "gate_up"]  # fmt: skip
    res = runner.invoke(app, [*args, "--html", str(tmp_path / "x.html")], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "w4a16_gemm is faster than gemm up to M = 213, as fast as it from 214" in res.output
    page = (tmp_path / "x.html").read_text()
    assert 'class="chart crossover"' in page and 'stroke-dasharray="6 3"' in page
    assert "<script" not in page
    data = orjson.loads(runner.invoke(app, [*args, "--json"]).output)
    assert data["crossovers"][0]["at"] == 214 and data["how"] == "floors"


@pytest.mark.parametrize(
    "args, words",
    [
        (["gemm", "--sweep", "M=1,2", "--floors-for", "h200"], "variants of one op share"),
        (["gemm", "w4a16_gemm", "--sweep", "M=1,2", "--floors-for", "h300"], "hardware table"),
        (["gemm", "w4a16_gemm", "--sweep", "Q=1,2", "--floors-for", "h200"], "no representative"),
        (["gemm", "--sweep", "M=1,2", "--variants", "torch"], "two variants"),
        (["gemm", "--sweep", "M=1,2", "--variants", "torch,nosuch"], "nosuch"),
        (["gemm", "--sweep", "M=1,2", "--variants", "torch,kernelab"], "cannot be timed on cpu"),
        (["gemm", "--sweep", "Q=1,2", "--variants", "torch,compile"], "no representative"),
        (["gemm", "--html", "x.html"], "--sweep"),
    ],
)
def test_cli_sweep_errors(args, words):
    from click.testing import CliRunner

    from kernelab.cli import app

    res = CliRunner().invoke(app, ["bench", *args, "--no-ledger", "--device", "cpu"])
    assert res.exit_code == 2, res.output
    assert words in res.output


def test_report_draws_a_stored_sweep_and_escapes_it():
    from kernelab.report import html

    study, _ = _study(lambda n: 0.01, values=(10, 160))
    data = study.as_dict()
    data["b"] = "<img src=x onerror=alert(1)>"
    page = html.render_study(data)
    assert "<img src=x" not in page and "&lt;img src=x" in page
    assert html._sweep_of({"provenance": {"bench": {"config": {"sweep": "junk"}}}}) is None


def test_a_stored_sweep_is_drawn_by_the_report(tmp_path):
    from kernelab import ledger
    from kernelab.bench.runner import BenchResult
    from kernelab.cli._common import record_bench
    from kernelab.report import html

    study, cases = _study(lambda n: 0.01, values=(10, 40, 60))
    info = detect("cpu")
    config = {"shape_set": "representative", "sweep": study.as_dict()}
    db = ledger.open(url=str(tmp_path / "l.sqlite"))
    run_id, _, failure = record_bench(
        db, info, BenchResult(info.as_dict(), {}, config, cases), None
    )
    assert failure is None
    page = html.write(db, [run_id], tmp_path / "r.html").read_text()
    assert 'class="chart crossover"' in page
    assert "linear is faster than flat at n ≤ 40, slower than it from 60" in page
