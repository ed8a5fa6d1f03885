"""A sweep's spec: what to run, from command-line flags or a TOML / JSON file.

Files are parsed (``tomllib``, orjson), never executed. Validation is strict and happens before
anything runs: an unknown key, a value of the wrong type, an unknown op, variant, dtype, shape
set or target is a :class:`SpecError` naming the key (``spec.targets[1]: unknown ...``).

Keys (all optional except ``kind``):

``kind``        "inspect", "verify", "bench", "tune" or "floors" (bench's speed-of-light floor
                of every shape on a GPU type, from its datasheet: no timing, CPU only)
``ops``         op names (default: every registered op)
``variants``    verify, bench: variant names (default: every variant that runs on the target)
``shape_sets``  named shape sets (default: ["representative"])
``shapes``      inspect, bench, tune, floors: keep shapes whose label contains one of these
``sizes``       inspect, bench, tune, floors: explicit sizes instead, each "rows=4096,cols=8192"
                or a table {rows = 4096, cols = 8192} naming every dim of the op (its options,
                a norm's residual say, come from the shape set's shapes); not with ``shapes``
``dtypes``      dtype names (default: every dtype the op takes)
``configs``     inspect, tune: "default", "space" (every config of the tuning space), or a
                list of tables of config fields, each selecting the space's configs whose
                fields equal the given values (``[{BLOCK_M = 64, num_warps = 4}]``)
``targets``     inspect, tune: compile targets (sm_80, sm_90, sm_100, gfx942, ...), tune also
                GPU types (H100, ...: the space searched by timing on one GPU of that type);
                verify, bench: device types ("cpu", or a GPU type: H100, H200, A100, B200,
                MI300X), each GPU task requesting one GPU of that type; floors: GPU types
``seeds``       verify: input seeds, one task per seed (default: [0])
``trials``      verify: trials per case (default: verify's)
``max_rows``    bench: cap of the batch dimension (default: bench's)
``mode``        bench: "auto", "cold" or "hot"
``retries``     how often a task whose worker died is tried again (default: 2)

A sweep may have at most :data:`DEFAULT_MAX_TASKS` tasks unless told otherwise (``--max-tasks``,
``KERNELAB_SWEEP_MAX_TASKS``): the count is checked before any task is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

try:
    import tomllib
except ImportError:  # Python 3.10: JSON specs only
    tomllib = None

KINDS = ("inspect", "verify", "bench", "tune", "floors")
DEFAULT_RETRIES = 2
MAX_RETRIES = 20

#: The most tasks a sweep may have unless raised (``--max-tasks``, KERNELAB_SWEEP_MAX_TASKS).
#: Each task costs about 1 KiB and 0.1 ms to make before anything runs; every op's whole
#: inspect space at sm_90 is about 167,000 tasks (16 s to expand on a 2-core VM).
DEFAULT_MAX_TASKS = 500_000

#: A spec file's largest size: a spec names ops, shapes and configs (a few KiB); a file far
#: larger is a mistake (or a data file given by accident), refused before it is read.
MAX_SPEC_BYTES = 1 << 20
#: How deeply a spec file's tables and arrays may nest. The keys need 3 levels (the file's
#: table, ``configs``, one config's table); the parsers recurse once per level, and a file of
#: nested brackets would otherwise end in a RecursionError.
MAX_DEPTH = 10

#: GPU device types a verify or bench task may ask for (the Ray custom resource ``gpu:<type>``).
GPU_TYPES = ("A100", "H100", "H200", "B200", "MI300X")

DTYPES = ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "int8", "int32")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}

_KEYS = (
    "kind",
    "ops",
    "variants",
    "shape_sets",
    "shapes",
    "sizes",
    "dtypes",
    "configs",
    "targets",
    "seeds",
    "trials",
    "max_rows",
    "mode",
    "retries",
)
#: Keys that only some kinds take.
_ONLY = {
    "variants": ("verify", "bench"),
    "shapes": ("inspect", "bench", "tune", "floors"),
    "sizes": ("inspect", "bench", "tune", "floors"),
    "configs": ("inspect", "tune"),
    "seeds": ("verify",),
    "trials": ("verify",),
    "max_rows": ("bench",),
    "mode": ("bench",),
}


def _sizes(raw, ops, shape_sets) -> tuple:
    """``spec.sizes``: a list of "name=value,..." strings or tables of positive integers, each
    naming every dim of every op of the sweep."""
    from kernelab.bench.runner import explicit_shapes, parse_dims

    if not isinstance(raw, list) or not raw:
        raise SpecError(f"spec.sizes: expected a non-empty list, got {raw!r:.80}")
    out = []
    for i, item in enumerate(raw):
        where = f"spec.sizes[{i}]"
        if isinstance(item, str):
            try:
                dims = parse_dims(item, where)
            except ValueError as exc:
                raise SpecError(str(exc)) from None
        elif isinstance(item, Mapping) and item:
            dims = {}
            for k, v in item.items():
                if not isinstance(k, str) or not k.isidentifier():
                    raise SpecError(f"{where}: expected dim names, got {k!r}")
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SpecError(f"{where}.{k}: expected a positive integer, got {v!r}")
                dims[k] = v
        else:
            raise SpecError(f"{where}: expected 'name=value,...' or a table, got {item!r:.80}")
        for op in ops:
            for shape_set in shape_sets:
                try:
                    explicit_shapes(op, [dims], shape_set)
                except ValueError as exc:
                    raise SpecError(f"{where}: {str(exc).removeprefix('--shape: ')}") from None
        out.append(tuple(dims.items()))
    return tuple(out)


class SpecError(ValueError):
    """A spec that cannot run; the message names the key."""


def max_tasks(value: int | None = None) -> int:
    """The task limit: ``value`` (an option) if given, else KERNELAB_SWEEP_MAX_TASKS, else
    :data:`DEFAULT_MAX_TASKS`."""
    from kernelab import _flags

    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"max_tasks: expected a positive integer, got {value!r}")
        return value
    return _flags.sweep_max_tasks() or DEFAULT_MAX_TASKS


def too_many(what: str, limit: int) -> SpecError:
    return SpecError(
        f"{what}, more than the limit of {limit:,} tasks per sweep (raise it with "
        "--max-tasks N or KERNELAB_SWEEP_MAX_TASKS=N, or split the sweep)"
    )


@dataclass(frozen=True)
class SweepSpec:
    """A validated spec (tuples of names; None where the default applies)."""

    kind: str
    ops: tuple[str, ...]
    variants: tuple[str, ...] | None = None
    shape_sets: tuple[str, ...] = ("representative",)
    shapes: tuple[str, ...] | None = None
    #: explicit sizes, each a tuple of (dim, value) pairs
    sizes: tuple[tuple[tuple[str, int], ...], ...] | None = None
    dtypes: tuple[str, ...] | None = None
    configs: str | tuple[tuple[tuple[str, object], ...], ...] = "default"
    targets: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    trials: int | None = None
    max_rows: int | None = None
    mode: str = "auto"
    retries: int = DEFAULT_RETRIES

    def as_dict(self) -> dict:
        """The spec as plain JSON values, the keys its kind takes (what the ledger stores and
        the sweep id hashes; ``validate`` gives the same spec back)."""
        out = asdict(self)
        if not isinstance(self.configs, str):
            out["configs"] = [dict(c) for c in self.configs]
        if self.sizes is not None:
            out["sizes"] = [dict(d) for d in self.sizes]
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in out.items()
            if v is not None and self.kind in _ONLY.get(k, (self.kind,))
        }


def _names(key: str, value, allowed=None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple) or not value:
        raise SpecError(f"spec.{key}: expected a non-empty list of strings, got {value!r}")
    out = []
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v.strip():
            raise SpecError(f"spec.{key}[{i}]: expected a non-empty string, got {v!r}")
        v = v.strip()
        if allowed is not None and v not in allowed:
            raise SpecError(
                f"spec.{key}[{i}]: unknown {key[:-1].replace('_', ' ')} {v!r} "
                f"(expected one of: {', '.join(allowed)})"
            )
        out.append(v)
    return tuple(dict.fromkeys(out))


def _int(key: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"spec.{key}: expected an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
        raise SpecError(f"spec.{key}: expected an integer {bound}, got {value}")
    return value


def _configs(value):
    if value in ("default", "space"):
        return value
    if isinstance(value, str):
        raise SpecError(
            f"spec.configs: expected 'default', 'space' or a list of tables, got {value!r}"
        )
    if not isinstance(value, list | tuple) or not value:
        raise SpecError(
            f"spec.configs: expected 'default', 'space' or a non-empty list of tables, "
            f"got {value!r}"
        )
    out = []
    for i, c in enumerate(value):
        if not isinstance(c, Mapping) or not c:
            raise SpecError(f"spec.configs[{i}]: expected a table of config fields, got {c!r}")
        fields = []
        for k, v in c.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | str):
                raise SpecError(
                    f"spec.configs[{i}].{k}: expected an integer or a string, got {v!r}"
                )
            fields.append((k, v))
        out.append(tuple(sorted(fields)))
    return tuple(out)


def validate(raw: Mapping, limit: int | None = None) -> SweepSpec:
    """A :class:`SweepSpec` from plain values (a parsed file, flags); :class:`SpecError` names
    the first bad key. Ops, variants, dtypes, shape sets and targets are checked against what
    is registered; a list of seeds or sizes that alone makes more tasks than ``limit``
    (:func:`max_tasks`) is refused before its entries are checked."""
    from kernelab import ops as registry
    from kernelab.inspect.targets import TARGETS

    if not isinstance(raw, Mapping):
        raise SpecError(f"spec: expected a table of keys, got {type(raw).__name__}")
    cap = max_tasks(limit)
    for key in ("seeds", "sizes"):  # each entry is a task or more of every op
        if isinstance(raw.get(key), list | tuple) and len(raw[key]) > cap:
            raise too_many(f"spec.{key}: {len(raw[key]):,} {key} make at least as many tasks", cap)
    unknown = [k for k in raw if k not in _KEYS]
    if unknown:
        raise SpecError(f"spec.{unknown[0]}: unknown key (expected some of: {', '.join(_KEYS)})")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise SpecError(f"spec.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    for key, kinds in _ONLY.items():
        if raw.get(key) is not None and kind not in kinds:
            raise SpecError(f"spec.{key}: not a key of a {kind} sweep (only {', '.join(kinds)})")
    known_ops = [o.name for o in registry.all_ops()]
    ops = _names("ops", raw["ops"], known_ops) if raw.get("ops") is not None else ()
    selected = [registry.get(n) for n in ops] if ops else registry.all_ops()
    out: dict = {"kind": kind, "ops": tuple(o.name for o in selected)}
    if raw.get("variants") is not None:
        known = sorted({v for o in selected for v in o.variants})
        out["variants"] = _names("variants", raw["variants"], known)
    if raw.get("shape_sets") is not None:
        out["shape_sets"] = _names("shape_sets", raw["shape_sets"])
        for i, name in enumerate(out["shape_sets"]):
            for o in selected:
                try:
                    o.shapes(name)
                except (KeyError, ValueError) as exc:
                    raise SpecError(f"spec.shape_sets[{i}]: {exc}") from None
    if raw.get("shapes") is not None:
        out["shapes"] = _names("shapes", raw["shapes"])
    if raw.get("sizes") is not None:
        if raw.get("shapes") is not None:
            raise SpecError("spec.sizes: give sizes or label filters (spec.shapes), not both")
        out["sizes"] = _sizes(raw["sizes"], selected, out.get("shape_sets", ("representative",)))
    if raw.get("dtypes") is not None:
        names = _names("dtypes", raw["dtypes"])
        dts = []
        for i, n in enumerate(names):
            key = n.lower().removeprefix("torch.")
            key = DTYPE_ALIASES.get(key, key)
            if key not in DTYPES:
                raise SpecError(
                    f"spec.dtypes[{i}]: unknown dtype {n!r} (expected one of: "
                    f"{', '.join(DTYPES)}, or bf16, fp16, fp32)"
                )
            dts.append(key)
        out["dtypes"] = tuple(dict.fromkeys(dts))
    if raw.get("configs") is not None:
        out["configs"] = _configs(raw["configs"])
    compile_targets = kind in ("inspect", "tune")
    allowed = list(TARGETS) if compile_targets else ["cpu", *GPU_TYPES]
    if kind == "tune":  # ranked statically for a compile target, or timed on a GPU type
        allowed += list(GPU_TYPES)
    if kind == "floors":
        allowed = list(GPU_TYPES)
    if raw.get("targets") is None:
        out["targets"] = {"inspect": ("sm_90",), "tune": ("sm_90",), "floors": ("H100",)}.get(
            kind, ("cpu",)
        )
    else:
        out["targets"] = _names("targets", raw["targets"], allowed)
    if raw.get("seeds") is not None:
        seeds = raw["seeds"]
        if not isinstance(seeds, list | tuple) or not seeds:
            raise SpecError(f"spec.seeds: expected a non-empty list of integers, got {seeds!r}")
        out["seeds"] = tuple(
            dict.fromkeys(_int(f"seeds[{i}]", s, 0, 2**63 - 1) for i, s in enumerate(seeds))
        )
    if raw.get("trials") is not None:
        out["trials"] = _int("trials", raw["trials"], 1, 1000)
    if raw.get("max_rows") is not None:
        out["max_rows"] = _int("max_rows", raw["max_rows"], 0)
    if raw.get("mode") is not None:
        if raw["mode"] not in ("auto", "cold", "hot"):
            raise SpecError(f"spec.mode: expected auto, cold or hot, got {raw['mode']!r}")
        out["mode"] = raw["mode"]
    if raw.get("retries") is not None:
        out["retries"] = _int("retries", raw["retries"], 0, MAX_RETRIES)
    return SweepSpec(**out)


def _depth(value, limit: int, level: int = 0) -> int:
    """How many levels of tables and arrays ``value`` is (counting stops past ``limit``)."""
    if not isinstance(value, dict | list):
        return level
    if level >= limit:
        return level + 1
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, limit, level + 1) for v in items), default=level + 1)


def _brackets(data: bytes) -> int:
    """An upper bound of the nesting of ``[`` and ``{`` in ``data`` (strings not told apart):
    cheap, so that a file nested far too deeply never reaches a recursive parser."""
    depth = deepest = 0
    for b in data:
        if b in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D) and depth:
            depth -= 1
    return deepest


def load(path: str | Path) -> dict:
    """The raw table of a spec file: ``.toml`` through tomllib, ``.json`` through orjson. A
    file over :data:`MAX_SPEC_BYTES` or nested deeper than :data:`MAX_DEPTH` is refused."""
    p = Path(path)
    if p.suffix not in (".toml", ".json"):
        raise SpecError(f"spec: expected a .toml or .json file, got {str(p)!r}")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"spec: cannot read {str(p)!r} ({exc.strerror or exc})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(
            f"spec: {str(p)!r} is larger than {MAX_SPEC_BYTES:,} bytes, the limit of a spec file"
        )
    too_deep = SpecError(
        f"spec: {str(p)!r} nests tables and arrays more than {MAX_DEPTH} levels deep, the "
        "limit of a spec file"
    )
    # Brackets inside strings count too, so the bound is loose: only a file far past the
    # limit is refused unparsed; the parsed table is measured exactly below.
    if _brackets(data) > 4 * MAX_DEPTH + 64:
        raise too_deep
    if p.suffix == ".toml" and tomllib is None:
        raise SpecError(f"spec: {str(p)!r}: TOML needs Python 3.11 (tomllib); use JSON")
    try:
        raw = tomllib.loads(data.decode()) if p.suffix == ".toml" else orjson.loads(data)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError, JSONDecodeError
        raise SpecError(f"spec: {str(p)!r} is not valid {p.suffix[1:].upper()} ({exc})") from None
    if _depth(raw, MAX_DEPTH) > MAX_DEPTH:
        raise too_deep
    if not isinstance(raw, dict):
        raise SpecError(f"spec: {str(p)!r} must hold a table of keys, got {type(raw).__name__}")
    return raw


__all__ = [
    "DEFAULT_MAX_TASKS",
    "GPU_TYPES",
    "KINDS",
    "SpecError",
    "SweepSpec",
    "load",
    "max_tasks",
    "validate",
]
