"""Linear layers on kernelab GEMMs: dense, or with weights quantized once at patch time.

``prepare(weight, bias, quantize)`` turns an nn.Linear weight [N, K] into a
:class:`PreparedLinear`; calling it computes ``x @ W.T + b`` for ``x`` [..., K]:

- ``None``: the dense weight itself (no copy) through ``ops.gemm(..., b_layout="nk")``;
- ``"w8a16"``: symmetric int8 per output channel, ``ops.w8a16_gemm``;
- ``"w4a16"``: asymmetric int4, groups of 128 along K (64 when K is not a multiple of 128),
  ``ops.w4a16_gemm``;
- ``"fp8"``: e4m3 per output channel for the weight, per token (computed at each call) for the
  activations, ``ops.fp8_gemm`` (bfloat16 output, cast back to the model's dtype);
- ``"fp8-block"`` (DeepSeek-V3's recipe): e4m3 weight with one float32 scale per 128 × 128
  block (``packing.quantize_fp8_block``), activations quantized at each call per token and 128
  columns (``ops.fp8_quant(x, group_size=128)``), ``ops.fp8_block_gemm`` (bfloat16 output,
  cast back to the model's dtype, then the bias added). K or N not a multiple of 128 needs no
  fallback: both ops give the last block (and the last activation group) the columns it has;
- ``"mxfp4"``: OCP MX weight (``packing.quantize_mx``: e2m1 values two per byte, a ue8m0
  scale per 32 along K), bfloat16 activations as they are (weight-only, ``quantize_a=False``:
  mxfp4 checkpoints such as gpt-oss are served with bf16 activations; e2m1 activations would add
  their own, much larger, error), ``ops.mx_gemm`` (bfloat16 output, then the bias). A layer
  whose K is not a multiple of 32 (the scale block) stays dense, and says why (``note``).

The GEMM kernels take 16-bit activations; in a float32 model the same prepared weights go
through each op's torch reference (dequantize, then a float32 matmul) — checked, not faster.

``reference(x)`` computes what the layer stands for in plain torch: the original layer with
its weight quantized and dequantized the same way (and, for fp8 and fp8-block, the activations
too, rounded to bfloat16 as the fp8 GEMMs' output is; mxfp4's on bfloat16 activations with a
bfloat16 output in a 16-bit model). That is the contract the parity check holds a quantized
patch to: quantization error is the price of the format, not a kernel defect, so it is taken
out of the comparison rather than tolerated.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelab import ops
from kernelab.models import _library
from kernelab.ops import packing as _packing

# The modules, not the functions ``kernelab.ops.fp8_gemm`` (...) that shadow them as package
# attributes.
_fp8 = importlib.import_module("kernelab.ops.matmul.fp8_gemm")
_fp8_quant = importlib.import_module("kernelab.ops.quant.fp8_quant")

QUANTIZE = (None, "w4a16", "w8a16", "fp8", "fp8-block", "mxfp4")
_HALF = (torch.float16, torch.bfloat16)
#: fp8-block: activations quantized per token and this many columns (the weight's block side).
FP8_GROUP = _packing.FP8_BLOCK
#: The dequantized kinds whose activations are quantized too (fp8 GEMMs, bfloat16 output).
FP8_KINDS = ("fp8", "fp8-block")


def check_quantize(quantize) -> None:
    if quantize not in QUANTIZE:
        names = ", ".join(repr(q) for q in QUANTIZE)
        raise ValueError(f"quantize: expected one of {names}, got {quantize!r}")


def group_size_for(k: int) -> int:
    """int4 group size: 128, or 64 when K is not a multiple of 128."""
    return 128 if k % 128 == 0 else 64


def check_device(quantize, device) -> None:
    """Refuse a quantization the device cannot run, before anything is prepared."""
    if quantize in FP8_KINDS and not _fp8.fp8_supported(device):
        raise ValueError(
            f"quantize: {quantize!r} needs an fp8-capable device (NVIDIA sm_89+, AMD "
            f"gfx942/gfx950, or the CPU), got {device}; use 'w8a16', 'w4a16' or 'mxfp4' here"
        )


@dataclass(eq=False)
class PreparedLinear:
    """One linear layer's weight in the form its GEMM reads (see the module docstring)."""

    kind: str  # "dense", "w8a16", "w4a16", "fp8", "fp8-block", "mxfp4"
    in_features: int
    out_features: int
    tensors: dict
    bias: torch.Tensor | None
    #: why this layer is not in the format asked for (kept dense), None when it is
    note: str | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features)
        y = _CALL[self.kind](self, a)
        return y.reshape(*lead, self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The original layer on the quantize-dequantized weight (and activations for fp8 and
        fp8-block)."""
        w32, bias = self.dequantized(torch.float32), self.bias
        w = w32.to(x.dtype)
        shape = (*x.shape[:-1], self.out_features)
        if self.kind == "fp8":
            a = x.reshape(-1, self.in_features)
            values, scale = _fp8.quantize_fp8(a, per_row=True, dtype=self.tensors["b"].dtype)
            a = values.to(torch.float32) * scale[:, None]
            y = F.linear(a, w.to(torch.float32), None if bias is None else bias.float())
            return y.to(torch.bfloat16).to(x.dtype).reshape(shape)
        if self.kind in ("fp8-block", "mxfp4"):
            a = x.reshape(-1, self.in_features)
            if self.kind == "fp8-block":
                values, scale = _quantize_groups(a, self.tensors["b"].dtype, torch_only=True)
                scale = scale.repeat_interleave(FP8_GROUP, 1)[:, : a.shape[1]]
                a = values.to(torch.float32) * scale
            elif a.dtype in _HALF:
                a = a.to(torch.bfloat16)  # mx_gemm's activations
            y = F.linear(a.to(torch.float32), w32)
            y = _output(y, x.dtype)
            return (y if bias is None else y + bias).reshape(shape)
        return F.linear(x, w, bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [N, K] this layer multiplies by, in ``dtype``."""
        t = self.tensors
        if self.kind == "dense":
            return t["weight"].to(dtype)
        if self.kind == "w8a16":
            return _packing.dequantize_int8(t["qweight"], t["scales"], dtype).t()
        if self.kind == "w4a16":
            return _packing.dequantize_int4(
                t["qweight"], t["scales"], t["zeros"], t["group_size"], dtype
            ).t()
        if self.kind == "fp8-block":
            w = _packing.dequantize_fp8_block(t["b"], t["scale_b"], dtype)
            return w if t["rows"] is None else w[t["rows"]]
        if self.kind == "mxfp4":
            return _packing.dequantize_mx(t["b"], t["b_scale"], "mxfp4", dtype)
        return (t["b"].to(torch.float32) * t["scale_b"][:, None]).to(dtype)

    def nbytes(self) -> int:
        """Bytes of the prepared weight (values and scales; not fp8-block's row index)."""
        t = self.tensors
        return sum(v.numel() * v.element_size() for k, v in t.items() if _is_t(v) and k != "rows")


def _is_t(v) -> bool:
    return isinstance(v, torch.Tensor)


def prepare(weight: torch.Tensor, bias: torch.Tensor | None, quantize, name: str, parts=None):
    """The prepared form of an nn.Linear ``weight`` [N, K] (and ``bias``) for ``quantize``.

    ``parts``: the output sizes of the projections ``weight`` concatenates (a fused gate/up),
    each quantized as it would be alone: per output channel and per group along K that is
    automatic; fp8-block's 128 x 128 blocks would straddle two projections where a size is not
    a multiple of 128, so there each part is quantized alone and padded to whole blocks."""
    check_quantize(quantize)
    weight = weight.detach()
    n, k = weight.shape
    bias = None if bias is None else bias.detach()
    if quantize is None:
        return PreparedLinear("dense", k, n, {"weight": weight}, bias)
    if quantize == "w8a16":
        q, s = _packing.quantize_int8(weight.t())
        return PreparedLinear("w8a16", k, n, {"qweight": q, "scales": s}, bias)
    if quantize == "w4a16":
        g = group_size_for(k)
        if k % g:
            raise ValueError(
                f"quantize: 'w4a16' needs K (in_features) a multiple of 64 or 128; {name} has K={k}"
            )
        w4 = _packing.quantize_int4(weight.t(), group_size=g)
        tensors = {"qweight": w4.qweight, "scales": w4.scales, "zeros": w4.zeros, "group_size": g}
        return PreparedLinear("w4a16", k, n, tensors, bias)
    if quantize == "fp8-block":
        return PreparedLinear("fp8-block", k, n, _fp8_blocks(weight, parts or (n,)), bias)
    if quantize == "mxfp4":
        if k % _packing.MX_BLOCK:
            note = (
                f"{name}: kept dense, not mxfp4: K (in_features) = {k} is not a multiple of "
                f"mxfp4's {_packing.MX_BLOCK}-value scale block"
            )
            return PreparedLinear("dense", k, n, {"weight": weight}, bias, note)
        values, scales = _packing.quantize_mx(weight, "mxfp4")
        return PreparedLinear("mxfp4", k, n, {"b": values, "b_scale": scales}, bias)
    e4m3 = _fp8.e4m3_for(weight.device)
    values, scale = _fp8.quantize_fp8(weight, per_row=True, dtype=e4m3)
    fp8_bias = None if bias is None else bias.to(torch.bfloat16)
    return PreparedLinear("fp8", k, n, {"b": values, "scale_b": scale}, fp8_bias)


def _fp8_blocks(weight, parts) -> dict:
    """fp8-block tensors of ``weight``: e4m3 values and 128 x 128 block scales of each part
    (rows), every part but the last padded with zero rows to whole blocks; ``rows``: where the
    weight's rows are in the padded result (None without padding)."""
    e4m3 = _fp8.e4m3_for(weight.device)
    if sum(parts) != weight.shape[0] or any(p <= 0 for p in parts):
        raise ValueError(f"parts: expected sizes > 0 summing to N = {weight.shape[0]}, got {parts}")
    values, scales, rows, at = [], [], [], 0
    for i, part in enumerate(weight.split(list(parts))):
        v, sc = _packing.quantize_fp8_block(part, e4m3, ue8m0=False)
        rows.append(torch.arange(at, at + part.shape[0]))
        if i < len(parts) - 1 and part.shape[0] % FP8_GROUP:
            v = torch.cat([v, v.new_zeros((sc.shape[0] * FP8_GROUP - v.shape[0], v.shape[1]))])
        at += v.shape[0]
        values.append(v)
        scales.append(sc)
    padded = at != weight.shape[0]
    index = torch.cat(rows).to(weight.device) if padded else None
    return {"b": torch.cat(values), "scale_b": torch.cat(scales), "rows": index}


# --- the calls ---------------------------------------------------------------------------------


def _dense(p: PreparedLinear, a):
    w, bias = p.tensors["weight"], p.bias
    if a.dtype in _HALF:
        return _library.gemm(a, w, bias)
    return ops.gemm_ref(a, w, bias, b_layout="nk")


def _w8a16(p: PreparedLinear, a):
    t = p.tensors
    if a.dtype in _HALF:
        return _library.w8a16_gemm(a, t["qweight"], t["scales"], p.bias)
    return ops.w8a16_ref(a, t["qweight"], t["scales"], p.bias)


def _w4a16(p: PreparedLinear, a):
    t = p.tensors
    args = (t["qweight"], t["scales"], t["zeros"], t["group_size"], p.bias)
    if a.dtype in _HALF:
        return _library.w4a16_gemm(a, *args)
    return ops.w4a16_ref(a, *args)


def _fp8_call(p: PreparedLinear, a):
    t = p.tensors
    values, scale = _fp8.quantize_fp8(a, per_row=True, dtype=t["b"].dtype)
    y = _library.fp8_gemm(values, t["b"], scale, t["scale_b"], p.bias)
    return y if y.dtype == a.dtype else y.to(a.dtype)


def _output(y, dtype):
    """A 16-bit model gets the fp8/mx GEMMs' bfloat16 output in its dtype; float32 keeps its
    float32 result."""
    return y.to(torch.bfloat16).to(dtype) if dtype in _HALF else y.to(dtype)


def _quantize_groups(a, e4m3, torch_only=False):
    """e4m3 values and float32 scales per token and 128 columns (``ops.fp8_quant``; the torch
    implementation for the reference and a float32 model)."""
    if torch_only or a.dtype not in _HALF:
        return _fp8_quant.fp8_quant_torch(a, fp8_dtype=e4m3, group_size=FP8_GROUP)
    return _library.fp8_quant_groups(a, e4m3, FP8_GROUP)


def _fp8_block_call(p: PreparedLinear, a):
    t = p.tensors
    values, scale = _quantize_groups(a, t["b"].dtype)
    if a.dtype in _HALF:
        y = _library.fp8_block_gemm(values, t["b"], scale, t["scale_b"])
    else:
        y = ops.fp8_block_gemm_ref(values.float(), t["b"].float(), scale, t["scale_b"])
    if t["rows"] is not None:
        y = y[:, t["rows"]]  # the padding's columns out
    y = _output(y, a.dtype)
    return y if p.bias is None else y + p.bias


def _mxfp4_call(p: PreparedLinear, a):
    t = p.tensors
    if a.dtype in _HALF:
        y = _library.mx_gemm(a.to(torch.bfloat16), t["b"], t["b_scale"])
    else:
        y = ops.mx_gemm_ref(a, t["b"], t["b_scale"], "mxfp4")
    y = _output(y, a.dtype)
    return y if p.bias is None else y + p.bias


_CALL = {
    "dense": _dense,
    "w8a16": _w8a16,
    "w4a16": _w4a16,
    "fp8": _fp8_call,
    "fp8-block": _fp8_block_call,
    "mxfp4": _mxfp4_call,
}


@contextmanager
def forwards_replaced(pairs):
    """Within the block, each module of ``pairs`` (an iterable of (module, forward), consumed
    inside) runs ``forward``; yields {id(module): forward}. After it, every module's own
    forward (an instance attribute or none) is back."""
    refs: dict[int, object] = {}
    saved: list[tuple[torch.nn.Module, object]] = []
    try:
        for module, forward in pairs:
            saved.append((module, vars(module).get("forward")))
            object.__setattr__(module, "forward", forward)
            refs[id(module)] = forward
        yield refs
    finally:
        for module, own in reversed(saved):
            if own is None:
                object.__delattr__(module, "forward")
            else:
                object.__setattr__(module, "forward", own)


def reference_forwards(model, blueprint, quantize):
    """Within the block, each projection of ``blueprint.linears`` computes its
    :meth:`PreparedLinear.reference` for ``quantize`` (a patched projection: of its own prepared
    weight; any other: of the weight prepared afresh). Yields {id(module): reference}."""
    return forwards_replaced(_references(model, blueprint, quantize))


def _references(model, blueprint, quantize):
    for name, layer in model.named_modules():
        if type(layer).__name__ != blueprint.layer_class:
            continue
        for path in blueprint.linears:
            try:
                module = layer.get_submodule(path)
            except AttributeError:
                continue
            if not isinstance(module, torch.nn.Linear):
                continue
            prepared = vars(module).get("_kernelab_linear")
            if prepared is None:
                prepared = prepare(module.weight, module.bias, quantize, f"{name}.{path}")
            yield module, prepared.reference
