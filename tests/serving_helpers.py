"""What the serving tests share: gc frozen around continuous batching, counting the routes taken
through kernelab's attention ops, and seeded prompts."""

import gc

import torch

import kernelab.ops as ko

ROUTES = ("attention_prefill", "paged_attention", "kv_cache_write")


def frozen_gc():
    """A fixture body: transformers' continuous batching calls gc.collect() on stop, seconds in
    a process that holds torch, triton and transformers, unless what exists now is frozen."""
    gc.freeze()
    yield
    gc.unfreeze()


def count_calls(monkeypatch) -> dict:
    """How often each kernelab attention op runs from now on (the routes taken)."""
    seen = {}
    for name in ROUTES:
        fn = getattr(ko, name)

        def counted(*a, _fn=fn, _name=name, **k):
            seen[_name] = seen.get(_name, 0) + 1
            return _fn(*a, **k)

        monkeypatch.setattr(ko, name, counted)
    return seen


def prompts(lengths, seed=0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (n,), generator=gen).tolist() for n in lengths]
