"""The columnar form of a trace: event kinds, the categories Kineto writes, and
:class:`Trace`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    block: np.ndarray  # int64 threads per block, -1 if none
    grid: np.ndarray  # int64 blocks in the grid, -1 if none
    nbytes: np.ndarray  # int64 bytes of a memcpy / memset, -1 if none
    shape: np.ndarray  # int32 index into shape_table (a shaped op's inputs), -1 if none
    #: The distinct (input dims, input types) of the shaped ops (cpu ops in SHAPED_OPS).
    shape_table: list[tuple[list, list]] = field(default_factory=list)
    unknown_categories: dict[str, int] = field(default_factory=dict)
    malformed: int = 0  # 'X' events without a usable ts/dur/name
    out_of_range: int = 0  # 'X' events whose ts or dur overflows (skipped)
    #: Events far outside the bulk of the times (dropped): count and a few examples.
    outliers: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    #: ``[memory]`` instants (profile_memory=True), in file order: ts (ns, like the events'),
    #: tid, addr, bytes (negative: a free), allocated and reserved totals after the event,
    #: device_type (0 CPU, 1 CUDA, ...), device_id; None when the trace has none.
    memory: dict | None = None
    #: How the file was read: processes used, and the peak memory of the extra ones (bytes).
    ingest: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def shapes(self) -> dict[int, tuple[list, list]]:
        """Row -> (input dims, input types) of every row with recorded shapes."""
        table = self.shape_table
        rows = np.flatnonzero(self.shape >= 0)
        return {i: table[j] for i, j in zip(rows.tolist(), self.shape[rows].tolist(), strict=True)}

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
