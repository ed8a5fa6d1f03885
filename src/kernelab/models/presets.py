"""Model presets: configurations with the real dimensions of public models, built with random
weights (no download). Dimensions from each model's published config.json."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    rope_theta: float = 500000.0
    tiny: bool = False
    #: further config fields (name, value): the mixture-of-experts sizes, say
    extra: tuple[tuple[str, object], ...] = ()

    def config(self, head_dim: int | None = None):
        """A transformers config for this preset (transformers must be installed); ``head_dim``
        overrides the preset's (the attention kernels take 64, 96, 128 and 256: the tiny
        presets' 16 is below them)."""
        import transformers

        cls = transformers.AutoConfig.for_model(self.model_type).__class__
        kwargs = dict(
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            vocab_size=self.vocab,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
        if (head_dim or self.head_dim) is not None:
            kwargs["head_dim"] = head_dim or self.head_dim
        kwargs.update(self.extra)
        config = cls(**kwargs)
        config.rope_theta = self.rope_theta
        return config

    def values(self) -> dict:
        """The preset as config.json values (Hugging Face names), for costing without
        transformers."""
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "head_dim": self.head_dim or self.hidden // self.heads,
            "hidden_act": dict(self.extra).get("hidden_activation", "silu"),
            "tie_word_embeddings": False,
            **dict(self.extra),
        }


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
        Preset("llama3-8b", "llama", 4096, 32, 32, 8, 14336, 128256),
        # huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
        Preset("llama3-70b", "llama", 8192, 80, 64, 8, 28672, 128256),
        # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
        Preset("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, rope_theta=1e6),
        # huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json (vocabulary 32768)
        Preset("mistral-7b", "mistral", 4096, 32, 32, 8, 14336, 32768, rope_theta=1e6),
        # huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
        Preset(
            "mixtral-8x7b",
            "mixtral",
            4096,
            32,
            32,
            8,
            14336,
            32000,
            rope_theta=1e6,
            extra=(("num_local_experts", 8), ("num_experts_per_tok", 2)),
        ),
        # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
        Preset(
            "qwen3-30b-a3b",
            "qwen3_moe",
            2048,
            48,
            32,
            4,
            6144,
            151936,
            head_dim=128,
            rope_theta=1e6,
            extra=(
                ("num_experts", 128),
                ("num_experts_per_tok", 8),
                ("moe_intermediate_size", 768),
                ("norm_topk_prob", True),
                ("decoder_sparse_step", 1),
                ("mlp_only_layers", []),
            ),
        ),
        # Tiny versions: the same block structure, small enough for a CPU and the interpreter
        # (K = 64 and 192: int4 groups of 64).
        Preset("tiny-llama", "llama", 64, 2, 4, 2, 192, 256, tiny=True),
        Preset("tiny-mistral", "mistral", 64, 2, 4, 2, 192, 256, tiny=True),
        Preset("tiny-qwen2", "qwen2", 64, 2, 4, 2, 192, 256, tiny=True),
        Preset("tiny-qwen3", "qwen3", 64, 2, 4, 2, 192, 256, head_dim=16, tiny=True),
        # Gemma-2's attention: alternating sliding-window (layer 0) and full (layer 1) layers,
        # logits soft-capped, scale query_pre_attn_scalar^-0.5 (32: not the head size, so a
        # kernel using 1/sqrt(head_dim) is caught). The cap (1.0, Gemma-2's is 50) and window
        # (12 tokens, Gemma-2's is 4096) are small so that both matter on short prompts, and
        # the weights start at 5x the usual spread (initializer_range 0.1): with 0.02 the
        # attention scores are so small that tanh is the identity and dropping the cap changes
        # the logits by 7e-5 (rel L2); with 0.1, by 0.3.
        Preset(
            "tiny-gemma2",
            "gemma2",
            64,
            2,
            4,
            2,
            192,
            256,
            head_dim=16,
            rope_theta=10000.0,
            tiny=True,
            extra=(
                ("hidden_activation", "gelu_pytorch_tanh"),
                ("query_pre_attn_scalar", 32),
                ("sliding_window", 12),
                ("attn_logit_softcapping", 1.0),
                ("final_logit_softcapping", 30.0),
                ("initializer_range", 0.1),
            ),
        ),
        # Mixtures of experts: 4 experts of 192 (Mixtral, top-2), 8 of 64 (Qwen3-MoE, top-2,
        # its second layer a dense MLP of 192).
        Preset(
            "tiny-mixtral",
            "mixtral",
            64,
            2,
            4,
            2,
            192,
            256,
            tiny=True,
            extra=(("num_local_experts", 4), ("num_experts_per_tok", 2)),
        ),
        Preset(
            "tiny-qwen3-moe",
            "qwen3_moe",
            64,
            2,
            4,
            2,
            192,
            256,
            head_dim=16,
            tiny=True,
            extra=(
                ("num_experts", 8),
                ("num_experts_per_tok", 2),
                ("moe_intermediate_size", 64),
                ("norm_topk_prob", True),
                ("decoder_sparse_step", 1),
                ("mlp_only_layers", [1]),
            ),
        ),
    )
}


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]


def build(name: str, dtype=None, device="cpu", seed: int = 0, head_dim: int | None = None):
    """A causal LM for preset ``name`` with random weights, in eval mode (``head_dim``: see
    ``Preset.config``)."""
    import torch
    import transformers

    preset = get(name)
    torch.manual_seed(seed)
    device = torch.device(device)
    # Built on the target device: random initialisation of an 8B model is seconds on a GPU
    # and minutes on a CPU. (The tiny presets are built on the CPU whatever the device, so a
    # tiny model is the same model everywhere.)
    where = device if device.type != "cpu" and not preset.tiny else torch.device("cpu")
    with where:
        model = transformers.AutoModelForCausalLM.from_config(preset.config(head_dim))
    # Trained norm weights are not all ones (the initial value): spread them, so that kernels
    # that mishandle the weight cannot agree with the original by accident.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.eval()
    if dtype is not None:
        model.to(dtype)
    return model.to(device)
