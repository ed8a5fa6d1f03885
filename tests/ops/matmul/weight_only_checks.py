"""What the weight-only GEMM tests (test_w4a16, test_w8a16) share beyond ``tests.opcheck``'s
check against the float64 reference (computed from the same quantized weights)."""


def decode_and_prefill(shapes):
    return [shapes[0].reduced(1), shapes[2].reduced(8)]  # M = 1 (GEMV path) and M = 128
