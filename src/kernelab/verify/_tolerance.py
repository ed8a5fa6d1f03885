"""The tolerance of one target (an output or an in-place argument) of one case.

For a bfloat16 or float16 target of an op whose ``Contract`` declares its reduction length,
the tolerance is derived from the case itself, not from a fixed floor:

    bound = r × √(1 + narrowings) × 1.1 + 2 × 2⁻²⁴ × √n

``r`` is the relative L2 error of the float64 reference rounded once to the target's format
(the rounding no kernel can avoid), ``narrowings`` the roundings to that format the op's
honest algorithm does before the last one (each costs about another ``r``, independent, hence
the square root), 1.1 the slack for the statistics of one case, and the last term a float32
accumulation over ``n`` terms (its rounding errors walk randomly: √n units of 2⁻²⁴, twice).
A single rounding of partial results to the target format beyond the declared ones adds
about another ``r`` and fails: √2 > 1.1 (a split-K GEMM whose partial sums are rounded to
bfloat16 between steps, a norm whose sum of squares is).

Eager torch passes by construction: where its error on the case exceeds the bound (it rounds
more often than the op's algorithm needs, a residual add after the GEMM, say), the tolerance
is twice its error, as for every other target.

Other targets (float32 and wider, integers, ops without a declared reduction, or a contract
with a fixed tolerance) keep ``Contract.tolerance_for``: ``max(k × eager error, floor)``.
"""

from __future__ import annotations

import math

import torch

from kernelab.numerics import error

#: The formats whose tolerance is derived (where a fixed floor sits far above one rounding).
NARROW = (torch.bfloat16, torch.float16)
SLACK = 1.1
F32_UNIT = 2.0**-24


def rounding_error(ref: torch.Tensor, stored: torch.dtype, region=None) -> float:
    """Relative L2 error of ``ref`` (float64) rounded once to ``stored``, on ``region``."""
    with torch.no_grad():
        rounded = ref.to(stored)
    if region is not None:
        ref, rounded = ref.detach().cpu()[region], rounded.detach().cpu()[region]
    return error(rounded, ref).rel_l2


def derived_bound(contract, stored: torch.dtype, ref: torch.Tensor, inputs: dict, region=None):
    """``(bound, r, n)`` for a target stored as ``stored``, or None where not derived."""
    reduction = getattr(contract, "reduction", None)
    if reduction is None or stored not in NARROW or not ref.is_floating_point():
        return None
    n = max(1, int(reduction(inputs)))
    r = rounding_error(ref, stored, region)
    k = int(getattr(contract, "narrowings", 0))
    return r * math.sqrt(1 + k) * SLACK + 2 * F32_UNIT * math.sqrt(n), r, n


def tolerance(
    contract,
    dtype: torch.dtype,
    stored: torch.dtype,
    eager: float | None,
    ref: torch.Tensor | None = None,
    inputs: dict | None = None,
    region=None,
) -> tuple[float, str]:
    """The tolerance for a case in ``dtype`` on a target stored as ``stored``, and a few words
    on where it came from.

    A fixed contract tolerance is keyed by the case's dtype. With ``ref`` and ``inputs``, a
    bfloat16/float16 target of an op with a declared reduction gets the derived bound (module
    docstring). Otherwise ``max(k × eager error, floor)``, the floor from the target's own
    format (float32 scales of a bfloat16 op get float32's floor).
    """
    tol, source = contract.tolerance_for(dtype, eager)
    if source == "contract":
        return tol, source
    if ref is not None and inputs is not None:
        derived = derived_bound(contract, stored, ref, inputs, region)
        if derived is not None:
            bound, r, n = derived
            k = int(getattr(contract, "narrowings", 0))
            if eager is not None and eager > bound:
                return 2 * eager, f"2x eager torch, over the derived {bound:.2e}"
            fmt = str(stored).removeprefix("torch.")
            return bound, f"derived: {fmt} rounding {r:.2e}, {k} narrowing(s), n={n}"
    if stored == dtype:
        return tol, source
    return contract.tolerance_for(stored, eager)
