"""Links between events: GPU rows to their launch calls (correlation ids), launch calls to the
cpu op that issued them (nesting on the launching thread), and interval arithmetic."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kernelab.trace._ingest import CPU_OP, GPU_KINDS, KERNEL, MEMCPY, MEMSET, RUNTIME, Trace

COMPUTE, MEMORY, COMMUNICATION = "compute", "memory", "communication"
CATEGORY_ORDER = (COMPUTE, MEMORY, COMMUNICATION)

_COMM = re.compile(r"^(void )?(nccl|rccl)", re.IGNORECASE)
_GRAPH = re.compile(r"GraphLaunch")
_SYNC = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize)$"
    r"|^cu(Ctx|Stream|Event)Synchronize$"
)
SYNC_KIND = {"Device": "device", "Ctx": "device", "Stream": "stream", "Event": "event"}


def normalise(name: str) -> str:
    """A kernel name with template arguments collapsed and the parameter list dropped.

    ``void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>, ...>(int, ...)``
    becomes ``at::native::vectorized_elementwise_kernel<...>``.
    """
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            ch = text[i]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    if i > 0 and text[i - 1] != " ":
                        text = text[:i]
                    break
    out = []
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<" and not text.startswith("operator", max(0, i - 8)):
            if depth == 0:
                out.append("<...>")
            depth += 1
        elif ch == ">" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()


def _group_ids(links: Links) -> tuple[np.ndarray, list[str]]:
    """Per GPU row (aligned with ``links.gpu``): a group id, and the group names."""
    t = links.trace
    table: dict[str, int] = {}
    per_string = np.array([table.setdefault(normalise(s), len(table)) for s in t.strings])
    names = [""] * len(table)
    for k, v in table.items():
        names[v] = k
    ids = per_string[t.name[links.gpu]] if len(t.strings) else np.zeros(0, dtype=np.int64)
    return ids, names


def nesting_parents(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The enclosing interval of each interval on its thread, or -1 (vectorised).

    Input is sorted by (thread, start, longest first). Interval j encloses i when it started
    no later and had not ended by i's start; an interval ending exactly where i starts is a
    sibling, except a zero-length one at the same start, which encloses. The parent of i is
    the latest interval before it one nesting level up.
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new_thread = np.r_[True, thread[1:] != thread[:-1]]
    rank = np.cumsum(new_thread) - 1
    first = np.flatnonzero(new_thread)[rank]  # index of the thread's first interval
    base = int(min(start.min(), end.min()))
    width = int(max(start.max(), end.max())) - base + 1
    end_key = np.sort(rank * width + (end - base))
    at = rank * width + (start - base)
    ended = np.searchsorted(end_key, at, side="right") - first
    # Zero-length intervals starting exactly at i's start have not ended for it (they sort
    # before i, or are i itself).
    zero = np.sort(at[end == start])
    ended -= np.searchsorted(zero, at, side="right") - np.searchsorted(zero, at, side="left")
    depth = np.maximum(np.arange(n) - first - ended, 0)
    levels = int(depth.max()) + 2
    group = rank * levels + depth
    key = group * n + np.arange(n)
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    want = (group - 1) * n + np.arange(n)
    pos = np.searchsorted(sorted_key, want, side="left") - 1
    ok = (depth > 0) & (pos >= 0)
    cand = np.where(ok, order[np.maximum(pos, 0)], -1)
    ok &= (cand >= 0) & (group[np.maximum(cand, 0)] == group - 1)
    c = np.maximum(cand, 0)
    ok &= (end[c] > start) | (start[c] == start)  # it still runs when i starts
    return np.where(ok, cand, -1)


# np.unique without indices, np.isin and np.percentile import numpy.ma on first use (10-15 ms
# of a whole summary on a small machine); the analyses use these instead.


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array (``np.unique``)."""
    s = np.sort(values)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def member(values: np.ndarray, of) -> np.ndarray:
    """Whether each value occurs in ``of`` (``np.isin`` for integers)."""
    keys = distinct(np.asarray(of, dtype=np.int64))
    if len(keys) == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return keys[pos] == values


