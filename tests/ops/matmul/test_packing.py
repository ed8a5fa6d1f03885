"""Packed int4/int8 weight layouts: exact round trips and the documented bit positions."""

import dataclasses

import pytest
import torch

from kernelab.ops.matmul import _packing as P


def _codes(shape, seed=0, high=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g, dtype=torch.uint8)


def test_kernelab_int4_layout_puts_even_rows_in_the_low_nibble():
    q = torch.tensor([[1, 2], [3, 4], [15, 0], [7, 9]], dtype=torch.uint8)
    packed = P.pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed.tolist() == [[1 | 3 << 4, 2 | 4 << 4], [15 | 7 << 4, 0 | 9 << 4]]
    assert torch.equal(P.unpack_int4(packed), q)


@pytest.mark.parametrize("shape", [(2, 1), (128, 24), (256, 8)])
def test_int4_pack_unpack_round_trips(shape):
    q = _codes(shape, seed=shape[0])
    assert torch.equal(P.unpack_int4(P.pack_int4(q)), q)


def test_awq_nibble_order_and_round_trip():
    q = torch.arange(8, dtype=torch.uint8).repeat(2, 1)  # column c holds code c
    words, _ = P.pack_awq(q, q[:1])
    word = int(words[0, 0]) & 0xFFFFFFFF
    nibbles = [(word >> (4 * p)) & 0xF for p in range(8)]
    assert nibbles == list(P.AWQ_ORDER)  # nibble p holds column AWQ_ORDER[p]
    codes, zeros = _codes((256, 64), 1), _codes((2, 64), 2)
    qw, qz = P.pack_awq(codes, zeros)
    assert qw.dtype == torch.int32 and qw.shape == (256, 8) and qz.shape == (2, 8)
    back_q, back_z = P.unpack_awq(qw, qz)
    assert torch.equal(back_q, codes) and torch.equal(back_z, zeros)


def test_gptq_round_trip_with_the_zero_offset():
    codes, zeros = _codes((256, 16), 3), _codes((2, 16), 4)
    qw, qz = P.pack_gptq(codes, zeros)
    assert qw.shape == (32, 16) and qz.shape == (2, 2)
    # nibble p of word (i, n) is row 8i + p
    assert (int(qw[1, 3]) >> 8) & 0xF == int(codes[10, 3])
    # the stored zero is zero - 1 (mod 16)
    assert int(qz[0, 0]) & 0xF == (int(zeros[0, 0]) - 1) % 16
    back_q, back_z = P.unpack_gptq(qw, qz)
    assert torch.equal(back_q, codes) and torch.equal(back_z, zeros)


@pytest.mark.parametrize("group_size", [64, 128])
def test_checkpoint_converters_give_the_same_weight(group_size):
    w = torch.randn(256, 32)
    ours = P.quantize_int4(w, group_size, torch.float16)
    q = P.unpack_int4(ours.qweight)
    awq = P.from_awq(*P.pack_awq(q, ours.zeros), ours.scales, group_size)
    gptq = P.from_gptq(
        *P.pack_gptq(q, ours.zeros),
        ours.scales,
        group_size,
        g_idx=torch.arange(256) // group_size,
    )
    for other in (awq, gptq):
        assert torch.equal(other.qweight, ours.qweight) and torch.equal(other.zeros, ours.zeros)
        assert torch.equal(other.dequantize(), ours.dequantize())


@pytest.mark.parametrize("group_size", [64, 128])
def test_quantize_int4_error_is_at_most_half_a_step(group_size):
    w = torch.randn(256, 48) * 0.05 + 0.01
    qw = P.quantize_int4(w, group_size, torch.float32)
    assert int(P.unpack_int4(qw.qweight).max()) <= 15 and int(qw.zeros.max()) <= 15
    step = qw.scales.double().repeat_interleave(group_size, 0)
    err = (qw.dequantize() - w.double()).abs()
    assert (err <= step * 0.5 + 1e-7).all()
    assert qw.shape == (256, 48)


def test_quantize_int8_is_symmetric_per_column():
    w = torch.randn(64, 10)
    q, s = P.quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (10,)
    assert (q.abs().amax(dim=0) == 127).all()
    assert ((P.dequantize_int8(q, s) - w.double()).abs() <= s.double() / 2 + 1e-6).all()


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: P.pack_int4(torch.full((2, 2), 16)), ValueError, "q: expected codes in [0, 15]"),
        (lambda: P.pack_int4(torch.zeros(3, 2, dtype=torch.uint8)), ValueError, "K even"),
        (lambda: P.pack_int4(torch.zeros(2, 2)), TypeError, "q: expected an integer tensor"),
        (lambda: P.quantize_int4(torch.randn(128, 4), 32), ValueError, "group_size: expected"),
        (lambda: P.quantize_int4(torch.randn(96, 4), 64), ValueError, "K: expected a multiple"),
        (
            lambda: P.quantize_int4(torch.randn(128, 4), 64.0),
            TypeError,
            "group_size: expected an int",
        ),
        (lambda: P.quantize_int4(torch.randn(128, 4), True), TypeError, "got bool"),
        (
            lambda: P.from_gptq(
                *P.pack_gptq(_codes((128, 8)), _codes((1, 8))), torch.ones(1, 8), 128.0
            ),
            TypeError,
            "group_size: expected an int, got float",
        ),
        (
            lambda: P.pack_gptq(_codes((128, 8)), _codes((1, 8)), zero_offset=1.0),
            TypeError,
            "zero_offset: expected an int",
        ),
        (
            lambda: dataclasses.replace(
                P.quantize_int4(torch.randn(128, 4)), group_size=64.0
            ).dequantize(),
            TypeError,
            "group_size: expected an int",
        ),
        (lambda: P.unpack_awq(torch.zeros(2, 2), torch.zeros(1, 2)), TypeError, "qweight"),
        (
            lambda: P.from_gptq(
                *P.pack_gptq(_codes((128, 8)), _codes((1, 8))),
                torch.ones(1, 8),
                128,
                g_idx=torch.arange(128) % 2,  # reordered (act-order) groups
            ),
            ValueError,
            "g_idx: expected k // group_size",
        ),
        (
            lambda: P.from_awq(
                *P.pack_awq(_codes((128, 8)), _codes((1, 8))), torch.ones(2, 8), 128
            ),
            ValueError,
            "scales: expected shape (1, 8)",
        ),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)
