"""Tuned configs: read once, hashed once, every entry checked; a bad entry or file is skipped with
one warning and the op runs its default config; a good entry is what the launch uses.

The lookup path runs only for CUDA launches: here a fake device key and ``DEVICE_TYPES`` with
"cpu" let it run on CPU tensors, and the norm launches go through the interpreter."""

import types
import warnings

import orjson
import pytest
import torch

from kernelab.core.runtime import tuned as _tuned
from kernelab.core.runtime.launch import RowConfig
from kernelab.ops.matmul.gemm import GEMM, GemmConfig
from kernelab.ops.norm import _common as _norm
from kernelab.ops.norm.rmsnorm import RMSNORM, rmsnorm_ref, rmsnorm_triton
from kernelab.tune import TuneResult, store_winner

CPU = torch.device("cpu")
DIMS = {"rows": 5, "cols": 96}
DEVICE = "fake-gpu|1|1GB"
#: In rmsnorm's tuning space for 96 columns, and not the default (RowConfig(1, 128, 1) here).
TUNED = RowConfig(4, 128, 2)


@pytest.fixture
def tuned_file(tmp_path, monkeypatch):
    """The path of the only tuned-config file; lookups run on CPU under a fake device key."""
    path = tmp_path / "tuned.json"
    monkeypatch.setattr(_tuned, "_files", lambda: [path])
    monkeypatch.setattr(_tuned, "_table", None)
    monkeypatch.setattr(_tuned, "_warned", set())
    monkeypatch.setattr(_tuned, "DEVICE_TYPES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(_tuned, "device_key", lambda device: DEVICE)
    return path


def _entry(**changes):
    e = {
        "device": DEVICE,
        "op": "rmsnorm",
        "kernel_hash": _tuned.kernel_hash(RMSNORM.kernels),
        "triton": _tuned.triton_version(),
        "dtype": "float32",
        "bucket": _tuned.bucket(DIMS, "rows"),
        "config": {"block_m": 4, "block_n": 128, "num_warps": 2, "num_stages": 1},
    }
    e.update(changes)
    return e


def _write(path, *entries):
    path.write_bytes(orjson.dumps({"format": _tuned.FORMAT, "version": 1, "entries": entries}))


def _config_for(dims=DIMS):
    return _tuned.config_for(
        "rmsnorm", RMSNORM.kernels, RowConfig, dims, "rows", torch.float32, CPU
    )


def _launched_config(monkeypatch):
    """Run rmsnorm through the interpreter (checked against the reference); the config its
    launch was built with."""
    seen = []
    real = _norm.KernelCall

    def spy(*args, **kwargs):
        seen.append(kwargs["config"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_norm, "KernelCall", spy)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(DIMS["rows"], DIMS["cols"], generator=gen)
    w = torch.randn(DIMS["cols"], generator=gen)
    torch.testing.assert_close(rmsnorm_triton(x, w), rmsnorm_ref(x, w))
    monkeypatch.setattr(_norm, "KernelCall", real)
    (config,) = seen
    return config


def _tuned_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, _tuned.TunedConfigWarning)]


def test_a_valid_entry_is_what_the_launch_uses(tuned_file, monkeypatch):
    _write(tuned_file, _entry())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _config_for() == TUNED
        assert _config_for({"rows": 7, "cols": 96}) == TUNED  # same bucket (8 rows)
        assert _config_for({"rows": 9, "cols": 96}) is None  # another bucket
        assert _launched_config(monkeypatch) == TUNED
    assert _tuned_warnings(record) == []
    # without a tuned file, the same launch takes the heuristic's config
    tuned_file.unlink()
    _tuned.reload()
    assert _launched_config(monkeypatch) == RowConfig.default_for(5, 96, CPU) != TUNED


TRUNCATED = orjson.dumps({"format": _tuned.FORMAT, "version": 1, "entries": [_entry()]})[:-20]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ([_entry(config={"block_m": -4, "block_n": 128, "num_warps": 2})], "block_m=-4"),
        ([_entry(config={"block_m": 4, "block_n": "128", "num_warps": 2})], "block_n"),
        ([_entry(config={"block_m": 3, "block_n": 128, "num_warps": 2})], "power of two"),
        ([_entry(config={"block_m": 4, "block_n": 128, "num_warps": 0})], "num_warps=0"),
        ([_entry(config={"block_m": 4, "block_n": 128, "num_warps": True})], "bool"),
        ([_entry(config={"block_m": 4, "block_n": 128, "num_warps": 2, "num_stages": 0})], "0"),
        ([_entry(config=[4, 128, 2])], "not a dict"),
        ([_entry(bucket=["cols=96", "rows=8"])], "bucket"),
        ([_entry(bucket="cols:96")], "bucket"),
        # a Unicode digit and a 5000-digit size: int() refuses both (ValueError)
        ([_entry(bucket="cols=²,rows=8")], "bucket 'cols=²,rows=8'"),
        ([_entry(bucket="cols=" + "9" * 5000 + ",rows=8")], "18 ASCII digits"),
        ([_entry(dtype="float33")], "dtype"),
        ([{k: v for k, v in _entry().items() if k != "triton"}], "'triton'"),
        # constructs no RowConfig
        ([_entry(config={"block_m": 4, "block_n": 128, "num_warps": 2, "tile": 8})], "RowConfig"),
        ([_entry(config={"block_m": 4})], "RowConfig"),
        # a power of two, but outside rmsnorm's tuning space (1 value per thread)
        ([_entry(config={"block_m": 4, "block_n": 128, "num_warps": 16})], "tuning space"),
        (TRUNCATED, "not valid JSON"),
        (b"[1, 2]", "not a kernelab tuned-config file"),
        (b'{"format": "kernelab-tuned-configs", "version": 2, "entries": []}', "version 2"),
        (b'{"format": "kernelab-tuned-configs", "version": 1, "entries": [7]}', "no list"),
    ],
)
def test_a_bad_entry_or_file_is_skipped_with_one_warning(tuned_file, monkeypatch, content, says):
    if isinstance(content, bytes):
        tuned_file.write_bytes(content)
    else:
        _write(tuned_file, *content)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            assert _config_for() is None
        assert _launched_config(monkeypatch) == RowConfig.default_for(5, 96, CPU)
        assert _launched_config(monkeypatch) == RowConfig.default_for(5, 96, CPU)
        _tuned.reload()  # read again (after a tuner run): the same problem is not told twice
        assert _config_for() is None
    (message,) = _tuned_warnings(record)  # one warning, not one per launch
    assert says in message and str(tuned_file) in message


