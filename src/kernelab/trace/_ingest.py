"""Reading a Kineto (PyTorch profiler) Chrome trace into columnar numpy arrays.

The file is decompressed as it is read; the ``traceEvents`` array is cut into chunks of
about a megabyte at event boundaries (any JSON layout: see :mod:`kernelab.trace._scan`),
and each chunk is decoded (msgspec, reading only the fields used, or orjson) and turned
into numpy columns at once. The decoded events of a chunk are dropped before the next is
decoded, so peak memory stays near one chunk plus the columns, never the whole file. Names
are interned into one string table. Only a file that is not valid JSON is parsed whole, for
the exact error.

Times are kept as int64 nanoseconds (Kineto writes microseconds, sometimes with a fraction).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import zlib
from pathlib import Path

import orjson

from kernelab import _flags
from kernelab._workers import ending_with, in_worker
from kernelab.trace import _scan
from kernelab.trace._columns import _Columns
from kernelab.trace._events import (  # noqa: F401 - re-exported for the analyses
    ANNOTATION,
    CATEGORIES,
    CPU_OP,
    GPU_ANNOTATION,
    GPU_KINDS,
    GPU_SYNC,
    IGNORED,
    KERNEL,
    KIND_NAMES,
    MEMCPY,
    MEMSET,
    PYTHON,
    RUNTIME,
    SHAPED_OPS,
    Trace,
    TraceError,
)
from kernelab.trace._limits import Exceeded, Limits, refusal

try:  # ISA-L inflates about twice as fast as zlib, with the same API; optional
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - exercised where isal is not installed
    _inflate = zlib
_ZLIB_ERRORS = (zlib.error, _inflate.error)

#: Bytes of events decoded at once, and of decompressed data per piece. Small pieces come
#: from memory the allocator reuses; large ones are fresh pages each time (a page fault per
#: 4 KB, which on a virtual machine costs about as much as decoding the bytes).
_CHUNK_BYTES = 1 << 20
_PIECE_BYTES = 1 << 16


def _read_bytes(path: Path, cap: int | None = None) -> bytearray:
    """The file's bytes, decompressed when gzip; more than ``cap`` raises :class:`Exceeded`."""
    if not path.exists():
        raise FileNotFoundError(f"trace: no such file {str(path)!r}")
    if path.is_dir():
        raise TraceError(f"trace: {str(path)!r} is a folder, expected a .json or .json.gz file")
    size = path.stat().st_size
    if cap is not None and size > cap:
        raise Exceeded("bytes")
    data = bytearray(size)
    with open(path, "rb") as fh:
        fh.readinto(data)
    if not data:
        raise TraceError(f"trace: {str(path)!r} is empty (0 bytes)")
    if data[:2] == b"\x1f\x8b":
        try:
            return _gunzip(data, cap)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"trace: {str(path)!r} is not a readable gzip file ({exc})") from None
    return data


def _gunzip(data: bytes, cap: int | None = None) -> bytearray:
    """Decompress into a buffer sized from the gzip trailer (gzip.decompress peaks at twice
    the output); multi-member files or a trailer that disagrees take the growing path."""
    size = int.from_bytes(data[-4:], "little") if len(data) >= 18 else 0
    if cap is not None and size > cap:  # the size modulo 2**32: the real one is no smaller
        raise Exceeded("bytes")
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
    return _gunzip_growing(data, cap)


def _gunzip_growing(data: bytes, cap: int | None = None) -> bytearray:
    out = bytearray()
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        step = 1 << 20
        while pos < len(data) and not d.eof:
            out += d.decompress(view[pos : pos + step])
            pos += step
            if cap is not None and len(out) > cap:
                raise Exceeded("bytes")
        out += d.flush()
        if not d.eof:
            raise EOFError("the compressed stream is truncated")
        pos -= len(d.unused_data)
        if not d.unused_data.strip(b"\x00"):
            break
    return out


