"""Every command's table at 80 and 160 columns: no line wider than the terminal, and every
identifier (run ids, ops, variants, shape labels, dtypes, targets) whole on one line."""

import io
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from kernelab import ledger
from kernelab._table import Col, Sheet
from kernelab.bench.roofline import COPY, MATMUL
from kernelab.cli import app
from kernelab.hardware import detect
from kernelab.inspect.findings import Finding
from kernelab.inspect.report import KernelReport
from kernelab.stages import Cell, StageReport
from kernelab.verify._types import AuditEntry, CaseResult, Failure, Measure, Report

runner = CliRunner()
WIDTHS = (80, 160)
#: The longest shape label the ops declare, cut for the interpreter as bench and verify do.
LONG_SHAPE = "llama3-8b/mistral-7b gate_up prefill M=2048 28672x4096 [M→128, N→160, K→256]"
SHAPES = (LONG_SHAPE, "llama3-8b/mistral-7b prefill 4096x(32+8)x128 rot128 neox", "1x4096")
OPS = ("rmsnorm_fp8_quant", "w4a16_gemm")
VARIANTS = ("kernelab-persistent", "my_candidate_with_a_long_name", "torch")
DTYPES = ("bfloat16", "float16")
LONG_FLAG = "noise target not reached (±3191.5% of median); outputs differ from the first call"


