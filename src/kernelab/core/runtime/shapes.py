"""Shapes of real models, for the ``representative`` shape sets.

Dimensions from each model's published ``config.json`` on the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelab.core.runtime.launch import RowConfig
from kernelab.core.shape import Shape


@dataclass(frozen=True)
class ModelDims:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


MODELS: tuple[ModelDims, ...] = (
    ModelDims("llama3-8b", 4096, 32, 8, 128, 14336, 128256),
    ModelDims("llama3-70b", 8192, 64, 8, 128, 28672, 128256),
    ModelDims("qwen2.5-7b", 3584, 28, 4, 128, 18944, 152064),
    ModelDims("mistral-7b", 4096, 32, 8, 128, 14336, 32768),
)

#: Tokens per step: decode at batch 1 and 32, prefill of one 4096-token sequence.
DECODE_TOKENS = (1, 32)
PREFILL_TOKENS = (4096,)
TOKENS = DECODE_TOKENS + PREFILL_TOKENS


def phase(tokens: int) -> str:
    return "decode" if tokens in DECODE_TOKENS else "prefill"


def by_width(width_of) -> dict[int, list[str]]:
    """Group models by a derived width (e.g. hidden size), so equal shapes appear once."""
    groups: dict[int, list[str]] = {}
    for m in MODELS:
        groups.setdefault(width_of(m), []).append(m.name)
    return groups


# --- the row-wise shape sets (norms, quantization): rows × a model's hidden width ----------


def row_suffix(params: dict) -> str:
    """A label's note of a shape's options: " +residual" for flags, " e4m3fnuz" for names."""
    return "".join(
        f" +{k}" if v is True else f" {v}" if isinstance(v, str) else "" for k, v in params.items()
    )


def hidden_rows(options: tuple[dict, ...]) -> list[Shape]:
    """Rows of each reference model's hidden width at decode and prefill, once per option set."""

    return [
        Shape(
            f"{'/'.join(models)} {phase(tokens)} {tokens}x{hidden}" + row_suffix(p),
            {"rows": tokens, "cols": hidden},
            p,
            batch_dim="rows",
        )
        for hidden, models in by_width(lambda m: m.hidden).items()
        for tokens in TOKENS
        for p in options
    ]


def row_edge(options: tuple[dict, ...]) -> list[Shape]:
    cases = [
        ("1 column", 3, 1, {}),
        ("prime width", 5, 1021, {}),
        ("one row", 1, 4096, {}),
        ("longer than one block", 3, RowConfig.MAX_SINGLE_PASS + 1000, {}),
        ("non-contiguous rows", 7, 257, {"row_pad": 13}),
        ("empty", 0, 128, {}),
        ("many short rows", 1000, 96, {}),
    ]
    return [
        Shape(
            f"{label} {n}x{c}" + row_suffix(p),
            {"rows": n, "cols": c},
            {**p, **extra},
            batch_dim="rows",
        )
        for label, n, c, extra in cases
        for p in options
    ]


#: Projections (label, N, K) of models served with 128 × 128 block-scaled float8 weights, from
#: their config.json: DeepSeek-V3 (deepseek-ai/DeepSeek-V3: hidden 7168, q_lora_rank 1536,
#: kv_lora_rank 512, qk_rope_head_dim 64, 128 heads of qk_nope_head_dim 128 and v_head_dim 128,
#: intermediate 18432 in its dense layers, moe_intermediate 2048 per expert) and Qwen3-8B
#: (Qwen/Qwen3-8B: hidden 4096, 32 heads and 8 KV heads of 128, intermediate 12288).
BLOCK_FP8_PROJECTIONS: tuple[tuple[str, int, int], ...] = (
    ("deepseek-v3 q_a+kv_a", 1536 + 512 + 64, 7168),
    ("deepseek-v3 q_b", 128 * (128 + 64), 1536),
    ("deepseek-v3 kv_b", 128 * (128 + 128), 512),
    ("deepseek-v3 o", 7168, 128 * 128),
    ("deepseek-v3 gate_up", 2 * 18432, 7168),
    ("deepseek-v3 down", 7168, 18432),
    ("deepseek-v3 expert gate_up", 2 * 2048, 7168),
    ("deepseek-v3 expert down", 7168, 2048),
    ("qwen3-8b qkv", (32 + 2 * 8) * 128, 4096),
    ("qwen3-8b o", 4096, 32 * 128),
    ("qwen3-8b gate_up", 2 * 12288, 4096),
    ("qwen3-8b down", 4096, 12288),
)
