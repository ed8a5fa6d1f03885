"""Commands that run no kernel load neither torch nor Triton: ``kernelab ops`` reads the ops'
stored catalogue (checked here against the registry), ``--version`` reads package metadata, a
misspelt op is refused from the catalogue with the closest names."""

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kernelab._suggest import close_matches, unknown_name
from kernelab.cli import _catalog, app, ops_cmd
from kernelab.core import calling
from kernelab.hardware import devices

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMALL_TRACE = Path(__file__).resolve().parent / "data" / "cpu_memory.json.gz"


def test_catalogue_is_the_registry():
    """The stored catalogue is what the registry makes now: regenerate it after changing an
    op (``python -m kernelab.cli._catalog``)."""
    built = orjson.loads(_catalog.dumps(_catalog.build()))
    stored = _catalog.load()
    assert [o["op"] for o in stored["ops"]] == [o["op"] for o in built["ops"]]
    for a, b in zip(stored["ops"], built["ops"], strict=True):
        assert a == b, f"{a['op']}: stale catalogue, run python -m kernelab.cli._catalog"
    assert stored == built


def _hide(monkeypatch, hidden=(), shown=()):
    """Package searches miss ``hidden`` and find ``shown`` (a placeholder spec)."""
    real = importlib.util.find_spec

    def find_spec(name, package=None):
        if name in hidden:
            return None
        if name in shown:
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("hidden", [(), ("jax",), ("jaxlib",)])
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_catalogue_rows_are_the_registry_rows(monkeypatch, device_type, hidden):
    """On every device type, with jax found or missing, the catalogue says what the registry
    says (the Pallas variants' 'jax not installed' included)."""
    _hide(monkeypatch, hidden)
    rows = _catalog.rows(device_type)
    assert rows == ops_cmd.registry_rows(device_type)
    if hidden:
        notes = {v["note"] for r in rows for v in r["variants"] if v["kind"] == "pallas"}
        assert notes and all(f"{hidden[0]} not installed" in n for n in notes)


def test_every_calling_convention_is_the_registry_one():
    from kernelab import ops

    for op in ops.all_ops():
        want = orjson.loads(orjson.dumps(calling.calling_convention(op)))
        assert _catalog.calling(op.name) == want, op.name


def test_an_external_variant_is_listed_where_its_package_is_installed(monkeypatch):
    """The catalogue keeps declared external variants; each is listed only where its package
    is found, as the registry registers it only then."""
    declared = {v["requires"] for o in _catalog.load()["ops"] for v in o["variants"]}
    assert "liger_kernel" in declared
    _hide(monkeypatch, hidden=("liger_kernel",))
    names = [v["name"] for v in _catalog.rows("cpu", ["rmsnorm"])[0]["variants"]]
    assert "liger" not in names
    _hide(monkeypatch, shown=("liger_kernel",))
    (row,) = _catalog.rows("cpu", ["rmsnorm"])
    liger = next(v for v in row["variants"] if v["name"] == "liger")
    assert (liger["runs_here"], liger["note"]) == (False, "needs a GPU")


def test_a_failing_package_search_falls_back_to_the_registry(monkeypatch):
    def refuse(name, package=None):
        raise ValueError(name)

    monkeypatch.setattr(importlib.util, "find_spec", refuse)
    assert _catalog.rows("cpu") is None
    assert _catalog.rows("tpu") is None  # a device type the catalogue does not know


def test_ops_from_the_registry_prints_what_the_catalogue_prints(monkeypatch):
    runner = CliRunner(env={"COLUMNS": "160"})
    fast = runner.invoke(app, ["ops", "--device", "cpu"])
    monkeypatch.setattr(_catalog, "rows", lambda *a: None)
    slow = runner.invoke(app, ["ops", "--device", "cpu"])
    assert fast.exit_code == slow.exit_code == 0
    assert fast.output == slow.output and "rmsnorm" in fast.output


def test_unknown_name_suggests_the_closest():
    ops = ["rmsnorm", "layernorm", "rmsnorm_fp8_quant", "gemm", "fp8_gemm", "rope"]
    assert close_matches("rmsnorn", ops)[0] == "rmsnorm"
    assert close_matches("RMSNorm", ops)[0] == "rmsnorm"
    assert set(close_matches("norm", ops)) == {"rmsnorm", "layernorm", "rmsnorm_fp8_quant"}
    assert close_matches("zzz", ops) == [] and close_matches("x", ops) == []
    err = unknown_name("op", "rmsnorn", ops)
    assert isinstance(err, ValueError)
    assert str(err).startswith("op: expected one of ['fp8_gemm', 'gemm', ")
    assert str(err).endswith("got 'rmsnorn'; did you mean 'rmsnorm'?")
    assert "did you mean" not in str(unknown_name("op", "zzz", ops))
    assert "did you mean" not in str(unknown_name("op", 3, ops))