@pytest.mark.parametrize("bucket", ["M=²,N=64,K=64", "K=64,M=16,N=" + "7" * 5000])
def test_a_bad_bucket_of_one_op_breaks_no_launch_of_another(tuned_file, monkeypatch, bucket):
    _write(tuned_file, _entry(op="gemm", bucket=bucket), _entry())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _launched_config(monkeypatch) == TUNED
    assert len(_tuned_warnings(record)) == 1


def test_good_entries_beside_a_bad_one_still_serve(tuned_file):
    bad = _entry(bucket=_tuned.bucket({"rows": 9, "cols": 96}, "rows"))
    bad["config"] = {"block_m": -1, "block_n": 128, "num_warps": 2}
    _write(tuned_file, bad, _entry())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _config_for() == TUNED
        assert _config_for({"rows": 9, "cols": 96}) is None
    assert len(_tuned_warnings(record)) == 1


def test_string_fields_are_checked_against_the_tuning_space(tuned_file):
    dims = {"M": 16, "N": 64, "K": 64}
    space = GemmConfig.tuning_space(16, 64, 64, torch.bfloat16)
    good = next(c for c in space if c.kind == "persistent")
    fields = {f: getattr(good, f) for f in good.__dataclass_fields__}

    def entry(op, **changes):
        return _entry(
            op=op,
            kernel_hash=_tuned.kernel_hash(GEMM.kernels),
            dtype="bfloat16",
            bucket=_tuned.bucket(dims, "M"),
            config={**fields, **changes},
        )

    def config_for(op):
        return _tuned.config_for(op, GEMM.kernels, GemmConfig, dims, "M", torch.bfloat16, CPU)

    _write(tuned_file, entry("gemm"))
    assert config_for("gemm") == good
    _write(tuned_file, entry("gemm", kind="warp-specialized"))
    _tuned.reload()
    with pytest.warns(_tuned.TunedConfigWarning, match="tuning space"):
        assert config_for("gemm") is None
    # an op the registry does not know: no space to check a string against but the default
    _write(tuned_file, entry("my_gemm"))
    _tuned.reload()
    with pytest.warns(_tuned.TunedConfigWarning, match="kind='persistent' cannot be checked"):
        assert config_for("my_gemm") is None
    _write(tuned_file, entry("my_gemm", kind="tiled"))
    _tuned.reload()
    assert config_for("my_gemm").kind == "tiled"


def test_the_source_is_hashed_once_and_the_files_read_once(tuned_file, monkeypatch):
    _write(tuned_file, _entry())
    counts = {"sha256": 0, "files": 0, "read": 0}
    real_sha, real_files, real_read = _tuned.hashlib.sha256, _tuned._files, _tuned.read_file

    def sha256(*args):
        counts["sha256"] += 1
        return real_sha(*args)

    def files():
        counts["files"] += 1
        return real_files()

    def read_file(path):
        counts["read"] += 1
        return real_read(path)

    monkeypatch.setattr(_tuned, "hashlib", types.SimpleNamespace(sha256=sha256))
    monkeypatch.setattr(_tuned, "_files", files)
    monkeypatch.setattr(_tuned, "read_file", read_file)
    _tuned._source_hash.cache_clear()
    for rows in range(1, 60):
        _config_for({"rows": rows, "cols": 96})
        _tuned.lookup("rmsnorm", RMSNORM.kernels, DIMS, "rows", "float32", DEVICE)
    assert _config_for() == TUNED
    assert counts == {"sha256": 1, "files": 1, "read": 1}
    _tuned.reload()  # what the tuner calls after writing: read again, the hash is kept
    assert _config_for() == TUNED
    assert counts == {"sha256": 1, "files": 2, "read": 2}


def test_without_tuned_files_a_lookup_hashes_nothing(tuned_file, monkeypatch):
    monkeypatch.setattr(_tuned, "kernel_hash", lambda kernels: pytest.fail("hashed"))
    assert _config_for() is None
    assert _config_for() is None


def test_the_tuner_s_fresh_winner_is_seen_without_a_restart(tuned_file):
    assert _config_for() is None  # the (empty) table is loaded
    shape = RMSNORM.shapes("representative")[0]
    shape = type(shape)("t", DIMS, {"residual": False}, batch_dim="rows")
    result = TuneResult("rmsnorm", shape, "float32", "sm_90", 1, winner=TUNED)
    store_winner(RMSNORM, path=tuned_file)(result, DEVICE)
    assert _config_for() == TUNED
