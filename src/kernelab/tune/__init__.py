"""The autotuner: prune statically, search, verify the winner, store it.

``tune(op, shapes, dtype, device)``:
1. lists the op's tuning space for each shape (``Op.tuning_space``);
2. prunes statically, before any timing: each config's launches are compiled for the target by
   ``inspect`` and dropped if they spill, exceed the target's shared memory, cannot reach one
   block per SM, or lose tensor-core instructions (the reasons are counted and reported);
3. searches the survivors (exhaustive when few, successive halving when many) with a timing
   function — on a GPU, bench's device timing; on a CPU none (interpreter timings mean
   nothing): the tuner then prunes and reports without timing;
4. verifies the winner against the float64 reference before storing it, falling back to the
   next best if it fails;
5. stores it in the ledger's cache and in the tuned-config file the ops read at run time
   (``kernelab.core.runtime.tuned``), keyed by device, kernel source hash, Triton version, dtype and
   shape bucket.
"""

from kernelab.tune.search import Trial, exhaustive, search, successive_halving
from kernelab.tune.tuner import TuneResult, export, gpu_measure, store_winner, tune

__all__ = [
    "Trial",
    "TuneResult",
    "exhaustive",
    "export",
    "gpu_measure",
    "search",
    "store_winner",
    "successive_halving",
    "tune",
]
