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

import torch

from kernelab.numerics import error

TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2, torch.float64: 1e-9}


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, 4e-2)


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
def localise(model, state, input_ids, tol: float) -> str | None:
    """The first patched module (in completion order) whose output differs from its original
    forward on the same inputs, with the error; None if each agrees alone."""
    records = []
    handles = []
    patched = {id(m) for m, attr in state.attributes if attr == "forward"}
    names = {id(m): n for n, m in model.named_modules()}

    def hook(module, args, kwargs, output):
        records.append((module, args, kwargs, output))

    for module, attr in state.attributes:
        if attr == "forward":
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        model(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    for module, args, kwargs, output in records:
        if id(module) not in patched:
            continue
        original = type(module).forward(module, *args, **kwargs)
        got = output[0] if isinstance(output, tuple) else output
        want = original[0] if isinstance(original, tuple) else original
        err = error(got, want).rel_l2
        if not err <= tol:
            return f"{names.get(id(module), type(module).__name__)} (rel L2 {err:.2e} > {tol:.1e})"
    return None
