"""Put kernelab's kernels into Hugging Face transformers models — declaratively, checked, and
reversibly.

    from kernelab.models import patch, unpatch, patched
    patch(model)                      # RMSNorm, fused residual + RMSNorm, fused SwiGLU MLP
    with patched(model): model.generate(...)

Supported: the causal LMs of the Llama family (Llama, Mistral, Qwen2/Qwen2.5, Qwen3); see
``kernelab.models._arch``. transformers is an optional dependency (``pip install kernelab[hf]``).
"""

from __future__ import annotations

from contextlib import contextmanager

from kernelab.models import _parity
from kernelab.models._arch import ARCHITECTURES, REPLACEMENTS
from kernelab.models._patch import PatchError, apply, state_of, unpatch
from kernelab.models.presets import PRESETS, build

__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "REPLACEMENTS",
    "PatchError",
    "build",
    "patch",
    "patched",
    "state_of",
    "unpatch",
]


def patch(model, ops=REPLACEMENTS, *, check: bool = True, check_tokens: int = 8):
    """Replace the model's modules with kernelab ops, in place, and return the model.

    ``ops`` chooses among ``REPLACEMENTS``. With ``check`` (the default), a few tokens run
    through the original and the patched model; if their logits differ beyond the dtype's
    contract the patch is undone and :class:`PatchError` names the first module that differs.
    """
    if isinstance(ops, str):
        ops = (ops,)
    reference = None
    if check:
        probe = _parity.probe_inputs(model, check_tokens)
        reference = _parity.logits(model, probe)
    state = apply(model, tuple(ops))
    if check:
        tol = _parity.tolerance(_parity.model_dtype(model))
        try:
            err = _parity_error(model, probe, reference)
            if not err <= tol:
                where = _parity.localise(model, state, probe, tol)
                raise PatchError(
                    f"model: patched logits differ from the original by rel L2 {err:.2e} > "
                    f"{tol:.1e} ({_parity.model_dtype(model)}); first module that differs: "
                    f"{where or _functions(state)}; the model was left unpatched"
                )
        except BaseException:
            unpatch(model)
            raise
    return model


def _functions(state) -> str:
    replaced = [n for n in state.names if n.startswith("transformers.")]
    if replaced:
        return f"no module alone; replaced function(s): {', '.join(replaced)}"
    return "no module alone (the combination)"


def _parity_error(model, probe, reference) -> float:
    from kernelab.numerics import error

    return error(_parity.logits(model, probe), reference).rel_l2


@contextmanager
def patched(model, ops=REPLACEMENTS, *, check: bool = True):
    """``with patched(model): ...`` patches for the block and always unpatches after it."""
    patch(model, ops, check=check)
    try:
        yield model
    finally:
        unpatch(model)
