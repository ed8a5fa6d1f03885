"""Checks shared by the op tests: a candidate against the float64 reference within the contract."""

from __future__ import annotations

import inspect
import re

import torch

from kernelab.numerics import error, special_mismatch
from kernelab.ops import as_tuple
from kernelab.verify._buffers import poison_value, prime_allocator


def clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def every_other(t: torch.Tensor, filler) -> torch.Tensor:
    """``t``'s values as every other element (along the last dimension) of a larger tensor
    whose skipped elements hold ``filler`` (a value, or a tensor of ``t``'s shape): a kernel
    that reads the view as if it were contiguous reads the filler."""
    big = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    big[..., ::2] = t
    big[..., 1::2] = filler
    return big[..., ::2]


def _poisoned_out(fn, inputs: dict, eager_out: tuple):
    """A NaN-filled ``out=`` for a candidate that takes one and has one floating output: an
    element it never writes then fails for certain. A candidate that allocates its output reads
    whatever the allocator held, which can be a freed copy of the right answer (a planted
    column-mask defect passed 23 of 200 repeats that way). None where it does not apply."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if "out" not in params or "out" in inputs or len(eager_out) != 1:
        return None
    (o,) = eager_out
    if not isinstance(o, torch.Tensor) or not o.dtype.is_floating_point:
        return None
    return torch.full(o.shape, poison_value(o.dtype, 0), dtype=o.dtype, device=o.device)


def check(op, inputs: dict, fn, dtype: torch.dtype) -> tuple:
    """Run ``fn`` and the op's eager torch on copies of ``inputs``; every output and in-place
    argument must be within the op's contract of the float64 reference (tolerance derived from
    eager torch's own error). Returns the candidate's outputs."""
    ref_out, ref_inplace = op.run_reference(inputs)
    eager, cand = clone(inputs), clone(inputs)
    eager_out = as_tuple(op.variants["torch"](**eager))
    poisoned = _poisoned_out(fn, inputs, eager_out)
    if poisoned is not None:
        out = as_tuple(fn(**cand, out=poisoned))
    else:
        # an element never written reads poison more often than a freed copy of the answer
        prime_allocator([(o.shape, o.dtype, o.device) for o in eager_out if o is not None])
        out = as_tuple(fn(**cand))
    assert len(out) == len(ref_out)
    pairs = list(zip(out, eager_out, ref_out, strict=True))
    pairs += [(cand[n], eager[n], ref) for n, ref in ref_inplace.items()]
    for got, base, ref in pairs:
        assert type(got) is torch.Tensor
        assert got.shape == ref.shape
        assert got.dtype == base.dtype, f"dtype {got.dtype}, eager torch gives {base.dtype}"
        assert not special_mismatch(got, ref).any(), "NaN/Inf pattern differs from the reference"
        tol, _ = op.contract.tolerance_for(dtype, error(base, ref).rel_l2)
        err = error(got, ref)
        assert err.rel_l2 <= tol, f"rel L2 {err.rel_l2:.3e} > tolerance {tol:.3e} at {err}"
    return out


# --- static checks of compiled launches (sm_90, no GPU needed) -----------------------------------


def compile_launch(launch, target=None):
    """Compile a ``Launch`` as Triton would at run time (with its 16-divisibility and
    equal-to-1 specialisations) for ``target`` (default sm_90)."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = target or GPUTarget("cuda", 90, 32)
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


def assert_wide_and_unspilled(launch, stores: bool = True) -> str:
    """The launch's sm_90 PTX moves its bulk data in 128-bit global loads (and stores, unless
    ``stores`` is False: a reduction-only launch), uses no local memory, and computes 64-bit
    offsets; returns the PTX."""
    compiled = compile_launch(launch)
    ptx = compiled.asm["ptx"]
    ld, st, local = widths(ptx)
    assert ld[:1] == [128], f"widest global load {ld} bits"
    assert st[:1] == [128] or not stores, f"widest global store {st} bits"
    assert not local, "local memory (spills) in the PTX"
    ttir = compiled.asm["ttir"]
    assert re.search(r"arith\.muli [^\n]*: (tensor<[^>]*xi64>|i64)", ttir), "no 64-bit offsets"
    return ptx
