"""Full size: a candidate called on a shape at its declared size, judged on a sample.

On CPU the batch size of every case is capped for the interpreter, so a candidate wrong
only above some number of rows, or on the last partial tile of a large grid, would pass. A
candidate that is not interpreted (eager torch, torch.compile, a third-party library, a user's
function without interpreted kernels) runs each shape that a cap cut once more at its full
size, for an op that declares its outputs row-independent (``Op.sampling``): the call is on
the full inputs, and the float64 reference — what costs — only on a random sample of output
rows (× columns for a GEMM): one row drawn in each of ``SAMPLE_ROWS`` equal strata, the last
row always among them, so that every stretch of rows and the last partial tile are seen.
The sample derives from the run seed and is recorded in the case (``CaseResult.sample``).

A shape too big to be cheap (``MAX_ELEMENTS`` input elements, ``MAX_FLOPS``) is cut first
(its ``reduce_to`` sizes, a GEMM's N and K, halved; then its rows, keeping the remainder
modulo the op's tile), and the cut is listed in the report (``Report.cut``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from kernelab.numerics import error
from kernelab.ops import as_tuple
from kernelab.verify import _buffers, _checks
from kernelab.verify._case import (
    _clone,
    accepts,
    derive_seed,
    distributions_of,
    out_kwargs,
    tolerance,
)
from kernelab.verify._types import CLASSES, CaseResult, Failure

#: Output rows (strata) and columns of the sample the reference is computed on.
SAMPLE_ROWS = 64
SAMPLE_COLS = 64

#: A full-size case beyond these is cut (and the cut listed): input elements, FLOPs.
MAX_ELEMENTS = 2**22
MAX_FLOPS = 2**30

#: The class of a wrong value seen only at full size.
FULL_SIZE = "full size"


def sample_indices(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``min(n, k)`` sorted indices in [0, n): one uniform draw in each of ``k`` equal strata,
    the last stratum's always ``n - 1`` (the last partial tile)."""
    if n <= k:
        return torch.arange(n)
    edges = torch.linspace(0, n, k + 1).floor().to(torch.int64)
    lo, hi = edges[:-1], edges[1:]
    picks = lo + (torch.rand(k, generator=gen, dtype=torch.float64) * (hi - lo)).to(torch.int64)
    picks = torch.minimum(picks, hi - 1)
    picks[-1] = n - 1
    return picks


def _size(op, shape, dtype) -> tuple[int, float]:
    inputs = op.inputs(shape, dtype, "meta")
    n = sum(v.numel() for v in inputs.values() if isinstance(v, torch.Tensor))
    return n, float(op.cost(inputs).flops)


