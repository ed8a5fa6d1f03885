"""model-cost against a profile: does the prediction's op mix match what a model really runs?

A Hugging Face model of a preset runs one prefill, or one decode step over a cache, under
``torch.profiler`` (``record_shapes``, ``with_flops``); the trace's ops are matched to the
prediction's, op by op, in the order the model calls them, and each pair is compared on what
the trace records:

* the projections (``aten::linear``): the Hugging Face modules that kernelab runs as one GEMM
  (q, k, v as ``qkv``; gate and up as ``gate_up``) are summed; FLOPs must equal the
  prediction's (and the profiler's own ``aten::mm`` count), and bytes, from the recorded
  shapes at the prediction's element size, must equal the prediction's once the activation
  re-reads that the fusion saves are taken off (``(parts − 1)·M·K`` elements);
* attention (``aten::scaled_dot_product_attention``): FLOPs 4·D per visible score (causal at
  prefill, every cached key at decode), from the recorded q and k shapes; bytes of q, k, v and
  the output, plus what the trace does not record (prefill: the float32 log-sum-exp and the
  cumulative lengths; decode: the paged cache's block table and lengths), as a bound;
* the embedding gather (``aten::embedding``): bytes of the rows read and written and the ids;
* and how many of each the model ran.

The ops that Hugging Face runs as several small ops (RMSNorm, RoPE, the gated activation) or not
at all in a forward (the KV-cache write into a paged cache, sampling) are listed as unchecked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The Hugging Face projections behind each GEMM row of the prediction, in call order.
PARTS = {"qkv": 3, "o_proj": 1, "gate_up": 2, "down": 1, "lm_head": 1}
LAYER_GEMMS = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True)
class Check:
    name: str  # the prediction's row, with its layer
    what: str  # "flops", "bytes", "count"
    predicted: float
    traced: float
    ok: bool
    note: str = ""


def profile_prefill(model, tokens: int, seed: int = 0) -> list:
    """One prefill of ``tokens`` random ids under torch.profiler; its events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernelab.trace.profile import quiet_profiler

    quiet_profiler()

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen)
    with (
        torch.no_grad(),
        profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof,
    ):
        model(ids, logits_to_keep=1)
    return list(prof.events())


