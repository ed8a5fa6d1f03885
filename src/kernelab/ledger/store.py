"""The results ledger: runs with their cases and raw samples, ceilings, and a small cache."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import orjson

from kernelab.ledger._sqlite import LedgerError, now_iso

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_KEY_FIELDS = ("op", "variant", "shape_key", "dtype", "device", "mode")
_RUN_COLS = "seq, id, kind, label, created, device_key, provenance"
_CASE_COLS = (
    "run_id, idx, op, variant, shape_key, shape_label, dtype, device, mode, metrics, flags, "
    "n_samples, samples"
)


def _dumps(value: Any, what: str) -> str:
    try:
        return orjson.dumps(value, option=_JSON_OPTS, default=_jsonable).decode()
    except TypeError as exc:
        raise TypeError(f"{what}: not storable as JSON ({exc})") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def pack_samples(samples: Any, where: str = "samples") -> bytes:
    """Raw per-sample seconds as little-endian float64 bytes."""
    try:
        arr = np.asarray(list(samples) if not hasattr(samples, "__array__") else samples)
        arr = arr.astype("<f8", copy=False).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: expected a sequence of seconds, got {samples!r:.80}") from None
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: expected finite seconds, got NaN or infinity")
    return arr.tobytes()


def unpack_samples(blob: bytes | None) -> list[float]:
    if not blob:
        return []
    return np.frombuffer(blob, dtype="<f8").tolist()


def _case_row(run_id: str, idx: int, case: Mapping) -> tuple:
    where = f"cases[{idx}]"
    if not isinstance(case, Mapping):
        raise TypeError(f"{where}: expected a dict, got {type(case).__name__}")
    values = {}
    for name in _KEY_FIELDS:
        v = case.get(name)
        if not isinstance(v, str) or not v:
            raise ValueError(f"{where}.{name}: expected a non-empty string, got {v!r}")
        values[name] = v
    label = case.get("shape_label") or values["shape_key"]
    metrics = case.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{where}.metrics: expected a dict, got {type(metrics).__name__}")
    flags = list(case.get("flags") or [])
    if not all(isinstance(f, str) for f in flags):
        raise TypeError(f"{where}.flags: expected a list of strings, got {flags!r}")
    blob = pack_samples(case.get("samples") or [], f"{where}.samples")
    return (
        run_id,
        idx,
        values["op"],
        values["variant"],
        values["shape_key"],
        str(label),
        values["dtype"],
        values["device"],
        values["mode"],
        _dumps(dict(metrics), f"{where}.metrics"),
        _dumps(flags, f"{where}.flags"),
        len(blob) // 8,
        blob,
    )


def _run_summary(row: tuple, n_cases: int | None = None) -> dict:
    seq, run_id, kind, label, created, device_key, prov = row
    provenance = orjson.loads(prov) if prov else {}
    device = provenance.get("device") if isinstance(provenance, dict) else None
    out = {
        "id": run_id,
        "seq": seq,
        "kind": kind,
        "label": label,
        "created": created,
        "device_key": device_key,
        "device": device.get("name") if isinstance(device, dict) else None,
        "commit": (provenance.get("git") or {}).get("commit")
        if isinstance(provenance, dict)
        else None,
    }
    if n_cases is not None:
        out["n_cases"] = n_cases
    return out


def _case_dict(row: tuple, samples: bool = True) -> dict:
    (_, idx, op, variant, shape_key, shape_label, dtype, device, mode, metrics, flags, n, blob) = (
        row
    )
    case = {
        "idx": idx,
        "op": op,
        "variant": variant,
        "shape_key": shape_key,
        "shape_label": shape_label,
        "dtype": dtype,
        "device": device,
        "mode": mode,
        "metrics": orjson.loads(metrics),
        "flags": orjson.loads(flags),
        "n_samples": n,
    }
    if samples:
        case["samples"] = unpack_samples(blob)
    return case


def insert_run(
    conn,
    run_id: str,
    kind: str,
    cases: Iterable[Mapping],
    provenance: Mapping,
    label,
    sweep_id=None,
) -> None:
    """The statements of one run and its cases, inside the caller's write transaction."""
    device = provenance.get("device")
    device_key = device.get("key") if isinstance(device, Mapping) else None
    prov_json = _dumps(dict(provenance), "provenance")
    conn.execute(
        "INSERT INTO runs (id, kind, label, created, device_key, provenance, sweep_id) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (run_id, kind, label, now_iso(), device_key, prov_json, sweep_id),
    )
    for idx, case in enumerate(cases):
        conn.execute(
            f"INSERT INTO cases ({_CASE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _case_row(run_id, idx, case),
        )


