"""The fields of a Hugging Face config that decide what a decoder model costs, parsed and
checked: from a preset, a config.json (parsed as JSON, never executed), a dict or a
transformers config, and changed with ``--set KEY=VALUE``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

#: The config.json fields model-cost reads (Hugging Face names), and what each must be.
_INT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "head_dim",
)
#: Activations (config.hidden_act) and the fused op of the gated MLP.
ACTIVATIONS = {
    "silu": "silu_and_mul",
    "swish": "silu_and_mul",
    "gelu": "gelu_and_mul",
    "gelu_pytorch_tanh": "gelu_and_mul",
    "gelu_new": "gelu_and_mul",
}
#: Keys of --set that change the workload rather than the config.
WORKLOAD_KEYS = ("recipe", "kv", "batch", "context", "prefill")


#: Integer fields --set may set to 0 (none).
_MAY_BE_ZERO = (
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "moe_layers",
)


#: Limits on what a config may say (a config.json is untrusted input: past these, the costing
#: would run for minutes or overflow the ops' int64 sizes before anything is wrong): the
#: largest size of any dimension, the most layers and experts (the largest published models
#: have about 130 layers and 384 experts), and the largest config.json read.
MAX_SIZE = 2**31 - 1
MAX_LAYERS = 10_000
MAX_EXPERTS = 65_536
MAX_CONFIG_BYTES = 4 << 20
_LIMITS = {
    "num_hidden_layers": MAX_LAYERS,
    "moe_layers": MAX_LAYERS,
    "num_local_experts": MAX_EXPERTS,
    "num_experts_per_tok": MAX_EXPERTS,
}


class CostError(ValueError):
    """A config, a workload or a device model-cost cannot cost (the message says which)."""


# --- the config ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a Hugging Face config that decide what a decoder model costs."""

    name: str
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2's q, k, v projections carry a bias; attention_bias sets it
    o_bias: bool = False
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    #: a mixture of experts: each expert's intermediate size (0: intermediate_size, as
    #: Mixtral's), the shared expert's (0: none), how many layers route (the others run the
    #: dense MLP of intermediate_size), the router's scoring and whether it renormalises
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: int = 0
    moe_scoring: str = "softmax"
    moe_renormalize: bool = True

    @classmethod
    def from_dict(cls, d: Mapping, name: str = "config") -> ModelConfig:
        """From a config.json's values; other keys are ignored, missing or bad ones named."""
        if not isinstance(d, Mapping):
            raise CostError(f"config: expected a JSON object of config values, got {type(d)}")
        text_config = d.get("text_config")
        if isinstance(text_config, Mapping) and "hidden_size" not in d:
            d = {**d, **text_config}  # multimodal configs keep the decoder's values here
        values: dict = {"name": name, "model_type": str(d.get("model_type", "?"))}
        for key in _INT_FIELDS:
            if key == "head_dim" and d.get(key) is None:
                continue
            if key == "num_key_value_heads" and d.get(key) is None:
                values[key] = values.get("num_attention_heads")
                continue
            values[key] = _positive_int(f"config {name}: {key}", d.get(key), _LIMITS.get(key))
        if "head_dim" not in values:
            values["head_dim"] = _whole_heads(values)
        values["num_key_value_heads"] = _positive_int(
            f"config {name}: num_key_value_heads", values["num_key_value_heads"]
        )
        act = d.get("hidden_act", d.get("hidden_activation", "silu"))
        values["hidden_act"] = str(act)
        values["tie_word_embeddings"] = bool(d.get("tie_word_embeddings", False))
        bias = d.get("attention_bias")
        values["qkv_bias"] = bool(bias) if bias is not None else values["model_type"] == "qwen2"
        values["o_bias"] = bool(bias) and values["model_type"] != "qwen2"
        experts = d.get("num_local_experts", d.get("num_experts")) or 0
        values["num_local_experts"] = _count(
            f"config {name}: num_local_experts", experts, MAX_EXPERTS
        )
        per_tok = d.get("num_experts_per_tok") or 0
        values["num_experts_per_tok"] = _count(
            f"config {name}: num_experts_per_tok", per_tok, MAX_EXPERTS
        )
        if experts or per_tok:
            values.update(_moe_values(d, name, values["num_hidden_layers"]))
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise CostError(
                f"config {self.name}: num_attention_heads ({self.num_attention_heads}) must be "
                f"a multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        e, k = self.num_local_experts, self.num_experts_per_tok
        if bool(e) != bool(k) or k > e:
            raise CostError(
                f"config {self.name}: a mixture of experts needs 1 <= num_experts_per_tok "
                f"({k}) <= num_local_experts ({e})"
            )
        if self.moe_layers > self.num_hidden_layers:
            raise CostError(
                f"config {self.name}: moe_layers ({self.moe_layers}) exceeds "
                f"num_hidden_layers ({self.num_hidden_layers})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise CostError(
                f"config {self.name}: hidden_act: expected one of {sorted(ACTIVATIONS)}, "
                f"got {self.hidden_act!r}"
            )

    def with_values(self, changes: Mapping[str, str]) -> ModelConfig:
        """This config with ``--set`` changes (``{key: text}``), each checked."""
        names = {f.name for f in fields(self)} - {"name", "model_type"}
        out = {}
        for key, text in changes.items():
            if key not in names:
                raise CostError(
                    f"set: unknown key {key!r}; expected one of "
                    f"{', '.join(sorted(names | set(WORKLOAD_KEYS)))}"
                )
            kind = type(getattr(self, key))
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0"):
                    raise CostError(f"set: {key} expects true or false, got {text!r}")
                out[key] = text.lower() in ("true", "1")
            elif kind is int:
                out[key] = _count(f"set: {key}", _int_text(key, text), _LIMITS.get(key))
                if out[key] == 0 and key not in _MAY_BE_ZERO:
                    raise CostError(f"set: {key} expects a positive integer, got {text!r}")
            else:
                out[key] = text
        if out.get("num_local_experts") and "moe_layers" not in out and not self.moe_layers:
            out["moe_layers"] = self.num_hidden_layers  # experts named: every layer routes
        label = ", ".join(f"{k}={v}" for k, v in changes.items())
        config = replace(self, **out, name=f"{self.name} ({label})")
        config.check()
        return config


def _moe_values(d: Mapping, name: str, layers: int) -> dict:
    """The mixture-of-experts fields of a config.json: Mixtral's (every layer routes, experts
    of intermediate_size), Qwen2-MoE's and Qwen3-MoE's (moe_intermediate_size, a shared
    expert, decoder_sparse_step, mlp_only_layers) and DeepSeek's names (first_k_dense_replace,
    n_shared_experts, scoring_func)."""
    if d.get("kv_lora_rank") or d.get("q_lora_rank"):
        raise CostError(
            f"config {name}: multi-head latent attention (kv_lora_rank, as DeepSeek-V2/V3) is "
            "not costed: its attention is not the grouped-query attention model-cost counts"
        )
    moe_i = _count(f"config {name}: moe_intermediate_size", d.get("moe_intermediate_size") or 0)
    shared = d.get("shared_expert_intermediate_size") or 0
    if not shared and d.get("n_shared_experts"):
        shared = _count(f"config {name}: n_shared_experts", d["n_shared_experts"]) * moe_i
    step = d.get("decoder_sparse_step") or 1
    step = _positive_int(f"config {name}: decoder_sparse_step", step)
    dense_only = d.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in dense_only
    ):
        raise CostError(f"config {name}: mlp_only_layers: expected a list of layer indices")
    if len(dense_only) > layers:
        raise CostError(
            f"config {name}: mlp_only_layers: expected at most num_hidden_layers ({layers}) "
            f"layer indices, got {len(dense_only)}"
        )
    dense_only = set(dense_only)
    first_dense = _count(
        f"config {name}: first_k_dense_replace", d.get("first_k_dense_replace") or 0
    )
    routed = sum(
        1 for i in range(layers) if i >= first_dense and i not in dense_only and (i + 1) % step == 0
    )
    scoring = str(d.get("scoring_func") or "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise CostError(
            f"config {name}: scoring_func: expected softmax or sigmoid, got {scoring!r}"
        )
    renorm = d.get("norm_topk_prob")
    return {
        "moe_intermediate_size": moe_i,
        "shared_expert_intermediate_size": _count(
            f"config {name}: shared_expert_intermediate_size", shared
        ),
        "moe_layers": routed,
        "moe_scoring": scoring,
        # Mixtral renormalises its top-k (its config has no such key); Qwen-MoE says
        "moe_renormalize": True if renorm is None else bool(renorm),
    }


