"""Ops, one folder per family (norm, matmul, quant, activation, rotary, logits, attention,
moe), each op declared once through the public op core (:mod:`kernelab.core`: Op, Variant,
Contract, Shape, launches, registries, and the runtime the families share) in one module of its
family.

Adding an op: one module in its family's folder, one test file, one export line below; then
``python -m kernelab.cli._catalog`` (the ops' catalogue that torch-free commands read).
"""

from kernelab.core import (
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
from kernelab.ops.activation.gelu_and_mul import GELU_AND_MUL, gelu_and_mul
from kernelab.ops.activation.silu_and_mul import SILU_AND_MUL, silu_and_mul
from kernelab.ops.attention.attention_prefill import (
    ATTENTION_PREFILL,
    attention_prefill,
    attention_prefill_ref,
)
from kernelab.ops.attention.kv_cache_write import KV_CACHE_WRITE, kv_cache_write, kv_cache_write_ref
from kernelab.ops.attention.merge_attention_states import (
    MERGE_ATTENTION_STATES,
    merge_attention_states,
    merge_attention_states_ref,
)
from kernelab.ops.attention.paged_attention import (
    PAGED_ATTENTION,
    paged_attention,
    paged_attention_ref,
)
from kernelab.ops.logits.softmax import SOFTMAX, softmax, softmax_ref
from kernelab.ops.matmul import _packing as packing  # int4/int8 layouts and converters
from kernelab.ops.matmul.fp8_block_gemm import FP8_BLOCK_GEMM, fp8_block_gemm, fp8_block_gemm_ref
from kernelab.ops.matmul.fp8_gemm import FP8_GEMM, fp8_gemm, fp8_gemm_ref
from kernelab.ops.matmul.gemm import GEMM, gemm, gemm_ref
from kernelab.ops.matmul.mx_gemm import MX_GEMM, mx_gemm, mx_gemm_ref
from kernelab.ops.matmul.nvfp4_gemm import NVFP4_GEMM, nvfp4_gemm, nvfp4_gemm_ref
from kernelab.ops.matmul.w4a16 import W4A16_GEMM, w4a16_gemm, w4a16_ref
from kernelab.ops.matmul.w8a16 import W8A16_GEMM, w8a16_gemm, w8a16_ref
from kernelab.ops.moe.fused_moe import FUSED_MOE, fused_moe, fused_moe_ref
from kernelab.ops.moe.fused_moe_fp8 import FUSED_MOE_FP8, fused_moe_fp8, fused_moe_fp8_ref
from kernelab.ops.moe.fused_moe_mxfp4 import (
    FUSED_MOE_MXFP4,
    fused_moe_mxfp4,
    fused_moe_mxfp4_ref,
)
from kernelab.ops.moe.fused_moe_w4a16 import (
    FUSED_MOE_W4A16,
    fused_moe_w4a16,
    fused_moe_w4a16_ref,
)
from kernelab.ops.moe.moe_align import MOE_ALIGN, moe_align, moe_align_ref
from kernelab.ops.moe.moe_topk import MOE_TOPK, moe_topk, moe_topk_ref
from kernelab.ops.norm.layernorm import LAYERNORM, layernorm, layernorm_ref
from kernelab.ops.norm.rmsnorm import RMSNORM, rmsnorm, rmsnorm_ref
from kernelab.ops.norm.rmsnorm_fp8_quant import (
    RMSNORM_FP8_QUANT,
    rmsnorm_fp8_quant,
    rmsnorm_fp8_quant_ref,
)
from kernelab.ops.quant.fp8_quant import FP8_QUANT, fp8_quant, fp8_quant_ref
from kernelab.ops.rotary.rope import ROPE, rope, rope_ref
