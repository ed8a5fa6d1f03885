"""Patching a transformers model's modules with kernelab ops: per instance, checked, reversible.

Nothing is patched at import. ``patch`` sets instance attributes (``module.forward``) on the
model's own modules — classes and other models are untouched — and records each change so that
``unpatch`` can remove it. The gated MLP's gate and up weights are re-laid as two views of one
[2·intermediate, hidden] matrix, so one GEMM produces both halves for the fused activation
without a second copy of the weights; ``unpatch`` gives each projection back its own storage.
The "linear" replacement runs the decoder layers' projections on kernelab GEMMs through
weights prepared once (dense, or quantized: see ``_linear``); they live in instance attributes,
so ``unpatch`` frees them, and the projections' own weights are never modified.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import types
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from kernelab import ops
from kernelab.models import _library, _linear
from kernelab.models._arch import DEFAULT_REPLACEMENTS, REPLACEMENTS, Blueprint, blueprint_for

# The modules, not the functions of the same names that shadow them as package attributes.
_fp8_gemm = importlib.import_module("kernelab.ops.matmul.fp8_gemm")
_fused_moe_fp8 = importlib.import_module("kernelab.ops.moe.fused_moe_fp8")
_fused_moe_mxfp4 = importlib.import_module("kernelab.ops.moe.fused_moe_mxfp4")

_STATE = "_kernelab_patch"


@dataclass
class PatchState:
    blueprint: Blueprint
    replacements: tuple[str, ...]
    #: (module, attribute name) set on instances; unpatch deletes them
    attributes: list[tuple[torch.nn.Module, str]] = field(default_factory=list)
    #: MLPs whose gate/up weights were re-laid into one matrix
    fused_mlps: list[torch.nn.Module] = field(default_factory=list)
    #: qualified names of the modules patched, for messages
    names: list[str] = field(default_factory=list)
    #: whether this model holds a use of the architecture's rotary-function replacement
    rope: bool = False
    #: weight format of the linear projections (None: dense), when "linear" is replaced
    quantize: str | None = None
    #: (qualified name, module, prepared weight) of each projection on a kernelab GEMM; a
    #: fused gate/up is listed under its MLP
    linears: list[tuple[str, torch.nn.Module, _linear.PreparedLinear]] = field(default_factory=list)
    #: replacement kind ("rmsnorm", "mlp", ...) -> the qualified names it replaced, in order
    replaced: dict[str, list[str]] = field(default_factory=dict)
    #: what was not done as asked, one line each (a projection kept dense, experts left in
    #: their own format)
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        """``<kernelab patch of llama: rmsnorm 5 (model.layers.0.input_layernorm … model.norm);
        mlp 2 (…)>``: each kind with how many it replaced, the first and the last."""
        parts = []
        for kind, names in self.replaced.items():
            span = names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}"
            parts.append(f"{kind} {len(names)} ({span})")
        quant = f" quantize={self.quantize}" if self.quantize else ""
        what = "; ".join(parts) or "nothing replaced"
        notes = "".join(f"; note: {n}" for n in self.notes)
        return f"<kernelab patch of {self.blueprint.model_type}{quant}: {what}{notes}>"


class PatchError(ValueError):
    """The patched model disagrees with the original beyond the dtype's contract."""


def _op(name: str):
    """The public function of a registered kernelab op, or None when it is not available."""
    try:
        ops.get(name)
    except ValueError:
        return None
    return getattr(ops, name, None)


# --- replacement forwards (bound to module instances) ------------------------------------------


def _norm_forward(self, hidden_states):
    return _library.rmsnorm(hidden_states, self.weight, self.variance_epsilon)


def _layer_forward(self, hidden_states, *args, **kwargs):
    """The pre-norm block with the post-attention residual add fused into the RMSNorm.

    ``rmsnorm(x, w, residual=r)`` sets ``r ← x + r`` in place and normalises ``r``; the
    attention output (a tensor this block owns) takes the role of ``r`` so the layer's input,
    which the caller may keep, is never written.
    """
    if args:
        bound = self._kernelab_signature.bind(self, hidden_states, *args, **kwargs)
        kwargs = {k: v for k, v in bound.arguments.items() if k not in ("self", "hidden_states")}
        kwargs.update(kwargs.pop("kwargs", {}))
    h = self.input_layernorm(hidden_states)
    attn = self.self_attn(hidden_states=h, **kwargs)
    attn = attn[0] if isinstance(attn, tuple) else attn
    norm = self.post_attention_layernorm
    normed = _library.rmsnorm(hidden_states, norm.weight, norm.variance_epsilon, residual=attn)
    return attn + self.mlp(normed)


