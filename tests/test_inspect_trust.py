"""The gate trusts a baseline entry whose cache key is unchanged: a fresh clone of an unchanged
tree compiles nothing, a changed kernel is compiled and compared, ``--full`` compiles all."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelab import ops
from kernelab.cli import app
from kernelab.inspect import baseline as bl
from kernelab.inspect import runner as inspect_runner
from kernelab.inspect import tpu

cli = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
GATE = ["inspect", "rmsnorm", "-t", "sm_90,gfx942", "--dtype", "bfloat16"]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    path = tmp_path_factory.getbasetemp() / "inspect-cache"
    path.mkdir(exist_ok=True)
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(path))


@pytest.fixture
def written(tmp_path):
    path = str(tmp_path / "baseline.json")
    result = cli.invoke(app, [*GATE, "--update-baseline", "--baseline", path])
    assert result.exit_code == 0, result.output
    return path


def _no_compiler(monkeypatch):
    """Any compilation (and any read of the local cache) from here on fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("compiled or read the cache, though the baseline had the entry")

    monkeypatch.setattr(inspect_runner, "run", refuse)


def test_every_entry_carries_its_cache_key(written):
    entries = json.loads(Path(written).read_bytes())["entries"]
    assert entries and all(len(e["cache_key"]) == 64 for e in entries.values())