def test_the_registry_suggests_the_closest_op():
    from kernelab import ops

    with pytest.raises(ValueError, match=r"op: expected one of .*did you mean 'rmsnorm'\?"):
        ops.get("rmsnorn")


def test_quick_detection_decides_a_cpu_without_torch_only_where_no_gpu_can_be(monkeypatch):
    monkeypatch.setattr(devices.sys, "platform", "linux")
    monkeypatch.setattr(devices.os.path, "exists", lambda p: False)
    assert devices.accelerator_possible() is False
    monkeypatch.setattr(devices.os.path, "exists", lambda p: p == "/dev/kfd")
    assert devices.accelerator_possible() is True
    monkeypatch.setattr(devices.sys, "platform", "win32")
    assert devices.accelerator_possible() is True
    import torch

    info = devices.detect("cpu", quick=True)
    assert info.type == "cpu" and info.threads == torch.get_num_threads()  # torch loaded here
    calls = []
    monkeypatch.setattr(devices, "accelerator_possible", lambda: calls.append(1) or True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.detect(None, quick=True).type == "cpu" and calls  # asked torch


def _heavy(args: list[str], tmp_path) -> tuple[int, str, list[str]]:
    """Run ``kernelab ARGS`` in a fresh interpreter: exit code, stderr, and which of torch,
    triton and jax it imported."""
    code = (
        "import sys\nsys.argv = ['kernelab', *sys.argv[1:]]\nfrom kernelab.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code or 0\nelse:\n    rc = 0\n"
        "print('LOADED', [m for m in ('torch', 'triton', 'jax') if m in sys.modules], rc)"
    )
    env = {"PYTHONPATH": SRC, "COLUMNS": "120", "KERNELAB_LEDGER": str(tmp_path / "l.sqlite")}
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("LOADED"), out.stdout[-500:] + out.stderr[-2000:]
    loaded, rc = last.removeprefix("LOADED ").rsplit(" ", 1)
    return int(rc), out.stderr, eval(loaded)


@pytest.mark.parametrize(
    "args",
    [
        ["ops"],
        ["ops", "--json"],
        ["ops", "rmsnorm"],
        ["--version"],
        ["--help"],
        ["verify", "--help"],
        ["trace", "summary", str(SMALL_TRACE)],
    ],
)
def test_commands_that_run_no_kernel_import_neither_torch_nor_triton(args, tmp_path):
    rc, err, loaded = _heavy(args, tmp_path)
    assert rc == 0, err[-2000:]
    assert loaded == []


def test_history_and_report_import_neither_torch_nor_triton(tmp_path):
    from kernelab import ledger

    ledger.open(tmp_path / "l.sqlite").close()
    # an empty ledger: history says so (0), report has no run to show (2)
    for args, want in ((["history"], 0), (["report", "--out", str(tmp_path / "r.html")], 2)):
        rc, err, loaded = _heavy(args, tmp_path)
        assert (rc, loaded) == (want, []), (args, err[-2000:])
        assert "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (["ops", "rmsnorn"], "op"),
        (["run", "rmsnorn"], "op"),
        (["verify", "rmsnorm", "rmsnorn"], "op"),
        (["verify", "--op", "rmsnorn", "--candidate", "x.py:f"], "--op"),
        (["bench", "rmsnorn"], "op"),
        (["bench", "--op", "rmsnorn", "--candidate", "x.py:f"], "--op"),
        (["inspect", "rmsnorn"], "op"),
        (["tune", "rmsnorn"], "op"),
        (["sweep", "bench", "--ops", "gemm,rmsnorn"], "--ops"),
    ],
)
def test_a_misspelt_op_is_refused_before_torch_loads(args, label, tmp_path):
    rc, err, loaded = _heavy(args, tmp_path)
    assert rc == 2 and loaded == []
    assert f"{label}: expected one of" in err and "did you mean 'rmsnorm'?" in err
    assert "Traceback" not in err


def test_a_changed_op_module_makes_the_catalogue_from_the_registry(monkeypatch):
    """An op added (or changed) since the catalogue was written is never refused: the stored
    digest of the op modules no longer matches, so the registry answers."""
    _catalog.load.cache_clear()
    try:
        assert _catalog.load()["sources"] == _catalog.sources_digest()  # committed: fresh
        monkeypatch.setattr(_catalog, "sources_digest", lambda: "changed")
        _catalog.load.cache_clear()
        built = []
        real = _catalog.build
        monkeypatch.setattr(_catalog, "build", lambda: built.append(1) or real())
        names = _catalog.op_names()
        assert built == [1] and "rmsnorm" in names
    finally:
        _catalog.load.cache_clear()
