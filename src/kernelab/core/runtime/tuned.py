"""Tuned launch configurations, looked up at run time by op, device and shape bucket.

The autotuner (``kernelab tune``) stores each winner in the ledger and materialises the
winners as JSON: the user's file ``<cache dir>/tuned.json`` and files shipped in
``kernelab/data/tuned/`` (``kernelab tune --export``), so that users on a known GPU start tuned.
Ops read only these JSON files (the ops layer does not depend on the ledger). An entry is used
only if its kernel source hash and Triton version match the running ones: a stale entry is
ignored and the op falls back to its heuristic.

Off the hot path. The files are read once, on the first lookup, into a table; :func:`reload`
forgets it (the tuner calls it after writing), so a lookup is a hash of the shape bucket and a
dictionary lookup. The kernel source hash is computed once per source text. With no tuned
files at all a lookup returns before hashing anything.

Never trusted. An entry is checked before any launch can use it, and an invalid one is skipped
(the op runs its heuristic) with one :class:`TunedConfigWarning` per file or entry, not per
launch (``warnings.warn``; each message at most once per process). Checked:

* when the files are read: the file is a kernelab tuned-config file of this version (a
  truncated or foreign file is skipped whole); each entry has the keys device, op,
  kernel_hash, triton, dtype, bucket as non-empty strings (dtype names a torch dtype, bucket
  reads ``name=size,...``, sizes of at most 18 ASCII digits) and a ``config`` dict of field
  name → int or string, where ``block_*`` fields are powers of two from 1 to 2**20 (Triton's
  largest block), ``num_warps`` a power of two from 1 to 32, and every other int
  (``num_stages``, ``group_m``, ``split_k``...) positive; an entry these checks cannot even
  read is skipped like any other;
* on the first launch it would serve (then remembered per entry and config class): the
  fields construct the op's config class; and if the op is registered with a tuning space,
  the config is one of the space's configs for the entry's bucket (its dims, the batch size at
  the bucket's upper bound: for the row-wise ops the space depends only on the other sizes,
  and the GEMM spaces only widen with M, so any winner the tuner stored for a shape of the
  bucket passes). That also checks string fields such as a GEMM's ``kind``. Where no space can
  be computed for the bucket (no tuning space, an unregistered op, a space that needs shape
  options the bucket does not record), a string field must equal the class's default.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
import warnings
from pathlib import Path

import orjson

from kernelab import _flags

FORMAT = "kernelab-tuned-configs"
VERSION = 1

#: The keys of an entry that locate it (all strings), besides its ``config``.
KEY_FIELDS = ("device", "op", "kernel_hash", "triton", "dtype", "bucket")
#: Device types whose launches look tuned configs up (tests add "cpu" to run the lookup path).
DEVICE_TYPES = frozenset({"cuda"})
#: Triton's largest number of elements in a block (a bound for every ``block_*`` field).
MAX_BLOCK = 1 << 20
MAX_WARPS = 32


class TunedConfigWarning(UserWarning):
    """A tuned-config file or entry was skipped: the op runs its default heuristic."""


@dataclasses.dataclass
class _Entry:
    fields: dict
    where: str  # "<path> entry <i>", for warnings
    dims: dict  # the bucket, parsed
    checked: dict = dataclasses.field(default_factory=dict)  # config class -> config or False


_lock = threading.RLock()
_table: dict[tuple, _Entry] | None = None
_warned: set[str] = set()


# --- keys ----------------------------------------------------------------------------------------


def kernel_hash(kernels) -> str:
    """A hash of the kernels' source (what decides whether a tuned config still applies);
    computed once per source text."""
    return _source_hash(tuple(getattr(k, "src", "") for k in kernels))


@functools.lru_cache(maxsize=256)
def _source_hash(sources: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for src in sources:
        h.update(src.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.cache
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


#: Most digits of a size in a bucket (sizes are int64 in every launch).
MAX_SIZE_DIGITS = 18


def _parse_bucket(text: str) -> dict | None:
    """``name=size,...`` as a dict, or None: sizes in ASCII digits only ("²" is a Unicode digit
    that ``int`` refuses), at most MAX_SIZE_DIGITS of them (``int`` refuses 4300 and more)."""
    dims = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.isidentifier():
            return None
        if not (value.isascii() and value.isdigit() and len(value) <= MAX_SIZE_DIGITS):
            return None
        dims[name] = int(value)
    return dims


def entry_key(device_key: str, op: str, khash: str, version: str, dtype: str, bkt: str):
    return (device_key, op, khash, version, dtype, bkt)


# --- files ---------------------------------------------------------------------------------------


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


def write_file(path: Path, entries: list[dict]) -> None:
    """Write entries atomically (a reader never sees half a file). Lookups in this process see
    them after :func:`reload`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": FORMAT,
        "version": VERSION,
        "entries": sorted(entries, key=lambda e: (e["device"], e["op"], e["dtype"], e["bucket"])),
    }
    tmp = path.with_suffix(f".tmp{threading.get_ident()}")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    tmp.replace(path)


