"""Flawed RMSNorm implementations: (name, expected failure class, candidate factory)."""

from __future__ import annotations

import importlib

import torch

from kernelab.ops.norm.rmsnorm import rmsnorm_torch, rmsnorm_triton
from tests.mutants import mutate

rmsnorm_module = importlib.import_module("kernelab.ops.norm.rmsnorm")

_SINGLE_PASS_STORE = "tl.store(o_rows + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)"
_SINGLE_PASS_LOAD = "h = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)"

#: name -> (expected class, old text, new text, occurrences) planted in the norm family's
#: kernel, which RMSNorm launches (``_rmsnorm_kernel``).
TRITON_FLAWS = {
    "tail block skipped": (
        "unwritten elements",
        "row_ok = rows < n_rows",
        "row_ok = rows < (tl.num_programs(0) - 1) * BLOCK_M",
        1,
    ),
    "mask off by one": (
        "out-of-bounds write",
        "mask = row_ok[:, None] & (cols[None, :] < n_cols)",
        "mask = row_ok[:, None] & (cols[None, :] <= n_cols)",
        1,
    ),
    "reduction in lower precision": (
        "wrong values",
        "rstd = tl.rsqrt(tl.sum(hc * hc, axis=1) / n_cols + eps)",
        "rstd = tl.rsqrt(tl.sum((hc * hc).to(tl.float16), axis=1).to(tl.float32) / n_cols + eps)",
        1,
    ),
    "input zeroed after use": (
        "mutated input",
        _SINGLE_PASS_STORE,
        _SINGLE_PASS_STORE
        + "\n        tl.store(x_rows + cols[None, :], (y * 0.0).to(X.dtype.element_ty), mask=mask)",
        1,
    ),
    "NaNs swallowed": (
        "NaN mismatch",
        _SINGLE_PASS_LOAD,
        _SINGLE_PASS_LOAD + "\n        h = tl.where(h == h, h, 0.0)",
        1,
    ),
    "reads uninitialised output": (
        "nondeterministic",
        "y = hc * rstd[:, None] * w[None, :]",
        "y = hc * rstd[:, None] * w[None, :]"
        " + 0.0 * tl.load(o_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)",
        1,
    ),
}


def with_kernel(kern):
    """The real launcher, running ``kern`` in place of the RMSNorm kernel for each call."""

    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        saved = rmsnorm_module._rmsnorm_kernel
        rmsnorm_module._rmsnorm_kernel = kern
        try:
            return rmsnorm_triton(x, weight, eps, residual, out)
        finally:
            rmsnorm_module._rmsnorm_kernel = saved

    return candidate


def triton_flaw(name: str, tmp_path):
    cls, old, new, count = TRITON_FLAWS[name]
    return cls, with_kernel(mutate(rmsnorm_module._rmsnorm_kernel, old, new, tmp_path, count))


# --- PyTorch flaws --------------------------------------------------------------------------


def cached_by_pointer():
    """Computes once per data pointer of its input and replays that result afterwards."""
    cache: dict = {}

    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        h = x if residual is None else residual.add_(x)
        key = (h.data_ptr(), tuple(h.shape), h.dtype)
        if key not in cache:
            cache[key] = rmsnorm_torch(h, weight, eps)
        y = cache[key]
        return y.clone() if out is None else out.copy_(y)

    return candidate


def writes_past_end():
    """Correct values, then one element written just past the end of the output."""

    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        y = rmsnorm_torch(x, weight, eps, residual, out)
        flat = torch.as_strided(y, (y.numel() + 1,), (1,), y.storage_offset())
        flat[-1] = 0
        return y

    return candidate


class LazyTensor(torch.Tensor):
    """Stands for an output computed lazily or wrapped: not a plain torch.Tensor."""


def lazy_subclass():
    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        return rmsnorm_torch(x, weight, eps, residual, out).as_subclass(LazyTensor)

    return candidate


def nan_to_num():
    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        y = torch.nan_to_num(rmsnorm_torch(x, weight, eps, residual), nan=0.0)
        return y if out is None else out.copy_(y)

    return candidate


def zeroes_input():
    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        y = rmsnorm_torch(x, weight, eps, residual, out)
        x.zero_()
        return y

    return candidate


def half_precision():
    """Normalises in float16 whatever the input dtype."""

    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        if residual is not None:
            residual.add_(x)
            x = residual
        h = x.half()
        y = (h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.half()).to(x.dtype)
        return y if out is None else out.copy_(y)

    return candidate


def last_column_unwritten():
    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        y = rmsnorm_torch(x, weight, eps, residual)
        if out is None:
            out = torch.empty_like(y)
        out[..., :-1].copy_(y[..., :-1])
        return out

    return candidate


def beta_times_output():
    """``out = y + beta * out`` with beta = 0, as GEMM epilogues do: reads the old contents,
    and 0 × NaN is NaN."""

    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        y = rmsnorm_torch(x, weight, eps, residual)
        if out is None:
            out = torch.zeros_like(y)
        return out.mul_(0.0).add_(y)

    return candidate


#: name -> (expected class, factory)
TORCH_FLAWS = {
    "results cached by data pointer": ("cached result", cached_by_pointer),
    "write past the end of the output": ("out-of-bounds write", writes_past_end),
    "output returned as a lazy subclass": ("contract", lazy_subclass),
    "NaNs swallowed (nan_to_num)": ("NaN mismatch", nan_to_num),
    "input zeroed after use": ("mutated input", zeroes_input),
    "computes in float16": ("wrong values", half_precision),
    "last column never written": ("unwritten elements", last_column_unwritten),
    "result depends on the output's old contents": ("nondeterministic", beta_times_output),
}