def _rope(original):
    """kernelab's rope in place of transformers' ``apply_rotary_pos_emb(q, k, cos, sin)``.

    transformers passes q [batch, heads, seq, head_dim] (a transposed view of the projection's
    output) and cos/sin [batch, seq, head_dim] with both halves equal (NeoX layout). Each
    token's cos/sin row becomes a row of the cache, so positions are simply 0..tokens-1. Any
    call outside that form goes to the original function.
    """

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, **kwargs):
        if (
            kwargs
            or unsqueeze_dim != 1
            or q.dim() != 4
            or k.dim() != 4
            or cos.dim() != 3
            or cos.shape != sin.shape
            or cos.shape[-1] != q.shape[-1]
            or q.shape[-1] % 2
            or cos.shape[:2] != (q.shape[0], q.shape[2])
        ):
            return original(q, k, cos, sin, unsqueeze_dim, **kwargs)
        b, _, s, d = q.shape
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)
        try:
            q3, k3 = qt.view(b * s, q.shape[1], d), kt.view(b * s, k.shape[1], d)
        except RuntimeError:
            return original(q, k, cos, sin, unsqueeze_dim, **kwargs)
        half = d // 2
        cache = torch.cat([cos[..., :half], sin[..., :half]], dim=-1).reshape(b * s, d)
        positions = torch.arange(b * s, device=q.device)
        _library.rope(positions, q3, k3, cache.to(q.dtype) if q.dtype != cache.dtype else cache)
        return q, k

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


# The rotary function is module-level in transformers, so it is replaced for the whole
# architecture while at least one model of it is patched (kernelab's rope agrees with it within
# the dtype's contract), and restored when the last one is unpatched.
_rope_lock = threading.Lock()
_rope_users: dict[str, int] = {}


def _install_rope(bp: Blueprint) -> bool:
    module = importlib.import_module(bp.modeling_module)
    with _rope_lock:
        current = getattr(module, bp.rope_function, None)
        if current is None:
            return False
        if _rope_users.get(bp.model_type, 0) == 0:
            setattr(module, bp.rope_function, _rope(current))
        _rope_users[bp.model_type] = _rope_users.get(bp.model_type, 0) + 1
    return True


def _uninstall_rope(bp: Blueprint) -> None:
    module = importlib.import_module(bp.modeling_module)
    with _rope_lock:
        _rope_users[bp.model_type] -= 1
        if _rope_users[bp.model_type] == 0:
            fn = getattr(module, bp.rope_function)
            setattr(module, bp.rope_function, fn.__wrapped__)


def _mlp_forward(self, x):
    fused = self.__dict__.get("_kernelab_gate_up_linear")
    if fused is not None:
        gate_up = fused(x)
    else:
        gate_up = F.linear(x, self._kernelab_gate_up, self._kernelab_gate_up_bias)
    return self.down_proj(self._kernelab_act(gate_up))


def _moe_forward(self, hidden_states):
    """The sparse MoE block: router logits (the block's own linear), ``moe_topk`` (softmax,
    renormalised as the block's router does), ``fused_moe`` on the experts' own weights,
    ``fused_moe_fp8`` on the block-scaled e4m3 experts prepared at patch time
    (``quantize="fp8-block"``) or ``fused_moe_mxfp4`` on mxfp4 experts (``quantize="mxfp4"``).
    In training mode (router jitter) the block's own forward runs."""
    if self.training:
        return type(self).forward(self, hidden_states)
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    gate, experts = self.gate, self.experts
    logits = F.linear(x, gate.weight)
    weights, ids = _library.moe_topk(logits, gate.top_k, self._kernelab_renormalize)
    fp8 = self.__dict__.get("_kernelab_fp8_experts")
    mx = self.__dict__.get("_kernelab_mxfp4_experts")
    if fp8 is not None:
        w1, s1, w2, s2 = fp8
        y = _library.fused_moe_fp8(x, w1, w2, s1, s2, weights, ids)
    elif mx is not None:
        w1, s1, w2, s2 = mx
        y = _library.fused_moe_mxfp4(x, w1, w2, s1, s2, weights, ids)
    else:
        y = _library.fused_moe(x, experts.gate_up_proj, experts.down_proj, weights, ids)
    return y.reshape(shape)


