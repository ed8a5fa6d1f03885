"""Put kernelab's kernels into Hugging Face transformers models — declaratively, checked, and
reversibly.

    from kernelab.models import patch, unpatch, patched
    state = patch(model)              # RMSNorm, fused residual + RMSNorm, fused SwiGLU MLP, RoPE
    state.replaced["mlp"]             # the qualified names of the modules each kind replaced
    patch(model, quantize="w4a16")    # ... and the projections on int4 weight-only GEMMs
    state_of(model)                   # what patch did (its return value), None if unpatched
    with patched(model): model.generate(...)
    register_attention(model)         # attention on kernelab's kernels, paged cache in place

Supported: the causal LMs of the Llama family (Llama, Mistral, Qwen2/Qwen2.5, Qwen3); see
``kernelab.models._arch``. ``register_attention`` also serves Gemma-2 (softcap, its scale and
its sliding-window layers; ``patch`` does not: its norms and MLP differ). transformers is an
optional dependency (``pip install kernelab[hf]``).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

from kernelab.models import _linear, _parity, _patch
from kernelab.models._arch import ARCHITECTURES, DEFAULT_REPLACEMENTS, REPLACEMENTS, blueprint_for
from kernelab.models._linear import check_quantize
from kernelab.models._patch import PatchError, apply, state_of, unpatch
from kernelab.models.presets import PRESETS, build
from kernelab.models.serving import AttentionParityError, register_attention, unregister_attention

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_REPLACEMENTS",
    "PRESETS",
    "REPLACEMENTS",
    "AttentionParityError",
    "PatchError",
    "build",
    "check_quantize",
    "cost",
    "patch",
    "patched",
    "register_attention",
    "state_of",
    "unpatch",
    "unregister_attention",
]


def patch(
    model,
    ops=DEFAULT_REPLACEMENTS,
    *,
    quantize: str | None = None,
    check: bool = True,
    check_tokens: int = 8,
):
    """Replace the model's modules with kernelab ops, in place; return what was replaced.

    The return value is the model's :class:`~kernelab.models._patch.PatchState` (also
    ``state_of(model)`` until ``unpatch``): ``.replaced`` maps each replacement kind
    ("rmsnorm", "fused_residual", "mlp", "rope", "linear") to the qualified names it replaced,
    and its ``repr`` counts them per kind. A kind that found nothing to replace is absent.

    ``ops`` chooses among ``REPLACEMENTS``; "linear" (the decoder layers' projections on
    kernelab GEMMs) is not in the default set. ``quantize`` ("w8a16", "w4a16", "fp8",
    "fp8-block" or "mxfp4"; see ``kernelab.models._linear``) implies "linear" and quantizes
    those weights once, here; ``unpatch`` frees them and the model's own dense weights, never
    modified, serve again. What was not done as asked (an mxfp4 layer kept dense, MoE experts
    left in 16 bits) is listed in the state's ``notes``, one line each.

    With ``check`` (the default), a few tokens run through the original and the patched model;
    if their logits differ beyond the dtype's contract, or any patched module's output differs
    from its original's on the same inputs beyond it, the patch is undone and
    :class:`PatchError` names the first module that differs. A quantized patch is held to the
    same contract against the original model whose projections compute with quantize-dequantized
    weights (and, for fp8 and fp8-block, quantize-dequantized activations): the kernels must
    reproduce the format exactly, up to rounding order, while the format's own error (what the
    quantization costs the model) is not hidden inside a looser tolerance.
    """
    if isinstance(ops, str):
        ops = (ops,)
    _linear.check_quantize(quantize)
    reference = None
    originals = None
    if quantize is not None:
        bp = blueprint_for(model)
        originals = partial(_patch.reference_forwards, model, bp, quantize)

    if check:
        probe = _parity.probe_inputs(model, check_tokens)
        if quantize is not None:
            _linear.check_device(quantize, next(model.parameters()).device)
            with originals():
                reference = _parity.logits(model, probe)
        else:
            reference = _parity.logits(model, probe)
    state = apply(model, tuple(ops), quantize=quantize)
    if check:
        tol = _parity.tolerance(_parity.model_dtype(model), quantize)
        qtext = f", quantize={quantize!r}" if quantize else ""
        try:
            err = _parity_error(model, probe, reference)
            if not err <= tol:
                where = _parity.localise(model, state, probe, tol, originals)
                raise PatchError(
                    f"model: patched logits differ from the original by rel L2 {err:.2e} > "
                    f"{tol:.1e} ({_parity.model_dtype(model)}{qtext}); first module that differs: "
                    f"{where or _functions(state)}; the model was left unpatched"
                )
            # Within the contract at the logits, each patched module is still held to it alone,
            # on its own inputs: a small model can dilute a wrong block (routing weights applied
            # twice: the block off by 0.5, the logits by 0.08) below the logits' tolerance.
            where = _parity.localise(model, state, probe, tol, originals)
            if where:
                raise PatchError(
                    f"model: patched logits within {tol:.1e} of the original (rel L2 {err:.2e}, "
                    f"{_parity.model_dtype(model)}{qtext}), but a module alone is not; first "
                    f"module that differs: {where}; the model was left unpatched"
                )
        except BaseException:
            unpatch(model)
            raise
    return state


def _functions(state) -> str:
    replaced = [n for n in state.names if n.startswith("transformers.")]
    if replaced:
        return f"no module alone; replaced function(s): {', '.join(replaced)}"
    return "no module alone (the combination)"


def _parity_error(model, probe, reference) -> float:
    from kernelab.numerics import error

    return error(_parity.logits(model, probe), reference).rel_l2


@contextmanager
def patched(model, ops=DEFAULT_REPLACEMENTS, *, quantize: str | None = None, check: bool = True):
    """``with patched(model): ...`` patches for the block and always unpatches after it."""
    patch(model, ops, quantize=quantize, check=check)
    try:
        yield model
    finally:
        unpatch(model)


def __getattr__(name: str):
    # ``kernelab.models.cost`` as before the workload instruments moved to kernelab.workloads
    # (loaded on first use: the integration does not import the instruments above it)
    if name == "cost":
        from kernelab.workloads.model_cost import cost

        return cost
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