def _pieces(path: Path, size: int | None = None, cap: int | None = None):
    """The file's bytes, gzip-decompressed when compressed, in pieces of about ``size``
    (default :data:`_PIECE_BYTES`); past ``cap`` bytes in all, :class:`Exceeded` (the
    stream is inflated a piece at a time, so a small file that inflates to gigabytes is
    refused after ``cap`` bytes, none of them kept)."""
    size = size or _PIECE_BYTES
    total = 0
    cap = cap if cap is not None else float("inf")
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic != b"\x1f\x8b":
            while piece := fh.read(size):
                total += len(piece)
                if total > cap:
                    raise Exceeded("bytes")
                yield piece
            return
        d = _inflate.decompressobj(31)
        pending = b""
        while True:
            if not pending:
                pending = fh.read(size // 8)
                if not pending:
                    break
            piece = d.decompress(pending, size)
            total += len(piece)
            if total > cap:
                raise Exceeded("bytes")
            yield piece
            pending = d.unconsumed_tail
            if d.eof:
                rest = d.unused_data + fh.read()
                if not rest.strip(b"\x00"):
                    return
                d = _inflate.decompressobj(31)  # another gzip member follows
                pending = rest
        tail = d.flush()
        if total + len(tail) > cap:
            raise Exceeded("bytes")
        if tail:
            yield tail
        if not d.eof:
            raise EOFError("the compressed stream is truncated")


_DEFAULTS = Limits()


class _Fallback(Exception):
    """The stream cannot be read as a Chrome trace (not JSON, truncated, no event array):
    the whole document is parsed instead, for the exact error."""


#: Bytes left unread past each cut, so that the end of the event array and the top-level
#: fields after it reach the exact end-of-stream handling rather than a guessed cut.
_LOOKAHEAD = 1 << 16
#: The most bytes read while looking for the event array before giving up on streaming.
_HEAD_LIMIT = 1 << 26


def _add_in_place(
    cols: _Columns, buf: bytearray, a: int, b: int, memory: bool | None = None
) -> bool:
    """Decode the events ``buf[a:b]`` as an array without copying them: the byte before
    (blank, comma or the array's '[') and the byte after (',' or blank) become the brackets
    for the call and are restored after it. False where the slice is not valid JSON.
    ``memory``: whether ``[memory]`` instants may be there (None: not known; instants are
    then decoded and looked at, which costs less than searching the bytes)."""
    saved = buf[a - 1], buf[b]
    buf[a - 1], buf[b] = 0x5B, 0x5D
    try:
        with memoryview(buf) as view, view[a - 1 : b + 1] as chunk:
            return cols.add_raw(chunk, memory)
    finally:
        buf[a - 1], buf[b] = saved


def _head(pieces, max_depth: int) -> tuple[dict | None, bytearray, int]:
    """Read until the event array opens at the top level. Returns the top-level fields
    before it (None for a bare array document), the bytes read, and the position after
    the array's '['. Fields nested deeper than ``max_depth`` raise :class:`Exceeded`."""
    buf = bytearray()
    search = first = 0
    while True:
        piece = next(pieces, None)
        if piece is None:
            raise _Fallback
        buf += piece
        first = _scan.skip_blanks(buf, first)  # from where the blanks seen so far end
        if first < len(buf) and buf[first] == 0x5B:
            return None, buf, first + 1
        if first < len(buf) and buf[first] != 0x7B:
            raise _Fallback
        m = _scan.EVENTS_KEY.search(buf, search)
        while m is not None:
            deepest = _scan.depth(buf, first, m.start())  # before parsing: any depth
            if deepest > max_depth:
                raise Exceeded("depth", deepest)
            try:
                head = _scan.lenient_loads(bytes(buf[: m.start()]).rstrip().rstrip(b",") + b"}")
            except ValueError:
                head = None
            if isinstance(head, dict):
                return head, buf, m.end()
            m = _scan.EVENTS_KEY.search(buf, m.start() + 1)  # inside a string or a value
        if len(buf) > _HEAD_LIMIT:
            raise _Fallback
        search = max(0, len(buf) - 256)  # a key cut across two pieces is found next time


def _compact(buf: bytearray, size: int) -> tuple[int, int]:
    """Drop a run of blanks between two values at the start of ``buf[1 : 1 + size]`` (a
    comma between them is kept), so that no byte of a run is scanned twice however long it
    is. Returns the first byte of the next value and the new size."""
    hi = 1 + size
    pos = _scan.skip_blanks(buf, 1)
    comma = int(pos < hi and buf[pos] == 0x2C)
    a = min(_scan.skip_blanks(buf, pos + 1) if comma else pos, hi)
    drop = a - 1 - comma
    if drop <= _PIECE_BYTES:  # a few blanks, as between indented events: left in place
        return a, size
    if comma:
        buf[1] = 0x2C
    buf[1 + comma : hi - drop] = bytes(memoryview(buf)[a:hi])
    return 1 + comma, size - drop


def _lead(buf, lo: int, hi: int) -> int:
    """The first byte of the next value: past blanks and one separating comma."""
    pos = _scan.skip_blanks(buf, lo)
    if pos < hi and buf[pos] == 0x2C:
        pos = _scan.skip_blanks(buf, pos + 1)
    return min(pos, hi)


def _load_streaming(
    path: Path, cols: _Columns, rank: int = 0, workers: int = 1, limits: Limits = _DEFAULTS
) -> dict:
    """Decompress, cut and parse the events as they stream in; returns the top-level fields.

    Any layout: compact or indented, one line or many, the event array first, last or
    between other fields, or a bare array (see :mod:`kernelab.trace._scan` for how chunks
    are cut). With several ``workers``, this one decodes the chunks whose number is
    ``rank`` modulo ``workers``; every worker cuts the same chunks (the guesses depend on
    the bytes only), and a chunk that does not decode raises :class:`_WorkerFailed` (one
    process then reads again, proving each cut). Memory stays near one chunk plus the
    look-ahead. Raises :class:`_Fallback` for a stream that is not a readable trace, and
    :class:`Exceeded` past a limit (decompressed bytes as they stream; events as chunks
    decode; nesting by a bracket count of every chunk before it is decoded, and of the
    top-level fields). A run of blanks is scanned once however long it is, and an event
    longer than the buffer is looked at again only once the buffer has doubled: the time
    is linear in the bytes.
    """

    def take(a: int, b: int, deepest: int | None = None) -> bool:
        if cols.next_chunk % workers != rank:
            cols.skip()
            return True
        if deepest is None:  # measured before decoding: the decoders follow ~1000 levels
            deepest = _scan.depth_fast(work, a, b) + base
            if deepest > limits.max_depth:
                raise Exceeded("depth", deepest)
        if _add_in_place(cols, work, a, b, memory):
            return True
        if workers > 1:
            raise _WorkerFailed
        return False

    def exact(a: int, hi: int) -> tuple[int, int]:
        """Decode the complete events of ``work[a:hi]`` at their exact boundaries; returns
        the end of the last one and the array's ']' (-1 if not in the slice)."""
        ends, close, deepest = _scan.structure(work, a, hi)
        if deepest + base > limits.max_depth:
            raise Exceeded("depth", deepest + base)
        done = ends[-1] if ends else a
        if close >= 0 and _lead(work, done, close) != close:
            raise _Fallback  # a value that is not an object or array: not a trace
        if ends and not take(a, done, deepest):
            try:
                events, bad = _scan.events_of(work, a, ends)
            except ValueError:
                raise _Fallback from None
            cols.malformed += bad
            cols.add(events)
        return done, close

    pieces = _pieces(path, cap=limits.max_bytes)
    head, buf, pos = _head(pieces, limits.max_depth)
    base = 1 if head is None else 2  # the levels around an event: the array, the document
    # Kineto writes profile_memory before the events: without it (0), instants are skipped
    # in C; with it, or where the flag comes later or not at all, they are decoded.
    flag = head.get("profile_memory") if head else None
    memory = None if flag is None or flag else False
    cutter = _scan.Cutter()
    # The unparsed bytes sit in one reused buffer after a spare byte for the '[' (reused:
    # see _PIECE_BYTES).
    work = bytearray(_CHUNK_BYTES + _LOOKAHEAD + 2 * _PIECE_BYTES)
    size = len(buf) - pos
    work[1 : 1 + size] = memoryview(buf)[pos:]
    del buf
    close = -1
    # Where a buffer held no cut, the size at which it is looked at again: twice the size
    # then, so that however long one event is, each byte is scanned a bounded number of times.
    retry = 0
    for piece in pieces:
        end = 1 + size + len(piece)
        work[1 + size : end] = piece  # grows the buffer only for events longer than a chunk
        size += len(piece)
        if size < max(_CHUNK_BYTES + _LOOKAHEAD, retry):
            continue
        a, size = _compact(work, size)
        end = 1 + size
        if size < _CHUNK_BYTES + _LOOKAHEAD:
            continue
        hi = end - _LOOKAHEAD
        guess = cutter.guess(work, a, hi)
        if guess is not None and take(a, guess[0] + 1):
            nxt = guess[1]
        else:  # no separator (a long event, or a run of blanks), a wrong guess, or not
            nxt, close = exact(a, end)  # valid JSON as a whole
            if close >= 0:
                break
        if nxt == a:  # one event longer than the buffer: keep reading
            retry = 2 * size
            continue
        retry = 0
        work[1 : 1 + end - nxt] = bytes(memoryview(work)[nxt:end])
        size = end - nxt
    if close < 0:
        hi = 1 + size
        _, close = exact(_lead(work, 1, hi), hi)
        if close < 0:
            raise _Fallback  # the array never closes: truncated, or not JSON
        rest = bytes(work[close + 1 : hi])
    else:
        rest = bytes(work[close + 1 : end])
    tail = [rest] if rest.strip() else []
    for piece in pieces:  # blanks after the array before anything else are not kept
        if tail or piece.strip():
            tail.append(piece)
    rest = b"".join(tail).strip()
    if head is None:  # a bare array
        if rest:
            raise _Fallback
        return {}
    if rest == b"}":
        return head
    if not rest.startswith(b","):
        raise _Fallback
    deepest = _scan.depth(rest) + 1  # the fields after the array, inside the document
    if deepest > limits.max_depth:
        raise Exceeded("depth", deepest)
    try:
        trailer = _scan.lenient_loads(b"{" + rest[1:])
    except ValueError:
        raise _Fallback from None
    if not isinstance(trailer, dict):
        raise _Fallback
    return {**head, **trailer}


class _WorkerFailed(Exception):
    """A decoding process failed: the trace is read again by this process alone."""


def _decompressed_size(p: Path) -> int:
    with open(p, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return p.stat().st_size
        fh.seek(-4, 2)
        isize = int.from_bytes(fh.read(4), "little")  # the size modulo 2**32
    return max(isize, 4 * p.stat().st_size)  # JSON compresses 5-20x; a wrapped size is small


def _workers(workers: int | None) -> int:
    """Processes that decode: as asked, else ``KERNELAB_TRACE_WORKERS``, else one. One by
    default because a forked decoder costs CPU time of its own (each process inflates and
    cuts the whole stream, and the columns cross a pipe): it shortens the wall time only
    where a CPU would otherwise be idle, and always lengthens the CPU time."""
    if workers is None:
        workers = _flags.trace_workers()
    if workers is None:
        return 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a whole number of processes >= 1, got {workers!r}")
    return workers if hasattr(os, "fork") else 1


def _load_parallel(p: Path, cols: _Columns, workers: int, limits: Limits) -> tuple[dict, list]:
    """Decode the chunks in ``workers`` processes: this one and forked ones, each reading the
    whole stream and decoding every ``workers``-th chunk. The others send their columns back
    through a pipe as raw arrays and a JSON header (never pickled). Returns the top-level
    fields and the other processes' peak memory. The others end with this one: on an error,
    Ctrl-C or SIGTERM they are killed and reaped."""
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe, or -1 once closed)

    def stop() -> None:
        while children:
            pid, r = children.pop()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            if r >= 0:
                os.close(r)

    try:
        with ending_with(stop) as guard:
            return _fork_and_decode(p, cols, workers, children, guard, limits)
    finally:
        stop()  # only on an error: nothing is left once the workers have been read


def _fork_and_decode(
    p: Path, cols: _Columns, workers: int, children: list, guard, limits: Limits
) -> tuple:
    """``_load_parallel``'s work; each forked worker is in ``children`` from its start until
    it has been read and reaped (signals wait while it starts: ``guard.starting``)."""
    for rank in range(1, workers):
        with guard.starting():
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the forked worker: decode, send, exit without cleanup
                code = 1
                try:
                    in_worker()
                    os.close(r)
                    mine = _Columns(limits.max_events)
                    _load_streaming(p, mine, rank, workers, limits)
                    with open(w, "wb") as out:
                        for piece in mine.export():
                            out.write(piece)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
    meta = _load_streaming(p, cols, 0, workers, limits)
    peaks = []
    while children:
        pid, r = children[0]
        with open(r, "rb") as fh:
            children[0] = (pid, -1)  # closed with fh
            payload = fh.read()  # bytes: the columns below are read-only views of it
        _, status = os.waitpid(pid, 0)
        children.pop(0)
        if status != 0 or len(payload) < 8:
            raise _WorkerFailed
        try:
            peaks.append(cols.absorb(payload)["peak_rss"])
        except (ValueError, KeyError, TypeError) as exc:
            raise _WorkerFailed from exc
    return meta, peaks


def load(path, *, workers: int | None = 1, limits: Limits | None = None) -> Trace:
    """Read a Kineto trace (``.json`` or ``.json.gz``) into columns.

    ``workers``: processes that decode it: ``1`` (the default) this one alone; more fork
    helpers (POSIX) that each decode a share of the chunks (shorter wall time on idle CPUs,
    more CPU time); ``None``: ``KERNELAB_TRACE_WORKERS`` if set, else one (the command
    line does this). ``limits``: the most it may hold (default: :meth:`Limits.resolve`,
    the environment's or the defaults). Raises :class:`TraceError` (a ValueError) with
    one line for anything unreadable, :class:`TraceLimitError` for a trace over a limit.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"trace: no such file {str(p)!r}")
    if p.is_dir():
        raise TraceError(f"trace: {str(p)!r} is a folder, expected a .json or .json.gz file")
    if p.stat().st_size == 0:
        raise TraceError(f"trace: {str(p)!r} is empty (0 bytes)")
    limits = Limits.resolve() if limits is None else limits
    n = _workers(workers)
    try:
        if _decompressed_floor(p) > limits.max_bytes:  # refused before inflating a byte
            raise Exceeded("bytes")
        trace, n, peaks = _load(p, n, limits)
    except Exceeded as exc:
        raise refusal(str(p), exc, limits) from None
    except RecursionError:  # a decoder gave up (about 1000 levels): never a traceback
        raise refusal(str(p), Exceeded("depth"), limits) from None
    trace.ingest = {"workers": n, "worker_peak_rss": peaks}
    return trace


def _load(p: Path, n: int, limits: Limits) -> tuple[Trace, int, list[int]]:
    cols = _Columns(limits.max_events)
    peaks: list[int] = []
    enabled = gc.isenabled()
    gc.disable()  # the decoders build many objects; the cyclic collector only slows them
    try:
        if n > 1:
            try:
                meta, peaks = _load_parallel(p, cols, n, limits)
            except _WorkerFailed:
                cols, n, peaks = _Columns(limits.max_events), 1, []
                meta = _load_streaming(p, cols, limits=limits)
        else:
            meta = _load_streaming(p, cols, limits=limits)
    except (_Fallback, orjson.JSONDecodeError):
        meta = None
    except (OSError, EOFError, *_ZLIB_ERRORS) as exc:
        raise TraceError(f"trace: {str(p)!r} is not a readable gzip file ({exc})") from None
    finally:
        if enabled:
            gc.enable()
    if meta is None:
        return _load_whole(p, limits), 1, []
    return cols.finish(str(p), meta), n, peaks


def _decompressed_floor(p: Path) -> int:
    """The fewest bytes the file can inflate to: a plain file's size; for gzip the last
    member's recorded size (modulo 2**32, so the real one is never smaller)."""
    with open(p, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or p.stat().st_size < 18:
            return p.stat().st_size
        fh.seek(-4, 2)
        return int.from_bytes(fh.read(4), "little")


def _load_whole(p: Path, limits: Limits = _DEFAULTS) -> Trace:
    """Parse the whole document (any layout; exact JSON error messages)."""
    data = _read_bytes(p, limits.max_bytes)
    cols = _Columns(limits.max_events)
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit exceeded"):  # orjson follows 1024 levels
                raise Exceeded("depth") from None
            raise TraceError(f"trace: {str(p)!r} is not valid JSON ({exc})") from None
        deepest = _scan.depth_fast(data)  # exact: the document is valid JSON
        if deepest > limits.max_depth:
            raise Exceeded("depth", deepest)
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