def _fp8_experts(module) -> tuple[torch.Tensor, ...]:
    """The block's expert weights as ``fused_moe_fp8`` reads them, quantized once to
    128 x 128 blocks in the device's e4m3: (w1, w1_scale, w2, w2_scale)."""
    experts = module.experts
    w1, w2 = experts.gate_up_proj.detach(), experts.down_proj.detach()
    e4m3 = _fp8_gemm.e4m3_for(w1.device)
    q1, s1 = ops.packing.quantize_fp8_block_experts(w1, e4m3)
    q2, s2 = ops.packing.quantize_fp8_block_experts(w2, e4m3)
    return q1, s1, q2, s2


def _mx_experts(module) -> tuple[torch.Tensor, ...] | None:
    """The block's expert weights as ``fused_moe_mxfp4`` reads them, quantized once to mxfp4
    (``packing.quantize_mxfp4_experts``): (w1, w1_scale, w2, w2_scale); None when H or I is
    not a multiple of the 32-value scale block (the experts then stay 16-bit)."""
    experts = module.experts
    w1, w2 = experts.gate_up_proj.detach(), experts.down_proj.detach()
    if w1.shape[2] % ops.packing.MX_BLOCK or w2.shape[2] % ops.packing.MX_BLOCK:
        return None
    q1, s1 = ops.packing.quantize_mxfp4_experts(w1)
    q2, s2 = ops.packing.quantize_mxfp4_experts(w2)
    return q1, s1, q2, s2


#: quantize → (the MoE op, the block attribute holding its prepared experts, the preparation,
#: the recipe in eager torch)
_MOE_QUANT = {
    "fp8-block": (
        "fused_moe_fp8", "_kernelab_fp8_experts", _fp8_experts, _fused_moe_fp8.fused_moe_fp8_torch
    ),
    "mxfp4": (
        "fused_moe_mxfp4", "_kernelab_mxfp4_experts", _mx_experts,
        _fused_moe_mxfp4.fused_moe_mxfp4_torch,
    ),
}  # fmt: skip


