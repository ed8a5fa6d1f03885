"""Declared Pallas launches: validated declarations, runs through the TPU interpreter with
races and interpreter errors raised under their class, one compile per program, and kernelab
without jax."""

from __future__ import annotations

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.core.runtime.pallas import Block, Out, PallasCall, Scratch
from tests.core.runtime.fresh import run_python

jax_ok, jax_why = pallas.available()
needs_jax = pytest.mark.skipif(not jax_ok, reason=jax_why)


def _double_kernel(x_ref, o_ref, *, scale):
    o_ref[...] = x_ref[...] * scale


def _double(x: torch.Tensor, rows: int, shift: int = 0) -> PallasCall:
    """Blocks of ``rows`` rows; ``shift`` plants a block index off by that much."""
    n = x.shape[1]
    return PallasCall(
        _double_kernel,
        grid=(pallas_cdiv(x.shape[0], rows),),
        inputs=(x,),
        in_specs=(Block((rows, n), lambda i: (i + shift, 0)),),
        outputs=(Out(tuple(x.shape), x.dtype, Block((rows, n), lambda i: (i, 0))),),
        semantics=("parallel",),
        params={"scale": 2.0},
    )


def pallas_cdiv(a, b):
    return -(-a // b)


def _dma_kernel(x_hbm, o_ref, buf, sem, *, wait_first):
    """Copy the whole input by DMA into VMEM scratch, then out; ``wait_first=False`` reads the
    scratch before waiting for the copy (a race)."""
    from jax.experimental.pallas import tpu as pltpu

    copy = pltpu.make_async_copy(x_hbm, buf, sem.at[0])
    copy.start()
    if wait_first:
        copy.wait()
        o_ref[...] = buf[...]
    else:
        o_ref[...] = buf[...]
        copy.wait()


def _dma(x: torch.Tensor, wait_first: bool) -> PallasCall:
    return PallasCall(
        _dma_kernel,
        grid=(1,),
        inputs=(x,),
        in_specs=(Block(memory="any"),),
        outputs=(Out(tuple(x.shape), x.dtype, Block(tuple(x.shape), lambda i: (0, 0))),),
        scratch=(Scratch("vmem", tuple(x.shape), x.dtype), Scratch("dma", (1,))),
        params={"wait_first": wait_first},
    )


def test_declarations_are_checked_naming_what_is_wrong():
    x = torch.empty(16, 128, device="meta")
    with pytest.raises(ValueError, match="in_specs: expected 1 blocks"):
        PallasCall(_double_kernel, (2,), (x,), (), (Out((16, 128), torch.float32),))
    with pytest.raises(ValueError, match="semantics: expected one per grid axis"):
        PallasCall(
            _double_kernel,
            (2,),
            (x,),
            (Block(),),
            (Out((16, 128), torch.float32),),
            semantics=("parallel", "parallel"),
        )
    with pytest.raises(ValueError, match="semantics: expected"):
        PallasCall(
            _double_kernel,
            (2,),
            (x,),
            (Block(),),
            (Out((16, 128), torch.float32),),
            semantics=("sequential",),
        )
    with pytest.raises(ValueError, match="has 1 dimensions"):
        PallasCall(
            _double_kernel,
            (2,),
            (x,),
            (Block((8,), lambda i: (i,)),),
            (Out((16, 128), torch.float32),),
        )
    with pytest.raises(ValueError, match="grid: expected positive"):
        PallasCall(_double_kernel, (0,), (x,), (Block(),), (Out((16, 128), torch.float32),))
    with pytest.raises(ValueError, match="memory: expected"):
        Block(memory="hbm")
    with pytest.raises(ValueError, match="no shape or index map"):
        Block((8, 128), lambda i: (i, 0), memory="any")
    with pytest.raises(ValueError, match="kind: expected"):
        Scratch("vreg", (8, 128))
    with pytest.raises(ValueError, match="target: expected one of"):
        pallas.generation("tpu_v2")


def test_same_program_same_key_different_closure_values_differ():
    x = torch.empty(16, 128, device="meta")
    assert _double(x, 8).key() == _double(x, 8).key()  # new lambdas, same code and values
    assert _double(x, 8).key() != _double(x, 8, shift=1).key()
    assert _double(x, 8).key() != _double(x, 16).key()


@needs_jax
def test_run_is_right_and_outputs_are_torch_owned_copies():
    x = torch.randn(24, 128, dtype=torch.bfloat16)
    before = x.clone()
    (out,) = _double(x, 8).run()
    assert type(out) is torch.Tensor and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, x * 2, rtol=0, atol=0)
    out.fill_(0)  # writable: a copy, never a view of a jax buffer
    assert torch.equal(x, before)
    (again,) = _double(x, 8).run()
    torch.testing.assert_close(again, x * 2, rtol=0, atol=0)


@needs_jax
def test_a_block_index_past_the_array_is_an_interpreter_error_and_state_is_reset():
    x = torch.randn(16, 128)
    with pytest.raises(pallas.PallasInterpreterError) as info:
        _double(x, 8, shift=1).run()
    assert info.value.failure_class == "interpreter error"
    (out,) = _double(x, 8).run()  # the interpreter runs again after a failure
    torch.testing.assert_close(out, x * 2)


@needs_jax
def test_a_read_before_its_dma_wait_is_a_race_and_the_flag_is_per_run():
    x = torch.randn(8, 128)
    with pytest.raises(pallas.PallasRace) as info:
        _dma(x, wait_first=False).run()
    assert info.value.failure_class == "race"
    assert "race" in str(info.value)
    (out,) = _dma(x, wait_first=True).run()  # the next, correct run is not blamed
    torch.testing.assert_close(out, x, rtol=0, atol=0)


@needs_jax
def test_int64_operands_are_checked_before_they_reach_an_index():
    big = torch.tensor([2**40], dtype=torch.int64)
    with pytest.raises(ValueError, match="outside int32"):
        pallas.to_jax(big, "block_tables")


@needs_jax
def test_lowering_for_tpu_without_one():
    lowered = _double(torch.empty(16, 128, device="meta"), 8).lower()
    assert "tpu_custom_call" in lowered.as_text()


def test_without_jax_kernelab_works_and_pallas_variants_say_why():
    # A meta-path finder refusing jax: the situation of an install without kernelab[tpu].
    code = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jax', 'jaxlib'):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Refuse())
import kernelab.ops as ko
unavailable = [o.name for o in ko.all_ops() for v in o.variants.values()
               if v.kind == 'pallas' and not v.runs_on('cpu')[0]]
print('unavailable', sorted(unavailable))
from kernelab.verify import verify
report = verify(['rmsnorm'], variants=['pallas'], device='cpu', seed=1)
print('skipped', report.skipped)
from kernelab.cli import main
sys.argv = ['kernelab', 'ops']
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
assert 'jax' not in sys.modules
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    ops = ["attention_prefill", "gemm", "paged_attention", "rmsnorm", "silu_and_mul", "w8a16_gemm"]
    assert f"unavailable {ops}" in r.stdout
    skipped = next(line for line in r.stdout.splitlines() if line.startswith("skipped"))
    assert "rmsnorm/pallas: jax cannot be imported (ModuleNotFoundError)" in skipped
    assert "pip install" in r.stdout and "kernelab ops" in r.stdout
