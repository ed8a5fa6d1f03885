"""kernelab ops as torch custom ops, so torch.compile treats each kernel as one opaque node.

Every custom op is generated from its :class:`~kernelab.ops.Op` declaration, not written by
hand: the schema's arguments are the public function's (without ``out=``), typed from the op's
own inputs (a tensor, an optional tensor, a float, an int, a bool, a string, a dtype);
``mutates_args`` is ``Contract.inplace``; the returned tensors are the op's outputs that are not
in-place arguments (none for an op that only writes in place); the fake (meta) implementation
runs the op's launch plan, which allocates the outputs and launches nothing.

Registered on first use (never at import). Only device tensors go through them: on the CPU the
public ops run plain torch code, which torch.compile traces as it is.
"""

from __future__ import annotations

import functools
import inspect
import typing

import torch

from kernelab import ops

#: Public-function arguments that are not part of a custom op's schema: the custom op allocates
#: its outputs, and launch configs are the kernel's business.
_NOT_IN_SCHEMA = ("out", "config")


def _annotation(name: str, seen: set, default) -> typing.Any:
    """The schema type of an argument from the values the op's inputs give it."""
    kinds = {t for t in seen if t is not type(None)}
    optional = type(None) in seen or default is None
    if not kinds and default is not inspect.Parameter.empty and default is not None:
        kinds = {type(default)}
    if not kinds or kinds == {torch.Tensor}:
        return torch.Tensor | None if optional else torch.Tensor
    if kinds <= {int, float} and float in kinds:
        kinds = {float}
    if len(kinds) != 1:
        raise TypeError(f"{name}: inputs give it several types {sorted(k.__name__ for k in kinds)}")
    (kind,) = kinds
    if kind not in (bool, int, float, str, torch.dtype):
        raise TypeError(f"{name}: no custom-op schema type for {kind.__name__}")
    return kind | None if optional else kind