def group_rows(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows with equal values in every one of ``keys`` (int64 arrays of one length) as one
    group: ``(group of each row, first row of each group)``, groups numbered by their first
    row (file order)."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), *keys[::-1]))
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for k in keys:
        ks = k[order]
        new[1:] |= ks[1:] != ks[:-1]
    sorted_group = np.cumsum(new) - 1
    firsts = order[new]  # the first row of each group (rows of a group are in file order)
    rank = np.empty(len(firsts), dtype=np.int64)
    rank[np.argsort(firsts, kind="stable")] = np.arange(len(firsts))
    group = np.empty(n, dtype=np.int64)
    group[order] = rank[sorted_group]
    return group, np.sort(firsts)


def percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)``: the same linear interpolation (equal to within a unit in
    the last place; the analyses round to nanoseconds)."""
    a = np.sort(values)
    n = len(a)
    f = q / 100
    virtual = n * f + (1 + f * -1) - 1
    lo = min(max(int(np.floor(virtual)), 0), n - 1)
    hi = min(lo + 1, n - 1)
    t = virtual - np.floor(virtual)
    d = a[hi] - a[lo]
    return float(a[hi] - d * (1 - t)) if t >= 0.5 else float(a[lo] + d * t)


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint [start, end) arrays."""
    if len(starts) == 0:
        return starts[:0].copy(), ends[:0].copy()
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    # A merged interval ends at the running maximum of ends at its last member (times may be
    # negative: they are relative to the first chunk's earliest event).
    last = np.r_[heads[1:] - 1, len(s) - 1]
    return s[heads], reach[last]


def covered(starts: np.ndarray, ends: np.ndarray) -> int:
    ms, me = merge(starts, ends)
    return int((me - ms).sum())


