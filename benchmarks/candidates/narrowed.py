"""Reductions with one rounding too many, and honest ones written differently from the reference.

Planted (``PLANTED``): each rounds a partial result of its reduction to the output's format
(bfloat16 or float16) once more than the op's contract allows, and must fail verify with
"wrong values":

- split-K GEMMs whose slices are stored in a 16-bit workspace, or whose running sum is
  rounded to 16 bits between the steps (2, 4 and 8 slices);
- an RMSNorm and a LayerNorm whose sum of squares (their variance) is accumulated in column
  chunks with the running sum held in 16 bits, and an RMSNorm that rounds the normalised row
  before multiplying by the weight;
- softmaxes whose denominator is held in 16 bits between column chunks, or whose
  exponentials are rounded before the sum and the division;
- a merge of attention states whose running weighted sum is held in 16 bits between parts;
- paged attentions (P rounded once, as declared) whose scores, running output or softmax
  denominator are held in 16 bits as well.

Honest (``HONEST``): the same algorithms with float32 partials, plus other float32 orders
(an online softmax, a Welford LayerNorm, an outer-product GEMM; paged attentions in float32
with one rounding, their scores summed by BLAS or one term at a time, and with P rounded once
as the op declares): none may be flagged.

Every candidate follows its op's calling convention (``kernelab ops <op>``).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

# --- helpers ----------------------------------------------------------------------------------


def _narrow(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and back: the one extra rounding a planted candidate does."""
    return t.to(dtype).float()


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)] or [slice(0, 0)]


def _emit(y: torch.Tensor, out):
    if out is not None:
        out.copy_(y)
        return out
    return y


# --- GEMM -------------------------------------------------------------------------------------


def _kn(b, b_layout):
    return b if b_layout == "kn" else b.t()


def _gemm_finish(acc, a, bias, residual, activation, out):
    """The epilogue in float32 on the float32 accumulator, one rounding at the end."""
    if bias is not None:
        acc = acc + bias.float()
    if activation == "silu":
        acc = F.silu(acc)
    elif activation == "gelu":
        acc = F.gelu(acc)
    if residual is not None:
        acc = acc + residual.float()
    return _emit(acc.to(a.dtype), out)


