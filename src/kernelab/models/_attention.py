"""kernelab's attention as a transformers attention implementation (``attn_implementation=
"kernelab"``): the function transformers calls in each attention layer, and its routes.

transformers calls ``fn(module, query, key, value, attention_mask, scaling=, dropout=,
sliding_window=, softcap=, **kwargs)`` with query ``[B, Hq, Sq, D]`` and key/value
``[B, Hkv, Sk, D]`` (after its cache update), and expects ``([B, Sq, Hq, D], None)``. Routes:

- **continuous batching, in place** (``kwargs["kernelab_paged"]``, set by ``_paged_cache``'s
  update of the paged cache): key/value are only this step's tokens; they are written into the
  cache's pages with ``kv_cache_write`` and ``paged_attention`` reads the pages through block
  tables built from transformers' read indices (index arithmetic, no K/V gathered).
- **continuous batching, gathered** (the cache update was transformers' own: Gemma-2's and
  Mistral's sliding-window layers): key/value are each sequence's keys packed along tokens
  (``cu_seq_lens_k``): ``attention_prefill`` over them. transformers 5.24 keeps a sliding
  layer's cache as a ring buffer (``SlidingAttentionCacheAllocator``: the token at position p
  in slot p mod W of at most ceil(W / page_size) pages, no block table:
  ``supports_block_table`` is False) and reads before it writes, because a chunk of q queries
  needs up to W − 1 + q keys and its own writes overwrite the oldest of them. So the keys are
  neither in order nor all present once the chunk is written: paged reading in place cannot
  serve a chunk, and the gather it does is what is used. Its cost is bounded by the window:
  min(past, W − 1) + q keys per sequence and sliding layer (W = 4096 on Gemma-2), where a full
  layer's gather grows with the whole context.
- **dense caches** (no cache, ``DynamicCache``, ``StaticCache``): the number of valid keys of
  each sequence comes from the mask (sdpa's mask rules, see ``_dense_lengths``); a fresh prefill
  runs ``attention_prefill``, anything with a past runs ``paged_attention`` on the cache tensor
  as it is laid out, viewed as pages (``_as_pages``: strides only, no copy).

Gemma-2: its attention calls pass ``scaling`` (query_pre_attn_scalar^-0.5, not the head
size's), ``softcap`` (attn_logit_softcapping) and, on its sliding layers, ``sliding_window``
W; the kernels take them as ``softmax_scale``, ``softcap`` and ``window_left = W − 1``
(transformers' window W: key j is visible from query i when i − W < j ≤ i, so a query sees W
keys, itself included).

Anything else (an architecture, a dtype, a head size, a mask the kernels do not express,
dropout, attention weights requested) falls back to the implementation the model had before,
with one warning per reason, and with the mask that implementation expects: ``"kernelab"``
shares sdpa's masks (boolean, or None for "causal"), which an eager implementation (Gemma-2's
default: sdpa refuses a softcap) would add to its scores as 0/1 or skip — so for any fallback
but sdpa a mask is turned into eager's additive float mask (``_fallback_mask``); and in
continuous batching transformers builds no mask at all for an implementation it does not know
(``attn_mask_is_needed``), so the fallback gets one built with transformers' own
``build_attention_mask`` from the cumulative lengths and the window.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

#: The architectures whose attention layers this serves (``kernelab.models.patch``'s set).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma2")
HEAD_DIMS = (64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class PagedStep:
    """What the paged cache's update hands the attention layer instead of gathered K/V: the
    layer's key and value pages ``[pages, page_size, Hkv, D]`` (views of transformers' cache
    tensor), the slots of this step's tokens and the flat read indices of every sequence."""

    k_pages: torch.Tensor
    v_pages: torch.Tensor
    write_index: torch.Tensor
    read_index: torch.Tensor
    page_size: int


class Fallback(Exception):
    """Raised inside the routes when a case is not served; its message is the reason."""


#: the fallback for each registered model's attention: {id(config): (name, function)}
_FALLBACKS: dict[int, tuple[str, object]] = {}
_WARNED: set[str] = set()
#: configs (by id) whose attention runs the fallback on transformers' own cache update, with
#: the mask it expects: the parity check's reference where transformers' path is wrong
_REFERENCE: set[int] = set()
#: a planted defect for the parity check's own test: shift each block-table row by this many
#: rows (0: none). Never set outside tests.
_TABLE_ROW_SHIFT = 0


def warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(
            f"kernelab attention: {reason}; using the model's previous attention for it",
            RuntimeWarning,
            stacklevel=3,
        )


def tensor_unsupported(t: torch.Tensor) -> str | None:
    """Why the kernels cannot take query or key states like ``t`` (None: they can)."""
    if t.dtype not in DTYPES:
        return f"dtype {t.dtype} is not served"
    if t.dtype == torch.float32 and t.is_cuda:
        return "float32 on a GPU is not served (the kernels' dots would run in TF32)"
    if t.shape[-1] not in HEAD_DIMS:
        return f"head_dim {t.shape[-1]} is not served (served: {HEAD_DIMS})"
    return None


def arch_unsupported(config) -> str | None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        return f"architecture {model_type!r} is not served (served: {', '.join(SUPPORTED)})"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention (use_bidirectional_attention) is not served"
    return None


def unsupported(module, query: torch.Tensor, kwargs: dict) -> str | None:
    """Why the kernels cannot serve this call (None: they can)."""
    reason = arch_unsupported(getattr(module, "config", None)) or tensor_unsupported(query)
    if reason:
        return reason
    if kwargs.get("dropout"):
        return "dropout is not served"
    if kwargs.get("output_attentions"):
        return "attention weights (output_attentions) are not served"
    if kwargs.get("s_aux") is not None:
        return "attention sinks (s_aux) are not served by this integration"
    return None


def attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """The function registered as ``"kernelab"`` with transformers' ``AttentionInterface``."""
    step = kwargs.pop("kernelab_paged", None)
    reference = id(getattr(module, "config", None)) in _REFERENCE
    reason = (
        "reference" if reference else unsupported(module, query, {**kwargs, "dropout": dropout})
    )
    if reason is None:
        try:
            out = _route(module, query, key, value, attention_mask, scaling, sliding_window,
                         softcap, step, kwargs)  # fmt: skip
            return out, None
        except Fallback as exc:
            reason = str(exc)
    if step is not None:  # the cache was not written: the fallback needs it written and read
        raise RuntimeError(f"kernelab attention: cannot fall back on the in-place path: {reason}")
    if not reference:
        warn_once(reason)
    name, fn = _FALLBACKS.get(id(module.config), ("sdpa", None))
    if fn is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward as fn
    mask = _fallback_mask(name, attention_mask, query, key, _window(module, sliding_window), kwargs)
    return fn(module, query, key, value, mask, dropout=dropout, scaling=scaling,
              sliding_window=sliding_window, softcap=softcap, **kwargs)  # fmt: skip


def _fallback_mask(name, mask, query, key, window: int, kwargs):
    """The mask for the fallback ``name`` in the form it expects. ``window``: W, 0 for none.

    Continuous batching without a mask (transformers builds none for "kernelab"): an additive
    block-diagonal mask from the cumulative lengths, built by transformers' own
    ``build_attention_mask`` (query rows past the last sequence, CUDA-graph padding, masked
    out). Otherwise sdpa takes the mask as it is; any other fallback (eager) gets sdpa's mask
    as an additive float mask: a boolean mask as 0 / the dtype's minimum, None (causal, aligned
    to the first key, sdpa's ``is_causal``; no mask at all for one query) built as such."""
    if "cu_seq_lens_q" in kwargs:
        if mask is not None:
            return mask
        from transformers.generation.continuous_batching.utils import build_attention_mask

        cu_k = kwargs["cu_seq_lens_k"]
        if isinstance(cu_k, dict):
            raise RuntimeError("kernelab attention: per-layer-type key lengths were not selected")
        bias = torch.full((1, 1, query.shape[-2], key.shape[-2]), torch.finfo(query.dtype).min,
                          dtype=query.dtype, device=query.device)  # fmt: skip
        build_attention_mask(bias, kwargs["cu_seq_lens_q"].tolist(), cu_k.tolist(),
                             sliding_window=window if window > 1 else 1)  # fmt: skip
        return bias
    if name == "sdpa":
        return mask
    if mask is None:
        q_len, k_len = query.shape[-2], key.shape[-2]
        if q_len == 1:
            return None
        i = torch.arange(q_len, device=query.device)[:, None]
        j = torch.arange(k_len, device=query.device)[None, :]
        mask = j <= i
        if window:
            mask &= j > i - window
        mask = mask[None, None]
    if mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)