def _int_text(key: str, text: str) -> int:
    if len(text) > 30:  # int() of thousands of digits is refused (or slow): no size is that long
        raise CostError(f"set: {key} expects an integer, got {text[:30]!r}... ({len(text)} chars)")
    try:
        return int(text)
    except ValueError:
        raise CostError(f"set: {key} expects an integer, got {text!r}") from None


def _shown(v) -> str:
    text = (
        repr(v)
        if not isinstance(v, int) or v.bit_length() < 200
        else f"an int of {len(str(v))} digits"
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _positive_int(what: str, v, top: int | None = None) -> int:
    top = top or MAX_SIZE
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= top:
        raise CostError(f"{what}: expected a positive integer up to {top:,}, got {_shown(v)}")
    return v


def _count(what: str, v, top: int | None = None) -> int:
    top = top or MAX_SIZE
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
        raise CostError(f"{what}: expected an integer from 0 to {top:,}, got {_shown(v)}")
    return v


def _whole_heads(values: dict) -> int:
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if hidden % heads:
        raise CostError(
            f"config {values['name']}: hidden_size ({hidden}) is not a multiple of "
            f"num_attention_heads ({heads}); give head_dim"
        )
    return hidden // heads


def load_config(spec) -> ModelConfig:
    """A preset name, a config.json path, a dict of config values or a transformers config."""
    from kernelab.models.presets import PRESETS

    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, Mapping):
        return ModelConfig.from_dict(spec)
    if hasattr(spec, "to_dict") and not isinstance(spec, str | Path):
        return ModelConfig.from_dict(spec.to_dict(), getattr(spec, "name_or_path", "") or "config")
    text = str(spec)
    if text in PRESETS:
        return ModelConfig.from_dict(PRESETS[text].values(), text)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.is_file():
        try:
            with path.open("rb") as f:  # the size checked by reading one byte past the limit
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise CostError(f"config: cannot read {text!r}: {exc.strerror or exc}") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise CostError(
                f"config: {text!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB, which no "
                "config.json is (pass its values as a dict to kernelab.workloads.model_cost.cost)"
            )
        try:
            data = json.loads(raw)  # parsed, never executed
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CostError(f"config: {text!r} is not valid JSON: {exc}") from None
        except RecursionError:
            raise CostError(f"config: {text!r} is nested too deep to be a config") from None
        return ModelConfig.from_dict(data, path.parent.name or path.stem)
    raise CostError(
        f"config: expected a preset ({', '.join(sorted(PRESETS))}) or a path to a "
        f"config.json, got {text!r}"
    )
