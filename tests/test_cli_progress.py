"""Progress when piped: one plain line per op or stage; run stores its bench cases."""

from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app
from kernelab.cli._common import progress_key
from kernelab.stages import StageReport, load

runner = CliRunner()


def progress_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[") and " s] " in line]


def test_progress_key_is_the_stage_and_op():
    assert progress_key("bench rmsnorm llama decode 1x4096 float32 (3/9)") == "bench rmsnorm"
    assert progress_key("verify rmsnorm/torch edge 1x7 float32") == "verify rmsnorm"
    assert progress_key("inspect: compiled 3/18 for sm_90") == "inspect: compiled"


def test_bench_piped_prints_one_line_per_op(monkeypatch):
    def fake(ops, device, cfg, candidate=None, db=None, progress=None, remeasure=True):
        for op in ("rmsnorm", "softmax"):
            for i in range(3):
                progress(f"bench {op} shape{i} float32 ({i + 1}/3)")
        progress("bench gemm " + "llama3-8b/mistral-7b gate_up prefill M=2048 28672x4096 " * 2)
        raise ValueError("stop here")

    monkeypatch.setattr("kernelab.bench.bench", fake)
    result = runner.invoke(app, ["bench", "rmsnorm", "softmax", "--device", "cpu", "--no-ledger"])
    lines = progress_lines(result.output)
    assert [line.split("] ", 1)[1] for line in lines][:2] == [
        "bench rmsnorm shape0 float32 (1/3)",
        "bench softmax shape0 float32 (1/3)",
    ]
    assert len(lines) == 3  # one per op
    assert max(len(line) for line in result.output.splitlines()) <= 80  # wrapped, not cut


def test_run_piped_shows_each_stage_and_stores_its_bench_cases(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))

    def verify_stage(ops, info, progress, **options):
        progress("verify rmsnorm/torch edge 1x7 float32")
        progress("verify rmsnorm/kernelab edge 1x7 float32")
        return StageReport("verify")

    def inspect_stage(ops, info, progress, **options):
        for i in range(5):
            progress(f"inspect: compiled {i}/5 for sm_90")
        return StageReport("inspect sm_90")

    fakes = {"kernelab.verify:stage": verify_stage, "kernelab.inspect:stage": inspect_stage}
    monkeypatch.setattr("kernelab.cli.run_cmd.load", lambda p: fakes.get(p) or load(p))
    result = runner.invoke(app, ["run", "rmsnorm", "--device", "cpu", "--label", "card"])
    assert result.exit_code == 0, result.output
    said = [line.split("] ", 1)[1] for line in progress_lines(result.output)]
    # one line per stage and op (the bench stage measures the CPU's ceilings first)
    assert said[:2] == ["verify rmsnorm/torch edge 1x7 float32", "inspect: compiled 0/5 for sm_90"]
    assert [s for s in said if s.startswith("bench")] == [
        "bench rmsnorm llama3-8b/mistral-7b decode 1x4096"
    ]
    assert len({progress_key(s) for s in said}) == len(said)
    with ledger.open(str(path)) as db:
        (run,) = db.list_runs()
        cases = db.get_run(run["id"], samples=False)["cases"]
    assert run["kind"] == "bench" and run["label"] == "card"
    assert {c["op"] for c in cases} == {"rmsnorm"} and {c["variant"] for c in cases} == {"torch"}
    assert f"ledger run {run['id']}" in " ".join(result.output.split())
