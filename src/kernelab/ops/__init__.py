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
from kernelab.ops.activation import GELU_AND_MUL, SILU_AND_MUL, gelu_and_mul, silu_and_mul
from kernelab.ops.fp8_gemm import FP8_GEMM, fp8_gemm, fp8_gemm_ref
from kernelab.ops.fp8_quant import FP8_QUANT, fp8_quant, fp8_quant_ref
from kernelab.ops.gemm import GEMM, gemm, gemm_ref
from kernelab.ops.layernorm import LAYERNORM, layernorm, layernorm_ref
from kernelab.ops.quant_gemm import (
    W4A16_GEMM,
    W8A16_GEMM,
    w4a16_gemm,
    w4a16_ref,
    w8a16_gemm,
    w8a16_ref,
)
from kernelab.ops.rmsnorm import RMSNORM, rmsnorm, rmsnorm_ref
from kernelab.ops.rmsnorm_fp8_quant import (
    RMSNORM_FP8_QUANT,
    rmsnorm_fp8_quant,
    rmsnorm_fp8_quant_ref,
)
from kernelab.ops.rope import ROPE, rope, rope_ref
from kernelab.ops.softmax import SOFTMAX, softmax, softmax_ref
