"""Reading a Kineto (PyTorch profiler) Chrome trace into columnar numpy arrays.

The file is decompressed as it is read; the ``traceEvents`` array is cut into chunks of
about half a megabyte at the top-level object boundaries Kineto writes, and each chunk is
decoded (msgspec, reading only the fields used, or orjson) and turned into numpy columns at
once. The decoded events of a chunk are dropped before the next is decoded, so peak memory
stays near one chunk plus the columns, never the whole file. Names are interned into one
string table. A trace written without Kineto's line layout (e.g. minified) is parsed whole.

Times are kept as int64 nanoseconds (Kineto writes microseconds, sometimes with a fraction).
"""

from __future__ import annotations

import gc
import re
import zlib
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter, itemgetter, methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import orjson

try:  # a faster decoder that skips the fields we do not read; orjson does without it
    import msgspec
except ImportError:  # pragma: no cover - exercised under environments without msgspec
    msgspec = None

# Event kinds (the ``kind`` column).
CPU_OP, ANNOTATION, RUNTIME, KERNEL, MEMCPY, MEMSET, GPU_ANNOTATION, GPU_SYNC, PYTHON = range(9)
KIND_NAMES = (
    "cpu_op",
    "user_annotation",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "gpu_user_annotation",
    "gpu_sync",
    "python_function",
)
GPU_KINDS = (KERNEL, MEMCPY, MEMSET)

#: Category names as Kineto wrote them across versions (lower-cased) -> kind.
CATEGORIES = {
    "cpu_op": CPU_OP,
    "operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "runtime": RUNTIME,
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "gpu_user_annotation": GPU_ANNOTATION,
    "cuda_sync": GPU_SYNC,
    "python_function": PYTHON,
}
#: Categories that carry nothing this analysis uses (flows, instants, spans, metadata).
IGNORED = {
    "ac2g",
    "async_cpu_to_gpu",
    "fwdbwd",
    "forward_backward",
    "cpu_instant_event",
    "trace",
    "overhead",
    "cuda_profiler_range",
    "python_function_call",
    "flow_event",
    "",
}
#: cpu ops whose input shapes are kept (roofline placement, fusion byte counts).
SHAPED_OPS = frozenset(
    "aten::" + n
    for n in [
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "linear",
        "matmul",
        "addmv",
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "relu",
        "relu_",
        "gelu",
        "gelu_",
        "silu",
        "silu_",
        "sigmoid",
        "sigmoid_",
        "tanh",
        "tanh_",
        "threshold_backward",
        "copy_",
        "clamp",
        "clamp_min",
        "clamp_min_",
        "neg",
        "exp",
        "rsqrt",
        "pow",
        "where",
        "masked_fill",
        "masked_fill_",
        "dropout",
        "native_dropout",
        "layer_norm",
        "native_layer_norm",
        "rms_norm",
        "_fused_rms_norm",
        "batch_norm",
        "native_batch_norm",
        "cudnn_batch_norm",
        "group_norm",
        "native_group_norm",
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ]
)

_CHUNK_BYTES = 1 << 19


class TraceError(ValueError):
    """The file is not a trace this analysis can read (one line, no traceback)."""