def _moe_reference(module, experts, renormalize, recipe, hidden_states):
    """What a block on a quantized MoE op stands for, in plain torch: the block's router
    (softmax in float32, top-k, renormalised as the block does) and the op's recipe on the
    quantize-dequantized experts (``fused_moe_fp8_torch``: activations quantized per 1 x 128
    group as the kernels do; ``fused_moe_mxfp4_torch``: the activations as they are)."""
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    probs = torch.softmax(F.linear(x, module.gate.weight).float(), dim=-1)
    weights, ids = torch.topk(probs, module.gate.top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    w1, s1, w2, s2 = experts
    return recipe(x, w1, w2, s1, s2, weights, ids).reshape(shape)


def _moe_reference_forwards(model, blueprint: Blueprint, quantize):
    """Within the block, each MoE block ``patch`` puts on a quantized MoE op computes
    :func:`_moe_reference` (of its own prepared experts when patched, else of experts
    quantized afresh, the same). Yields {id(module): reference}."""
    return _linear.forwards_replaced(_moe_references(model, blueprint, quantize))


def _moe_references(model, blueprint: Blueprint, quantize):
    act = getattr(model.config, "hidden_act", None)
    if quantize not in _MOE_QUANT:
        return
    _, attr, prepare, recipe = _MOE_QUANT[quantize]
    for _, module in model.named_modules():
        if type(module).__name__ != blueprint.moe_class or not _fusable_moe(module, act):
            continue
        experts = vars(module).get(attr) or prepare(module)
        if experts is None:
            continue  # kept 16-bit: fused_moe, checked against the original block
        renorm = bool(getattr(module.gate, "norm_topk_prob", True))
        yield module, partial(_moe_reference, module, experts, renorm, recipe)


@contextmanager
def reference_forwards(model, blueprint: Blueprint, quantize):
    """The quantize-dequantize references of a quantized patch: the projections'
    (``_linear.reference_forwards``) and the quantized MoE blocks'. Yields
    {id(module): reference}."""
    with ExitStack() as stack:
        refs = dict(stack.enter_context(_linear.reference_forwards(model, blueprint, quantize)))
        refs.update(stack.enter_context(_moe_reference_forwards(model, blueprint, quantize)))
        yield refs


def _fusable_moe(module, hidden_act) -> bool:
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    w1, w2 = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    return (
        hidden_act == "silu"
        and isinstance(getattr(gate, "weight", None), torch.Tensor)
        and isinstance(getattr(gate, "top_k", None), int)
        and isinstance(w1, torch.Tensor)
        and isinstance(w2, torch.Tensor)
        and w1.dim() == w2.dim() == 3
        # fused_moe takes 16-bit floats (tensor-core inputs); a float32 model keeps its block
        and w1.dtype in (torch.float16, torch.bfloat16)
    )


def _linear_forward(self, x):
    return self._kernelab_linear(x)


# --- patch / unpatch -------------------------------------------------------------------------


def _replaced(state: PatchState, kind: str, name: str) -> None:
    state.names.append(name)
    state.replaced.setdefault(kind, []).append(name)


def _set(state: PatchState, module, attr: str, value) -> None:
    if attr in module.__dict__:
        raise RuntimeError(f"module {type(module).__name__} already has an instance {attr!r}")
    object.__setattr__(module, attr, value)
    state.attributes.append((module, attr))


def _fuse_gate_up(state: PatchState, mlp) -> None:
    gate, up = mlp.gate_proj, mlp.up_proj
    weight = torch.cat([gate.weight.data, up.weight.data], dim=0)
    n = gate.weight.shape[0]
    gate.weight.data = weight[:n]
    up.weight.data = weight[n:]
    bias = None
    if gate.bias is not None and up.bias is not None:
        bias = torch.cat([gate.bias.data, up.bias.data])
        gate.bias.data, up.bias.data = bias[:n], bias[n:]
    elif gate.bias is not None or up.bias is not None:
        raise ValueError("model: gate_proj and up_proj must both have a bias or neither")
    _set(state, mlp, "_kernelab_gate_up", weight)
    _set(state, mlp, "_kernelab_gate_up_bias", bias)
    state.fused_mlps.append(mlp)


def _prepare_gate_up(state: PatchState, name: str, mlp) -> None:
    """The gated MLP's gate and up as one prepared [2·intermediate, hidden] weight. Dense, it
    is the re-laid matrix itself; quantized, the concatenation is quantized once (per output
    channel or per group along K, so exactly as each projection alone) and then dropped."""
    gate, up = mlp.gate_proj, mlp.up_proj
    if state.quantize is None:
        weight, bias = mlp._kernelab_gate_up, mlp._kernelab_gate_up_bias
    else:
        weight = torch.cat([gate.weight.detach(), up.weight.detach()], dim=0)
        bias = None
        if gate.bias is not None and up.bias is not None:
            bias = torch.cat([gate.bias.detach(), up.bias.detach()])
        elif gate.bias is not None or up.bias is not None:
            raise ValueError("model: gate_proj and up_proj must both have a bias or neither")
    parts = (gate.weight.shape[0], up.weight.shape[0])
    prepared = _linear.prepare(weight, bias, state.quantize, f"{name}.gate_proj+up_proj", parts)
    _set(state, mlp, "_kernelab_gate_up_linear", prepared)
    state.linears.append((name, mlp, prepared))
    if prepared.note:
        state.notes.append(prepared.note)


def _patch_linears(state: PatchState, layers: list[tuple[str, torch.nn.Module]]) -> None:
    for layer_name, layer in layers:
        for path in state.blueprint.linears:
            parent_path, _, attr = path.rpartition(".")
            parent = layer.get_submodule(parent_path) if parent_path else layer
            if attr in ("gate_proj", "up_proj") and "_kernelab_gate_up_linear" in vars(parent):
                continue  # the fused MLP computes both with one GEMM
            module = getattr(parent, attr, None)
            if not isinstance(module, torch.nn.Linear):
                continue
            name = f"{layer_name}.{path}"
            prepared = _linear.prepare(module.weight, module.bias, state.quantize, name)
            _set(state, module, "_kernelab_linear", prepared)
            _set(state, module, "forward", types.MethodType(_linear_forward, module))
            state.linears.append((name, module, prepared))
            _replaced(state, "linear", name)
            if prepared.note:
                state.notes.append(prepared.note)


def apply(model, replacements=DEFAULT_REPLACEMENTS, quantize=None) -> PatchState:
    """Patch ``model`` in place without checking; see :func:`kernelab.models.patch`."""
    _linear.check_quantize(quantize)
    if quantize is not None and "linear" not in replacements:
        replacements = (*replacements, "linear")
    if getattr(model, _STATE, None) is not None:
        raise ValueError("model: already patched by kernelab (unpatch it first)")
    unknown = [r for r in replacements if r not in REPLACEMENTS]
    if unknown:
        raise ValueError(
            f"ops: unknown replacement(s) {unknown}; expected some of {list(REPLACEMENTS)}"
        )
    bp = blueprint_for(model)
    act_ops = dict(bp.activations)
    hidden_act = getattr(model.config, "hidden_act", None)
    state = PatchState(bp, tuple(replacements))
    linear = "linear" in replacements
    if linear:
        state.quantize = quantize
        _linear.check_device(quantize, next(model.parameters()).device)
    layers = []
    try:
        for name, module in model.named_modules():
            cls = type(module).__name__
            if cls == bp.layer_class:
                layers.append((name, module))
            if "rmsnorm" in replacements and cls == bp.norm_class:
                _set(state, module, "forward", types.MethodType(_norm_forward, module))
                _replaced(state, "rmsnorm", name)
            elif "fused_residual" in replacements and cls == bp.layer_class:
                sig = inspect.signature(type(module).forward)
                _set(state, module, "_kernelab_signature", sig)
                _set(state, module, "forward", types.MethodType(_layer_forward, module))
                _replaced(state, "fused_residual", name)
            elif "mlp" in replacements and cls == bp.mlp_class:
                act_name = act_ops.get(hidden_act, "")
                act = None if _op(act_name) is None else getattr(_library, act_name, _op(act_name))
                if act is None:
                    continue  # activation not fusable here: the MLP stays as it is
                if not (linear and quantize is not None):
                    _fuse_gate_up(state, module)
                if linear:
                    _prepare_gate_up(state, name, module)
                _set(state, module, "_kernelab_act", act)
                _set(state, module, "forward", types.MethodType(_mlp_forward, module))
                _replaced(state, "mlp", name)
            elif "moe" in replacements and bp.moe_class and cls == bp.moe_class:
                if _op("fused_moe") is None or not _fusable_moe(module, hidden_act):
                    continue  # not the block fused_moe computes: it stays as it is
                renorm = getattr(module.gate, "norm_topk_prob", True)  # Mixtral: always
                _set(state, module, "_kernelab_renormalize", bool(renorm))
                if quantize in _MOE_QUANT and _op(_MOE_QUANT[quantize][0]) is not None:
                    _quantize_experts(state, name, module, quantize)
                _set(state, module, "forward", types.MethodType(_moe_forward, module))
                _replaced(state, "moe", name)
        if "rope" in replacements and _op("rope") is not None:
            state.rope = _install_rope(bp)
            if state.rope:
                _replaced(state, "rope", f"{bp.modeling_module}.{bp.rope_function}")
        if linear:
            _patch_linears(state, layers)
    except Exception:
        _restore(state)
        raise
    object.__setattr__(model, _STATE, state)
    return state


def _quantize_experts(state: PatchState, name: str, module, quantize: str) -> None:
    _, attr, prepare, _ = _MOE_QUANT[quantize]
    experts = prepare(module)
    if experts is None:
        _, two_i, h = module.experts.gate_up_proj.shape
        state.notes.append(
            f"{name}: experts not quantized under {quantize}: hidden {h} or intermediate "
            f"{two_i // 2} is not a multiple of {ops.packing.MX_BLOCK}; fused_moe runs on the "
            "16-bit expert weights"
        )
        return
    _set(state, module, attr, experts)


def _restore(state: PatchState) -> None:
    for mlp in state.fused_mlps:
        for proj in (mlp.gate_proj, mlp.up_proj):
            proj.weight.data = proj.weight.data.clone()
            if proj.bias is not None:
                proj.bias.data = proj.bias.data.clone()
    for module, attr in reversed(state.attributes):
        if attr in module.__dict__:
            object.__delattr__(module, attr)
    state.attributes.clear()
    state.fused_mlps.clear()
    state.linears.clear()  # the prepared (packed) weights go with the last reference
    if state.rope:
        _uninstall_rope(state.blueprint)
        state.rope = False


def unpatch(model) -> None:
    """Undo :func:`patch`: the model computes exactly what it did before (bitwise)."""
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("model: not patched by kernelab")
    _restore(state)
    object.__delattr__(model, _STATE)


def state_of(model) -> PatchState | None:
    """What :func:`kernelab.models.patch` did to ``model`` (the :class:`PatchState` it
    returned), or None when the model is not patched: ``state_of(model).replaced`` maps each
    replacement kind to the qualified names of what it replaced."""
    return getattr(model, _STATE, None)