def _window(module, sliding_window) -> int:
    """transformers' window W of this call (0: none): a query sees its W last keys."""
    w = sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)
    return int(w) if w else 0


def _window_left(module, sliding_window) -> int:
    """The kernels' window: keys j with i − window_left ≤ j ≤ i, so W − 1 (−1: none)."""
    return _window(module, sliding_window) - 1 if _window(module, sliding_window) else -1


def _route(module, query, key, value, mask, scaling, sliding_window, softcap, step, kwargs):
    import kernelab.ops as ko

    opts = dict(softmax_scale=scaling, window_left=_window_left(module, sliding_window),
                softcap=float(softcap or 0.0))  # fmt: skip
    batch, heads_q, q_len, head_dim = query.shape
    q = query.transpose(1, 2).reshape(batch * q_len, heads_q, head_dim)  # [tokens, Hq, D]
    if step is not None or "cu_seq_lens_q" in kwargs:
        out = _continuous(ko, q, key, value, step, kwargs, opts)
    else:
        out = _dense(ko, q, key, value, mask, batch, q_len, opts)
    return out.view(batch, q_len, heads_q, head_dim)


# --- continuous batching ------------------------------------------------------------------------


def _continuous(ko, q, key, value, step, kwargs, opts):
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_k = kwargs["cu_seq_lens_k"]
    if isinstance(cu_k, dict):
        raise Fallback("continuous batching: per-layer-type key lengths were not selected")
    cu_k = cu_k.to(torch.int32)
    k_new = key[0].transpose(0, 1)  # [tokens, Hkv, D] views
    v_new = value[0].transpose(0, 1)
    if step is None:
        # transformers' own update gathered each sequence's keys, packed along tokens
        return ko.attention_prefill(q, k_new, v_new, cu_q, cu_k, check=False, **opts)
    ko.kv_cache_write(k_new, v_new, step.k_pages, step.v_pages, step.write_index, check=False)
    if step.read_index.numel() == 0:
        # no sequence has a past: the new keys are all there is
        return ko.attention_prefill(q, k_new, v_new, cu_q, cu_k, check=False, **opts)
    tables = block_tables(step.read_index, cu_k, int(kwargs["max_length_k"]), step.page_size)
    seq_lens = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    out = torch.zeros_like(q)  # padded query rows (CUDA graphs) are left as zeros
    return ko.paged_attention(q, step.k_pages, step.v_pages, tables, seq_lens, cu_q, out=out,
                              check=False, **opts)  # fmt: skip


def block_tables(read_index, cu_k, max_len_k: int, page_size: int) -> torch.Tensor:
    """Each sequence's pages in key order, from transformers' flat read indices: sequence b's
    keys are read from read_index[cu_k[b] : cu_k[b + 1]], key j of it at token row
    read_index[cu_k[b] + j] of the layer's view, i.e. page // page_size, offset % page_size.
    So its j-th page is read_index[cu_k[b] + j·page_size] // page_size. Index arithmetic on the
    device; no key or value is touched."""
    max_blocks = max(1, -(-max_len_k // page_size))
    starts = cu_k[:-1].to(torch.int64)
    if _TABLE_ROW_SHIFT:  # the planted defect of the parity check's test
        starts = starts.roll(_TABLE_ROW_SHIFT)
    ends = cu_k[1:].to(torch.int64)
    cols = torch.arange(max_blocks, device=read_index.device, dtype=torch.int64) * page_size
    idx = starts[:, None] + cols[None, :]
    ok = idx < ends[:, None]
    idx = torch.where(ok, idx, torch.zeros_like(idx)).clamp_(max=max(read_index.numel() - 1, 0))
    pages = torch.div(read_index[idx], page_size, rounding_mode="floor")
    return torch.where(ok, pages, torch.zeros_like(pages)).to(torch.int32)


# --- dense caches -------------------------------------------------------------------------------


def _dense(ko, q, key, value, mask, batch, q_len, opts):
    _, heads_kv, k_len, head_dim = key.shape
    lengths = _dense_lengths(mask, batch, q_len, k_len, opts["window_left"], key.device)
    dev = q.device
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev) * q_len
    if all(n == q_len for n in lengths):
        # a fresh prefill: the new keys, packed along tokens (a copy only when batch > 1)
        k = key[:, :, :q_len].transpose(1, 2).reshape(batch * q_len, heads_kv, head_dim)
        v = value[:, :, :q_len].transpose(1, 2).reshape(batch * q_len, heads_kv, head_dim)
        return ko.attention_prefill(q, k, v, cu_q, cu_q.clone(), check=False, **opts)
    k_pages, tables = _as_pages(key)
    v_pages, v_tables = _as_pages(value)
    if not torch.equal(tables, v_tables):
        raise Fallback("key and value caches laid out differently")
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=dev)
    return ko.paged_attention(q, k_pages, v_pages, tables, seq_lens, cu_q, check=False, **opts)