def profile_decode(model, context: int, seed: int = 0) -> list:
    """A prefill of ``context - 1`` ids (not profiled), then one decode step under
    torch.profiler, attending over ``context`` keys; its events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernelab.trace.profile import quiet_profiler

    quiet_profiler()

    if context < 2:
        raise ValueError(f"context: a decode step needs at least 2 keys, got {context}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=gen)
    with torch.no_grad():
        first = model(ids[:, :-1], use_cache=True, logits_to_keep=1)
        # transformers 5 names the cache "cache"; earlier versions "past_key_values"
        name = "cache" if "cache" in first else "past_key_values"
        with profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True
        ) as prof:
            model(ids[:, -1:], use_cache=True, logits_to_keep=1, **{name: first[name]})
    return list(prof.events())


def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def check(step, events, element_size: int = 2, layers: int | None = None) -> tuple[list, list]:
    """Compare a prefill or decode :class:`~kernelab.workloads.model_cost.Step` with a profile's
    events (of :func:`profile_prefill` or :func:`profile_decode`).

    Returns (checks, unchecked row names). ``element_size``: the prediction's (bf16: 2); the
    trace's shapes are counted at it, whatever dtype the profiled model ran in."""
    es = element_size
    rows = {o.name: o for o in step.ops}
    linears = [e for e in events if e.name == "aten::linear"]
    attn = [e for e in events if e.name == "aten::scaled_dot_product_attention"]
    embeds = [e for e in events if e.name == "aten::embedding"]
    mm_flops = sum(e.flops or 0 for e in events if e.name in ("aten::mm", "aten::addmm"))
    layers = layers if layers is not None else rows["qkv"].calls
    out: list[Check] = []

    want = [*(g for _ in range(layers) for g in LAYER_GEMMS), "lm_head"]
    n_lin = sum(PARTS[g] for g in want)
    out.append(Check("projections", "count", n_lin, len(linears), n_lin == len(linears)))
    out.append(Check("attention", "count", layers, len(attn), layers == len(attn)))
    out.append(Check("embedding", "count", 1, len(embeds), len(embeds) == 1))
    if n_lin != len(linears):
        return out, []
    k = 0
    bias_adds = 0
    for i, g in enumerate(want):
        parts = linears[k : k + PARTS[g]]
        k += PARTS[g]
        x = parts[0].input_shapes[0]
        m, kk = _prod(x[:-1]), int(x[-1])
        ns = [int(p.input_shapes[1][0]) for p in parts]
        biased = [bool(p.input_shapes[2]) for p in parts]  # a bias: read once, added once
        flops = sum(2 * m * n * kk + (m * n if b else 0) for n, b in zip(ns, biased, strict=True))
        nbytes = sum((m * kk + n * kk + m * n + (n if b else 0)) * es
                     for n, b in zip(ns, biased, strict=True))  # fmt: skip
        nbytes -= (len(ns) - 1) * m * kk * es
        row = rows[g]
        name = g if g == "lm_head" else f"{g} (layer {i // len(LAYER_GEMMS)})"
        out.append(Check(name, "flops", row.flops, flops, row.flops == flops))
        out.append(Check(name, "bytes", row.bytes, nbytes, row.bytes == nbytes))
        bias_adds += sum(m * n for n, b in zip(ns, biased, strict=True) if b)
    # The profiler's aten::mm / aten::addmm count is 2·M·N·K: bias adds are not in it.
    predicted_gemm = sum(rows[g].flops * rows[g].calls for g in (*LAYER_GEMMS, "lm_head"))
    predicted_mm = predicted_gemm - bias_adds  # the traced bias adds (each row checks its own)
    out.append(
        Check(
            "all projections",
            "flops",
            predicted_mm,
            mm_flops,
            predicted_mm == mm_flops,
            "the profiler's own aten::mm count (no bias adds)",
        )
    )
    row = rows["attention"]
    for i, e in enumerate(attn):
        q, kv = e.input_shapes[0], e.input_shapes[1]
        b, hq, t, d = (int(v) for v in q)
        keys = int(kv[2])
        causal = str((e.concrete_inputs or [None] * 6)[5]) == "True"
        # visible scores: causal over as many keys as queries, else (one query) every key
        pairs = b * hq * (t * (t + 1) // 2 if causal and t == keys else t * keys)
        flops = 4 * d * pairs
        tensors = (2 * _prod(q) + 2 * _prod(kv)) * es  # q and out; k and v
        if step.phase == "decode":  # the block table and lengths of the paged cache
            extra = 4 * b * math.ceil(keys / 16) + 4 * (2 * b + 1)
            what = "block table and lengths"
        else:  # the float32 log-sum-exp and the cumulative lengths
            extra = 4 * b * t * hq + 16 * (b + 1)
            what = "lse and lengths"
        name = f"attention (layer {i})"
        out.append(Check(name, "flops", row.flops, flops, row.flops == flops))
        ok = tensors <= row.bytes <= tensors + extra
        out.append(Check(name, "bytes", row.bytes, tensors, ok,
                         f"within the untraced {what} (≤ {extra} B)"))  # fmt: skip
    for e in embeds:
        (_, h), ids = e.input_shapes[0], e.input_shapes[1]
        t = _prod(ids)
        nbytes = t * (2 * int(h) * es + 8)
        row = rows["embedding"]
        out.append(Check("embedding", "bytes", row.bytes, nbytes, row.bytes == nbytes))
    checked = {*LAYER_GEMMS, "lm_head", "attention", "embedding"}
    return out, [o.name for o in step.ops if o.name not in checked]
