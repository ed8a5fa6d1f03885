"""The Pallas attention kernels (attention/_pallas.py) through the TPU interpreter: paged decode
over the op's cache layout (pages by DMA, double-buffered), mixed batches, window and sinks;
flash prefill over packed query blocks that straddle sequences; a read of a page before its
DMA wait is a race verify names; fp8 caches and block masks are declared unsupported."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.ops import ATTENTION_PREFILL, PAGED_ATTENTION
from kernelab.ops.attention import _pallas as ap
from kernelab.ops.attention._pallas import PagedSteps, PrefillBlocks
from tests.ops import pallas_checks as pc

pytestmark = pc.needs_jax

PAGED = PAGED_ATTENTION.variants["pallas"]
EDGE = {s.label.split(" (")[0]: s for s in PAGED_ATTENTION.shapes("edge")}
ONE_PAGE = PagedSteps(1)  # a step per page: the two slots alternate


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_paged_decode_passes_across_pages_and_with_window_sinks_and_a_chunk():
    shapes = [EDGE["length = block size and block size + 1"], EDGE["sinks window 8"]]
    report = pc.verify(PAGED_ATTENTION, pc.configured(PAGED, ONE_PAGE), shapes)
    assert pc.passed(report), pc.failures(report)


def _racy_kernel(
    seq_ref, tables_ref, lens_ref, cu_ref, q_ref, k_hbm, v_hbm, o_ref, kbuf, vbuf, sem,
    *, scale, window, softcap, has_sinks, pps, bs, max_pages,
):  # fmt: skip
    """The paged decode kernel reading each page before waiting for its DMA (a planted race)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    t, h = pl.program_id(0), pl.program_id(1)
    b, lo, hi = ap._decode_bounds(seq_ref, lens_ref, cu_ref, t, window)
    n_pages = (hi + bs - 1) // bs
    steps = jnp.where(hi > lo, n_pages, 0)
    q = q_ref[...]

    def copies(step):
        return ap._page_copies(
            k_hbm, v_hbm, kbuf, vbuf, sem, tables_ref, b, h, step, 0,
            pps=1, bs=bs, max_pages=max_pages, n_pages=n_pages,
        )  # fmt: skip

    def body(i, carry):
        ap._start(copies(i))
        carry = ap._attend(carry, q, kbuf[0], vbuf[0], i * bs, lo, hi, softcap, scale)
        ap._wait(copies(i))  # too late: the buffer was read above
        return carry

    g = q.shape[0]
    init = (jnp.full((g, 1), ap.M_INIT), jnp.zeros((g, 1)), jnp.zeros(q.shape))
    m, l_, acc = jax.lax.fori_loop(0, steps, body, init)
    o_ref[...] = ap._finish_rows(m, l_, acc, None, hi > lo).astype(o_ref.dtype)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_reading_a_page_before_its_dma_wait_is_a_race():
    def racy(call):
        return dataclasses.replace(call, kernel=_racy_kernel)

    shape = EDGE["length = block size and block size + 1"]
    report = pc.verify(PAGED_ATTENTION, pc.planted(PAGED, racy, config=ONE_PAGE), [shape])
    assert "race" in pc.classes(report), pc.failures(report)


def test_fp8_caches_are_declared_unsupported_and_the_lse_refused():
    fp8 = EDGE["fp8 e4m3 cache block 64"]
    assert "fp8" in PAGED.unsupported(fp8)
    assert PAGED.unsupported(EDGE["MQA"]) is None
    inputs = PAGED_ATTENTION.inputs(EDGE["MQA"], torch.bfloat16, "meta")
    with pytest.raises(ValueError, match="return_lse"):
        PAGED.plan(**inputs, return_lse=True)


def test_paged_launch_keeps_the_cache_in_hbm_and_prefetches_the_tables():
    shape = PAGED_ATTENTION.shapes("representative")[0]
    (call,) = pallas.launches(PAGED_ATTENTION, shape, torch.bfloat16, target="tpu_v6e")
    assert call.num_scalar_prefetch == 4
    assert [b.memory for b in call.in_specs[1:3]] == ["any", "any"]
    assert call.config.pages_per_step * shape.dims["block_size"] == pallas.CHIPS["tpu_v6e"].mxu
    assert {s.kind for s in call.scratch} == {"vmem", "dma"}


PREFILL = ATTENTION_PREFILL.variants["pallas"]
PREFILL_EDGE = {s.label: s for s in ATTENTION_PREFILL.shapes("edge")}


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_prefill_passes_on_blocks_straddling_sequences_with_a_partial_last_block():
    # 64 + 65 + 128 + 129 tokens in query blocks of 128 (four, the last partial, three of them
    # spanning two sequences) and key blocks of 64; lse checked too (the op asks for it).
    shape = PREFILL_EDGE["block size and block size + 1"]
    report = pc.verify(ATTENTION_PREFILL, pc.configured(PREFILL, PrefillBlocks(128, 64)), [shape])
    assert pc.passed(report), pc.failures(report)


def test_prefill_declares_block_masks_unsupported_and_keys_ranges_per_block():
    assert "block-sparse" in PREFILL.unsupported(
        PREFILL_EDGE["block-sparse mask masking whole rows"]
    )
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 12], dtype=torch.int32)
    lo, hi = ap.row_bounds(cu_q, cu_k, 5, causal=True, window_left=-1)
    # Sequence 0: 3 queries at positions 7, 8, 9 of 10 keys; sequence 1: 2 queries over 2 keys.
    assert lo[:, 0].tolist() == [0, 0, 0, 10, 10]
    assert hi[:, 0].tolist() == [8, 9, 10, 11, 12]
    start, count = ap.key_blocks(lo, hi, 5, 4, 4)
    assert start.tolist() == [0, 2] and count.tolist() == [3, 1]
