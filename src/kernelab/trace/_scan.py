"""Finding the events of a Chrome trace's ``traceEvents`` array in any JSON layout.

Streaming cuts the array into chunks at event boundaries and decodes each chunk as an
array of its own. A boundary is first *guessed* (the last ``}`` followed by blanks, a comma,
blanks and ``{``; the separator seen last is tried first, so Kineto's ``},\\n  {`` or a
minified ``},{`` is one ``rfind``), and the guess is *proved* by the decoder: a slice that
starts at an event and decodes as a JSON array of complete values ends where the real
document's parser would be back at the array's level, because a JSON parser's state after
a prefix depends only on that prefix. Where a guess fails (a ``},{`` inside nested args or a
string, the end of the array, or an event that is not valid JSON), :func:`structure` finds
the exact boundaries with a vectorised bracket count that skips strings and escapes.
"""

from __future__ import annotations

import json
import re

import numpy as np
import orjson

#: The top-level key of the event array; a match counts only if what precedes it parses as
#: the start of a JSON object (so a match inside a string or a nested value is passed over).
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SEP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_BLANK = re.compile(rb"[ \t\r\n]*")
_OPEN, _CLOSE, _QUOTE, _BACKSLASH = (ord(c) for c in '{}"\\')


def skip_blanks(buf, pos: int) -> int:
    return _BLANK.match(buf, pos).end()


class Cutter:
    """Guesses the last event boundary in a buffer; remembers the separator it saw last."""

    def __init__(self, sep: bytes = b"},{"):
        self.sep = sep

    def guess(self, buf, lo: int, hi: int) -> tuple[int, int] | None:
        """``(close, next_open)``: the ``}`` ending the last event that seems complete in
        ``buf[lo:hi]`` and the ``{`` of the event after it; None if no separator is seen."""
        at = buf.rfind(self.sep, lo, hi)
        if at >= lo:
            return at, at + len(self.sep) - 1
        pos = hi
        while True:
            pos = buf.rfind(b"}", lo, pos)
            if pos < lo:
                return None
            m = _SEP.match(buf, pos, hi)
            if m:
                self.sep = bytes(m.group())
                return pos, m.end() - 1


#: Bytes counted at once by the bracket count (its arrays take about 15 bytes per byte).
_BLOCK = 1 << 22


def _blocks(buf, lo: int, hi: int):
    """``(start, length)`` of consecutive blocks of ``buf[lo:hi]`` of about :data:`_BLOCK`
    bytes, none ending inside a run of backslashes (a run and the byte it escapes are
    always counted together)."""
    pos = lo
    while pos < hi:
        end = min(pos + _BLOCK, hi)
        while end < hi and buf[end - 1] == _BACKSLASH:
            end += 1
        yield pos, end - pos
        pos = end


