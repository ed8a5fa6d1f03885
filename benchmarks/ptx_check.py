"""Static check of every representative launch of the given ops on sm_90 (no GPU needed).

For each launch: compiles it with triton.compile for GPUTarget("cuda", 90, 32), and reports the
widest global load and store in the PTX and any local memory (spills).

    PYTHONPATH=src python benchmarks/ptx_check.py silu_and_mul gelu_and_mul
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.opcheck import compile_launch, widths

import kernelab.ops as ops


def main(names: list[str]) -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}, {platform.node()}, sm_90")
    bad = 0
    for name in names or [o.name for o in ops.all_ops()]:
        op = ops.get(name)
        for shape in op.shapes("representative"):
            for dtype in op.dtypes:
                for launch in op.launches(shape, dtype):
                    ld, st, local = widths(compile_launch(launch).asm["ptx"])
                    # The bulk of the data moves in 128-bit accesses; narrower ones are small
                    # per-row or per-token operands (weights of short rows, positions, cos/sin).
                    ok = ld[:1] == [128] and st[:1] in ([128], []) and not local
                    bad += not ok
                    print(
                        f"{'ok ' if ok else 'BAD'} {name:<16} {str(dtype)[6:]:<8} "
                        f"{shape.label:<48} {launch.name:<24} ld{ld} st{st} "
                        f"local={local} warps={launch.num_warps} grid={launch.grid}"
                    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