def test_an_unchanged_tree_compiles_nothing_and_says_so(written, monkeypatch):
    _no_compiler(monkeypatch)
    result = cli.invoke(app, [*GATE, "--check", "--baseline", written, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    n = len(json.loads(Path(written).read_bytes())["entries"])
    assert data["trusted"] == n and all(r["trusted"] for r in data["reports"])
    assert data["check"]["regressions"] == [] and data["check"]["new"] == []
    table = cli.invoke(app, [*GATE, "--check", "--baseline", written])
    assert table.exit_code == 0, table.output
    assert f"{n} of {n} kernel×target×config unchanged since the baseline" in table.output
    # An update from an unchanged tree keeps the same bytes, compiling nothing.
    before = Path(written).read_bytes()
    again = cli.invoke(app, [*GATE, "--update-baseline", "--baseline", written])
    assert again.exit_code == 0, again.output
    assert Path(written).read_bytes() == before


def test_a_changed_launch_is_compiled_and_its_regression_caught(written, monkeypatch):
    op = ops.get("rmsnorm")
    declared = op.launches

    def unaligned(shape, dtype, config=None):
        return [dataclasses.replace(x, divisible_16=()) for x in declared(shape, dtype, config)]

    monkeypatch.setattr(op, "launches", unaligned)
    result = cli.invoke(app, [*GATE, "--check", "--baseline", written, "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["trusted"] == 0 and not any(r["trusted"] for r in data["reports"])
    assert any("lost vectorisation" in r for r in data["check"]["regressions"])


def test_only_the_changed_entries_are_compiled(written, monkeypatch):
    data = json.loads(Path(written).read_bytes())
    (victim,) = [k for k in sorted(data["entries"]) if "/sm_90/" in k][:1]
    data["entries"][victim]["cache_key"] = "0" * 64  # as if that kernel's source had changed
    Path(written).write_bytes(bl.dumps(data))
    compiled: list[str] = []
    real = inspect_runner.run

    def counting(pairs, *args, **kwargs):
        compiled.extend(f"{s.name}/{t.name}" for s, t in pairs)
        return real(pairs, *args, **kwargs)

    monkeypatch.setattr(inspect_runner, "run", counting)
    result = cli.invoke(app, [*GATE, "--check", "--baseline", written, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["trusted"] == len(data["entries"]) - 1
    (fresh,) = [r for r in out["reports"] if not r["trusted"]]
    assert fresh["key"] == victim and fresh["facts"]["registers"]
    assert compiled and all(c.endswith("/sm_90") for c in compiled)


def test_a_tampered_entry_without_its_key_is_compiled_and_fails(written):
    # Facts edited by hand lose nothing of the gate: with no key the entry is recompiled.
    data = json.loads(Path(written).read_bytes())
    victim = sorted(data["entries"])[0]
    entry = data["entries"][victim]
    del entry["cache_key"]
    entry["spill_bytes"], entry["registers"] = 0, 1  # now "better" than the kernel can be
    entry["narrow_accesses"] = -1
    Path(written).write_bytes(bl.dumps(data))
    result = cli.invoke(app, [*GATE, "--check", "--baseline", written, "--json"])
    assert result.exit_code == 1, result.output
    regressions = json.loads(result.stdout)["check"]["regressions"]
    assert regressions and all(victim in r for r in regressions)


def test_full_compiles_every_entry(written, monkeypatch):
    _no_compiler(monkeypatch)
    result = cli.invoke(app, [*GATE, "--check", "--full", "--baseline", written])
    assert result.exit_code != 0 and "compiled or read the cache" in repr(result.exception)
    lone = cli.invoke(app, [*GATE, "--full"])
    assert lone.exit_code == 2 and "full: goes with --check or --update-baseline" in lone.output


def test_pallas_keys_do_not_name_the_checkout_folder():
    here = str(Path(tpu.__file__).resolve())
    assert tpu._portable(here) == "kernelab/inspect/tpu.py"
    assert tpu._portable("/elsewhere/user_kernel.py") == "/elsewhere/user_kernel.py"


def test_the_committed_baseline_holds_every_current_key(monkeypatch):
    """The committed baseline is current: every kernel x target x config the gate builds today
    has its entry there, under the same cache key, so a fresh clone compiles nothing. A kernel
    changed without `make inspect-baseline` fails here (the gate alone would only be slow)."""
    _no_compiler(monkeypatch)
    result = cli.invoke(app, ["inspect", "--check", "--dtype", "bfloat16", "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    data = json.loads(result.stdout)
    stale = [r["key"] for r in data["reports"] if not r["trusted"]]
    assert not stale, f"{len(stale)} entries not in the baseline under their key: {stale[:5]}"
    assert data["trusted"] == len(data["reports"]) > 1000


def _jobs_and_reports(names=("rmsnorm",), target="sm_90"):
    from kernelab.inspect import parse_targets
    from kernelab.inspect.ops import plan
    from kernelab.inspect.report import analyze_jobs

    p = plan([ops.get(n) for n in names], parse_targets(target), dtypes=("bfloat16",))
    return p.jobs, analyze_jobs(p.jobs)


def _shown(rep):
    return (
        rep.summary(),
        [(f.kind, f.severity, f.message) for f in rep.findings if f.severity != "info"],
        rep.ok,
        rep.occupancy,
    )


def test_a_report_trusted_for_showing_reads_as_the_compiled_one():
    from kernelab.inspect.findings import Finding

    jobs, reports = _jobs_and_reports()
    # planted: one report warns (spills) and one cannot launch, as a compiled report would say
    reports[0].findings.append(Finding("spills", "warn", "spills: 8 bytes of local memory"))
    reports[1].findings.append(Finding("cannot-launch", "error", "needs 300 KiB of shared"))
    base = {"entries": {r.key: bl.entry(r) for r in reports}}
    trusted, n = bl.trust(jobs, base, shown=True)
    assert n == len(jobs)
    assert [_shown(t) for t in trusted] == [_shown(r) for r in reports]
    assert not trusted[1].ok and "spills: 8 bytes" in trusted[0].findings[0].message


def test_an_entry_without_what_it_shows_is_compiled_for_showing():
    jobs, reports = _jobs_and_reports()
    base = {"entries": {r.key: bl.entry(r) for r in reports}}
    for name in bl.SHOWN:
        del base["entries"][reports[0].key][name]
    shown, n = bl.trust(jobs, base, shown=True)
    assert shown[0] is None and n == len(jobs) - 1  # the card compiles it
    gated, n = bl.trust(jobs, base)
    assert gated[0] is not None and n == len(jobs)  # the gate's facts are all there


def test_the_report_card_reads_every_kernel_from_the_committed_baseline(monkeypatch):
    """A fresh clone's `kernelab run` compiles nothing for its inspect column."""
    from kernelab.core.op import all_ops
    from kernelab.inspect import stage

    _no_compiler(monkeypatch)
    lines = []
    report = stage(all_ops(), progress=lines.append)
    cells = [c for c in report.cells.values() if c.data]
    assert cells and all(c.data["from_baseline"] == c.data["kernels"] for c in cells)
    assert any("read from inspect-baseline.json" in line for line in lines)
    assert not report.skipped
