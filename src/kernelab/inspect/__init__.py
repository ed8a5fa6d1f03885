"""inspect: what the compiler made of each kernel, for sm_80, sm_90, sm_100 and gfx942, without
a GPU; and what Mosaic receives from each Pallas call for tpu_v5e, tpu_v6e and tpu7x, without a
TPU (:mod:`kernelab.inspect.tpu`: grid, blocks, semantics, VMEM estimate, findings).

Public API (the autotuner's too):

- :func:`analyze` (a :class:`kernelab.ops.Launch`, a target) → :class:`KernelReport`:
  registers, spills, shared memory, occupancy and its limiter, global load/store widths,
  tensor-core instructions, TMA, 32-bit offsets, and findings with suggestions.
- :func:`prune` (a launch, a target) → :class:`Verdict`: whether a config spills, exceeds
  shared memory, cannot reach one block per SM, or loses tensor cores.
- :func:`inspect_ops` (ops, targets) → reports for every launch the ops would make;
  :func:`parse_signature` and :func:`analyze_spec` for users' own kernels.
- :class:`Job` and :func:`analyze_jobs`: many (spec, target) compilations in one batch, over
  the workers and the cache (the autotuner's static ranking); :func:`resolve_target`.
- :mod:`kernelab.inspect.baseline`: the CI gate.

Nothing compiles at import.
"""

from kernelab.inspect.findings import Finding
from kernelab.inspect.report import (
    Job,
    KernelReport,
    Verdict,
    analyze,
    analyze_jobs,
    analyze_spec,
    prune,
)
from kernelab.inspect.signature import parse_signature
from kernelab.inspect.spec import Spec, from_launch
from kernelab.inspect.stage import inspect_ops, stage
from kernelab.inspect.targets import (
    DEFAULT_TARGETS,
    GPU_TARGETS,
    TARGETS,
    TPU_TARGETS,
    Target,
    parse_targets,
    resolve_target,
)

__all__ = [
    "DEFAULT_TARGETS",
    "GPU_TARGETS",
    "TARGETS",
    "TPU_TARGETS",
    "Finding",
    "Job",
    "KernelReport",
    "Spec",
    "Target",
    "Verdict",
    "analyze",
    "analyze_jobs",
    "analyze_spec",
    "from_launch",
    "inspect_ops",
    "parse_signature",
    "parse_targets",
    "prune",
    "resolve_target",
    "stage",
]
