"""Where the columns of a trace's chunks are written as they are decoded: one growing array
per column, and a note per chunk of where its rows went."""

from __future__ import annotations

import numpy as np

#: The columns of a :class:`Trace` and their dtypes.
COLUMNS = {
    "kind": np.int8,
    "name": np.int32,
    "ts": np.int64,
    "dur": np.int64,
    "pid": np.int64,
    "tid": np.int64,
    "corr": np.int64,
    "regs": np.int32,
    "shmem": np.int64,
    "block": np.int64,
    "grid": np.int64,
    "nbytes": np.int64,
    "shape": np.int32,
}


class _Part:
    """One chunk's rows in the store: which chunk (rows are put in file order at the end),
    the microsecond base its times are relative to, where its rows start in the store and
    how many there are."""

    __slots__ = ("base_us", "chunk", "n", "start")

    def __init__(self, chunk: int, base_us: int, start: int, n: int):
        self.chunk, self.base_us, self.start, self.n = chunk, base_us, start, n


class _Store:
    """The rows of every chunk, one growing array per column. The capacity grows by a quarter
    in place (``ndarray.resize`` reallocates, which moves a large block's pages instead of
    copying them, and zero-fills the new part: a quarter wastes less than doubling), so each
    row is written once into memory that stays: no per-chunk arrays kept and no
    concatenation at the end, which on a virtual machine cost a page fault per 4 KB twice
    over. No view of the arrays may exist while they can still grow."""

    #: Rows allocated at first.
    FIRST = 1 << 12

    def __init__(self):
        self.n = 0
        self.cols = {k: np.empty(self.FIRST, dtype=dt) for k, dt in COLUMNS.items()}

    def append(self, arrays: dict) -> int:
        """Copy one chunk's columns in; returns the row where they start."""
        start, m = self.n, len(arrays["kind"])
        end = start + m
        cap = len(self.cols["kind"])
        if end > cap:
            cap = max(end, cap + cap // 4)
            for col in self.cols.values():
                col.resize(cap, refcheck=False)  # the store holds the only reference
        for k, col in self.cols.items():
            col[start:end] = arrays[k]
        self.n = end
        return start

    def take(self) -> dict:
        """The columns trimmed to the rows written (the store is empty after)."""
        cols, n = self.cols, self.n
        for col in cols.values():
            col.resize(n, refcheck=False)
        self.cols, self.n = {k: np.empty(0, dtype=dt) for k, dt in COLUMNS.items()}, 0
        return cols


class _ShapeTable:
    """The distinct ``(input dims, input types)`` of the shaped ops, numbered as first seen;
    a row's ``shape`` column holds its number (-1: none). Keyed by the values (``repr``), so
    equal shapes written differently (indented, or read by another process) are one entry,
    and by raw JSON texts for the decoder's rows (:attr:`texts`: a pair of texts -> the
    number, each pair decoded once by ``decode``)."""

    def __init__(self, decode=None):
        self.pairs: list[tuple[list, list]] = []
        self._ids: dict[str, int] = {}
        self.texts = _ShapeTexts(self, decode)

    def of(self, dims, types) -> int:
        """The number of a shape (-1 unless both are lists)."""
        if type(dims) is not list or type(types) is not list:
            return -1
        key = repr((dims, types))
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.pairs)
            self.pairs.append((dims, types))
        return i


class _ShapeTexts(dict):
    """(dims text, types text) -> the shape's number in the table (-1: no shape); a lookup
    is one C-level call, a new pair of texts is decoded once."""

    def __init__(self, table: _ShapeTable, decode):
        super().__init__()
        self.table, self.decode = table, decode

    def __missing__(self, texts: tuple) -> int:
        try:
            i = self.table.of(self.decode(texts[0]), self.decode(texts[1]))
        except ValueError:  # not valid JSON on its own: no shape
            i = -1
        self[texts] = i
        return i
