"""Shapes of real models, for the ``representative`` shape sets.

Dimensions from each model's published ``config.json`` on the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass


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