def _dense_lengths(mask, batch, q_len, k_len, window_left, device) -> list[int]:
    """The valid keys of each sequence, under sdpa's mask rules (the masks transformers makes
    for ``sdpa``, which ``"kernelab"`` shares): no mask means causal over all keys, except that
    a prefill with more keys than queries (an empty static cache) sees only the first q_len
    (sdpa's rule); a boolean mask must be exactly the causal prefix (with the window) of some
    length per sequence, anything else (left padding, custom masks) is not served. The check
    reads the mask on the host: a synchronisation per layer, on this path only."""
    if mask is None:
        return [q_len if (q_len > 1 and k_len > q_len) else k_len] * batch
    if mask.dtype != torch.bool:
        raise Fallback("a non-boolean attention mask is not served")
    if mask.dim() != 4 or mask.shape[1] != 1:
        raise Fallback(f"an attention mask of shape {tuple(mask.shape)} is not served")
    m = mask.expand(batch, 1, q_len, k_len)[:, 0]
    keys = torch.arange(k_len, device=device)
    # the last query sees its sequence's last key (bottom-right causal): the length is that + 1
    lens = torch.where(m[:, -1], keys, -1).amax(-1) + 1
    pos = lens[:, None] - q_len + torch.arange(q_len, device=device)[None, :]  # [B, Sq]
    want = keys <= pos[..., None]
    if window_left >= 0:
        want &= keys >= pos[..., None] - window_left
    if not torch.equal(m, want):
        raise Fallback("an attention mask that is not a causal prefix (padding?) is not served")
    return [int(n) for n in lens.tolist()]


def _as_pages(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense cache ``[B, H, S, D]`` (any strides, unit stride in D) as pages
    ``[n, P, H, D]`` plus a block table ``[B, ceil(S / P)]``, sharing its memory: page
    (b, j) starts at b·stride_b + j·P·stride_s, so with a page stride of P·stride_s the page
    number is b·(stride_b / (P·stride_s)) + j. P is the largest power of two ≤ 16 that divides
    S and stride_b / stride_s (pages never reach past the tensor)."""
    batch, heads, s_len, d = cache.shape
    sb, sh, ss, sd = cache.stride()
    if sd != 1 or ss <= 0 or sb % ss:
        raise Fallback(f"a cache tensor with strides {cache.stride()} is not served")
    per_seq = sb // ss if batch > 1 else s_len
    page = 16
    while page > 1 and (s_len % page or per_seq % page):
        page //= 2
    pages_per_seq = per_seq // page
    n_pages = (batch - 1) * pages_per_seq + s_len // page
    pages = cache.as_strided((n_pages, page, heads, d), (page * ss, ss, sh, 1))
    rows = torch.arange(batch, device=cache.device, dtype=torch.int32)[:, None] * pages_per_seq
    if _TABLE_ROW_SHIFT:  # the planted defect of the parity check's test
        rows = rows.roll(_TABLE_ROW_SHIFT, 0)
    cols = torch.arange(math.ceil(s_len / page), device=cache.device, dtype=torch.int32)
    return pages, rows + cols[None, :]
