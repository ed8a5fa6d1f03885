"""Tuned launch configurations, looked up at run time by op, device and shape bucket.

The autotuner (``kernelab tune``) stores each winner in the ledger and materialises the
winners as JSON: the user's file ``<cache dir>/tuned.json`` and files shipped in
``kernelab/data/tuned/`` (``kernelab tune --export``), so that users on a known GPU start tuned.
Ops read only these JSON files (a dictionary lookup per launch; the ops layer does not depend
on the ledger). An entry is used only if its kernel source hash and Triton version match the
running ones: a stale entry is ignored and the op falls back to its heuristic.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import orjson

from kernelab import _flags

FORMAT = "kernelab-tuned-configs"
VERSION = 1

_lock = threading.Lock()
_table: dict[tuple, dict] | None = None
_sources: list[tuple[Path, float]] = []


def kernel_hash(kernels) -> str:
    """A hash of the kernels' source (what decides whether a tuned config still applies)."""
    h = hashlib.sha256()
    for k in kernels:
        h.update(getattr(k, "src", "").encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def triton_version() -> str:
    import triton

    return triton.__version__


def bucket(dims, batch_dim: str | None) -> str:
    """Shape bucket: the batch size rounded up to a power of two, other sizes exact."""
    parts = []
    for name, value in sorted(dims.items()):
        if name == batch_dim and value > 1:
            value = 1 << (int(value) - 1).bit_length()
        parts.append(f"{name}={value}")
    return ",".join(parts)


def entry_key(device_key: str, op: str, khash: str, version: str, dtype: str, bkt: str):
    return (device_key, op, khash, version, dtype, bkt)


def _files() -> list[Path]:
    shipped = sorted((Path(__file__).resolve().parent.parent / "data" / "tuned").glob("*.json"))
    return [*shipped, _flags.cache_dir() / "tuned.json"]


def read_file(path: Path) -> list[dict]:
    """Entries of one tuned-config file; a malformed file raises ValueError naming it."""
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"tuned configs: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"tuned configs: {path} is not a kernelab tuned-config file")
    if data.get("version") != VERSION:
        raise ValueError(
            f"tuned configs: {path} has version {data.get('version')!r}, "
            f"this kernelab reads version {VERSION}"
        )
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"tuned configs: {path} has no list of entries")
    return entries


def _load() -> dict[tuple, dict]:
    global _table, _sources
    current = [(p, p.stat().st_mtime) for p in _files() if p.is_file()]
    with _lock:
        if _table is not None and current == _sources:
            return _table
        table: dict[tuple, dict] = {}
        for path, _ in current:
            try:
                entries = read_file(path)
            except (ValueError, OSError):
                continue  # a broken file never breaks an op: it falls back to its heuristic
            for e in entries:
                try:
                    key = entry_key(
                        e["device"], e["op"], e["kernel_hash"], e["triton"], e["dtype"], e["bucket"]
                    )
                except KeyError:
                    continue
                if isinstance(e.get("config"), dict):
                    table[key] = e["config"]
        _table, _sources = table, current
        return table


def lookup(op: str, kernels, dims, batch_dim, dtype: str, device_key: str) -> dict | None:
    """The tuned config fields for this launch, or None (use the heuristic)."""
    table = _load()
    if not table:
        return None
    key = entry_key(
        device_key, op, kernel_hash(kernels), triton_version(), dtype, bucket(dims, batch_dim)
    )
    return table.get(key)


def write_file(path: Path, entries: list[dict]) -> None:
    """Write entries atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": FORMAT,
        "version": VERSION,
        "entries": sorted(entries, key=lambda e: (e["device"], e["op"], e["dtype"], e["bucket"])),
    }
    tmp = path.with_suffix(f".tmp{threading.get_ident()}")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    tmp.replace(path)


_device_keys: dict[tuple[str, int | None], str] = {}


def device_key(device) -> str:
    import torch

    from kernelab.hardware import detect

    dev = torch.device(device)
    k = (dev.type, dev.index)
    if k not in _device_keys:
        _device_keys[k] = detect(str(dev)).key
    return _device_keys[k]


def config_for(op: str, kernels, cls, dims, batch_dim, dtype, device):
    """A tuned instance of the config dataclass ``cls`` for this launch on a GPU, or None."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    fields = lookup(
        op, kernels, dims, batch_dim, str(dtype).removeprefix("torch."), device_key(device)
    )
    if fields is None:
        return None
    try:
        return cls(**fields)
    except TypeError:
        return None  # written by another version of the config: the heuristic serves
