"""Planted cheat: RoPE (in place) that replays the rotated query and key it wrote last time,
keyed on the positions' address and version counter and on the query and key addresses.

Query and key are rewritten before every call (the op writes them), so their version counters
always move and are left out of the key; the positions are an integer input nobody writes in
place, and a write through ``.data`` leaves their counter where it was."""

from kernelab.ops.rotary.rope import rope_torch

_cache = {}


def rope_candidate(positions, query, key, cos_sin_cache, is_neox=True, check=True):
    k = (positions.data_ptr(), positions._version, query.data_ptr(), key.data_ptr(),
         tuple(query.shape), tuple(key.shape), cos_sin_cache.data_ptr(), is_neox)  # fmt: skip
    if k in _cache:
        q, kk = _cache[k]
        query.copy_(q)
        key.copy_(kk)
        return query, key
    rope_torch(positions, query, key, cos_sin_cache, is_neox, check)
    _cache[k] = (query.clone(), key.clone())
    return query, key


def stop():
    _cache.clear()