def _warn(message: str) -> None:
    if message in _warned:
        return
    _warned.add(message)
    warnings.warn(message, TunedConfigWarning, stacklevel=3)


def _pow2(v: int, top: int) -> bool:
    return 1 <= v <= top and v & (v - 1) == 0


def field_problem(name, value) -> str | None:
    """Why a config field cannot be launched (None if it can, as far as its name tells)."""
    if not isinstance(name, str) or not name.isidentifier():
        return f"field name {name!r} is not an identifier"
    if isinstance(value, str):
        return None if value else f"{name} is an empty string"
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name}={value!r} is a {type(value).__name__}, not an int or a string"
    if name.startswith("block_") and not _pow2(value, MAX_BLOCK):
        return f"{name}={value} is not a power of two from 1 to {MAX_BLOCK}"
    if name == "num_warps" and not _pow2(value, MAX_WARPS):
        return f"{name}={value} is not a power of two from 1 to {MAX_WARPS}"
    if value < 1:
        return f"{name}={value} is not a positive int"
    return None


def entry_problem(e: dict) -> str | None:
    """Why an entry of a tuned-config file cannot be used (None if it can be looked up)."""
    import torch

    for k in KEY_FIELDS:
        if k not in e:
            return f"no {k!r}"
        if not isinstance(e[k], str) or not e[k]:
            return f"{k} is {e[k]!r}, not a non-empty string"
    if not isinstance(getattr(torch, e["dtype"], None), torch.dtype):
        return f"dtype {e['dtype']!r} is not a torch dtype"
    if _parse_bucket(e["bucket"]) is None:
        shown = e["bucket"] if len(e["bucket"]) <= 80 else e["bucket"][:77] + "..."
        return (
            f"bucket {shown!r} does not read name=size,... (sizes of at most "
            f"{MAX_SIZE_DIGITS} ASCII digits)"
        )
    config = e.get("config")
    if not isinstance(config, dict):
        return f"config is {type(config).__name__}, not a dict"
    for name, value in config.items():
        problem = field_problem(name, value)
        if problem:
            return problem
    return None


def _read_all() -> dict[tuple, _Entry]:
    table: dict[tuple, _Entry] = {}
    for path in _files():
        if not path.is_file():
            continue
        try:
            entries = read_file(path)
        except (ValueError, OSError) as exc:
            # a broken file never breaks an op: every launch falls back to its heuristic
            _warn(f"{exc}; its tuned configs are ignored")
            continue
        for i, e in enumerate(entries):
            where = f"{path} entry {i}"
            try:
                problem = entry_problem(e)
            except Exception as exc:  # whatever an entry holds, it never breaks another one
                problem = f"unreadable ({type(exc).__name__}: {str(exc)[:80]})"
            if problem:
                _warn(f"tuned configs: {where} skipped: {problem}")
                continue
            key = entry_key(*(e[k] for k in KEY_FIELDS))
            table[key] = _Entry(dict(e["config"]), where, _parse_bucket(e["bucket"]))
    return table