def split_k_gemm(splits: int, mode: str = "float32"):
    """A split-K GEMM: K cut into ``splits`` slices, each multiplied in float32.

    ``mode``: "float32" keeps every partial in float32 (honest); "workspace" stores each
    slice's partial in the output's format before the float32 sum (a 16-bit workspace);
    "running" rounds the running sum to the output's format after each step but the last.
    """
    if mode not in ("float32", "workspace", "running"):
        raise ValueError(f"mode: expected 'float32', 'workspace' or 'running', got {mode!r}")

    def gemm(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
        bk = _kn(b, b_layout).float()
        af = a.float()
        k = af.shape[1]
        bounds = torch.linspace(0, k, splits + 1).round().long().tolist()
        acc = torch.zeros((af.shape[0], bk.shape[1]), dtype=torch.float32, device=a.device)
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            part = af[:, lo:hi] @ bk[lo:hi]
            if mode == "workspace":
                part = _narrow(part, a.dtype)
            acc = acc + part
            if mode == "running" and i < splits - 1:
                acc = _narrow(acc, a.dtype)
        return _gemm_finish(acc, a, bias, residual, activation, out)

    gemm.__name__ = f"gemm_split{splits}_{mode}"
    return gemm


def gemm_outer_product(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    """Honest: rank-8 updates of a float32 accumulator, in K order."""
    bk = _kn(b, b_layout).float()
    af = a.float()
    acc = torch.zeros((af.shape[0], bk.shape[1]), dtype=torch.float32, device=a.device)
    for sl in _chunks(af.shape[1], 8):
        acc += torch.einsum("mk,kn->mn", af[:, sl], bk[sl])
    return _gemm_finish(acc, a, bias, residual, activation, out)


# --- norms ------------------------------------------------------------------------------------


def _residual(x, residual):
    if residual is None:
        return x
    residual.add_(x)  # in the stream's format, as the reference's in-place update stores it
    return residual


def _sum_sq(hf: torch.Tensor, chunk: int, narrow_to) -> torch.Tensor:
    """Σ over the last dimension of hf², in column chunks; the running sum rounded to
    ``narrow_to`` after each chunk when given."""
    acc = torch.zeros(hf.shape[:-1], dtype=torch.float32, device=hf.device)
    for sl in _chunks(hf.shape[-1], chunk):
        acc = acc + hf[..., sl].square().sum(-1)
        if narrow_to is not None:
            acc = _narrow(acc, narrow_to)
    return acc


def rmsnorm_chunked(chunk: int = 64, narrow: bool = False):
    """RMSNorm with the sum of squares accumulated over column chunks of ``chunk``; with
    ``narrow``, the running sum is held in the input's format (planted)."""

    def rmsnorm(x, weight, eps=1e-6, residual=None, out=None):
        h = _residual(x, residual)
        hf = h.float()
        ss = _sum_sq(hf, chunk, x.dtype if narrow else None)
        rs = torch.rsqrt(ss / max(hf.shape[-1], 1) + eps)
        return _emit((hf * rs[..., None] * weight.float()).to(x.dtype), out)

    rmsnorm.__name__ = f"rmsnorm_chunk{chunk}_{'narrowed' if narrow else 'float32'}"
    return rmsnorm


def rmsnorm_rounded_before_weight(x, weight, eps=1e-6, residual=None, out=None):
    """Planted: the normalised row rounded to the input's format, then times the weight."""
    h = _residual(x, residual)
    hf = h.float()
    normed = hf * torch.rsqrt(hf.square().mean(-1, keepdim=True) + eps)
    return _emit((_narrow(normed, x.dtype) * weight.float()).to(x.dtype), out)


def layernorm_chunked(chunk: int = 64, narrow: bool = False):
    """LayerNorm, two passes: the mean in float32, then the centred sum of squares over
    column chunks; with ``narrow`` its running sum is held in the input's format (planted)."""

    def layernorm(x, weight, bias=None, eps=1e-5, residual=None, out=None):
        h = _residual(x, residual)
        hf = h.float()
        n = max(hf.shape[-1], 1)
        mean = hf.sum(-1, keepdim=True) / n
        c = hf - mean
        var = _sum_sq(c, chunk, x.dtype if narrow else None) / n
        y = c * torch.rsqrt(var + eps)[..., None] * weight.float()
        if bias is not None:
            y = y + bias.float()
        return _emit(y.to(x.dtype), out)

    layernorm.__name__ = f"layernorm_chunk{chunk}_{'narrowed' if narrow else 'float32'}"
    return layernorm


def layernorm_welford(x, weight, bias=None, eps=1e-5, residual=None, out=None):
    """Honest: Welford's running mean and M2 over column chunks of 32, merged in float32."""
    h = _residual(x, residual)
    hf = h.float()
    count = torch.zeros(hf.shape[:-1], dtype=torch.float32, device=hf.device)
    mean = torch.zeros_like(count)
    m2 = torch.zeros_like(count)
    for sl in _chunks(hf.shape[-1], 32):
        blk = hf[..., sl]
        nb = blk.shape[-1]
        if nb == 0:
            continue
        bmean = blk.mean(-1)
        bm2 = (blk - bmean[..., None]).square().sum(-1)
        total = count + nb
        delta = bmean - mean
        mean = mean + delta * (nb / total)
        m2 = m2 + bm2 + delta.square() * count * nb / total
        count = total
    var = m2 / count.clamp_min(1)
    y = (hf - mean[..., None]) * torch.rsqrt(var + eps)[..., None] * weight.float()
    if bias is not None:
        y = y + bias.float()
    return _emit(y.to(x.dtype), out)


# --- softmax ----------------------------------------------------------------------------------


def _logits(x, scale, mask):
    z = x.float() * scale
    if mask is not None:
        z = z + mask.float()
    return z


def softmax_chunked_sum(chunk: int = 64, narrow: bool = False):
    """Softmax whose denominator is summed over column chunks of ``chunk``; with ``narrow``
    the running sum is held in the input's format (planted)."""

    def softmax(x, scale=1.0, mask=None, out=None):
        z = _logits(x, scale, mask)
        e = torch.exp(z - z.amax(-1, keepdim=True))
        s = torch.zeros(z.shape[:-1], dtype=torch.float32, device=z.device)
        for sl in _chunks(z.shape[-1], chunk):
            s = s + e[..., sl].sum(-1)
            if narrow:
                s = _narrow(s, x.dtype)
        return _emit((e / s[..., None]).to(x.dtype), out)

    softmax.__name__ = f"softmax_chunk{chunk}_{'narrowed' if narrow else 'float32'}"
    return softmax


def softmax_rounded_exp(x, scale=1.0, mask=None, out=None):
    """Planted: the exponentials rounded to the input's format before the sum and division."""
    z = _logits(x, scale, mask)
    e = _narrow(torch.exp(z - z.amax(-1, keepdim=True)), x.dtype)
    return _emit((e / e.sum(-1, keepdim=True)).to(x.dtype), out)


def softmax_online(x, scale=1.0, mask=None, out=None):
    """Honest: one pass of running max and rescaled sum over column chunks of 32, then the
    normalisation, all in float32."""
    z = _logits(x, scale, mask)
    m = torch.full(z.shape[:-1], -math.inf, dtype=torch.float32, device=z.device)
    s = torch.zeros_like(m)
    for sl in _chunks(z.shape[-1], 32):
        blk = z[..., sl]
        if blk.shape[-1] == 0:
            continue
        new = torch.maximum(m, blk.amax(-1))
        safe = torch.where(new == -math.inf, torch.zeros_like(new), new)
        s = s * torch.exp(m - safe) + torch.exp(blk - safe[..., None]).sum(-1)
        m = new
    safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    return _emit((torch.exp(z - safe[..., None]) / s[..., None]).to(x.dtype), out)


# --- merge of attention states ----------------------------------------------------------------


def merge_states(narrow: bool = False):
    """Merge S partial attention outputs by their log-sum-exps, one part at a time in
    float32; with ``narrow`` the running weighted sum is held in the states' format between
    parts (planted)."""

    def merge_attention_states(states, lse, out=None, out_lse=None):
        parts = states.shape[0]
        m = lse.amax(0) if parts else lse.new_full(lse.shape[1:], -math.inf)
        m_safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
        total = torch.zeros(states.shape[1:3], dtype=torch.float32, device=states.device)
        acc = torch.zeros(states.shape[1:], dtype=torch.float32, device=states.device)
        for p in range(parts):
            w = torch.exp(lse[p].float() - m_safe)
            x = torch.where((w > 0)[..., None], states[p].float(), torch.zeros(()))
            term = w[..., None] * x
            acc = acc + term
            if narrow:
                acc = _narrow(acc, states.dtype)
            total = total + w
        some = total > 0
        safe = torch.where(some, total, torch.ones_like(total))
        o = torch.where(some[..., None], acc / safe[..., None], torch.zeros_like(acc))
        o = torch.where(torch.isnan(total)[..., None], math.nan, o)
        lo = torch.where(some, m + torch.log(safe), -math.inf)
        lo = torch.where(torch.isnan(total), math.nan, lo)
        o = o.to(states.dtype)
        if out is not None:
            o = out.copy_(o)
        if out_lse is not None:
            lo = out_lse.copy_(lo)
        return o, lo

    merge_attention_states.__name__ = f"merge_{'narrowed' if narrow else 'float32'}"
    return merge_attention_states


# --- paged attention --------------------------------------------------------------------------


def _scores(q, k, order: str) -> torch.Tensor:
    """float32 scores [H, Q, K] of q [Q, H, D] against k [K, H, D]: "blas" one einsum,
    "sequential" one head-dim term at a time (the products exact, every partial sum rounded:
    the order with the most rounding)."""
    if order == "blas":
        return torch.einsum("qhd,khd->hqk", q, k)
    s = torch.zeros(q.shape[1], q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    for i in range(q.shape[-1]):
        s = s + q[:, :, i].t()[:, :, None] * k[:, :, i].t()[:, None, :]
    return s


def paged_tiles(order: str = "blas", tile: int = 32, narrow: tuple[str, ...] = ()):
    """Paged attention per sequence in float32 (keys and values gathered in float32), an
    online softmax over key tiles of ``tile``, one rounding at the end. ``order``: how the
    scores are summed (``_scores``). ``narrow``: intermediates rounded to q's format, "p"
    (P before P·V: the op's declared narrowing) or planted: "scores", "running output",
    "denominator"."""
    from kernelab.ops.attention import _paged

    def paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
        window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
        return_lse=False, out=None, lse=None, check=True,
    ):  # fmt: skip
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale

        def attend(q_b, k, v, visible):
            group = q_b.shape[1] // k.shape[1]
            qf = q_b.float()
            kf = k.float().repeat_interleave(group, dim=1)
            vf = v.float().repeat_interleave(group, dim=1)
            shape = (qf.shape[1], qf.shape[0])
            m = torch.full(shape, -math.inf, dtype=torch.float32, device=q.device)
            total = torch.zeros(shape, dtype=torch.float32, device=q.device)
            if sinks is not None:  # a key of value 0 with the learned logit
                m = sinks.float()[:, None].expand(shape).clone()
                total = torch.ones(shape, dtype=torch.float32, device=q.device)
            acc = torch.zeros((*shape, qf.shape[-1]), dtype=torch.float32, device=q.device)
            for sl in _chunks(kf.shape[0], tile):
                s = _scores(qf, kf[sl], order) * scale
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                if "scores" in narrow:
                    s = _narrow(s, q.dtype)
                s = s.masked_fill(~visible[:, sl], -math.inf)
                if s.shape[-1] == 0:
                    continue
                new = torch.maximum(m, s.amax(-1))
                safe = torch.where(new == -math.inf, torch.zeros_like(new), new)
                alpha = torch.exp(m - safe)
                p = torch.exp(s - safe[..., None])
                total = total * alpha + p.sum(-1)
                if "denominator" in narrow:
                    total = _narrow(total, q.dtype)
                pv = _narrow(p, q.dtype) if "p" in narrow else p
                acc = acc * alpha[..., None] + torch.einsum("hqk,khd->hqd", pv, vf[sl])
                if "running output" in narrow:
                    acc = _narrow(acc, q.dtype)
                m = new
            empty = total == 0
            o = acc / torch.where(empty, torch.ones_like(total), total)[..., None]
            o = torch.where(empty[..., None], torch.zeros_like(o), o)
            lse_b = torch.where(empty, -math.inf, m + torch.log(total))
            return o.transpose(0, 1), lse_b

        o, lse_v = _paged.per_sequence(
            q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
            _paged.window_of(window_left), k_scale, v_scale, attend,
        )  # fmt: skip
        o = _emit(o.to(q.dtype), out)
        if not (return_lse or lse is not None):
            return o
        return o, _emit(lse_v.float(), lse)

    paged_attention.__name__ = f"paged_{order}_tile{tile}_" + ("_".join(narrow) or "float32")
    return paged_attention


#: op -> {name: candidate} that must fail with "wrong values".
PLANTED = {
    "gemm": {
        f"split-K {s}, {mode} 16-bit": split_k_gemm(s, mode)
        for s in (2, 4, 8)
        for mode in ("workspace", "running")
    },
    "rmsnorm": {
        "sum of squares held in 16 bits": rmsnorm_chunked(64, narrow=True),
        "row rounded before the weight": rmsnorm_rounded_before_weight,
    },
    "layernorm": {"variance held in 16 bits": layernorm_chunked(64, narrow=True)},
    "softmax": {
        "denominator held in 16 bits": softmax_chunked_sum(64, narrow=True),
        "exponentials rounded": softmax_rounded_exp,
    },
    "merge_attention_states": {"running sum held in 16 bits": merge_states(narrow=True)},
    "paged_attention": {
        "scores in 16 bits": paged_tiles(narrow=("p", "scores")),
        "running output in 16 bits": paged_tiles(narrow=("p", "running output")),
        "denominator in 16 bits": paged_tiles(narrow=("p", "denominator")),
    },
}

#: op -> {name: candidate} that must pass.
HONEST = {
    "gemm": {
        "split-K 4, float32": split_k_gemm(4),
        "split-K 8, float32": split_k_gemm(8),
        "outer products, float32": gemm_outer_product,
    },
    "rmsnorm": {"chunked float32": rmsnorm_chunked(64)},
    "layernorm": {"chunked float32": layernorm_chunked(64), "Welford": layernorm_welford},
    "softmax": {"chunked float32": softmax_chunked_sum(64), "online": softmax_online},
    "merge_attention_states": {"per part, float32": merge_states()},
    "paged_attention": {
        "float32, one rounding": paged_tiles(),
        "sequential float32 dot": paged_tiles("sequential"),
        "P rounded once": paged_tiles(narrow=("p",)),
    },
}
