"""Linear layers on kernelab GEMMs: dense, or with weights quantized once at patch time.

``prepare(weight, bias, quantize)`` turns an nn.Linear weight [N, K] into a
:class:`PreparedLinear`; calling it computes ``x @ W.T + b`` for ``x`` [..., K]:

- ``None``: the dense weight itself (no copy) through ``ops.gemm(..., b_layout="nk")``;
- ``"w8a16"``: symmetric int8 per output channel, ``ops.w8a16_gemm``;
- ``"w4a16"``: asymmetric int4, groups of 128 along K (64 when K is not a multiple of 128),
  ``ops.w4a16_gemm``;
- ``"fp8"``: e4m3 per output channel for the weight, per token (computed at each call) for the
  activations, ``ops.fp8_gemm`` (bfloat16 output, cast back to the model's dtype).

The GEMM kernels take 16-bit activations; in a float32 model the same prepared weights go
through each op's torch reference (dequantize, then a float32 matmul) — checked, not faster.

``reference(x)`` computes what the layer stands for in plain torch: the original layer with
its weight quantized and dequantized the same way (and, for fp8, the activations too). That is
the contract the parity check holds a quantized patch to: quantization error is the price of
the format, not a kernel defect, so it is taken out of the comparison rather than tolerated.
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

# The module, not the function ``kernelab.ops.fp8_gemm`` that shadows it as a package attribute.
_fp8 = importlib.import_module("kernelab.ops.matmul.fp8_gemm")

QUANTIZE = (None, "w4a16", "w8a16", "fp8", "fp8-block")
_HALF = (torch.float16, torch.bfloat16)


def check_quantize(quantize) -> None:
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize: expected None, 'w4a16', 'w8a16' or 'fp8', got {quantize!r}")


def group_size_for(k: int) -> int:
    """int4 group size: 128, or 64 when K is not a multiple of 128."""
    return 128 if k % 128 == 0 else 64


def check_device(quantize, device) -> None:
    """Refuse a quantization the device cannot run, before anything is prepared."""
    if quantize == "fp8" and not _fp8.fp8_supported(device):
        raise ValueError(
            f"quantize: 'fp8' needs an fp8-capable device (NVIDIA sm_89+, AMD gfx942/gfx950, or "
            f"the CPU), got {device}; use 'w8a16' or 'w4a16' here"
        )


@dataclass(eq=False)
class PreparedLinear:
    """One linear layer's weight in the form its GEMM reads (see the module docstring)."""

    kind: str  # "dense", "w8a16", "w4a16", "fp8"
    in_features: int
    out_features: int
    tensors: dict
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features)
        y = _CALL[self.kind](self, a)
        return y.reshape(*lead, self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The original layer on the quantize-dequantized weight (and activations for fp8)."""
        w, bias = self.dequantized(torch.float32).to(x.dtype), self.bias
        if self.kind == "fp8":
            a = x.reshape(-1, self.in_features)
            values, scale = _fp8.quantize_fp8(a, per_row=True, dtype=self.tensors["b"].dtype)
            a = values.to(torch.float32) * scale[:, None]
            y = F.linear(a, w.to(torch.float32), None if bias is None else bias.float())
            return y.to(torch.bfloat16).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
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
        return (t["b"].to(torch.float32) * t["scale_b"][:, None]).to(dtype)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.tensors.values() if _is_t(v))


def _is_t(v) -> bool:
    return isinstance(v, torch.Tensor)


def prepare(weight: torch.Tensor, bias: torch.Tensor | None, quantize, name: str):
    """The prepared form of an nn.Linear ``weight`` [N, K] (and ``bias``) for ``quantize``."""
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
    e4m3 = _fp8.e4m3_for(weight.device)
    values, scale = _fp8.quantize_fp8(weight, per_row=True, dtype=e4m3)
    fp8_bias = None if bias is None else bias.to(torch.bfloat16)
    return PreparedLinear("fp8", k, n, {"b": values, "scale_b": scale}, fp8_bias)


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


_CALL = {"dense": _dense, "w8a16": _w8a16, "w4a16": _w4a16, "fp8": _fp8_call}


@contextmanager
def reference_forwards(model, blueprint, quantize):
    """Within the block, each projection of ``blueprint.linears`` computes its
    :meth:`PreparedLinear.reference` for ``quantize`` (a patched projection: of its own prepared
    weight; any other: of the weight prepared afresh). Yields {id(module): reference}."""
    refs: dict[int, object] = {}
    saved: list[tuple[torch.nn.Module, object]] = []
    try:
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
                saved.append((module, vars(module).get("forward")))
                object.__setattr__(module, "forward", prepared.reference)
                refs[id(module)] = prepared.reference
        yield refs
    finally:
        for module, forward in reversed(saved):
            if forward is None:
                object.__delattr__(module, "forward")
            else:
                object.__setattr__(module, "forward", forward)