def schema_of(op) -> tuple[inspect.Signature, tuple[str, ...], tuple[str, ...]]:
    """(signature of the custom op, the arguments it mutates, the outputs it returns) for
    ``op``, from its public function, its inputs (meta tensors of every shape) and contract."""
    public = getattr(ops, op.name)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = [
        p
        for p in inspect.signature(public).parameters.values()
        # a catch-all (paged_attention's deprecated keyword spellings) is not in the schema
        if p.name not in _NOT_IN_SCHEMA and p.kind not in variadic
    ]
    seen: dict[str, set] = {p.name: set() for p in params}
    for shape_set in op.shape_sets:
        for shape in op.shapes(shape_set):
            for name, value in op.inputs(shape, op.dtypes[0], "meta").items():
                if name in seen:
                    seen[name].add(torch.Tensor if isinstance(value, torch.Tensor) else type(value))
    typed = [
        p.replace(
            annotation=_annotation(p.name, seen[p.name], p.default),
            kind=inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
        for p in params
    ]
    mutated = tuple(n for n in op.contract.inplace if n in seen)
    returned = tuple(o for o in op.outputs if o not in op.contract.inplace)
    ret = {0: None, 1: torch.Tensor}.get(len(returned), tuple[(torch.Tensor,) * len(returned)])
    return inspect.Signature(typed, return_annotation=ret), mutated, returned


def _returned(result, op, returned):
    """The op's returned outputs from a call's result (in-place outputs left out)."""
    values = dict(zip(op.outputs, ops.as_tuple(result), strict=False))
    picked = tuple(values[o] for o in returned)
    return None if not picked else picked[0] if len(picked) == 1 else picked


def _taken_by(fn, inputs: dict) -> dict:
    """The entries of ``inputs`` that ``fn`` has parameters for (all, if it takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return inputs
    return {k: v for k, v in inputs.items() if k in params}


def custom_op(name: str):
    """The torch custom op ``kernelab::<name>`` generated from the op's declaration."""
    return _generated(name)[0]


@functools.cache
def _generated(name: str):
    """(the custom op, its signature, the outputs it returns), registered once."""
    op = ops.get(name)
    signature, mutated, returned = schema_of(op)

    def bind(args, kwargs) -> dict:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def impl(*args, **kwargs):
        # Looked up per call: the public function (a test may replace it).
        return _returned(getattr(ops, name)(**bind(args, kwargs)), op, returned)

    impl.__signature__ = signature
    impl.__name__ = name
    lib_op = torch.library.custom_op(f"kernelab::{name}", impl, mutates_args=mutated)

    def fake(*args, **kwargs):
        inputs = bind(args, kwargs)
        if op.plan is not None:
            # the plan's arguments only: the public function's own (``check=``, the value
            # checks that read the tensors) have no meaning for fake tensors
            return _returned(op.plan(**_taken_by(op.plan, inputs)).result, op, returned)
        return _returned(op.eager(**inputs), op, returned)

    fake.__signature__ = signature
    lib_op.register_fake(fake)
    return lib_op, signature, returned


def call(name: str, *args, **kwargs):
    """``kernelab.ops.<name>(...)``: on device tensors through its custom op, on the CPU
    directly. Returns what the public function returns."""
    public = getattr(ops, name)
    bound = inspect.signature(public).bind(*args, **kwargs)
    bound.apply_defaults()
    first = next(v for v in bound.arguments.values() if isinstance(v, torch.Tensor))
    if first.device.type == "cpu":
        return public(*bound.args, **bound.kwargs)
    lib_op, signature, returned = _generated(name)
    result = lib_op(*(bound.arguments[p] for p in signature.parameters))
    if returned:
        return result
    # An op that only writes in place returns the arguments it wrote, as its public function.
    outs = tuple(bound.arguments[o] for o in ops.get(name).outputs)
    return outs[0] if len(outs) == 1 else outs if outs else None


# --- what the model patches call -----------------------------------------------------------


def rmsnorm(x, weight, eps, residual=None):
    return call("rmsnorm", x, weight, float(eps), residual=residual)


def rope(positions, query, key, cos_sin_cache):
    # The patch passes positions 0..rows-1 of a cache made beside them: on a device, checking
    # them would synchronise at every layer for nothing.
    if positions.device.type == "cpu":
        call("rope", positions, query, key, cos_sin_cache)
    else:
        call("rope", positions, query, key, cos_sin_cache, check=False)


def silu_and_mul(x):
    return call("silu_and_mul", x)


def moe_topk(router_logits, top_k, renormalize):
    return call("moe_topk", router_logits, int(top_k), "softmax", bool(renormalize))


def fused_moe(x, w1, w2, topk_weights, topk_ids):
    # The ids come from moe_topk (always in range): on a device, checking them would
    # synchronise at every layer for nothing.
    return call("fused_moe", x, w1, w2, topk_weights, topk_ids, check=x.device.type == "cpu")


def fused_moe_fp8(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids):
    return call(
        "fused_moe_fp8", x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids,
        check=x.device.type == "cpu",
    )  # fmt: skip


def fused_moe_mxfp4(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids):
    return call(
        "fused_moe_mxfp4", x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids,
        check=x.device.type == "cpu",
    )  # fmt: skip


# The GEMMs: x [M, K] with a weight prepared by ``kernelab.models._linear`` → [M, N].


def gemm(a, weight, bias=None):
    """``ops.gemm(a, weight, bias, b_layout="nk")`` (weight: an nn.Linear weight [N, K])."""
    return call("gemm", a, weight, bias, b_layout="nk")


def w8a16_gemm(x, qweight, scales, bias=None):
    return call("w8a16_gemm", x, qweight, scales, bias)


def w4a16_gemm(x, qweight, scales, zeros, group_size, bias=None):
    """``ops.w4a16_gemm`` on a weight ``_linear`` quantized (zero points in range by
    construction: no host check per call)."""
    return call("w4a16_gemm", x, qweight, scales, zeros, int(group_size), bias, check=False)


def fp8_gemm(a, weight, scale_a, scale_b, bias=None):
    """bfloat16 ``ops.fp8_gemm`` with the weight as [N, K] e4m3."""
    return call("fp8_gemm", a, weight, scale_a, scale_b, bias, b_layout="nk")


def fp8_quant_groups(x, fp8_dtype, group_size):
    """``ops.fp8_quant(x, group_size=...)``: e4m3 values and float32 scales per token and
    ``group_size`` columns."""
    return call("fp8_quant", x, False, fp8_dtype, None, int(group_size), False)


def fp8_block_gemm(a, weight, scale_a, scale_b):
    """bfloat16 ``ops.fp8_block_gemm`` (weight: e4m3 [N, K] with 128 x 128 block scales)."""
    return call("fp8_block_gemm", a, weight, scale_a, scale_b)


def mx_gemm(a, weight, weight_scale):
    """bfloat16 ``ops.mx_gemm`` on an mxfp4 weight [N, K/2] and bfloat16 activations
    (weight-only)."""
    return call("mx_gemm", a, weight, weight_scale, "mxfp4", False)