def _loaded() -> dict[tuple, _Entry]:
    global _table
    table = _table
    if table is None:
        with _lock:
            if _table is None:
                _table = _read_all()
            table = _table
    return table


def reload() -> None:
    """Forget the table read from the files: the next lookup reads them again (the tuner
    calls this after writing a file)."""
    global _table
    with _lock:
        _table = None


# --- lookup --------------------------------------------------------------------------------------


def _find(op, kernels, dims, batch_dim, dtype: str, device_key: str) -> _Entry | None:
    table = _table if _table is not None else _loaded()
    if not table:
        return None
    key = entry_key(
        device_key, op, kernel_hash(kernels), triton_version(), dtype, bucket(dims, batch_dim)
    )
    return table.get(key)


def lookup(op: str, kernels, dims, batch_dim, dtype: str, device_key: str) -> dict | None:
    """The tuned config fields for this launch (a copy), or None (use the heuristic). The
    fields passed the checks made when the files were read; :func:`config_for` makes the rest."""
    entry = _find(op, kernels, dims, batch_dim, dtype, device_key)
    return None if entry is None else dict(entry.fields)


def _space(op: str, dims: dict, batch_dim, dtype: str):
    """The op's tuning space for a bucket, or None where none can be computed."""
    import torch

    from kernelab.core.op import get
    from kernelab.core.shape import Shape

    try:
        declared = get(op)
    except ValueError:  # not a registered op
        return None
    if declared.tuning_space is None:
        return None
    try:
        return list(
            declared.tuning_space(Shape("tuned", dims, batch_dim=batch_dim), getattr(torch, dtype))
        )
    except Exception:  # the space needs what a bucket does not record (shape options)
        return None


def _check(op: str, entry: _Entry, cls, batch_dim, dtype: str):
    """The config instance for ``entry``, or False (warned) if it must not be launched."""
    try:
        config = cls(**entry.fields)
    except Exception as exc:  # a config class's own checks may raise anything
        _warn(f"tuned configs: {entry.where} skipped: not a {cls.__name__} ({exc})")
        return False
    space = _space(op, entry.dims, batch_dim, dtype)
    if space is not None and any(isinstance(c, cls) for c in space):
        if config not in space:
            _warn(
                f"tuned configs: {entry.where} skipped: {config} is not in {op}'s tuning "
                f"space for {bucket(entry.dims, None)} {dtype}"
            )
            return False
        return config
    defaults = (
        {f.name: f.default for f in dataclasses.fields(cls)}
        if dataclasses.is_dataclass(cls)
        else {}
    )
    for name, value in entry.fields.items():
        if isinstance(value, str) and value != defaults.get(name):
            _warn(
                f"tuned configs: {entry.where} skipped: {name}={value!r} cannot be checked "
                f"against a tuning space (only the default {defaults.get(name)!r} is trusted)"
            )
            return False
    return config


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
    """A tuned instance of the (frozen) config dataclass ``cls`` for this launch on a GPU, or
    None: no tuned entry, or one that failed the checks (see the module docstring)."""
    if getattr(device, "type", "cpu") not in DEVICE_TYPES:
        return None
    if _table is not None and not _table:
        return None  # no tuned configs at all: nothing to hash
    dtype = str(dtype).removeprefix("torch.")
    entry = _find(op, kernels, dims, batch_dim, dtype, device_key(device))
    if entry is None:
        return None
    config = entry.checked.get(cls)
    if config is None:
        with _lock:
            config = entry.checked.get(cls)
            if config is None:
                config = entry.checked[cls] = _check(op, entry, cls, batch_dim, dtype)
    return config or None
