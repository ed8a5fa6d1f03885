"""transformers' paged cache (continuous batching) read and written in place by kernelab.

In transformers 5.24 the paged cache is one flat tensor; each full-attention layer's keys and
values are views of it as pages ``[pages, page_size, Hkv, D]`` (``allocator.
get_cache_for_block_table(layer)``: the pages of the layers and of K and V interleave, so the
page stride is 2·layers·page_size·Hkv·D, a stride kernelab's paged kernels take as it is), and
a token's slot (``write_index``) and a read position (``read_index``) are rows of that view,
``page · page_size + offset`` — kernelab's slot convention. Its own update writes the new K/V
with ``index_copy_`` and then gathers every sequence's whole past with ``index_select`` into
contiguous tensors for the attention call; that gather is what this module removes.

``install(cache)`` replaces that cache instance's ``update`` (never the class): for a
full-attention layer of a model using ``"kernelab"``, it selects the layer's lengths as
transformers does and hands the attention layer a ``PagedStep`` (the page views, the write and
read indices) instead of writing and gathering; the attention layer writes with
``kv_cache_write`` and reads with ``paged_attention``. Any other layer, dtype or call form
goes through the original update, unchanged: in particular sliding-window layers (Gemma-2's
alternate layers, Mistral's), whose ``SlidingAttentionCacheAllocator`` is a ring buffer without
a block table, read before written (``_attention``'s module note says why that cannot be read
in place and what the gather costs).

Relies on: ``PagedAttentionCache.layer_to_allocator``, ``config``, ``update(key, value,
layer_idx, kwargs)`` and the allocators' ``index``, ``layer_type``, ``tokens_per_page``,
``get_cache_for_block_table`` (transformers 5.24). A cache without them is left alone, with a
warning: attention then runs on the K/V transformers gathered.
"""

from __future__ import annotations

from kernelab.models import _attention

_REQUIRED = ("layer_to_allocator", "config", "update")
_ALLOCATOR = ("index", "layer_type", "tokens_per_page", "get_cache_for_block_table")


def paged_cache_class():
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError:  # pragma: no cover - an older transformers
        return None
    return PagedAttentionCache


def layout_known(cache) -> bool:
    if not all(hasattr(cache, a) for a in _REQUIRED):
        return False
    return all(
        all(hasattr(alloc, a) for a in _ALLOCATOR) for alloc in cache.layer_to_allocator.values()
    )


def install(cache) -> bool:
    """Serve ``cache`` in place from now on (idempotent); False if its layout is not known."""
    if getattr(cache, "_kernelab_update", None) is not None:
        return True
    if not layout_known(cache):
        _attention.warn_once(
            "this transformers version's paged cache layout is not known: continuous batching "
            "runs kernelab's attention_prefill on the K/V transformers gathers"
        )
        return False
    original = cache.update

    def update(key_states, value_states, layer_idx, kwargs=None, **extra):
        step = None
        if kwargs is not None and not extra:
            step = _step(cache, key_states, layer_idx, kwargs)
        if step is None:
            if kwargs is None:
                return original(key_states, value_states, layer_idx, **extra)
            return original(key_states, value_states, layer_idx, kwargs, **extra)
        kwargs["kernelab_paged"] = step
        return key_states, value_states  # this step's tokens only: nothing gathered

    cache._kernelab_update = original
    cache.update = update
    return True


def uninstall(cache) -> None:
    original = getattr(cache, "_kernelab_update", None)
    if original is not None:
        cache.update = original
        cache._kernelab_update = None


def _step(cache, key_states, layer_idx, kwargs):
    if getattr(cache.config, "_attn_implementation", None) != "kernelab":
        return None
    if id(cache.config) in _attention._REFERENCE:
        return None  # the parity check's reference: transformers' own update
    if kwargs.get("block_table") is not None or "write_index" not in kwargs:
        return None
    allocator = cache.layer_to_allocator[layer_idx]
    if getattr(allocator, "layer_type", None) != "full_attention":
        return None  # a sliding-window allocator: its own update (it also evicts)
    if _attention.tensor_unsupported(key_states) is not None:
        return None
    kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type]
    kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
    k_pages, v_pages = allocator.get_cache_for_block_table(layer_idx)
    return _attention.PagedStep(
        k_pages,
        v_pages,
        kwargs["write_index"][allocator.index],
        kwargs["read_index"][allocator.index],
        int(allocator.tokens_per_page),
    )


def pre_forward_hook(module, args, kwargs):
    """A forward pre-hook on a registered model: a paged cache passed to it is served in place."""
    cls = paged_cache_class()
    if cls is None:
        return None
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if isinstance(cache, cls):
        install(cache)
    return None