def render(sheet: Sheet, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    sheet.print(console)
    return console.export_text()


def check(text: str, width: int, identifiers, phrases=()) -> None:
    """No line wider than ``width``, nothing cut short; each identifier whole on one line,
    each phrase (free text) whole once line breaks are read as spaces."""
    lines = text.splitlines()
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, f"wider than {width}:\n" + "\n".join(too_wide)
    assert "…" not in text
    for ident in identifiers:
        assert any(ident in line for line in lines), f"{ident!r} not whole in:\n{text}"
    flat = " ".join(text.split())
    for phrase in phrases:
        assert phrase in flat, f"{phrase!r} not whole in:\n{text}"


def bench_result():
    cases = []
    for op in OPS:
        for shape in SHAPES:
            for dtype in DTYPES:
                for i, variant in enumerate(VARIANTS):
                    cases.append(
                        {
                            "op": op,
                            "shape_label": shape,
                            "dtype": dtype,
                            "variant": variant,
                            "mode": "cold",
                            "flags": [LONG_FLAG] if i == 1 else [],
                            "metrics": {
                                "valid": i != 2,
                                "median_s": 1.234e-3,
                                "q1_s": 1.2e-3,
                                "q3_s": 1.3e-3,
                                "n": 120,
                                "cv": 0.05,
                                "gbps": 3215.4,
                                "pct_roofline": 67.0,
                                "speedup_vs_torch": 1.25,
                            },
                        }
                    )
    return SimpleNamespace(device={"name": "NVIDIA H200"}, cases=cases, skipped=[], seconds=1.0)


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_table(width):
    from kernelab.cli.bench_cmd import bench_sheet

    text = render(bench_sheet(bench_result()), width)
    check(text, width, OPS + SHAPES + VARIANTS + DTYPES, [LONG_FLAG])
    if width >= 160:  # wide terminals get every column
        assert "q1–q3" in text and "left out" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_floors_table(width, monkeypatch):
    rows = [
        {
            "op": op,
            "shape_label": shape,
            "dtype": dtype,
            "bytes": 1e6,
            "flops": 1e6,
            "floor_s": 1e-6,
            "bound": "memory",
        }
        for op in OPS
        for shape in SHAPES
        for dtype in DTYPES
    ]
    from kernelab.cli.bench_cmd import _print_floors
    from kernelab.hardware import lookup

    console = Console(width=width, file=io.StringIO(), record=True)
    import kernelab.cli._common as common

    monkeypatch.setenv("COLUMNS", str(width))
    common._CONSOLES[("console", str(width))] = console
    try:
        rows[0]["ceiling_source"] = "datasheet"
        _print_floors(lookup("h200"), rows, json=False)
    finally:
        common._CONSOLES.clear()
    check(console.export_text(), width, OPS + SHAPES + DTYPES)


def compare_result():
    cases = [
        SimpleNamespace(
            op=op,
            variant=variant,
            shape_label=shape,
            dtype="bfloat16",
            mode="cold",
            median_a=1e-3,
            median_b=1.1e-3,
            ratio=1.1,
            basis="vs torch",
            ci_low=1.05,
            ci_high=1.15,
            verdict="slower",
            regression=True,
            note="interval excludes 1 and the change exceeds the noise",
        )
        for op in OPS
        for shape in SHAPES
        for variant in VARIANTS
    ]
    run = {"id": "78e6877ba1c2", "label": "before-the-fp8-fix"}
    return SimpleNamespace(
        run_a=run, run_b={**run, "id": "0a1b2c3d4e5f"}, confidence=0.95, cases=cases
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_table(width):
    from kernelab.cli.compare_cmd import compare_sheet

    text = render(compare_sheet(compare_result(), 0.05), width)
    check(text, width, OPS + SHAPES + VARIANTS + ("78e6877ba1c2", "0a1b2c3d4e5f", "slower"))


RUNS = [
    {
        "created": "2026-12-01T20:31:29.414691+00:00",
        "id": run_id,
        "kind": kind,
        "label": label,
        "device": "NVIDIA H200",
        "commit": "c6ca97189f1c3e0d364ab4908c5456f48bdce977",
        "n_cases": 1234,
    }
    for run_id, kind, label in (
        ("78e6877ba1c2", "bench", "baseline-bf16-before-the-rmsnorm-fix"),
        ("0a1b2c3d4e5f", "model-bench", None),
    )
]


@pytest.mark.parametrize("width", WIDTHS)
def test_history_tables(width):
    from kernelab.cli.history_cmd import history_sheet, runs_sheet

    text = render(runs_sheet(RUNS), width)
    check(text, width, ("78e6877ba1c2", "0a1b2c3d4e5f", "model-bench", RUNS[0]["label"]))
    rows = [
        {
            "created": r["created"],
            "run": r["id"],
            "label": r["label"],
            "variant": variant,
            "shape_label": shape,
            "dtype": "bfloat16",
            "mode": "cold",
            "median_s": 1e-3,
            "vs_previous": 1.01,
            "gbps": 3000.0,
            "pct_roofline": 60.0,
            "verdict": "fail: wrong values (4.2×)" if variant == VARIANTS[0] else None,
            "flags": [LONG_FLAG],
        }
        for r in RUNS
        for shape in SHAPES
        for variant in VARIANTS
    ]
    text = render(history_sheet("rmsnorm_fp8_quant", rows), width)
    words = ("78e6877ba1c2", RUNS[0]["label"], *SHAPES, *VARIANTS, "fail: wrong values (4.2×)")
    check(text, width, words, [LONG_FLAG])


#: inspect compiles the shapes as declared (never cut): the longest declared label.
INSPECT_SHAPES = ("llama3-8b/mistral-7b prefill 4096x4096 hidden per tensor", *SHAPES[1:])


def kernel_reports():
    config = (
        "BLOCK_M=1 BLOCK_N=4096 IS_RMS=True HAS_BIAS=False HAS_RESIDUAL=False SINGLE_PASS=True "
        "QUANT=False FP8_MAX=1.0 MIN_SCALE=1.1754943508222875e-38 w8 s1"
    )
    facts = {
        "registers": 38,
        "spill_bytes": 0,
        "shared_bytes": 1024,
        "loads": {"128": 1},
        "stores": {"128": 1},
        "tensor_cores": {"wgmma": 4},
        "tma": True,
    }
    occ = {"occupancy": 0.75, "limiter": "registers"}
    reps = []
    for target in ("sm_90", "gfx942"):
        for label in INSPECT_SHAPES:
            reps.append(
                KernelReport(
                    key=f"rmsnorm_fp8_quant/_rmsnorm_fp8_quant_kernel/{target}/bfloat16/{label}",
                    op="rmsnorm_fp8_quant",
                    kernel="_rmsnorm_fp8_quant_kernel",
                    target=target,
                    label=f"{label} bfloat16",
                    config=config,
                    facts=facts,
                    occupancy=occ,
                    findings=[Finding("narrow", "warn", "64-bit loads of x", "use 128")],
                )
            )
    reps.append(
        KernelReport("e", "gemm", "_gemm_kernel", "sm_100", SHAPES[0], config, error="boom")
    )
    return reps, config


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_table(width):
    from kernelab.cli.inspect_cmd import inspect_sheet

    reps, config = kernel_reports()
    text = render(inspect_sheet(SimpleNamespace(triton="3.9.0", reports=reps), reps), width)
    check(
        text,
        width,
        ["rmsnorm_fp8_quant/_rmsnorm_fp8_quant_kernel", "gemm/_gemm_kernel", "sm_90", "gfx942"]
        # each row names its shape and dtype (54 rows of one kernel look alike otherwise)
        + [f"{label} bfloat16" for label in INSPECT_SHAPES],
        [config],
    )
    assert text.splitlines()[0].endswith("— dtypes: bfloat16")


def test_the_run_card_says_which_dtype_it_inspects():
    from kernelab.inspect.stage import RUN_DTYPE, stage

    assert RUN_DTYPE in stage([], None).stage


def card_reports():
    verify = StageReport("verify")
    inspect = StageReport("inspect sm_90")
    bench = StageReport("bench")
    for op in ("rmsnorm", "gemm"):
        verify.cells[(op, "kernelab")] = Cell("pass", "pass: 78 cases, worst 0.25× tol")
        verify.cells[(op, "compile")] = Cell(
            "skip", "torch.compile builds C++ on CPU (slow); ask for it with --variant compile"
        )
        inspect.cells[(op, "kernelab")] = Cell("pass", "128-bit, 0 spills, occ 75%")
        bench.cells[(op, "kernelab")] = Cell("skip", "interpreter on CPU: not timed")
        bench.cells[(op, "torch")] = Cell("pass", "244.3 µs median, 1–1% roofline")
    return [verify, inspect, bench]


@pytest.mark.parametrize("width", WIDTHS)
def test_run_card(width):
    from kernelab.cli._common import select_ops
    from kernelab.cli.run_cmd import card_sheet

    info = detect("cpu")
    sheet = card_sheet(info, select_ops(["rmsnorm", "gemm"]), card_reports(), width)
    text = render(sheet, width)
    check(text, width, ("rmsnorm", "gemm", "kernelab", "compile"))
    # a line per stage result (10), the title, header and rule, a line per op, and the two
    # long skip notes wrapped once: no cell spread over 4-7 lines
    assert len(text.splitlines()) <= 10 + 3 + 2 + 2


def verify_report():
    m = Measure("out", 1e-3, 1e-3, 1e-3, [0], 1.0, 1.0, 1e-2, "derived", 1e-3)
    cases = []
    for op in OPS:
        for variant in VARIANTS:
            c = CaseResult(op, variant, "representative", LONG_SHAPE, "k", "bfloat16")
            c.add_measure(m)
            if variant == "torch":
                c.failures.append(Failure("wrong values", "out", "rel_l2 above tolerance"))
            cases.append(c)
    report = Report(1, "cpu", 2, ["representative"], cases)
    report.audit = [
        AuditEntry(op, "zeros", "out", "bfloat16", True, "wrong values", 1.0, note=LONG_FLAG)
        for op in OPS
    ]
    return report


@pytest.mark.parametrize("width", WIDTHS)
def test_verify_tables(width):
    from kernelab.cli.verify_cmd import audit_sheet, verify_sheet

    report = verify_report()
    check(render(verify_sheet(report), width), width, OPS + VARIANTS + ("representative",))
    check(render(audit_sheet(report), width), width, (*OPS, "zeros"), [LONG_FLAG])


@pytest.mark.parametrize("width", WIDTHS)
def test_tune_and_model_bench_tables(width):
    from collections import Counter

    from kernelab.cli.model_bench_cmd import model_sheet, profile_sheet
    from kernelab.cli.tune_cmd import tune_sheet

    results = [
        SimpleNamespace(
            shape=SimpleNamespace(label=shape),
            space=96,
            pruned=Counter({"spills registers": 12, "exceeds shared memory": 30}),
            winner=None,
            note="no GPU here: pruned statically, not timed (run on a GPU to search)",
        )
        for shape in SHAPES
    ]
    info = detect("cpu")
    check(render(tune_sheet("w4a16_gemm", info, results), width), width, SHAPES)
    row = {
        "variant": "patched-w4a16",
        "prefill_s": 0.01,
        "prefill_speedup": 1.1,
        "decode_tokens_per_s": 100.0,
        "decode_speedup": 1.2,
        "prefill_spread": {"n": 12, "rel_ci": 0.031, "converged": True},
        "decode_spread": {"n": 40, "rel_ci": 0.084, "converged": False},
        "decode_profile": {
            "step_us": 1500.0,
            "framework_overhead_share": 0.4,
            "top_cpu_ops": [
                {
                    "name": "kernelab::w4a16_gemm_with_a_very_long_custom_op_name_for_the_test",
                    "count": 7,
                    "self_us": 120.0,
                    "self_share": 0.2,
                }
            ],
        },
    }
    table = render(model_sheet("tiny-llama", info, [row]), width)
    check(table, width, ("patched-w4a16",))
    assert "±3%" in table and "±8%*" in table and "12/40" in table
    check(
        render(profile_sheet(row), width),
        width,
        ("kernelab::w4a16_gemm_with_a_very_long_custom_op_name_for_the_test",),
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_ops_command(width):
    result = runner.invoke(app, ["ops", "--device", "cpu"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    data = json.loads(runner.invoke(app, ["ops", "--json", "--device", "cpu"]).output)
    names = [o["op"] for o in data["ops"]]
    variants = [v["name"] for o in data["ops"] for v in o["variants"]]
    check(result.output, width, names + variants)


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))
    with ledger.open(str(path)) as db:
        key = detect("cpu").key
        db.put_ceiling(key, COPY, 250e9, "B/s", "test copy")
        db.put_ceiling(key, MATMUL + "float32", 1e13, "FLOP/s", "test matmul")
    return path


def test_bench_history_and_compare_commands_at_80_and_160(db_path):
    quick = ["--device", "cpu", "--dtype", "float32", "--max-time", "0.2", "--min-samples", "5"]
    args = ["bench", "rmsnorm", *quick, "--shape", "decode 1x4096", "--label", "first-run"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    with ledger.open(str(db_path)) as db:
        (run,) = db.list_runs()
        cases = db.get_run(run["id"], samples=False)["cases"]
    idents = {c["shape_label"] for c in cases} | {c["variant"] for c in cases} | {"rmsnorm"}
    check(result.output, 80, idents)
    for width in WIDTHS:
        env = {"COLUMNS": str(width)}
        out = runner.invoke(app, ["history"], env=env).output
        check(out, width, (run["id"], "first-run"))
        out = runner.invoke(app, ["history", "rmsnorm"], env=env).output
        check(out, width, idents | {run["id"]})
        out = runner.invoke(app, ["compare", run["id"], run["id"]], env=env).output
        check(out, width, idents | {run["id"]})


def test_a_sheet_never_cuts_an_identifier_wider_than_its_share():
    sheet = Sheet("t", [Col("id"), Col("a", give="drop", step=1), Col("b", give="below", step=2)])
    sheet.row("x" * 70, "dropped first", "then moved below its row")
    text = render(sheet, 80)
    check(text, 80, ("x" * 70, "then moved below its row"))
    assert "dropped first" not in text and "left out at 80 columns: a" in text


def test_a_spill_column_keeps_the_names_that_fit_and_moves_the_rest_below():
    long = "cutlass_" + "x" * 90
    sheet = Sheet("t", [Col("kernel", give="spill", step=1), Col("time", right=True)])
    for name in ("gemm_a", "gemm_b", long):
        sheet.row(name, "1.0 us")
    text = render(sheet, 60)
    lines = text.splitlines()
    assert any(line.startswith("gemm_a") and line.endswith("1.0 us") for line in lines)
    check(text, 60, ("gemm_a", "gemm_b"))
    assert long in "".join(text.split())  # continues on the next lines, every character kept
    assert "kernel:" in text and "left out" not in text


def test_a_word_wider_than_the_line_continues_on_the_next():
    from kernelab._table import pack

    lines = pack([Text("short"), Text("y" * 25)], 10)
    assert [line.plain for line in lines] == ["short", "y" * 10, "y" * 10, "y" * 5]


def check_names(text: str, width: int, names) -> None:
    """:func:`check` for trace names: one that fits a line (less the indent of a line under a
    row) is whole on one line; a longer one (a mangled kernel name of a thousand characters)
    continues on the next lines, every character kept."""
    fits = {n for n in names if cell_len(n) <= width - 8}
    check(text, width, fits)
    flat = "".join(text.split())
    for name in set(names) - fits:
        assert "".join(name.split()) in flat, f"{name!r} not whole in:\n{text}"


def trace_command(args, width):
    result = runner.invoke(app, ["trace", *args], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    data = json.loads(runner.invoke(app, ["trace", *args, "--json"]).output)
    return result.output, data


TRACES = ("a100_alexnet", "mi250_minitoy", "a100_nccl", "a100_diff_control")
DIFF_PAIR = ("a100_diff_control.json.gz", "v100_diff_test.json.gz")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", TRACES)
def test_trace_summary_of_real_traces(shared_dir, name, width):
    from kernelab.trace.render import CPU_ROWS

    path = str(shared_dir / "traces" / f"{name}.json.gz")
    text, s = trace_command(["summary", path], width)
    gpu = s["gpu"]
    names = [k["name"] for k in gpu["top_kernels"]]
    names += [k["op"] for k in gpu["top_kernels"] if k["op"]]
    names += [k["category"] for k in gpu["top_kernels"]]
    names += [o["op"] for o in gpu["roofline"]["ops"]]
    names += [op for c in gpu["fusion"]["candidates"] for op in c["ops"]]
    names += [k["name"] for k in gpu["occupancy"]["kernels"] if k.get("occupancy") is not None]
    names += [o["name"] for o in s["cpu"]["ops"][:CPU_ROWS]]
    names += [str(b["device"]) for b in gpu["breakdown"]]
    check_names(text, width, names)
    assert "left out" not in text  # nothing dropped: long names move below their row
    if width >= 160:  # the device table keeps every column in its place
        assert "host idle:" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_trace_diff_of_real_traces(shared_dir, width):
    a, b = (str(shared_dir / "traces" / n) for n in DIFF_PAIR)
    text, d = trace_command(["diff", a, b], width)
    names = [k["name"] for k in d["kernels"]] + [c["category"] for c in d["categories"]]
    check_names(text, width, names)
    assert "-66.811 ms" in text  # a negative change in its unit, not "-66811.0 us"


@pytest.mark.parametrize("width", WIDTHS)
def test_trace_summary_of_a_folder_of_ranks(tmp_path, width):
    from tests.kineto_builder import TraceBuilder

    for rank in range(2):
        b = TraceBuilder(rank=rank)
        b.launch("gemm_a", 0, 5, 10, 40 + 10 * rank)
        b.launch("nccl_allreduce_kernel", 60, 5, 70, 20)
        b.write(tmp_path / f"rank{rank}_of_a_job_with_a_rather_long_file_name.json")
    text, r = trace_command(["summary", str(tmp_path)], width)
    check_names(text, width, [row["file"] for row in r["ranks"]])
    assert "left out" not in text
