"""Ops: one module per op family, each declared once through the op model.

Adding an op: one module here, one test file, one export line below.
"""

from kernelab.ops._model import (
    SHAPE_SETS,
    Contract,
    Cost,
    Launch,
    Op,
    Shape,
    Variant,
    all_ops,
    as_tuple,
    get,
    register,
)

# --- export lines: one per op module ---------------------------------------------------------
from kernelab.ops.fp8_gemm import FP8_GEMM, fp8_gemm, fp8_gemm_ref
from kernelab.ops.gemm import GEMM, gemm, gemm_ref
from kernelab.ops.quant_gemm import (
    W4A16_GEMM,
    W8A16_GEMM,
    w4a16_gemm,
    w4a16_ref,
    w8a16_gemm,
    w8a16_ref,
)
from kernelab.ops.rmsnorm import RMSNORM, rmsnorm, rmsnorm_ref

__all__ = [
    "FP8_GEMM",
    "GEMM",
    "RMSNORM",
    "SHAPE_SETS",
    "W4A16_GEMM",
    "W8A16_GEMM",
    "Contract",
    "Cost",
    "Launch",
    "Op",
    "Shape",
    "Variant",
    "all_ops",
    "as_tuple",
    "fp8_gemm",
    "fp8_gemm_ref",
    "gemm",
    "gemm_ref",
    "get",
    "register",
    "rmsnorm",
    "rmsnorm_ref",
    "w4a16_gemm",
    "w4a16_ref",
    "w8a16_gemm",
    "w8a16_ref",
]