@dataclass
class Trace:
    """One trace as columns. Row ``i`` of every array is one complete ('X') event we keep."""

    path: str
    meta: dict
    strings: list[str]
    kind: np.ndarray  # int8
    name: np.ndarray  # int32 index into strings
    ts: np.ndarray  # int64 ns
    dur: np.ndarray  # int64 ns
    pid: np.ndarray  # int64 (device for GPU rows)
    tid: np.ndarray  # int64 (stream for GPU rows)
    corr: np.ndarray  # int64 correlation id, -1 if none
    regs: np.ndarray  # int32 registers per thread, -1 if none
    shmem: np.ndarray  # int64 bytes of shared memory (static + dynamic), -1 if none
    block: np.ndarray  # int32 threads per block, -1 if none
    grid: np.ndarray  # int64 blocks in the grid, -1 if none
    nbytes: np.ndarray  # int64 bytes of a memcpy / memset, -1 if none
    shapes: dict[int, tuple[list, list]] = field(default_factory=dict)  # row -> (dims, types)
    unknown_categories: dict[str, int] = field(default_factory=dict)
    malformed: int = 0  # 'X' events without a usable ts/dur/name

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def names_of(self, rows) -> list[str]:
        s = self.strings
        return [s[i] for i in self.name[rows]]

    def device_properties(self) -> list[dict]:
        props = self.meta.get("deviceProperties")
        return [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []

    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None


def _read_bytes(path: Path) -> bytearray:
    if not path.exists():
        raise FileNotFoundError(f"trace: no such file {str(path)!r}")
    if path.is_dir():
        raise TraceError(f"trace: {str(path)!r} is a folder, expected a .json or .json.gz file")
    size = path.stat().st_size
    data = bytearray(size)
    with open(path, "rb") as fh:
        fh.readinto(data)
    if not data:
        raise TraceError(f"trace: {str(path)!r} is empty (0 bytes)")
    if data[:2] == b"\x1f\x8b":
        try:
            return _gunzip(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"trace: {str(path)!r} is not a readable gzip file ({exc})") from None
    return data


def _gunzip(data: bytes) -> bytearray:
    """Decompress into a buffer sized from the gzip trailer (gzip.decompress peaks at twice
    the output); multi-member files or a trailer that disagrees take the growing path."""
    size = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    if size:
        out = bytearray(size)
        dest = memoryview(out)
        d = zlib.decompressobj(31)
        filled = 0
        memoryview(data)
        pending = memoryview(data)
        while pending and not d.eof:
            piece = d.decompress(pending, 1 << 20)
            if filled + len(piece) > size:
                break
            dest[filled : filled + len(piece)] = piece
            filled += len(piece)
            pending = d.unconsumed_tail if d.unconsumed_tail else b""
        if d.eof and filled == size and not d.unused_data.strip(b"\x00"):
            dest.release()
            return out
        dest.release()
        del out, dest
    return _gunzip_growing(data)


def _gunzip_growing(data: bytes) -> bytearray:
    out = bytearray()
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        step = 1 << 20
        while pos < len(data) and not d.eof:
            out += d.decompress(view[pos : pos + step])
            pos += step
        out += d.flush()
        if not d.eof:
            raise EOFError("the compressed stream is truncated")
        pos -= len(d.unused_data)
        if not d.unused_data.strip(b"\x00"):
            break
    return out


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _KindMap(dict):
    """Category string as written -> kind; -1 ignored, -2 unknown (counted)."""

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


_FIELDS = itemgetter("cat", "name", "ts", "dur", "pid", "tid", "args")
_ATTRS = attrgetter("cat", "name", "ts", "dur", "pid", "tid", "args")

#: Event args this analysis reads -> attribute names of the msgspec struct.
_ARG_ATTRS = {
    "correlation": "correlation",
    "device": "device",
    "stream": "stream",
    "registers per thread": "regs",
    "shared memory": "shmem",
    "block": "block",
    "grid": "grid",
    "bytes": "nbytes",
    "Input Dims": "dims",
    "Input type": "types",
}

if msgspec is not None:

    class _Args(msgspec.Struct, gc=False):
        """The args fields read here; the decoder skips every other field in C."""

        correlation: Any = -1
        device: Any = -1
        stream: Any = -1
        regs: Any = msgspec.field(default=-1, name="registers per thread")
        shmem: Any = msgspec.field(default=-1, name="shared memory")
        block: Any = None
        grid: Any = None
        nbytes: Any = msgspec.field(default=-1, name="bytes")
        dims: Any = msgspec.field(default=None, name="Input Dims")
        types: Any = msgspec.field(default=None, name="Input type")

    class _Event(msgspec.Struct, gc=False):
        ph: Any = None
        cat: Any = None
        name: Any = None
        ts: Any = None
        dur: Any = None
        pid: Any = None
        tid: Any = None
        args: _Args | None = None

    _DECODER = msgspec.json.Decoder(list[_Event])
    _NO_ARGS = _Args()
else:
    _DECODER = None
    _NO_ARGS = None


def _as_dict(event) -> dict:
    """A decoded struct back as the dict the careful path expects."""
    out = {k: getattr(event, k) for k in ("ph", "cat", "name", "ts", "dur", "pid", "tid")}
    a = event.args
    if a is not None:
        out["args"] = {key: getattr(a, attr) for key, attr in _ARG_ATTRS.items()}
    return {k: v for k, v in out.items() if v is not None}


class _Columns:
    """Per-chunk numpy columns, concatenated at the end."""

    def __init__(self):
        self.table: dict[str, int] = _Intern()
        self.kinds = _KindMap()
        self.parts: list[dict[str, np.ndarray]] = []
        self.shapes: dict[int, tuple[list, list]] = {}
        self.unknown: dict[str, int] = {}
        self.malformed = 0
        self.n = 0
        self.base_us: int | None = None

    def add_raw(self, chunk: memoryview) -> None:
        """Parse and append one JSON array of events (msgspec when installed, else orjson)."""
        if _DECODER is not None:
            try:
                events = _DECODER.decode(chunk)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass  # odd field types or invalid JSON: orjson and the careful path decide
            else:
                self.add(events, structs=True)
                return
        self.add(orjson.loads(chunk))

    def add(self, events: list, structs: bool = False) -> None:
        """Append one chunk of events: a fast path for well-formed chunks, else a careful one."""
        try:
            part, shapes, unknown = self._fast(events, structs)
        except (KeyError, TypeError, ValueError, AttributeError):
            if structs:
                events = [_as_dict(e) for e in events]
            self._careful(events)
            return
        if part is None:
            return
        for cat, count in unknown.items():
            self.unknown[cat] = self.unknown.get(cat, 0) + count
        self.shapes.update({self.n + i: v for i, v in shapes.items()})
        self.parts.append(part)
        self.n += len(part["kind"])

    def _fast(self, events: list, structs: bool = False):
        """Columns of a chunk where every 'X' event has all the fields; raises otherwise.

        Nothing is stored until it returns, so a failure leaves the columns unchanged.
        ``structs``: the events are msgspec structs (attributes) rather than dicts.
        """
        if structs:
            xs = [e for e in events if e.ph == "X"]
        else:
            xs = [e for e in events if e["ph"] == "X"]
        if not xs:
            return None, {}, {}
        cats, names, ts, dur, pid, tid, args = zip(
            *map(_ATTRS if structs else _FIELDS, xs), strict=False
        )
        if structs:
            if None in args:
                args = tuple(_NO_ARGS if a is None else a for a in args)

            def getter(key):
                return attrgetter(_ARG_ATTRS[key])

        else:
            if set(map(type, args)) != {dict}:
                raise TypeError("args not objects")

            def getter(key):
                return methodcaller("get", key, -1)

        kind_all = np.fromiter(map(self.kinds.__getitem__, cats), np.int8, len(cats))
        unknown: dict[str, int] = {}
        for i in np.flatnonzero(kind_all == -2):
            unknown[str(cats[i])] = unknown.get(str(cats[i]), 0) + 1
        keep = np.flatnonzero(kind_all >= 0)
        if not len(keep):
            return None, {}, unknown
        ts_a, dur_a = np.array(ts)[keep], np.array(dur)[keep]
        if ts_a.dtype.kind not in "if" or dur_a.dtype.kind not in "if":
            raise TypeError("non-numeric times")
        if self.base_us is None:
            self.base_us = int(ts_a.min())
        kind_a = kind_all[keep]
        intern = self.table
        known = len(intern)
        name_all = np.fromiter(map(intern.__getitem__, names), np.int32, len(names))
        added = list(islice(intern, known, None))
        if any(type(x) is not str for x in added):
            for x in added:  # undo, so ids stay dense and every interned name is a str
                del intern[x]
            raise TypeError("names not strings")
        n = len(keep)
        part = {
            "kind": kind_a,
            "name": name_all[keep],
            "ts": np.rint((ts_a - self.base_us) * 1000).astype(np.int64),
            "dur": np.rint(dur_a * 1000).astype(np.int64),
            "pid": _col(list(pid), np.int64)[keep],
            "tid": _col(list(tid), np.int64)[keep],
        }

        def sparse(mask, key, dtype=np.int64):
            out = np.full(n, -1, dtype=dtype)
            idx = np.flatnonzero(mask)
            if len(idx):
                sub = _pick(args, keep[idx])
                out[idx] = _col(list(map(getter(key), sub)), dtype)
            return idx, out

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
        kern_args = _pick(args, keep)  # aligned with the kept rows
        part["block"] = _dims_product(kern_args, kern, getter("block"))
        part["grid"] = _dims_product(kern_args, kern, getter("grid"))
        _, part["nbytes"] = sparse((kind_a == MEMCPY) | (kind_a == MEMSET), "bytes")
        shapes = {}
        shaped_ids = [intern[x] for x in SHAPED_OPS if x in intern]
        if shaped_ids:
            rows = np.flatnonzero((kind_a == CPU_OP) & np.isin(part["name"], shaped_ids))
            sub = _pick(kern_args, rows)
            dims_all = list(map(getter("Input Dims"), sub))
            types_all = list(map(getter("Input type"), sub))
            for i, dims, types in zip(rows.tolist(), dims_all, types_all, strict=True):
                if type(dims) is list and type(types) is list:
                    shapes[i] = (dims, types)
        return part, shapes, unknown

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
        names = [e.get("name") for e in rows]
        ts = [e.get("ts") for e in rows]
        dur = [e.get("dur") for e in rows]
        try:
            ts_a = np.array(ts)
            dur_a = np.array(dur)
            if (
                ts_a.dtype.kind not in "if"
                or dur_a.dtype.kind not in "if"
                or set(map(type, names)) != {str}
            ):
                raise TypeError
        except (TypeError, ValueError):
            ok = [
                type(n) is str and type(t) in (int, float) and type(d) in (int, float)
                for n, t, d in zip(names, ts, dur, strict=False)
            ]
            self.malformed += ok.count(False)
            rows = [e for e, g in zip(rows, ok, strict=False) if g]
            kinds = [k for k, g in zip(kinds, ok, strict=False) if g]
            if not rows:
                return
            names = [e["name"] for e in rows]
            ts_a = np.array([e["ts"] for e in rows], dtype=np.float64)
            dur_a = np.array([e["dur"] for e in rows], dtype=np.float64)
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
        part["block"] = _dims_product(args, kern, methodcaller("get", "block"))
        part["grid"] = _dims_product(args, kern, methodcaller("get", "grid"))
        _, part["nbytes"] = sparse((kind_a == MEMCPY) | (kind_a == MEMSET), "bytes")
        for i in np.flatnonzero(kind_a == CPU_OP):
            if names[i] in SHAPED_OPS:
                a = args[i]
                dims, types = a.get("Input Dims"), a.get("Input type")
                if isinstance(dims, list) and isinstance(types, list):
                    self.shapes[self.n + int(i)] = (dims, types)
        self.parts.append(part)
        self.n += n

    def finish(self, path: str, meta: dict) -> Trace:
        strings = [""] * len(self.table)
        for s, i in self.table.items():
            strings[i] = s
        keys = ("kind", "name", "ts", "dur", "pid", "tid", "corr")
        keys += ("regs", "shmem", "block", "grid", "nbytes")
        dtypes = (np.int8, np.int32, np.int64, np.int64, np.int64, np.int64, np.int64)
        dtypes += (np.int32, np.int64, np.int32, np.int64, np.int64)
        cols = {
            k: np.concatenate([p[k] for p in self.parts]) if self.parts else np.zeros(0, dt)
            for k, dt in zip(keys, dtypes, strict=False)
        }
        meta = dict(meta)
        meta["base_us"] = self.base_us or 0
        return Trace(
            path=path,
            meta=meta,
            strings=strings,
            shapes=self.shapes,
            unknown_categories=dict(self.unknown),
            malformed=self.malformed,
            **cols,
        )


def _int(v) -> int:
    if type(v) is int:
        return v
    if type(v) is float and v == v and abs(v) < 2**62:
        return int(v)
    return -1


def _dims_product(args: list, mask: np.ndarray, get) -> np.ndarray:
    """Product of a [x, y, z] launch dimension per masked row, -1 where absent."""
    out = np.full(len(args), -1, dtype=np.int64)
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    vals = [get(args[i]) for i in idx]
    try:
        arr = np.array(vals, dtype=np.int64)
        if arr.ndim != 2:
            raise ValueError
        out[idx] = arr.prod(axis=1)
    except (TypeError, ValueError, OverflowError):
        out[idx] = [_prod3(v) for v in vals]
    return out


def _prod3(v) -> int:
    if type(v) is list and v and all(type(x) is int for x in v):
        p = 1
        for x in v:
            p *= x
        return p
    return -1


def _pieces(path: Path, size: int = 1 << 20):
    """The file's bytes, gzip-decompressed when compressed, in pieces of about ``size``."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic != b"\x1f\x8b":
            while piece := fh.read(size):
                yield piece
            return
        d = zlib.decompressobj(31)
        pending = b""
        while True:
            if not pending:
                pending = fh.read(size // 8)
                if not pending:
                    break
            yield d.decompress(pending, size)
            pending = d.unconsumed_tail
            if d.eof:
                rest = d.unused_data + fh.read()
                if not rest.strip(b"\x00"):
                    return
                d = zlib.decompressobj(31)  # another gzip member follows
                pending = rest
        tail = d.flush()
        if tail:
            yield tail
        if not d.eof:
            raise EOFError("the compressed stream is truncated")


class _Fallback(Exception):
    """The file is not laid out as Kineto writes it: parse it whole instead."""


def _add_in_place(cols: _Columns, buf: bytearray, a: int, b: int) -> None:
    """Decode the events ``buf[a:b]`` as an array without copying them: the byte before
    (blank or the array's '[') and the byte after (',' or blank) become the brackets for
    the call and are restored after it."""
    saved = buf[a - 1], buf[b]
    buf[a - 1], buf[b] = 0x5B, 0x5D
    try:
        with memoryview(buf) as view, view[a - 1 : b + 1] as chunk:
            cols.add_raw(chunk)
    finally:
        buf[a - 1], buf[b] = saved


def _load_streaming(path: Path, cols: _Columns) -> dict:
    """Decompress, cut and parse the events as they stream in; returns the top-level fields.

    Memory stays near one piece plus one chunk. Raises :class:`_Fallback` where the layout
    is not Kineto's (the caller then parses the whole document).
    """
    pieces = _pieces(path)
    buf = bytearray()
    m = None
    while m is None or len(buf) <= m.end() + 256:
        piece = next(pieces, None)
        if piece is None:
            break
        buf += piece
        if m is None:
            m = _EVENTS_KEY.search(buf)
            if m is None and len(buf) > 1 << 26:
                raise _Fallback
    if m is None:
        raise _Fallback
    first = re.compile(rb"\s*").match(buf, m.end()).end()
    nl = buf.rfind(b"\n", m.end(), first)
    if first >= len(buf) or buf[first : first + 1] != b"{" or nl < 0:
        raise _Fallback
    sep = b"},\n" + bytes(buf[nl + 1 : first]) + b"{"
    try:
        head = orjson.loads(bytes(buf[: m.start()]).rstrip().rstrip(b",") + b"}")
    except orjson.JSONDecodeError:
        raise _Fallback from None
    if not isinstance(head, dict):
        raise _Fallback
    start = first
    done = False
    while not done:
        while True:
            nxt = buf.find(sep, start + _CHUNK_BYTES)
            if nxt < 0:
                break
            _add_in_place(cols, buf, start, nxt + 1)
            start = nxt + len(sep) - 1
        piece = next(pieces, None)
        if piece is None:
            done = True
        else:
            del buf[: start - 1]  # keep the byte before the next event for its '['
            start = 1
            buf += piece
    # The rest: the last events, the array's ']' and the trailing top-level fields.
    tail = buf.rfind(b"]")
    close = buf.rfind(b"}", start, tail)
    while close > start and buf[close + 1 : tail].strip():
        tail = buf.rfind(b"]", start, tail)
        close = buf.rfind(b"}", start, tail)
    if close <= start:
        raise _Fallback
    rest = bytes(buf[tail + 1 :]).lstrip().lstrip(b",").strip()
    try:
        trailer = orjson.loads(b"{" + rest) if rest not in (b"}", b"") else {}
    except orjson.JSONDecodeError:
        raise _Fallback from None
    if not isinstance(trailer, dict):
        raise _Fallback
    _add_in_place(cols, buf, start, close + 1)
    return {**head, **trailer}


def load(path) -> Trace:
    """Read a Kineto trace (``.json`` or ``.json.gz``) into columns.

    Raises :class:`TraceError` (a ValueError) with one line for anything unreadable.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"trace: no such file {str(p)!r}")
    if p.is_dir():
        raise TraceError(f"trace: {str(p)!r} is a folder, expected a .json or .json.gz file")
    if p.stat().st_size == 0:
        raise TraceError(f"trace: {str(p)!r} is empty (0 bytes)")
    cols = _Columns()
    enabled = gc.isenabled()
    gc.disable()  # the decoders build many objects; the cyclic collector only slows them
    try:
        meta = _load_streaming(p, cols)
    except (_Fallback, orjson.JSONDecodeError):
        meta = None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"trace: {str(p)!r} is not a readable gzip file ({exc})") from None
    finally:
        if enabled:
            gc.enable()
    if meta is not None:
        return cols.finish(str(p), meta)
    return _load_whole(p)


def _load_whole(p: Path) -> Trace:
    """Parse the whole document (any layout; exact JSON error messages)."""
    data = _read_bytes(p)
    cols = _Columns()
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"trace: {str(p)!r} is not valid JSON ({exc})") from None
        del data
        if isinstance(doc, list):  # a bare event array is also a valid Chrome trace
            doc = {"traceEvents": doc}
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise TraceError(
                f"trace: {str(p)!r} has no 'traceEvents' list; expected a PyTorch "
                "profiler (Kineto) Chrome trace"
            )
        events = doc.pop("traceEvents")
        meta = doc
        for i in range(0, len(events), 8192):
            cols.add(events[i : i + 8192])
        del events
    finally:
        if enabled:
            gc.enable()
    return cols.finish(str(p), meta)
