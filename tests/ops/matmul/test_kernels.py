"""Static evidence, no GPU needed: the GEMM kernels' default launches compile for sm_90, sm_80
and gfx942 with the tensor-core instructions of each target and without register spills."""

import re
import subprocess

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget

from kernelab.ops import FP8_GEMM, GEMM, W4A16_GEMM, W8A16_GEMM
from kernelab.ops.matmul._weight_only import WQConfig
from kernelab.ops.matmul.fp8_gemm import Fp8Config, e4m3_for
from kernelab.ops.matmul.gemm import GemmConfig

TARGETS = {
    "sm_90": (GPUTarget("cuda", 90, 32), r"wgmma\.mma_async"),
    "sm_80": (GPUTarget("cuda", 80, 32), r"mma\.sync\.aligned"),
    "gfx942": (GPUTarget("hip", "gfx942", 64), r"v_mfma_"),
}
#: Tensor-core instruction for launches whose M tile is below a warpgroup's 64 rows on sm_90.
SMALL_M_SM90 = r"mma\.sync\.aligned|wgmma\.mma_async"


def _prefill(op):
    return next(s for s in op.shapes("representative") if s.dims["M"] == 2048)


def _decode(op):
    return next(s for s in op.shapes("representative") if s.dims["M"] == 1)


CASES = [
    (GEMM, _prefill, "sm_90", "_gemm_tma_kernel"),  # the default on Hopper: TMA + wgmma
    (GEMM, _prefill, "sm_80", "_gemm_kernel"),
    (GEMM, _prefill, "gfx942", "_gemm_kernel"),
    (GEMM, _decode, "sm_90", "_gemm_kernel"),  # split-K, 16-row tiles
    (GEMM, _prefill, "sm_80", "_gemm_persistent_kernel"),  # the persistent variant's default
    (GEMM, _prefill, "sm_90", "_gemm_persistent_kernel"),
    (W4A16_GEMM, _prefill, "sm_90", "_wq_gemm_kernel"),
    (W4A16_GEMM, _prefill, "sm_80", "_wq_gemm_kernel"),
    (W4A16_GEMM, _prefill, "gfx942", "_wq_gemm_kernel"),
    (W4A16_GEMM, _decode, "sm_90", "_wq_gemm_kernel"),  # the GEMV-shaped path
    (W8A16_GEMM, _prefill, "sm_90", "_wq_gemm_kernel"),
    (W8A16_GEMM, _prefill, "sm_80", "_wq_gemm_kernel"),
    (W8A16_GEMM, _prefill, "gfx942", "_wq_gemm_kernel"),
    (FP8_GEMM, _prefill, "sm_90", "_fp8_gemm_kernel"),
    (FP8_GEMM, _prefill, "gfx942", "_fp8_gemm_kernel"),
]


def _default_config(op, dims, arch):
    if op is GEMM:
        return GemmConfig.default_for(**dims, device=arch)
    if op is FP8_GEMM:
        return Fp8Config.default_for(**dims, device=arch)
    return WQConfig.default_for(**dims, device=arch, bits=4 if op is W4A16_GEMM else 8)


def _first_launch(op, shape, arch, config=None):
    """The first launch of the op's plan for ``shape`` as ``arch`` would run it: meta inputs
    (fp8 in the arch's e4m3 flavour), and the arch's default config unless one is given."""
    inputs = op.inputs(shape, torch.bfloat16, "meta")
    if op is FP8_GEMM:
        f8 = e4m3_for(arch)
        inputs.update(a=inputs["a"].to(f8), b=inputs["b"].to(f8))
    config = config or _default_config(op, shape.dims, arch)
    return op.plan(**inputs, config=config).describe()[0]


def _compile(launch, target):
    """Compile as a launch would be specialised: 16-divisible arguments carry the divisibility
    attribute, arguments equal to 1 become constants."""
    sig, const = dict(launch.signature), dict(launch.constexprs)
    for name in launch.equal_1:
        sig[name], const[name] = "constexpr", 1
    names = launch.kernel.arg_names
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a in launch.divisible_16
        if sig.get(a) not in (None, "constexpr")
    }
    src = triton.compiler.ASTSource(fn=launch.kernel, signature=sig, constexprs=const, attrs=attrs)
    opts = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    return triton.compile(src, target=target, options=opts)


def _spills(compiled, arch: str, tmp_path) -> int:
    """Bytes spilled: from ptxas -v on NVIDIA, from the code object's metadata on AMD."""
    if arch.startswith("gfx"):
        asm = compiled.asm["amdgcn"]
        counts = re.findall(r"\.[sv]gpr_spill_count:\s*(\d+)", asm)
        assert counts, "no spill counts in the AMD code object metadata"
        return sum(int(c) for c in counts)
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = tmp_path / "k.ptx"
    ptx.write_text(compiled.asm["ptx"])
    sm = "sm_90a" if arch == "sm_90" else arch
    proc = subprocess.run(
        [get_ptxas(int(arch[3:])).path, "-v", f"--gpu-name={sm}", str(ptx), "-o", "/dev/null"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert found, f"no spill report from ptxas: {proc.stderr[:300]}"
    return sum(int(a) + int(b) for a, b in found)


@pytest.mark.parametrize(
    ("op", "pick", "arch", "kernel"),
    CASES,
    ids=[f"{op.name}-{pick.__name__[1:]}-{arch}" for op, pick, arch, _ in CASES],
)
def test_default_launch_uses_tensor_cores_and_does_not_spill(op, pick, arch, kernel, tmp_path):
    target, instruction = TARGETS[arch]
    config = None
    if kernel == "_gemm_persistent_kernel":
        config = GemmConfig.persistent_for(**pick(op).dims, device=arch)
    launch = _first_launch(op, pick(op), arch, config)
    assert launch.name == kernel
    compiled = _compile(launch, target)
    code = compiled.asm.get("ptx") or compiled.asm["amdgcn"]
    if arch == "sm_90" and launch.config.block_m < 64:
        instruction = SMALL_M_SM90
    assert re.search(instruction, code), f"no {instruction} in {kernel} for {arch}"
    assert _spills(compiled, arch, tmp_path) == 0
    if arch.startswith("sm_") and pick is _prefill:
        # 16-bit outputs leave in 128-bit stores, never one element at a time
        assert "st.global.v4" in code and not re.search(r"st\.global\.b16", code)