def _levels(buf, lo: int, n: int, inside: bool = False) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per byte of ``buf[lo:lo+n]``: +1 for a bracket that opens, -1 for one that closes,
    0 otherwise or inside a string; the nesting level after it, from 0 at ``lo``; and
    whether the slice ends inside a string (``inside``: whether it starts in one). A quote
    after an odd run of backslashes is escaped."""
    a = np.frombuffer(buf, np.uint8, n, lo)
    quote = a == _QUOTE
    bs = np.flatnonzero(a == _BACKSLASH)
    if len(bs):
        first = np.r_[True, np.diff(bs) != 1]  # starts of backslash runs
        starts = np.flatnonzero(first)
        lengths = np.diff(np.r_[starts, len(bs)])
        after = bs[np.r_[starts[1:] - 1, len(bs) - 1]] + 1  # the byte after each run
        after = after[(lengths % 2 == 1) & (after < n)]
        quote[after] = False
    strings = ((np.cumsum(quote, dtype=np.int64) + int(inside)) & 1).astype(bool)
    step = np.zeros(n, np.int8)
    step[(a == _OPEN) | (a == ord("["))] = 1
    step[(a == _CLOSE) | (a == ord("]"))] = -1
    step[strings] = 0
    return step, np.cumsum(step, dtype=np.int32), bool(strings[-1]) if n else inside


def structure(buf, lo: int, hi: int) -> tuple[list[int], int, int]:
    """Exact boundaries of the values in ``buf[lo:hi]``, which starts at a value of the
    events array (outside any string): the position one past each complete value that ends
    in a bracket, the position of the array's closing ``]`` (-1 if not in the slice), and
    the deepest nesting of the values (1: an object holding no object or array). Only
    brackets outside strings count; the slice is counted a block at a time, so the memory
    this takes does not grow with it."""
    ends: list[int] = []
    level = deepest = 0
    inside = False
    for start, n in _blocks(buf, lo, hi):
        step, depth, inside = _levels(buf, start, n, inside)
        depth += level
        below = np.flatnonzero(depth < 0)
        close = int(below[0]) if len(below) else n
        ends += (np.flatnonzero((step[:close] == -1) & (depth[:close] == 0)) + start + 1).tolist()
        if close:
            deepest = max(deepest, int(depth[:close].max()))
        if len(below):
            return ends, start + close, deepest
        level = int(depth[-1])
    return ends, -1, deepest


def depth(buf, lo: int = 0, hi: int | None = None) -> int:
    """The deepest nesting of the JSON text ``buf[lo:hi]`` (starting outside any string),
    counted from 0 at ``lo``; exact, without parsing, a block at a time."""
    level = deepest = 0
    inside = False
    for start, n in _blocks(buf, lo, len(buf) if hi is None else hi):
        _, levels, inside = _levels(buf, start, n, inside)
        deepest = max(deepest, level + int(levels.max()))
        level += int(levels[-1])
    return deepest


#: Every byte but the brackets and the quote: what the fast nesting count deletes.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'{}[]"')
_STEP = np.zeros(256, np.int8)
_STEP[list(b"{[")], _STEP[list(b"}]")] = 1, -1


def depth_fast(buf, lo: int = 0, hi: int | None = None) -> int:
    """:func:`depth`, about ten times faster where no quote follows a backslash (else it is
    :func:`depth`): only the brackets and quotes are kept (a few percent of a Kineto
    trace's bytes), less every pair of adjacent quotes (a string that holds no bracket, or
    the gap between two strings that holds none: taking away two adjacent quotes changes
    for no bracket whether it is inside a string). Where no quote is left, the brackets
    are all outside strings and are summed directly."""
    hi = len(buf) if hi is None else hi
    with memoryview(buf) as view, view[lo:hi] as part:
        text = part.tobytes()
    if b"\\" in text and b'\\"' in text:
        return depth(buf, lo, hi)
    marks = text.translate(None, _NOT_STRUCTURE).replace(b'""""', b"").replace(b'""', b"")
    if b'"' in marks:
        return depth(marks)
    return int(np.cumsum(_STEP[np.frombuffer(marks, np.uint8)], dtype=np.int32).max(initial=0))


class NonFinite(float):
    """A NaN or Infinity token (Python's json accepts them; orjson and msgspec do not)."""


def _non_finite(token: str) -> NonFinite:
    return NonFinite(float(token))


def lenient_loads(data) -> object:
    """orjson's parse, or where it fails Python's json with NaN / Infinity tokens read as
    :class:`NonFinite` floats; raises ValueError for anything else that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        text = bytes(data).decode("utf-8", errors="replace")
        return json.loads(text, parse_constant=_non_finite)


def has_non_finite(value) -> bool:
    """Whether a NaN or Infinity token is anywhere in ``value`` (no recursion: any depth)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if type(v) is NonFinite:
            return True
        if type(v) is dict:
            todo.extend(v.values())
        elif type(v) is list:
            todo.extend(v)
    return False


def events_of(buf, lo: int, ends: list[int]) -> tuple[list, int]:
    """Decode the values ``buf[lo:ends[-1]]`` one at a time (the slow path for a chunk that
    is not valid JSON as a whole): returns the decoded events and how many held NaN or
    Infinity (dropped, to be counted malformed). Raises ValueError on real syntax errors."""
    out, bad = [], 0
    start = lo
    for end in ends:
        value = lenient_loads(memoryview(buf)[start:end])
        if has_non_finite(value):
            bad += 1
        else:
            out.append(value)
        start = skip_blanks(buf, end)
        if start < len(buf) and buf[start] == ord(","):
            start = skip_blanks(buf, start + 1)
    return out, bad
