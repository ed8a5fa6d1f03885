"""Small unregistered ops with the shapes of the op families to come: several outputs (float8
values and float32 scales), integer outputs, in-place arguments with integer inputs, and a
deliberately loose contract. Built for the tests, never registered."""

from __future__ import annotations

import torch

from kernelab.core.runtime import inputs as _inputs
from kernelab.ops import Contract, Cost, Op, Shape, Variant

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def _shapes(*dims):
    return lambda: [Shape(f"{r}x{c}", {"rows": r, "cols": c}, batch_dim="rows") for r, c in dims]


def _x(shape, dtype, device, gen, dist):
    return _inputs.randn((shape.dims["rows"], shape.dims["cols"]), dtype, device, gen, dist)


# --- float8 quantization: values and per-row scales ------------------------------------------


def quant_ref(x, out=None):
    scale = x.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    return x / scale, scale.squeeze(-1)


def quant_torch(x, out=None):
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    s = scale.squeeze(-1)
    if out is None:
        return q, s
    out[0].copy_(q)
    out[1].copy_(s)
    return out


def quant_op() -> Op:
    op = Op(
        "toy_quant",
        description="per-row float8 quantization",
        reference=quant_ref,
        make_inputs=lambda s, d, dev, g, dist: {"x": _x(s, d, dev, g, dist)},
        shapes={"representative": _shapes((4, 64)), "edge": _shapes((3, 33))},
        cost=lambda i: Cost(0, 0),
        dtypes=(torch.float32, torch.bfloat16),
        outputs=("values", "scales"),
    )
    op.add_variant(Variant("torch", quant_torch, "torch"))
    return op


# --- integer output ----------------------------------------------------------------------------


def argmax_ref(x, out=None):
    y = x.argmax(dim=-1)
    return y if out is None else out.copy_(y)


def argmax_op() -> Op:
    op = Op(
        "toy_argmax",
        description="index of each row's largest element",
        reference=argmax_ref,
        make_inputs=lambda s, d, dev, g, dist: {"x": _x(s, d, dev, g, dist)},
        shapes={"representative": _shapes((4, 50)), "edge": _shapes((1, 7))},
        cost=lambda i: Cost(0, 0),
        dtypes=(torch.float32,),
    )
    op.add_variant(Variant("torch", argmax_ref, "torch"))
    return op


# --- in place, with integer positions (as RoPE updates q and k) --------------------------------


def scale_rows_ref(q, pos):
    q.mul_(pos[:, None].to(q.dtype) + 0.5)
    return q


def scale_rows_op() -> Op:
    def make(s, d, dev, g, dist):
        q = _x(s, d, dev, g, dist)
        pos = _inputs.randint((s.dims["rows"],), 0, 100, dev, g, dtype=torch.int32)
        return {"q": q, "pos": pos}

    op = Op(
        "toy_scale_rows",
        description="q *= pos + 0.5, row by row, in place",
        reference=scale_rows_ref,
        make_inputs=make,
        shapes={"representative": _shapes((4, 16)), "edge": _shapes((1, 3))},
        cost=lambda i: Cost(0, 0),
        contract=Contract(inplace=("q",)),
        dtypes=(torch.float32,),
        out_arg=None,
    )
    op.add_variant(Variant("torch", scale_rows_ref, "torch"))
    return op


# --- an op whose contract lets a trivial kernel pass ------------------------------------------


def double_ref(x, out=None):
    y = 2 * x
    return y if out is None else out.copy_(y)


def double_op(tolerance=None, compile_variant=False) -> Op:
    op = Op(
        "toy_double" if tolerance is None else "toy_double_loose",
        description="2x",
        reference=double_ref,
        make_inputs=lambda s, d, dev, g, dist: {"x": _x(s, d, dev, g, dist)},
        shapes={"representative": _shapes((4, 32), (1, 9)), "edge": _shapes((2, 5), (0, 3))},
        cost=lambda i: Cost(0, 0),
        contract=Contract(tolerance=tolerance),
        dtypes=(torch.float32,),
    )
    if compile_variant:
        op.add_torch(double_ref)
    else:
        op.add_variant(Variant("torch", double_ref, "torch"))
    return op


# --- in place within a region: rows scattered into a cache (as KV-cache writes do) -----------


def scatter_rows_ref(rows, cache, slots):
    keep = slots >= 0
    cache[slots[keep].long()] = rows[keep].to(cache.dtype)
    return cache


def _scatter_region(inputs):
    mask = torch.zeros(inputs["cache"].shape, dtype=torch.bool)
    slots = inputs["slots"].cpu()
    mask[slots[slots >= 0].long()] = True
    return mask


def scatter_rows_op(region: bool = True) -> Op:
    """``cache[slots[i]] = rows[i]`` in place; a negative slot is padding and writes nothing.
    ``region``: whether the contract declares the written rows as the in-place region."""

    def make(s, d, dev, g, dist):
        n, cols = s.dims["rows"], s.dims["cols"]
        n_slots = 4 * n + 8
        slots = torch.randperm(n_slots, generator=g)[:n].to(device=dev)
        slots[::3] = -1  # padding tokens
        return {
            "rows": _x(s, d, dev, g, dist),
            "cache": _inputs.randn((n_slots, cols), d, dev, g, dist),
            "slots": slots,
        }

    regions = {"cache": _scatter_region} if region else {}
    op = Op(
        "toy_scatter_rows",
        description="rows written into a cache at given slots, in place",
        reference=scatter_rows_ref,
        make_inputs=make,
        shapes={"representative": _shapes((8, 16)), "edge": _shapes((3, 5))},
        cost=lambda i: Cost(0, 0),
        contract=Contract(inplace=("cache",), regions=regions, special_inputs=("rows",)),
        dtypes=(torch.float32, torch.bfloat16),
        outputs=("cache",),
        out_arg=None,
    )
    op.add_variant(Variant("torch", scatter_rows_ref, "torch"))
    return op
