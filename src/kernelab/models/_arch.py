"""Which modules of each supported architecture kernelab replaces, declared as data.

Every architecture listed here shares the pre-norm decoder block of Llama:

    h = x + attn(norm_in(x));  y = h + mlp(norm_post(h));  mlp(z) = down(act(gate(z)) * up(z))

and so the same replacements: RMSNorm modules, the post-attention residual add fused into the
post-attention RMSNorm, the gated MLP's activation fused with its product (SwiGLU), and the
rotary embedding of q and k (one in-place kernel instead of a chain of slices, products and
concatenations), the sparse mixture-of-experts blocks of Mixtral and Qwen3-MoE (router top-k
and the fused expert layer), and, on request, the linear projections (dense or quantized
GEMMs). Adding an architecture that shares the block is one entry; one that does not needs its
own block rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Blueprint:
    model_type: str  # config.model_type
    modeling_module: str  # where transformers defines the architecture
    norm_class: str  # RMSNorm modules (also q_norm/k_norm in Qwen3)
    layer_class: str  # decoder layer with input_layernorm/self_attn/post_attention_layernorm/mlp
    mlp_class: str  # gate_proj, up_proj, down_proj, act_fn
    #: activations (config.hidden_act) the fused MLP supports, mapped to the kernelab op
    activations: tuple[tuple[str, str], ...] = (("silu", "silu_and_mul"),)
    #: the module-level function the attention calls to rotate q and k
    rope_function: str = "apply_rotary_pos_emb"
    #: the decoder layer's nn.Linear projections (paths inside the layer) that the "linear"
    #: replacement runs on kernelab GEMMs; the gated MLP's gate and up come last
    linears: tuple[str, ...] = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.down_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
    )
    #: the sparse mixture-of-experts block (a router ``gate`` with ``weight`` and ``top_k``,
    #: ``experts`` with ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]) that the "moe"
    #: replacement runs on ``moe_topk`` and ``fused_moe``; empty: none
    moe_class: str = ""


_LLAMA_LIKE = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
}

ARCHITECTURES: dict[str, Blueprint] = {
    model_type: Blueprint(
        model_type,
        f"transformers.models.{model_type}.modeling_{model_type}",
        f"{prefix}RMSNorm",
        f"{prefix}DecoderLayer",
        f"{prefix}MLP",
    )
    for model_type, prefix in _LLAMA_LIKE.items()
}
#: Mixtures of experts with the same decoder block, the MLP a sparse MoE block (Qwen3-MoE
#: keeps dense MLPs in its ``mlp_only_layers``).
ARCHITECTURES.update(
    {
        model_type: Blueprint(
            model_type,
            f"transformers.models.{model_type}.modeling_{model_type}",
            f"{prefix}RMSNorm",
            f"{prefix}DecoderLayer",
            f"{prefix}MLP",
            moe_class=f"{prefix}SparseMoeBlock",
        )
        for model_type, prefix in {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe"}.items()
    }
)

#: Replacements a caller may ask for, in the order they are applied.
REPLACEMENTS = ("rmsnorm", "fused_residual", "mlp", "rope", "moe", "linear")
#: What ``patch`` replaces unless told otherwise. "linear" (the projections on kernelab GEMMs)
#: is opt-in: on a CPU it brings nothing; ``quantize=`` implies it.
DEFAULT_REPLACEMENTS = ("rmsnorm", "fused_residual", "mlp", "rope", "moe")


def blueprint_for(model) -> Blueprint:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model: architecture {model_type!r} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))} (and architectures sharing their decoder block)"
        )
    return ARCHITECTURES[model_type]
