"""numerics.error: where the worst element is, for every layout, without a slow import."""

import subprocess
import sys

import pytest
import torch

from kernelab.numerics import error


@pytest.mark.parametrize(
    "shape, where",
    [((), ()), ((7,), (5,)), ((3, 4), (2, 0)), ((2, 3, 5), (1, 2, 4)), ((4, 1, 6), (3, 0, 1))],
)
def test_the_worst_index_is_the_planted_element(shape, where):
    ref = torch.linspace(-1, 1, max(1, torch.Size(shape).numel()), dtype=torch.float64)
    ref = ref.reshape(shape)
    out = ref.clone()
    out[where] += 0.5  # the one element off by more than any other
    err = error(out, ref)
    assert err.worst_index == where
    assert err.worst_out == pytest.approx(out[where].item())
    assert err.worst_ref == pytest.approx(ref[where].item())
    assert err.max_abs == pytest.approx(0.5)


def test_the_worst_index_is_logical_on_a_transposed_output():
    ref = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = ref.t().contiguous().t()  # same values, column-major storage
    out[1, 3] = -40.0
    err = error(out, ref)
    assert not out.is_contiguous()
    assert err.worst_index == (1, 3) and err.worst_ref == 7.0 and err.worst_out == -40.0


def test_error_does_not_import_sympy():
    """torch.unravel_index imports sympy on its first call (0.3-0.5 s CPU in a new process)."""
    code = (
        "import sys, torch\n"
        "from kernelab.numerics import error\n"
        "error(torch.randn(3, 4, 5), torch.randn(3, 4, 5))\n"
        "print('sympy' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
