"""Static check of every representative launch of the given ops on sm_90 (no GPU needed).

For each launch: compiles it with triton.compile for GPUTarget("cuda", 90, 32), and reports the
widest global load and store in the PTX and any local memory (spills).

    PYTHONPATH=src python benchmarks/ptx_check.py silu_and_mul gelu_and_mul
"""

from __future__ import annotations

import platform
import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget

import kernelab.ops as ops


def compile_launch(launch, target=GPUTarget("cuda", 90, 32)):
    sig = dict(launch.signature)
    constexprs = dict(launch.constexprs)
    attrs = {}
    params = list(sig)
    for name in launch.divisible_16:
        attrs[(params.index(name),)] = [["tt.divisibility", 16]]
    for name in launch.equal_1:
        sig[name] = "constexpr"
        constexprs[name] = 1
    src = triton.compiler.ASTSource(
        fn=launch.kernel, signature=sig, constexprs=constexprs, attrs=attrs
    )
    return triton.compile(
        src,
        target=target,
        options={"num_warps": launch.num_warps, "num_stages": launch.num_stages},
    )


def widths(ptx: str) -> tuple[list[int], list[int], bool]:
    """Bit widths of the global loads and of the global stores, and whether local memory
    (spills) is used."""

    def found(kind):
        sizes = set()
        pattern = rf"{kind}\.global(?:\.[A-Za-z0-9_:]+)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)"
        for m in re.finditer(pattern, ptx):
            sizes.add(int(m.group(1) or 1) * int(m.group(2)))
        return sorted(sizes, reverse=True)

    local = bool(re.search(r"\b(ld|st)\.local", ptx))
    return found("ld"), found("st"), local


def main(names: list[str]) -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}, {platform.node()}, sm_90")
    bad = 0
    for name in names or [o.name for o in ops.all_ops()]:
        op = ops.get(name)
        for shape in op.shapes("representative"):
            for dtype in op.dtypes:
                for launch in op.launches(shape, dtype):
                    k = compile_launch(launch)
                    ld, st, local = widths(k.asm["ptx"])
                    # The bulk of the data moves in 128-bit accesses; narrower ones are small
                    # per-row or per-token operands (weights of short rows, positions, cos/sin).
                    ok = ld[:1] == [128] and st[:1] == [128] and not local
                    bad += not ok
                    print(
                        f"{'ok ' if ok else 'BAD'} {name:<16} {str(dtype)[6:]:<8} "
                        f"{shape.label:<48} {launch.name:<24} ld{ld} st{st} "
                        f"local={local} warps={launch.num_warps} grid={launch.grid}"
                    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
