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
}


class _Part:
    """One chunk's rows in the store: which chunk (rows are put in file order at the end),
    the microsecond base its times are relative to, where its rows start in the store, how
    many there are, and the shapes of its rows (by row within the chunk)."""

    __slots__ = ("base_us", "chunk", "n", "shapes", "start")

    def __init__(self, chunk: int, base_us: int, start: int, n: int, shapes: dict):
        self.chunk, self.base_us, self.start, self.n = chunk, base_us, start, n
        self.shapes = shapes


class _Store:
    """The rows of every chunk, one growing array per column. The capacity doubles in place
    (``ndarray.resize`` reallocates, which moves a large block's pages instead of copying
    them), so each row is written once into memory that stays: no per-chunk arrays kept and
    no concatenation at the end, which on a virtual machine cost a page fault per 4 KB twice
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
            cap = max(end, 2 * cap)
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
