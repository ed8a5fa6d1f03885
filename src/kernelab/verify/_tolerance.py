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

The slack is a statistic of many elements. Where a few elements carry the reference's norm
(its participation ratio ``(Σ x²)² / Σ x⁴`` under ``FEW``: a partial update that planted a
few huge values among tiny ones, say), one element's rounding decides the case and the ratio
of two roundings is not near its mean: the bound is then at least the worst case per element
(``worst_case``: each value moved by ``narrowings`` unit roundoffs and the float32
accumulation, either way, then rounded). With no narrowing that is the reference's own
rounding wherever the accumulation cannot move a value across a rounding boundary, so a
dominant element one spacing off still fails; with one, an extra rounding of a dominant
element cannot be told from the honest one.

Where the op declares ``Contract.amplified`` (attention: the softmax of float32 scores), the
bound adds ``‖σ‖ / ‖ref‖``, σ the op's spread per element of its first output: float32
rounding that a later step amplifies beyond the output's format (scores of magnitude 10⁴ err
by 10⁻³ in float32 whatever the 16-bit format of the output, and a near tie between two keys
carries that error into the output). In the worst case per element each value moves by its
σ as well.

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
#: Below this many elements carrying the reference's norm, the bound is at least the worst
#: case per element. The planted extra roundings are caught from about 40 (a 3x40 GEMM
#: output); paged attention's honest P narrowing erred 1.18x the statistical bound at 4.6.
FEW = 16


def rounding_error(ref: torch.Tensor, stored: torch.dtype, region=None) -> float:
    """Relative L2 error of ``ref`` (float64) rounded once to ``stored``, on ``region``."""
    with torch.no_grad():
        rounded = ref.to(stored)
    if region is not None:
        ref, rounded = ref.detach().cpu()[region], rounded.detach().cpu()[region]
    return error(rounded, ref).rel_l2


def _finite(ref: torch.Tensor, region=None) -> torch.Tensor:
    """``ref``'s finite elements (on ``region``), float64 on the CPU, flat."""
    r = ref.detach().cpu().to(torch.float64)
    if region is not None:
        r = r[region]
    r = r.reshape(-1)
    return r[torch.isfinite(r)]


def _on_finite(spread: torch.Tensor, ref: torch.Tensor, region=None) -> torch.Tensor:
    """``spread`` on the elements ``_finite`` keeps of ``ref`` (the same order), float64."""
    x = spread.detach().cpu().to(torch.float64)
    r = ref.detach().cpu()
    if region is not None:
        x, r = x[region], r[region]
    return x.reshape(-1)[torch.isfinite(r.reshape(-1))]


def spread_of(contract, ref: torch.Tensor, inputs: dict) -> torch.Tensor | None:
    """The op's declared spread (``Contract.amplified``) for its first output ``ref``, or None
    where none is declared; a tensor of another shape is refused."""
    fn = getattr(contract, "amplified", None)
    if fn is None:
        return None
    spread = fn(inputs)
    if not isinstance(spread, torch.Tensor) or tuple(spread.shape) != tuple(ref.shape):
        raise ValueError(
            f"amplified: expected a tensor of the output's shape {tuple(ref.shape)}, "
            f"got {getattr(spread, 'shape', spread)!r:.60}"
        )
    return spread


def effective_elements(ref: torch.Tensor, region=None) -> float:
    """How many elements carry ``ref``'s L2 norm: ``(Σ x²)² / Σ x⁴`` over its finite elements
    (``n`` for ``n`` equal magnitudes, about 1 where one element dominates; 0 if all zero)."""
    r = _finite(ref, region)
    top = float(r.abs().max()) if r.numel() else 0.0
    if top == 0.0:
        return 0.0
    sq = (r / top) ** 2
    return float(sq.sum() ** 2 / (sq * sq).sum())


def worst_case(
    ref: torch.Tensor,
    stored: torch.dtype,
    narrowings: int,
    n: int,
    region=None,
    spread: torch.Tensor | None = None,
) -> float:
    """Relative L2 error of a result whose every element errs by the most an honest algorithm
    allows: the value moved by ``narrowings`` unit roundoffs of ``stored``, a float32
    accumulation of ``n`` terms (as in the bound) and its ``spread`` (the op's amplified
    float32 rounding, ``ref``'s shape), either way, then rounded to ``stored``;
    per element the farther of the two roundings from the reference. Where nothing moves a
    value across a rounding boundary this is the reference's own rounding."""
    r = _finite(ref, region)
    norm = float(torch.linalg.vector_norm(r)) if r.numel() else 0.0
    if norm == 0.0:
        return 0.0
    reach = (narrowings * torch.finfo(stored).eps / 2 + 2 * F32_UNIT * math.sqrt(n)) * r.abs()
    if spread is not None:
        reach = reach + _on_finite(spread, ref, region)
    top = torch.finfo(stored).max
    lo = (r - reach).clamp(-top, top).to(stored).to(torch.float64)
    hi = (r + reach).clamp(-top, top).to(stored).to(torch.float64)
    each = torch.maximum((lo - r).abs(), (hi - r).abs())
    return float(torch.linalg.vector_norm(each)) / norm


def derived_bound(
    contract, stored: torch.dtype, ref: torch.Tensor, inputs: dict, region=None, spread_on=None
):
    """``(bound, r, n, few)`` for a target stored as ``stored``, or None where not derived;
    ``few`` is the number of elements carrying the norm where it is under ``FEW`` (the bound
    is then at least the worst case per element), else None. ``spread_on``: where ``ref`` is
    the op's first output, the inputs it was computed from (a declared spread applies)."""
    reduction = getattr(contract, "reduction", None)
    if reduction is None or stored not in NARROW or not ref.is_floating_point():
        return None
    n = max(1, int(reduction(inputs)))
    r = rounding_error(ref, stored, region)
    k = int(getattr(contract, "narrowings", 0))
    bound = r * math.sqrt(1 + k) * SLACK + 2 * F32_UNIT * math.sqrt(n)
    spread = spread_of(contract, ref, spread_on) if spread_on is not None else None
    if spread is not None:
        norm = float(torch.linalg.vector_norm(_finite(ref, region)))
        if norm > 0.0:
            bound += float(torch.linalg.vector_norm(_on_finite(spread, ref, region))) / norm
    few = effective_elements(ref, region)
    if 0.0 < few < FEW:
        bound = max(bound, worst_case(ref, stored, k, n, region, spread))
    else:
        few = None
    return bound, r, n, few


def tolerance(
    contract,
    dtype: torch.dtype,
    stored: torch.dtype,
    eager: float | None,
    ref: torch.Tensor | None = None,
    inputs: dict | None = None,
    region=None,
    spread_on: dict | None = None,
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
        derived = derived_bound(contract, stored, ref, inputs, region, spread_on)
        if derived is not None:
            bound, r, n, few = derived
            k = int(getattr(contract, "narrowings", 0))
            if eager is not None and eager > bound:
                return 2 * eager, f"2x eager torch, over the derived {bound:.2e}"
            fmt = str(stored).removeprefix("torch.")
            source = f"derived: {fmt} rounding {r:.2e}, {k} narrowing(s), n={n}"
            if spread_on is not None and getattr(contract, "amplified", None) is not None:
                source += ", amplified float32 rounding"
            if few is not None:
                source += f", worst case per element ({few:.1f} elements carry the norm)"
            return bound, source
    if stored == dtype:
        return tol, source
    return contract.tolerance_for(stored, eager)
