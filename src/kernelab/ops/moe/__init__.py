"""Mixture of experts: routing (``moe_topk``), alignment of the routed pairs by expert
(``moe_align``), and the fused expert layer in bf16/fp16 (``fused_moe``), with int4 weights
(``fused_moe_w4a16``), block-scaled fp8 (``fused_moe_fp8``) and mxfp4 weights
(``fused_moe_mxfp4``)."""
