"""The parity check: a patched model must agree with the original within the dtype's contract.

Tolerances are on the relative L2 distance between the patched and the original logits. Both
are approximations of the same float64 model; measured on the tiny presets (random weights,
8 tokens, norm weights spread around 1), the original in each dtype sits at about 3e-7
(float32), 1e-3 (float16) and 8e-3 (bfloat16) from its own float64 evaluation, and the patched
model as close or closer. The contract allows about 5x the original's own error (30x in
float32, where it is tiny), so a change of rounding order passes and a wrong kernel (a swapped
half, a dropped row, a wrong epsilon, a lost weight) does not.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.utils._pytree import tree_map

from kernelab.numerics import error

TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2, torch.float64: 1e-9}


def tolerance(dtype: torch.dtype, quantize: str | None = None) -> float:
    """The contract for a model in ``dtype``. A quantized patch is compared with the original
    on quantize-dequantized weights (see ``kernelab.models._linear``), so the same contract
    holds, except for fp8: its GEMMs produce bfloat16, and an activation that an upstream
    rounding difference moves across an e4m3 rounding boundary changes by a whole e4m3 step
    (2^-3 relative, 32x bfloat16's), so fp8 (and fp8-block, whose activations are e4m3 too)
    gets twice bfloat16's contract. A wrong fp8 kernel (a lost or misplaced scale, wrong layout)
    errs by O(1) and is still refused."""
    tol = TOLERANCE.get(dtype, 4e-2)
    return 2 * max(tol, TOLERANCE[torch.bfloat16]) if quantize in ("fp8", "fp8-block") else tol


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def probe_inputs(model, tokens: int = 8, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, tokens), generator=gen)
    return ids.to(next(model.parameters()).device)


@torch.no_grad()
def logits(model, input_ids) -> torch.Tensor:
    return model(input_ids=input_ids, use_cache=False).logits


@torch.no_grad()
def localise(model, state, input_ids, tol: float, originals=None) -> str | None:
    """The first patched module (in completion order) whose output differs from its original
    forward on the same inputs, with the error; None if each agrees alone.

    ``originals``: a context manager factory yielding {id(module): forward} to compare some
    modules against instead of their class's forward (a quantized projection against its
    quantize-dequantized reference); the class forwards run inside it too."""
    records = []
    handles = []
    patched = {id(m) for m, attr in state.attributes if attr == "forward"}
    names = {id(m): n for n, m in model.named_modules()}

    def hook(module, args, kwargs, output):
        # Copies: later in-place kernels (rope rotates the q/k norms' outputs) must not change
        # what is compared.
        records.append((module, *tree_map(_copy, (args, kwargs, output))))

    for module, attr in state.attributes:
        if attr == "forward":
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        model(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    with originals() if originals is not None else nullcontext({}) as refs:
        return _first_divergent(records, patched, refs, names, tol)


def _copy(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def _first_divergent(records, patched, refs, names, tol) -> str | None:
    for module, args, kwargs, output in records:
        if id(module) not in patched:
            continue
        ref = refs.get(id(module))
        if ref is not None:
            original = ref(*args, **kwargs)
        else:
            original = type(module).forward(module, *args, **kwargs)
        got = output[0] if isinstance(output, tuple) else output
        want = original[0] if isinstance(original, tuple) else original
        err = error(got, want).rel_l2
        if not err <= tol:
            return f"{names.get(id(module), type(module).__name__)} (rel L2 {err:.2e} > {tol:.1e})"
    return None