class Ledger:
    """A results ledger; make one with :func:`kernelab.ledger.open`."""

    def __init__(self, backend):
        self._db = backend
        self.location = backend.location
        #: The schema version of the database (older than SCHEMA_VERSION only when read-only).
        self.version = getattr(backend, "version", None)

    def __repr__(self) -> str:
        return f"Ledger({self.location!r})"

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    # -- runs ------------------------------------------------------------------------------

    def record_run(
        self,
        kind: str,
        cases: Iterable[Mapping],
        provenance: Mapping | None = None,
        label: str | None = None,
    ) -> str:
        """Store a run and all its cases in one transaction; return the run's id.

        ``provenance=None`` records :func:`kernelab.ledger.provenance` of this process.
        ``cases`` may be any iterable; it is consumed inside the transaction, so an exception
        raised while producing or validating a case leaves nothing recorded.
        """
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"kind: expected a non-empty string, got {kind!r}")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label: expected a string or None, got {type(label).__name__}")
        if provenance is None:
            from kernelab.ledger.provenance import provenance as _prov

            provenance = _prov()
        if not isinstance(provenance, Mapping):
            raise TypeError(f"provenance: expected a dict, got {type(provenance).__name__}")
        if isinstance(cases, Mapping | str | bytes):
            raise TypeError("cases: expected an iterable of case dicts")
        run_id = uuid.uuid4().hex[:12]
        self._db.write(lambda conn: insert_run(conn, run_id, kind, cases, provenance, label))
        return run_id

    def _run_row(self, run_id: str) -> tuple | None:
        rows = self._db.query(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,))
        return rows[0] if rows else None

    def resolve(self, ref: str, kind: str | None = None, before: str | None = None) -> str:
        """A run id from ``ref``: "latest", a run id or unique id prefix, or a label.

        A label means the newest run carrying it. ``before`` (a run reference) restricts
        "latest" and labels to runs recorded before that run.
        """
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"run: expected a run id, label or 'latest', got {ref!r}")
        if ref in ("latest", "previous"):
            run = self.latest(kind=kind, before=before)
            if run is None:
                where = f" of kind {kind!r}" if kind else ""
                when = f" before run {before}" if before else ""
                raise ValueError(f"run: no run{where}{when} in ledger {self.location}")
            return run["id"]
        if self._run_row(ref):
            return ref
        if len(ref) >= 4 and all(c in "0123456789abcdef" for c in ref):
            hits = self._db.query("SELECT id FROM runs WHERE id LIKE ?", (ref + "%",))
            if len(hits) == 1:
                return hits[0][0]
            if len(hits) > 1:
                raise ValueError(f"run: id prefix {ref!r} is ambiguous ({len(hits)} runs)")
        run = self.latest(kind=kind, label=ref, before=before)
        if run is not None:
            return run["id"]
        raise ValueError(
            f"run: {ref!r} is neither a run id nor a label in ledger {self.location} "
            "(see `kernelab history` or list_runs())"
        )

    def get_run(self, ref: str, samples: bool = True) -> dict:
        """A run with its provenance and cases (raw samples included unless ``samples=False``)."""
        run_id = self.resolve(ref)
        row = self._run_row(run_id)
        cases = self._db.query(
            f"SELECT {_CASE_COLS} FROM cases WHERE run_id = ? ORDER BY idx", (run_id,)
        )
        run = _run_summary(row, len(cases))
        run["provenance"] = orjson.loads(row[6])
        run["cases"] = [_case_dict(c, samples) for c in cases]
        return run

    def list_runs(
        self, kind: str | None = None, label: str | None = None, limit: int | None = 50
    ) -> list[dict]:
        """Run summaries, newest first."""
        where, params = self._filters(kind=kind, label=label)
        sql = (
            f"SELECT {', '.join('r.' + c.strip() for c in _RUN_COLS.split(','))}, "
            "(SELECT COUNT(*) FROM cases c WHERE c.run_id = r.id) "
            f"FROM runs r{where} ORDER BY r.seq DESC"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_run_summary(r[:7], r[7]) for r in self._db.query(sql, params)]

    def _filters(self, kind=None, label=None, before=None) -> tuple[str, tuple]:
        clauses, params = [], []
        if kind is not None:
            clauses.append("r.kind = ?")
            params.append(kind)
        if label is not None:
            clauses.append("r.label = ?")
            params.append(label)
        if before is not None:
            row = self._run_row(before)
            if row is not None:
                clauses.append("r.seq < ?")
                params.append(row[0])
            else:  # a timestamp
                clauses.append("r.created < ?")
                params.append(str(before))
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        return where, tuple(params)

    def latest(
        self, kind: str | None = "bench", label: str | None = None, before: str | None = None
    ) -> dict | None:
        """The newest run (of ``kind``, with ``label``, recorded before run id or ISO time
        ``before``) as a summary, or None."""
        where, params = self._filters(kind=kind, label=label, before=before)
        cols = ", ".join("r." + c.strip() for c in _RUN_COLS.split(","))
        rows = self._db.query(
            f"SELECT {cols} FROM runs r{where} ORDER BY r.seq DESC LIMIT 1", params
        )
        return _run_summary(rows[0]) if rows else None

    def history(
        self,
        op: str,
        variant: str | None = None,
        shape_key: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        mode: str | None = None,
        limit: int | None = None,
        samples: bool = False,
    ) -> list[tuple[dict, dict]]:
        """Every stored case of ``op`` (narrowed by the other fields), oldest first, as
        ``(run summary, case)`` pairs."""
        clauses, params = ["c.op = ?"], [op]
        for name, value in (
            ("variant", variant),
            ("shape_key", shape_key),
            ("dtype", dtype),
            ("device", device),
            ("mode", mode),
        ):
            if value is not None:
                clauses.append(f"c.{name} = ?")
                params.append(value)
        run_cols = ", ".join("r." + c.strip() for c in _RUN_COLS.split(","))
        case_cols = ", ".join("c." + c.strip() for c in _CASE_COLS.split(","))
        sql = (
            f"SELECT {run_cols}, {case_cols} FROM cases c JOIN runs r ON r.id = c.run_id "
            f"WHERE {' AND '.join(clauses)} ORDER BY r.seq DESC, c.idx"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._db.query(sql, tuple(params))
        out = [(_run_summary(r[:7]), _case_dict(r[7:], samples)) for r in rows]
        out.reverse()
        return out

    def count_runs(self, kind: str | None = None) -> int:
        where, params = self._filters(kind=kind)
        return self._db.query(f"SELECT COUNT(*) FROM runs r{where}", params)[0][0]

    # -- ceilings --------------------------------------------------------------------------

    def put_ceiling(self, device_key: str, name: str, value: float, unit: str, source: str):
        """Store (or replace) a measured ceiling of a device, e.g. ``copy_gbps``."""
        for arg, v in (("device_key", device_key), ("name", name), ("unit", unit)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{arg}: expected a non-empty string, got {v!r}")
        if not isinstance(source, str):
            raise TypeError(f"source: expected a string, got {type(source).__name__}")
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"value: expected a number, got {value!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"value: expected a positive finite number, got {value!r}")
        self._db.write(
            lambda conn: conn.execute(
                "INSERT INTO ceilings (device_key, name, value, unit, source, measured) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (device_key, name) DO UPDATE SET "
                "value = excluded.value, unit = excluded.unit, source = excluded.source, "
                "measured = excluded.measured",
                (device_key, name, value, unit, source, now_iso()),
            )
        )

    def ceilings(self, device_key: str) -> dict[str, dict]:
        """Measured ceilings of a device: ``{name: {value, unit, source, measured}}``."""
        rows = self._db.query(
            "SELECT name, value, unit, source, measured FROM ceilings WHERE device_key = ? "
            "ORDER BY name",
            (device_key,),
        )
        return {n: {"value": v, "unit": u, "source": s, "measured": m} for n, v, u, s, m in rows}

    # -- cache -----------------------------------------------------------------------------

    def cache_put(self, namespace: str, key: str, value: Mapping) -> None:
        """Store a small JSON object under (namespace, key), replacing any previous one."""
        for arg, v in (("namespace", namespace), ("key", key)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{arg}: expected a non-empty string, got {v!r}")
        if not isinstance(value, Mapping):
            raise TypeError(f"value: expected a dict, got {type(value).__name__}")
        text = _dumps(dict(value), "value")
        self._db.write(
            lambda conn: conn.execute(
                "INSERT INTO cache (namespace, key, value, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                "updated = excluded.updated",
                (namespace, key, text, now_iso()),
            )
        )

    def cache_get(self, namespace: str, key: str) -> dict | None:
        rows = self._db.query(
            "SELECT value FROM cache WHERE namespace = ? AND key = ?", (namespace, key)
        )
        return orjson.loads(rows[0][0]) if rows else None

    def check(self) -> str:
        """The database's integrity check: "ok" or the problems found."""
        return self._db.check()


__all__ = ["Ledger", "LedgerError", "pack_samples", "unpack_samples"]