@dataclass
class Links:
    """Derived per-row facts shared by the analyses (computed once per trace)."""

    trace: Trace

    @cached_property
    def gpu(self) -> np.ndarray:
        """Row indices of GPU activity (kernels, copies, sets), sorted by start time."""
        k = self.trace.kind
        rows = np.flatnonzero((k == KERNEL) | (k == MEMCPY) | (k == MEMSET))
        return rows[np.argsort(self.trace.ts[rows], kind="stable")]

    @cached_property
    def name_category(self) -> np.ndarray:
        """Per string id: 0 compute, 2 communication (memory comes from the event kind)."""
        return np.array([2 if _COMM.match(s) else 0 for s in self.trace.strings], dtype=np.int8)

    @cached_property
    def category(self) -> np.ndarray:
        """Per GPU row (aligned with ``gpu``): 0 compute, 1 memory, 2 communication."""
        t = self.trace
        cat = self.name_category[t.name[self.gpu]].copy()
        cat[t.kind[self.gpu] != KERNEL] = 1
        return cat

    @cached_property
    def runtime(self) -> np.ndarray:
        """Runtime rows with a correlation id, sorted by it."""
        t = self.trace
        rows = np.flatnonzero((t.kind == RUNTIME) & (t.corr >= 0))
        return rows[np.argsort(t.corr[rows], kind="stable")]

    @cached_property
    def launch_of(self) -> np.ndarray:
        """Per GPU row (aligned with ``gpu``): the runtime row that launched it, or -1."""
        t = self.trace
        rt = self.runtime
        corr = t.corr[self.gpu]
        if len(rt) == 0:
            return np.full(len(corr), -1, dtype=np.int64)
        keys = t.corr[rt]
        pos = np.minimum(np.searchsorted(keys, corr), len(rt) - 1)
        found = (keys[pos] == corr) & (corr >= 0)
        return np.where(found, rt[pos], -1)

    @cached_property
    def graph_runtime(self) -> np.ndarray:
        """Per string id: whether it names a CUDA/HIP graph launch."""
        return np.array([bool(_GRAPH.search(s)) for s in self.trace.strings], dtype=bool)

    @cached_property
    def sync_kind(self) -> dict[int, str]:
        """String id -> "device" | "stream" | "event" for host-side synchronisation calls."""
        out = {}
        for i, s in enumerate(self.trace.strings):
            m = _SYNC.match(s)
            if m:
                word = next(w for w in SYNC_KIND if w in s)
                out[i] = SYNC_KIND[word]
        return out

    @cached_property
    def sync_rows(self) -> np.ndarray:
        t = self.trace
        if not self.sync_kind:
            return np.zeros(0, dtype=np.int64)
        ids = np.fromiter(self.sync_kind, dtype=np.int64)
        return np.flatnonzero((t.kind == RUNTIME) & member(t.name, ids))

    @cached_property
    def op_parent(self) -> tuple[np.ndarray, np.ndarray]:
        """cpu op rows sorted by (thread, start, -dur) and each one's enclosing op (-1)."""
        t = self.trace
        rows = np.flatnonzero(t.kind == CPU_OP)
        order = np.lexsort((-t.dur[rows], t.ts[rows], t.tid[rows], t.pid[rows]))
        rows = rows[order]
        thread = t.pid[rows] * 1_000_003 + t.tid[rows]
        start = t.ts[rows]
        return rows, nesting_parents(thread, start, start + np.maximum(t.dur[rows], 0))

    def enclosing_op(self, rows: np.ndarray) -> np.ndarray:
        """For each row (a CPU-side event), the innermost cpu op containing it, or -1."""
        t = self.trace
        out = np.full(len(rows), -1, dtype=np.int64)
        ops, parent = self.op_parent
        if len(ops) == 0 or len(rows) == 0:
            return out
        thread_ops = t.pid[ops] * 1_000_003 + t.tid[ops]
        thread_q = t.pid[rows] * 1_000_003 + t.tid[rows]
        q_ts = t.ts[rows]
        op_ts = t.ts[ops]
        op_end = op_ts + t.dur[ops]
        # Combined key: thread rank then time, so one searchsorted covers every thread.
        uniq = distinct(thread_ops)
        rank_ops = np.searchsorted(uniq, thread_ops)
        rank_q = np.searchsorted(uniq, thread_q)
        valid_q = (rank_q < len(uniq)) & (uniq[np.minimum(rank_q, len(uniq) - 1)] == thread_q)
        span = int(max(op_end.max(), q_ts.max()) - min(op_ts.min(), q_ts.min())) + 2
        base = int(min(op_ts.min(), q_ts.min()))
        key_o = rank_ops.astype(np.float64) * span + (op_ts - base)
        key_q = rank_q.astype(np.float64) * span + (q_ts - base)
        if span * (len(uniq) + 1) < 2**52:
            pos = np.searchsorted(key_o, key_q, side="right") - 1
        else:  # fall back to an exact per-thread search
            pos = np.full(len(rows), -1, dtype=np.int64)
            for r in range(len(uniq)):
                sel_o = np.flatnonzero(rank_ops == r)
                sel_q = np.flatnonzero(rank_q == r)
                p = np.searchsorted(op_ts[sel_o], q_ts[sel_q], side="right") - 1
                pos[sel_q] = np.where(p >= 0, sel_o[np.maximum(p, 0)], -1)
        q_end = q_ts + t.dur[rows]
        ok = valid_q & (pos >= 0)
        p = np.maximum(pos, 0)
        direct = ok & (rank_ops[p] == rank_q) & (op_ts[p] <= q_ts) & (op_end[p] >= q_end)
        out[direct] = ops[p[direct]]
        for i in np.flatnonzero(ok & ~direct):
            j = int(pos[i])
            while j >= 0 and not (
                rank_ops[j] == rank_q[i] and op_ts[j] <= q_ts[i] and op_end[j] >= q_end[i]
            ):
                j = int(parent[j])
            out[i] = ops[j] if j >= 0 else -1
        return out

    @cached_property
    def gpu_op(self) -> np.ndarray:
        """Per GPU row (aligned with ``gpu``): the cpu op that launched it, or -1."""
        launch = self.launch_of
        out = np.full(len(launch), -1, dtype=np.int64)
        have = np.flatnonzero(launch >= 0)
        if len(have):
            out[have] = self.enclosing_op(launch[have])
        return out

    @cached_property
    def groups(self) -> tuple[np.ndarray, list[str]]:
        """Per GPU row: a kernel-group id (normalised name), and the group names."""
        return _group_ids(self)

    @cached_property
    def gpu_rows_by_kind(self) -> dict[int, np.ndarray]:
        k = self.trace.kind[self.gpu]
        return {kind: np.flatnonzero(k == kind) for kind in GPU_KINDS}
