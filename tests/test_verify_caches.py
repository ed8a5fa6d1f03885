"""Planted candidates wrong only on the allocating path, or caching across calls in ways that
survive fresh values: each caught, with its class named; honest candidates never are."""

import pytest
import torch

from kernelab.ops import GEMM, RMSNORM, SILU_AND_MUL, SOFTMAX, Shape
from kernelab.verify import verify_candidate

SEED = 20261201

SHAPES = {
    "rmsnorm": [Shape("6x96", {"rows": 6, "cols": 96}, {}, batch_dim="rows")],
    "softmax": [Shape("5x130", {"rows": 5, "cols": 130}, {}, batch_dim="rows")],
    "silu_and_mul": [Shape("4x2x72", {"rows": 4, "d": 72}, {}, batch_dim="rows")],
    "gemm": [Shape("5x24x40 nk", {"M": 5, "N": 24, "K": 40}, {"layout": "nk"}, batch_dim="M")],
}
OPS = {"rmsnorm": RMSNORM, "softmax": SOFTMAX, "silu_and_mul": SILU_AND_MUL, "gemm": GEMM}


def _verdict(fn, op_name):
    dtype = torch.float32 if torch.float32 in OPS[op_name].dtypes else torch.float16
    report = verify_candidate(
        fn, op_name, shapes=SHAPES[op_name], dtypes=(dtype,), device="cpu", seed=SEED, trials=2
    )
    classes = {f.cls for c in report.cases for f in c.failures}
    return report, classes


def honest(op_name):
    return OPS[op_name].variants["torch"].fn


# --- wrong only when the candidate allocates -----------------------------------------------


def alloc_drops_last_row(fn):
    def cand(*args, out=None, **kw):
        if out is not None:
            return fn(*args, out=out, **kw)
        y = fn(*args, **kw)
        z = torch.empty_like(y)
        z[:-1] = y[:-1]  # the last row is left as whatever the allocator held
        z[-1:] = 0
        return z

    return cand


def alloc_low_precision(fn):
    def cand(*args, out=None, **kw):
        if out is not None:
            return fn(*args, out=out, **kw)
        y = fn(*args, **kw)
        narrow = torch.bfloat16 if y.dtype == torch.float32 else torch.float8_e5m2
        return y.to(narrow).to(y.dtype)

    return cand


def alloc_wrong_dtype(fn):
    def cand(*args, out=None, **kw):
        if out is not None:
            return fn(*args, out=out, **kw)
        return fn(*args, **kw).double()

    return cand


# --- caches that a rewrite of every element misses but a partial update hits -------------------


def _first_tensor(args, kw):
    return next(v for v in (*args, *kw.values()) if isinstance(v, torch.Tensor))


def _bytes(t):
    """The bits of a few elements (NaN-safe, as a cache key would hash them)."""
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def cache_on_address_and_samples(fn, samples=8):
    """Keyed on the first input's address and a few fixed elements: a full rewrite changes
    the samples (recompute); a partial update rarely does (stale)."""
    memo = {}

    def cand(*args, out=None, **kw):
        x = _first_tensor(args, kw)
        flat = x.reshape(-1)
        step = max(1, flat.numel() // samples)
        key = (x.data_ptr(), _bytes(flat[::step][:samples]))
        if key not in memo:
            memo.clear()
            memo[key] = fn(*args, **kw).clone()
        y = memo[key]
        return y.clone() if out is None else out.copy_(y)

    return cand


def cache_on_samples_only(fn, samples=4):
    """Keyed on a few elements of every tensor argument (no address): survives fresh
    allocations of equal contents and partial updates alike."""
    memo = {}

    def cand(*args, out=None, **kw):
        key = []
        for v in (*args, *kw.values()):
            if isinstance(v, torch.Tensor) and v.numel():
                flat = v.reshape(-1)
                key.append(_bytes(flat[:: max(1, flat.numel() // samples)][:samples]))
        key = tuple(key)
        if key not in memo:
            memo.clear()
            memo[key] = fn(*args, **kw).clone()
        y = memo[key]
        return y.clone() if out is None else out.copy_(y)

    return cand


def cache_on_sum(fn):
    """Keyed on the sum of the first input: rounding makes small changes invisible."""
    memo = {}

    def cand(*args, out=None, **kw):
        x = _first_tensor(args, kw)
        total = float(torch.nan_to_num(x.float(), 0.0, 0.0, 0.0).sum())
        key = (tuple(x.shape), round(total / 64))
        if key not in memo:
            memo.clear()
            memo[key] = fn(*args, **kw).clone()
        y = memo[key]
        return y.clone() if out is None else out.copy_(y)

    return cand


ALLOC_WRONG = {"wrong values", "cached result", "NaN mismatch"}
FLAWS = {
    "allocating path drops the last row": (alloc_drops_last_row, ALLOC_WRONG),
    "allocating path rounds to bf16": (alloc_low_precision, ALLOC_WRONG),
    "allocating path returns float64": (alloc_wrong_dtype, {"contract"}),
    "cache on address + sampled elements": (cache_on_address_and_samples, {"cached result"}),
    "cache on sampled elements only": (cache_on_samples_only, {"cached result"}),
    "cache on a rounded sum": (cache_on_sum, {"cached result"}),
}
FLAWED_OPS = ("rmsnorm", "softmax", "silu_and_mul", "gemm")


@pytest.mark.parametrize("op_name", FLAWED_OPS)
@pytest.mark.parametrize("flaw", list(FLAWS))
def test_flaw_is_caught_with_its_class(flaw, op_name):
    make, expected = FLAWS[flaw]
    report, classes = _verdict(make(honest(op_name)), op_name)
    assert not report.passed, f"{flaw} on {op_name} passed"
    assert classes & expected, (flaw, op_name, classes)


def test_partial_update_and_allocating_trials_are_recorded():
    report, _ = _verdict(honest("softmax"), "softmax")
    assert report.passed
    kinds = [t.get("kind") for c in report.cases for t in c.trials]
    assert "partial update" in kinds and "allocating" in kinds
    part = next(t for c in report.cases for t in c.trials if t.get("kind") == "partial update")
    assert part["changed"] and all(n >= 1 for n in part["changed"].values())


def _honest_variants():
    def rms_two_pass(x, weight, eps=1e-6, residual=None, out=None):
        h = x if residual is None else residual.add_(x)
        ms = torch.einsum("...i,...i->...", h.double(), h.double()) / h.shape[-1]
        y = (h.double() / torch.sqrt(ms + eps)[..., None] * weight.double()).to(x.dtype)
        return y if out is None else out.copy_(y)

    def softmax_logsumexp(x, scale=1.0, mask=None, out=None):
        s = x.float() * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        y = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True)).to(x.dtype)
        return y if out is None else out.copy_(y)

    def silu_mul_chunks(x, out=None):
        g, u = x.float().chunk(2, dim=-1)
        y = (g / (1 + torch.exp(-g)) * u).to(x.dtype)
        return y if out is None else out.copy_(y)

    return {"rmsnorm": rms_two_pass, "softmax": softmax_logsumexp, "silu_and_mul": silu_mul_chunks}


@pytest.mark.parametrize("op_name", ["rmsnorm", "softmax", "silu_and_mul", "gemm"])
def test_honest_candidates_pass(op_name):
    fn = _honest_variants().get(op_name, honest(op_name))
    report, classes = _verdict(fn, op_name)
    assert report.passed, classes