def budget_cut(op, shape, dtype):
    """``shape`` at its declared size, cut to the budget; returns (shape, [cut, ...])."""
    full = dict(shape.full_dims)
    dims, cuts = dict(full), {}
    base = replace(shape, dims=dims, declared={})

    def over(s) -> bool:
        try:
            n, flops = _size(op, s, dtype)
        except Exception:  # sizes unknown on meta: run as declared
            return False
        return n > MAX_ELEMENTS or flops > MAX_FLOPS

    current = base
    while over(current):
        changed = False
        for name, step in {**shape.reduce_to, **op.sampling.cut}.items():
            if name in dims and dims[name] > step:
                dims[name] = max(step, (dims[name] // 2) // step * step)
                changed = True
        if not changed and shape.batch_dim is not None:
            tile = op.sampling.tile.get(shape.batch_dim, 1)
            b = dims[shape.batch_dim]
            new = (b // tile) // 2 * tile + b % tile
            if 0 < new < b:
                dims[shape.batch_dim], changed = new, True
        if not changed:
            break
        current = replace(base, dims=dict(dims))
    for name, size in dims.items():
        if size != full[name]:
            cuts[name] = size
    note = ", ".join(f"{k} {full[k]}→{v}" for k, v in cuts.items())
    label = f"{shape.label} [full size" + (f"; cut {note}]" if cuts else "]")
    out = replace(current, label=label, declared=dict(full) if cuts else {})
    return out, ([note] if cuts else [])


def _full_index(sampling, name, t_dims, idx, inputs, rows, cols, output=True):
    """An index into a sampled tensor mapped back to the full tensor."""
    idx = list(idx)
    specs = {**sampling.rows, **sampling.outputs} if output else sampling.rows
    for table, picked in ((specs, rows), (sampling.cols, cols)):
        spec = table.get(name)
        if spec is None or picked is None:
            continue
        dim = spec(inputs) if callable(spec) else spec
        if dim is None or not t_dims:
            continue
        d = dim % t_dims
        if d < len(idx) and idx[d] < len(picked):
            idx[d] = int(picked[idx[d]])
    return idx


def run_full_case(op, subject, shape, shape_set, dtype, device, seed, baseline, dist_index=0):
    """One call of ``subject`` at full size, judged on a sampled reference (module doc)."""
    started = time.perf_counter()
    smp = op.sampling
    case = CaseResult(
        op.name, subject.name, shape_set, shape.label, shape.key, str(dtype).removeprefix("torch.")
    )
    tseed = derive_seed(seed, op.name, shape.key, str(dtype), "full size")
    dists = distributions_of(op)
    dist = dists[dist_index % len(dists)]
    inputs = op.inputs(shape, dtype, device, seed=tseed, dist=dist)
    case.trials.append({"seed": tseed, "dist": dist, "specials": None, "kind": "full size"})
    n_rows = int(shape.dims[shape.batch_dim])
    n_cols = int(shape.dims[smp.col_dim]) if smp.col_dim else None
    sseed = derive_seed(seed, op.name, shape.key, str(dtype), "sample")
    gen = torch.Generator().manual_seed(sseed)
    rows = sample_indices(n_rows, SAMPLE_ROWS, gen)
    cols = sample_indices(n_cols, SAMPLE_COLS, gen) if n_cols is not None else None
    case.sample = {
        "seed": sseed,
        "rows": rows.tolist(),
        "of_rows": n_rows,
        "cols": None if cols is None else cols.tolist(),
        "of_cols": n_cols,
    }
    sub = smp.sub_inputs(inputs, rows, cols, n_rows, n_cols)
    ref_out, ref_inplace = op.run_reference(sub)
    base_in = _clone(inputs)
    with np.errstate(all="ignore"):
        base_out = as_tuple(baseline(**base_in))
    names = list(op.outputs) if len(op.outputs) == len(ref_out) else []
    names = names or [f"out{i}" for i in range(len(ref_out))]
    specs = [(n, tuple(b.shape), b.dtype, b.device) for n, b in zip(names, base_out, strict=False)]
    use_out = accepts(subject.fn, op.out_arg) and subject.prepare is None
    outs = [_buffers.output(n, s, d, dev) for n, s, d, dev in specs] if use_out else None
    for o in outs or ():
        _buffers.poison(o.view, 0)
    call_in = _clone(inputs)
    kwargs = dict(call_in)
    if outs is not None:
        kwargs.update(out_kwargs(op.out_arg, [o.view for o in outs]))
    if subject.prepare is not None:
        kwargs = subject.prepare(kwargs)

    def fail(failures):
        for f in failures:
            f.trial, f.call = 0, "full size"
            case.failures.append(f)

    try:
        with np.errstate(all="ignore"):
            result = subject.fn(**kwargs)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        cls = getattr(exc, "failure_class", "contract")
        msg = f"at full size, the call raised {type(exc).__name__}: {text}"
        fail([Failure(cls if cls in CLASSES else "contract", "call", msg)])
        case.seconds = time.perf_counter() - started
        return case
    got, failures = _checks.contract(result, specs, outs)
    fail(failures)
    results = {s[0]: t for s, t in zip(specs, got or (), strict=False) if t is not None}
    base = {s[0]: b for s, b in zip(specs, base_out, strict=False)}
    for k in ref_inplace:
        results[k], base[k] = call_in[k], base_in[k]
    stored = {s[0]: s[2] for s in specs}
    stored.update({k: inputs[k].dtype for k in ref_inplace})
    refs = dict(zip(names, ref_out, strict=True)) | ref_inplace
    where = f"rows {len(rows)} of {n_rows}" + (
        f" × columns {len(cols)} of {n_cols}" if cols is not None else ""
    )
    for name, ref in refs.items():
        if name not in results:
            continue

        def pick(t, name=name):
            return smp.take(name, t, inputs, rows, cols, n_rows, n_cols, output=True)

        got_s, base_s = pick(results[name]), pick(base[name])
        if tuple(got_s.shape) != tuple(ref.shape):
            continue  # the contract check named the shape
        usable = isinstance(base_s, torch.Tensor) and tuple(base_s.shape) == tuple(ref.shape)
        eager = error(base_s, ref).rel_l2 if usable else None
        on = sub if name == names[0] and name not in ref_inplace else None  # ref's inputs
        tol = tolerance(op.contract, dtype, stored.get(name, dtype), eager, ref, inputs, None, on)
        m, found = _checks.values(name, got_s, ref, base_s if usable else None, tol, eager)
        case.add_measure(m)
        for f in found:
            f.cls = FULL_SIZE
            f.message = f"at full size ({shape.label}; sampled {where}): {f.message}"
            f.indices = [
                _full_index(smp, name, got_s.dim(), i, inputs, rows, cols) for i in f.indices
            ]
        fail(found)
    case.seconds = time.perf_counter() - started
    return case
