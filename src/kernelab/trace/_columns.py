"""Turning decoded events into numpy columns, one chunk at a time, without keeping a
Python object per event. A fast path handles well-formed chunks with C-level getters; a
careful path validates event by event and counts what it skips."""

from __future__ import annotations

from itertools import chain, islice, repeat
from operator import attrgetter, itemgetter, methodcaller

import numpy as np
import orjson

from kernelab.trace._events import (
    CATEGORIES,
    CPU_OP,
    GPU_ANNOTATION,
    GPU_SYNC,
    IGNORED,
    KERNEL,
    MEMCPY,
    MEMSET,
    RUNTIME,
    SHAPED_OPS,
    Trace,
)
from kernelab.trace._limits import Exceeded
from kernelab.trace._schema import (
    _ANY_CATEGORY,
    _ARG_ATTRS,
    _DECODER,
    _MEM_DECODERS,
    _NO_ARGS,
    _NOT_COMPLETE,
    _as_dict,
    _Instant,
    _plain,
    msgspec,
)
from kernelab.trace._store import COLUMNS, _Part, _ShapeTable, _Store
from kernelab.trace._times import TIME_LIMIT_US, drop_outliers, times_ok


class _KindMap(dict):
    """Category string as written -> kind; -1 ignored, -2 unknown (counted)."""

    def __init__(self):
        super().__init__({_NOT_COMPLETE: -1})

    def __missing__(self, cat):
        key = cat.lower() if isinstance(cat, str) else ""
        kind = CATEGORIES.get(key, -1 if key in IGNORED else -2)
        self[cat] = kind
        return kind


def _col(values: list, dtype) -> np.ndarray:
    try:
        return np.array(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int(v) for v in values], dtype=dtype)


class _Intern(dict):
    """String -> id, assigning the next id to a new string."""

    def __missing__(self, key):
        value = len(self)
        self[key] = value
        return value


def _pick(seq, idx) -> list:
    """``[seq[i] for i in idx]`` at C speed."""
    if len(idx) == 0:
        return []
    if len(idx) == 1:
        return [seq[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(seq))


_INT64_MIN = np.iinfo(np.int64).min  # -2**63: out of range for the memory columns


def _int64s(values: list) -> np.ndarray | None:
    """``values`` as int64 when every one is an int in (-2**63, 2**63), else None."""
    if set(map(type, values)) != {int}:
        return None
    try:
        out = np.fromiter(values, np.int64, len(values))
    except OverflowError:
        return None
    return None if (out == _INT64_MIN).any() else out


def _memory_columns(ts: list, tid: list, args: list) -> dict | None:
    """The columns of well-formed ``[memory]`` instants (their times, threads and args), one
    C-level pass per field; None where a row is not (the caller then goes row by row)."""
    if set(map(type, args)) != {dict} or not set(map(type, ts)) <= {int, float}:
        return None
    try:
        ts_a = np.fromiter(ts, np.float64, len(ts))
    except OverflowError:
        return None
    with np.errstate(invalid="ignore"):
        if not (np.abs(ts_a) < TIME_LIMIT_US).all():
            return None
    part = {"ts_us": ts_a, "tid": _int64s(tid)}
    if part["tid"] is None:
        return None
    for col, key in zip(MEMORY_COLUMNS[2:], _MEM_KEYS, strict=True):
        part[col] = _int64s(list(map(methodcaller("get", key), args)))
        if part[col] is None:
            return None
    return part


#: The args of a ``[memory]`` instant, in the order of :data:`MEMORY_COLUMNS` after ts, tid.
_MEM_KEYS = ("Addr", "Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id")
#: The columns of :attr:`Trace.memory` (ts in ns like the events', the rest int64).
MEMORY_COLUMNS = ("ts_us", "tid", "addr", "bytes", "allocated", "reserved", "device_type")
MEMORY_COLUMNS += ("device_id",)


class _Columns:
    """Per-chunk numpy columns, concatenated at the end.

    Chunks are numbered in file order. A process may decode only some of them (see
    :meth:`skip`) and pass its columns to another with :meth:`export` / :meth:`absorb`.
    """

    def __init__(self, max_events: int | None = None):
        #: Entries of the event array decoded here, of every phase; past ``max_events``
        #: :class:`Exceeded` is raised before the chunk's columns are built.
        self.events = 0
        self.max_events = max_events
        self.table: dict[str, int] = _Intern()
        self.kinds = _KindMap()
        self.parts: list[_Part] = []
        self.store = _Store()
        self.unknown: dict[str, int] = {}
        self.malformed = 0
        self.out_of_range = 0
        self.memory: list[tuple[int, dict]] = []  # (chunk, columns) of [memory] instants
        self.shapes = _ShapeTable(msgspec.json.decode if msgspec is not None else None)
        self.base_us: int | None = None
        self.next_chunk = 0
        self.absorbed = False

    def skip(self) -> None:
        """The next chunk is decoded elsewhere."""
        self.next_chunk += 1

    def _append(self, arrays: dict) -> None:
        start = self.store.append(arrays)
        n = len(arrays["kind"])
        self.parts.append(_Part(self.next_chunk - 1, self.base_us, start, n))

    def add_raw(self, chunk: memoryview, memory: bool | None = False) -> bool:
        """Parse and append one JSON array of events (msgspec when installed, else orjson).
        ``memory``: whether the chunk may hold ``[memory]`` instants (False: instants are
        skipped in C; True or None: they are decoded and kept). Returns False, adding
        nothing, where the bytes are not one valid JSON array."""
        if _DECODER is not None:
            decoders = (_DECODER, _ANY_CATEGORY) if memory is False else _MEM_DECODERS
            for decoder in decoders:
                try:
                    events = decoder.decode(chunk)
                except RecursionError:  # past ~1000 levels: the exact count measures them
                    return False
                except msgspec.ValidationError:
                    continue  # an unknown category (then odd field types): the next decoder
                except msgspec.DecodeError:
                    break  # invalid JSON: orjson decides
                self.add(events, structs=True, memory=memory)
                return True
        try:
            events = orjson.loads(chunk)
        except (orjson.JSONDecodeError, RecursionError):
            return False
        if type(events) is not list:
            return False
        self.add(events, memory=memory)
        return True

    def add(self, events: list, structs: bool = False, memory: bool | None = None) -> None:
        """Append one chunk of events: a fast path for well-formed chunks, else a careful one.
        ``memory``: whether it holds ``[memory]`` instants (None: look)."""
        self.next_chunk += 1
        self._count(len(events))
        if memory or memory is None:
            self._memory(events, structs)
        try:
            part, unknown = self._fast(events, structs)
        except (KeyError, TypeError, ValueError, AttributeError):
            if structs:
                events = [_as_dict(e) for e in events]
            self._careful(events)
            return
        if part is None:
            return
        for cat, count in unknown.items():
            self.unknown[cat] = self.unknown.get(cat, 0) + count
        self._append(part)

    def _count(self, n: int) -> None:
        self.events += n
        if self.max_events is not None and self.events > self.max_events:
            raise Exceeded("events")

    def _memory(self, events: list, structs: bool) -> None:
        """Keep the chunk's ``[memory]`` instants as columns (file order)."""
        if structs:
            if _Instant not in map(type, events):  # one C-level pass: most chunks have none
                return
            found = [e for e in events if type(e) is _Instant and e.name == "[memory]"]
            get = attrgetter
        else:
            found = [
                e
                for e in events
                if type(e) is dict and e.get("ph") in ("i", "I") and e.get("name") == "[memory]"
            ]

            def get(key):
                return methodcaller("get", key)

        if not found:
            return
        ts, tid, args = (list(map(get(k), found)) for k in ("ts", "tid", "args"))
        part = _memory_columns(ts, tid, args)
        if part is None:  # odd values somewhere: row by row, counting the malformed
            part = self._memory_rows(ts, tid, args)
        if part is not None:
            self.memory.append((self.next_chunk - 1, part))

    def _memory_rows(self, ts: list, tid: list, args: list) -> dict | None:
        """:func:`_memory_columns` one row at a time: a row with a missing or odd value is
        counted malformed and left out."""
        rows = []
        for t, i, a in zip(ts, tid, args, strict=True):
            a = a if type(a) is dict else {}
            vals = [a.get(k) for k in _MEM_KEYS]
            ok = type(t) in (int, float) and abs(t) < TIME_LIMIT_US
            ok = ok and all(type(v) is int and abs(v) < 2**63 for v in vals)
            if not ok:
                self.malformed += 1
                continue
            rows.append((float(t), i if type(i) is int and abs(i) < 2**63 else -1, *vals))
        if not rows:
            return None
        cols = list(zip(*rows, strict=True))
        part = {"ts_us": np.array(cols[0], dtype=np.float64)}
        for k, v in zip(MEMORY_COLUMNS[1:], cols[1:], strict=True):
            part[k] = np.array(v, dtype=np.int64)
        return part

    def _fast(self, events: list, structs: bool = False):
        """Columns of a chunk where every 'X' event has all the fields; raises otherwise.

        Nothing is stored until it returns, so a failure leaves the columns unchanged.
        ``structs``: the events are msgspec structs (attributes, times already validated as
        numbers by the decoder) rather than dicts. One C-level pass per field, over the kept
        rows only: no Python tuple per event.
        """
        if structs:
            xs = events  # the other phases' structs say they are ignored (_NOT_COMPLETE)
            field = attrgetter
        else:
            xs = [e for e in events if e["ph"] == "X"]
            field = itemgetter
        if not xs:
            return None, {}
        cat = field("cat")
        kind_all = np.fromiter(map(self.kinds.__getitem__, map(cat, xs)), np.int8, len(xs))
        unknown: dict[str, int] = {}
        for i in np.flatnonzero(kind_all == -2).tolist():
            name = str(cat(xs[i]))
            unknown[name] = unknown.get(name, 0) + 1
        keep = np.flatnonzero(kind_all >= 0)
        if not len(keep):
            return None, unknown
        rows = xs if len(keep) == len(xs) else _pick(xs, keep)
        n = len(rows)
        if structs:  # float-typed fields: the decoder rejected strings, booleans and nulls
            ts_a = np.fromiter(map(field("ts"), rows), np.float64, n)
            dur_a = np.fromiter(map(field("dur"), rows), np.float64, n)
        else:
            ts_l, dur_l = list(map(field("ts"), rows)), list(map(field("dur"), rows))
            if not set(map(type, ts_l)) | set(map(type, dur_l)) <= {int, float}:
                raise TypeError("non-numeric times")  # booleans are not numbers
            ts_a, dur_a = np.array(ts_l, dtype=np.float64), np.array(dur_l, dtype=np.float64)
        if not times_ok(ts_a, dur_a).all():
            raise ValueError("times beyond the representable range")
        if self.base_us is None:
            self.base_us = int(ts_a.min())
        kind_a = kind_all[keep]
        intern = self.table
        known = len(intern)
        name_a = np.fromiter(map(intern.__getitem__, map(field("name"), rows)), np.int32, n)
        added = list(islice(intern, known, None))
        if any(type(x) is not str for x in added):
            for x in added:  # undo, so ids stay dense and every interned name is a str
                del intern[x]
            raise TypeError("names not strings")
        part = {
            "kind": kind_a,
            "name": name_a,
            "ts": np.rint((ts_a - self.base_us) * 1000).astype(np.int64),
            "dur": np.rint(dur_a * 1000).astype(np.int64),
            "pid": _read(rows, field("pid")),
            "tid": _read(rows, field("tid")),
        }
        args = list(map(field("args"), rows))
        if structs:
            if None in args:
                args = [_NO_ARGS if a is None else a for a in args]

            def getter(key):
                return attrgetter(_ARG_ATTRS[key])

        else:
            if set(map(type, args)) != {dict}:
                raise TypeError("args not objects")

            def getter(key):
                return methodcaller("get", key, -1)

        picked: dict[int, tuple] = {}

        def pick(mask):
            """The rows of ``mask`` and their args, picked once per mask (the mask is kept
            with them, so its id is not reused while the table lives)."""
            hit = picked.get(id(mask))
            if hit is None:
                idx = np.flatnonzero(mask)
                hit = picked[id(mask)] = (mask, idx, _pick(args, idx))
            return hit[1], hit[2]

        def sparse(mask, key, dtype=np.int64):
            out = np.full(n, -1, dtype=dtype)
            idx, sub = pick(mask)
            if len(idx):
                out[idx] = _read(sub, getter(key), dtype)
            return idx, out

        _gpu_columns(part, kind_a, sparse, lambda m, k: _dims_product(n, *pick(m), getter(k)))
        part["shape"] = shape = np.full(n, -1, dtype=np.int32)
        shaped_ids = [intern[x] for x in SHAPED_OPS if x in intern]
        if shaped_ids:
            rows_i = np.flatnonzero((kind_a == CPU_OP) & np.isin(name_a, shaped_ids, kind="table"))
            sub = _pick(args, rows_i)
            dims_all = list(map(getter("Input Dims"), sub))
            types_all = list(map(getter("Input type"), sub))
            table = self.shapes
            if msgspec is not None and set(map(type, chain(dims_all, types_all))) == {msgspec.Raw}:
                # Raw JSON texts: each distinct pair of texts is decoded once (C-level passes)
                texts = zip(map(bytes, dims_all), map(bytes, types_all), strict=True)
                shape[rows_i] = np.fromiter(
                    map(table.texts.__getitem__, texts), np.int32, len(rows_i)
                )
            else:
                shape[rows_i] = list(map(table.of, map(_plain, dims_all), map(_plain, types_all)))
        return part, unknown

    def _careful(self, events: list) -> None:
        km = self.kinds
        xs = [e for e in events if type(e) is dict and e.get("ph") == "X"]
        kinds = [km[e.get("cat")] for e in xs]
        if -2 in kinds:
            for e, k in zip(xs, kinds, strict=False):
                if k == -2:
                    cat = str(e.get("cat"))
                    self.unknown[cat] = self.unknown.get(cat, 0) + 1
        rows = [e for e, k in zip(xs, kinds, strict=False) if k >= 0]
        kinds = [k for k in kinds if k >= 0]
        if not rows:
            return
        number = (int, float)  # booleans are not numbers
        ok = [
            type(e.get("name")) is str
            and type(e.get("ts")) in number
            and type(e.get("dur")) in number
            for e in rows
        ]
        self.malformed += ok.count(False)
        rows = [e for e, g in zip(rows, ok, strict=True) if g]
        kinds = [k for k, g in zip(kinds, ok, strict=True) if g]
        ts_a = np.array([e["ts"] for e in rows], dtype=np.float64)
        dur_a = np.array([e["dur"] for e in rows], dtype=np.float64)
        fits = times_ok(ts_a, dur_a)
        if not fits.all():
            self.out_of_range += int((~fits).sum())
            rows = [e for e, g in zip(rows, fits.tolist(), strict=True) if g]
            kinds = [k for k, g in zip(kinds, fits.tolist(), strict=True) if g]
            ts_a, dur_a = ts_a[fits], dur_a[fits]
        if not rows:
            return
        names = [e["name"] for e in rows]
        if self.base_us is None:
            self.base_us = int(ts_a.min())
        table = self.table
        kind_a = np.array(kinds, dtype=np.int8)
        n = len(rows)
        part = {
            "kind": kind_a,
            "name": np.array([table.setdefault(x, len(table)) for x in names], dtype=np.int32),
            "ts": np.rint((ts_a - self.base_us) * 1000).astype(np.int64),
            "dur": np.rint(dur_a * 1000).astype(np.int64),
            "pid": _col([e.get("pid") for e in rows], np.int64),
            "tid": _col([e.get("tid") for e in rows], np.int64),
        }
        args = [e.get("args") for e in rows]
        if None in args or not all(type(a) is dict for a in args):
            args = [a if type(a) is dict else {} for a in args]

        def sparse(mask, key, dtype=np.int64, fn=None):
            out = np.full(n, -1, dtype=dtype)
            idx = np.flatnonzero(mask)
            if len(idx):
                vals = [args[i].get(key, -1) for i in idx]
                out[idx] = _col([fn(v) for v in vals] if fn else vals, dtype)
            return idx, out

        def dims(mask, key):
            idx = np.flatnonzero(mask)
            return _dims_product(n, idx, _pick(args, idx), methodcaller("get", key))

        _gpu_columns(part, kind_a, sparse, dims)
        part["shape"] = shape = np.full(n, -1, dtype=np.int32)
        for i in np.flatnonzero(kind_a == CPU_OP).tolist():
            if names[i] in SHAPED_OPS:
                a = args[i]
                shape[i] = self.shapes.of(a.get("Input Dims"), a.get("Input type"))
        self._append(part)

    def export(self) -> list:
        """These columns as byte strings to write, in order, for :meth:`absorb` in another
        process: the header's length, a JSON header (names, counts, per part its chunk, base,
        length and shapes), then each part's arrays raw."""
        import resource

        header = {
            "strings": list(self.table),
            "unknown": self.unknown,
            "malformed": self.malformed,
            "out_of_range": self.out_of_range,
            "events": self.events,
            "memory": [[c, {k: v.tolist() for k, v in m.items()}] for c, m in self.memory],
            "shapes": self.shapes.pairs,
            "parts": [
                {
                    "chunk": p.chunk,
                    "base_us": p.base_us,
                    "n": p.n,
                }
                for p in self.parts
            ],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        head = orjson.dumps(header)
        store = self.store.cols
        body = (
            memoryview(store[k][p.start : p.start + p.n]).cast("B")
            for p in self.parts
            for k in COLUMNS
        )
        return [len(head).to_bytes(8, "little"), head, *body]

    def absorb(self, payload: bytes) -> dict:
        """Add the parts another process :meth:`export`-ed; returns its header's extras."""
        size = int.from_bytes(payload[:8], "little")
        header = orjson.loads(payload[8 : 8 + size])
        remap = np.array([self.table[s] for s in header["strings"]], dtype=np.int32)
        # the other process's shape numbers -> this one's; the extra last entry keeps -1
        shape_remap = [self.shapes.of(d, t) for d, t in header["shapes"]]
        shape_remap = np.array([*shape_remap, -1], dtype=np.int32)
        pos = 8 + size
        for p in header["parts"]:
            arrays = {}
            for k, dt in COLUMNS.items():
                nbytes = p["n"] * np.dtype(dt).itemsize
                arrays[k] = np.frombuffer(payload, dtype=dt, count=p["n"], offset=pos)
                pos += nbytes
            arrays["name"] = remap[arrays["name"]]
            arrays["shape"] = shape_remap[arrays["shape"]]
            start = self.store.append(arrays)
            self.parts.append(_Part(p["chunk"], p["base_us"], start, p["n"]))
        if pos != len(payload):
            raise ValueError("worker payload: length does not match its header")
        for cat, count in header["unknown"].items():
            self.unknown[cat] = self.unknown.get(cat, 0) + count
        self.malformed += header["malformed"]
        self.out_of_range += header["out_of_range"]
        self._count(header["events"])
        for c, m in header["memory"]:
            part = {"ts_us": np.array(m["ts_us"], dtype=np.float64)}
            part.update({k: np.array(m[k], dtype=np.int64) for k in MEMORY_COLUMNS[1:]})
            self.memory.append((c, part))
        self.absorbed = True
        return {"peak_rss": header["peak_rss"]}

    def finish(self, path: str, meta: dict) -> Trace:
        parts = sorted(self.parts, key=lambda p: p.chunk)
        bases = [p.base_us for p in parts if p.base_us is not None]
        base_us = min(bases) if bases else 0
        lengths = [p.n for p in parts]
        offsets = np.cumsum([0, *lengths])
        cols = self.store.take()
        if [p.start for p in parts] != offsets[:-1].tolist():  # parts from several processes
            order = np.concatenate([np.arange(p.start, p.start + p.n) for p in parts])
            for k in COLUMNS:  # one column at a time into file order
                cols[k] = cols[k][order]
        if len(set(bases)) > 1:  # parts decoded by several processes: one base for all
            shift = np.repeat([(p.base_us - base_us) * 1000 for p in parts], lengths)
            cols["ts"] += shift
        strings = list(self.table)
        if self.absorbed:  # name ids in order of first appearance, as one process assigns them
            ids, first = np.unique(cols["name"], return_index=True)
            order = ids[np.argsort(first, kind="stable")]
            remap = np.zeros(len(strings), dtype=np.int32)
            remap[order] = np.arange(len(order), dtype=np.int32)
            cols["name"] = remap[cols["name"]]
            strings = [strings[i] for i in order.tolist()]
        outliers = drop_outliers(cols, strings)
        outliers.pop("_mask", None)
        # Times so far are relative to the first chunk's earliest event; make them relative
        # to the trace's earliest (whole microseconds), whatever the chunking.
        if len(cols["ts"]):
            shift_us = int(cols["ts"].min()) // 1000
            cols["ts"] -= shift_us * 1000
            base_us += shift_us
        meta = dict(meta)
        meta["base_us"] = base_us
        memory = None
        if self.memory:
            parts = [m for _, m in sorted(self.memory, key=lambda cm: cm[0])]
            memory = {k: np.concatenate([p[k] for p in parts]) for k in MEMORY_COLUMNS}
            memory["ts"] = np.rint((memory.pop("ts_us") - base_us) * 1000).astype(np.int64)
        return Trace(
            path=path,
            meta=meta,
            strings=strings,
            shape_table=self.shapes.pairs,
            unknown_categories=dict(self.unknown),
            malformed=self.malformed,
            out_of_range=self.out_of_range,
            outliers=outliers,
            memory=memory,
            **cols,
        )


def _read(rows: list, get, dtype=np.int64) -> np.ndarray:
    """A column of ``get(row)`` per row, in one C-level pass; -1 where a value is not an
    integer (e.g. the string pids some tracers write)."""
    try:
        return np.fromiter(map(get, rows), dtype, len(rows))
    except (TypeError, ValueError, OverflowError):
        return _col(list(map(get, rows)), dtype)


def _int(v) -> int:
    if type(v) is int:
        return v
    if type(v) is float and v == v and abs(v) < 2**62:
        return int(v)
    return -1


def _dims_product(n: int, idx: np.ndarray, args: list, get) -> np.ndarray:
    """Product of a [x, y, z] launch dimension for the rows ``idx`` of ``n`` (``args``: theirs),
    -1 where absent."""
    out = np.full(n, -1, dtype=np.int64)
    if not len(idx):
        return out
    vals = list(map(get, args))
    types = set(map(type, vals))
    if types != {list}:  # rows without a list (absent: some graph replays' kernels) stay -1
        # JSON decodes to plain lists only, so isinstance is type(v) is list here (C speed)
        have = np.flatnonzero(np.fromiter(map(isinstance, vals, repeat(list)), bool, len(vals)))
        idx, vals = idx[have], _pick(vals, have)
        if not vals:
            return out
    if set(map(type, vals)) == {list} and set(map(len, vals)) == {3}:
        try:
            flat = np.fromiter(chain.from_iterable(vals), np.int64, 3 * len(vals))
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            out[idx] = flat.reshape(-1, 3).prod(axis=1)
            return out
    out[idx] = [_prod3(v) for v in vals]
    return out


def _prod3(v) -> int:
    if type(v) is list and v and all(type(x) is int for x in v):
        p = 1
        for x in v:
            p *= x
        return p
    return -1


def _gpu_columns(part: dict, kind_a, sparse, dims) -> None:
    """Fill a chunk's GPU-side columns (device, stream, correlation, registers, shared memory,
    block and grid sizes, bytes) from ``sparse(mask, key, dtype)`` reads of the events' args;
    ``dims(mask, key)`` is the product of a launch-dimension list per row. Both ingestion paths
    (the fast decoder and the careful one) share this."""
    gpu = (kind_a == KERNEL) | (kind_a == MEMCPY) | (kind_a == MEMSET) | (kind_a == GPU_SYNC)
    gpu |= kind_a == GPU_ANNOTATION
    for key, col in (("device", "pid"), ("stream", "tid")):
        idx, vals = sparse(gpu, key)
        have = idx[vals[idx] >= 0]
        part[col][have] = vals[have]
    _, part["corr"] = sparse(gpu | (kind_a == RUNTIME), "correlation")
    kern = kind_a == KERNEL
    _, part["regs"] = sparse(kern, "registers per thread", np.int32)
    _, part["shmem"] = sparse(kern, "shared memory")
    part["block"] = dims(kern, "block")
    part["grid"] = dims(kern, "grid")
    _, part["nbytes"] = sparse((kind_a == MEMCPY) | (kind_a == MEMSET), "bytes")
