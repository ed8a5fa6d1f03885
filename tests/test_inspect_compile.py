"""inspect on real compilations for sm_80, sm_90, sm_100 and gfx942 (Triton on the CPU)."""

import dataclasses
import typing

import pytest
import torch

from kernelab import ops
from kernelab.inspect import analyze, analyze_spec, parse_signature, prune, stage
from kernelab.inspect.spec import from_launch
from tests import inspect_kernels as K


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One compile cache for the session's inspect tests (test_inspect_cli.py shares it)."""
    path = tmp_path_factory.getbasetemp() / "inspect-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def _cache_dir(cache, monkeypatch):
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(cache))


def kinds(rep):
    return {f.kind: f for f in rep.findings}


def test_alignment_decides_vector_width():
    # Without 16-divisibility of the pointers and n: one 16-bit access per element.
    (bare,) = analyze_spec(parse_signature(K.copy_kernel, "*fp16,*fp16,i32,BLOCK=1024"))
    assert bare.triton and bare.target == "sm_90"
    assert bare.facts["loads"] == {"16": 8} and bare.facts["stores"] == {"16": 8}
    vec = kinds(bare)["vectorisation"]
    assert vec.severity == "warn" and "x_ptr, out_ptr, n" in vec.message
    assert "become 128-bit" in vec.message
    # Specialised as Triton does at run time for aligned tensors: 128-bit, no finding.
    (hinted,) = analyze_spec(parse_signature(K.copy_kernel, "*fp16:16,*fp16:16,i32:16,BLOCK=1024"))
    assert hinted.facts["loads"] == {"128": 1} and hinted.facts["stores"] == {"128": 1}
    assert "vectorisation" not in kinds(hinted)
    assert hinted.cached  # it was compiled as the counterfactual of the bare kernel


def test_non_unit_stride_is_explained():
    (rep,) = analyze_spec(parse_signature(K.strided_kernel, "*fp16:16,*fp16:16,i32:16,BLOCK=1024"))
    vec = kinds(rep)["vectorisation"]
    assert vec.severity == "info" and "even with every argument 16-divisible" in vec.message
    assert "non-unit stride" in vec.suggestion


def test_dot_uses_each_targets_tensor_cores():
    spec = parse_signature(K.dot_kernel, "*fp16:16,*fp16:16,*fp32:16,M=64,N=64,K=64")
    reps = {r.target: r for r in analyze_spec(spec, ("sm_80", "sm_90", "sm_100", "gfx942"))}
    assert set(reps["sm_80"].facts["tensor_cores"]) == {"mma"}
    assert set(reps["sm_90"].facts["tensor_cores"]) == {"wgmma"}
    assert set(reps["sm_100"].facts["tensor_cores"]) == {"tcgen05"}
    assert set(reps["gfx942"].facts["tensor_cores"]) == {"mfma"}
    for rep in reps.values():
        assert "no-tensor-cores" not in kinds(rep) and rep.facts["dots"] == 1


def test_planted_ieee_dot_loses_tensor_cores():
    spec = parse_signature(K.dot_ieee_kernel, "*fp32:16,*fp32:16,*fp32:16,M=32,N=32,K=32")
    (rep,) = analyze_spec(spec, ("sm_90",))
    assert rep.facts["tensor_cores"] == {}
    assert "wgmma" in kinds(rep)["no-tensor-cores"].message
    verdict = prune(None, "sm_90", report=rep)
    assert not verdict.keep and "loses tensor cores" in verdict.reasons


def test_planted_spills_are_found_and_pruned():
    # 8192 fp32 values over one warp: 256 live values per thread, beyond 255 registers.
    spec = parse_signature(K.row_scale_kernel, "*fp32:16,*fp32:16,BLOCK=8192,num_warps=1")
    (rep,) = analyze_spec(spec, ("sm_90",))
    assert rep.facts["spill_bytes"] > 0 and rep.facts["registers"] == 255
    assert kinds(rep)["spills"].severity == "warn"
    assert any("spills" in r for r in prune(None, "sm_90", report=rep).reasons)


def test_shared_memory_beyond_the_target_cannot_launch():
    # 32 KB of A and B tiles per stage; 7 stages need more than sm_80's 163 KB per block.
    spec = parse_signature(
        K.matmul_kernel, "*fp16:16,*fp16:16,*fp32:16,i32:16,BM=64,BN=64,BK=128,num_stages=7"
    )
    (rep,) = analyze_spec(spec, ("sm_80",))
    assert rep.facts["shared_bytes"] > 163 * 1024
    assert kinds(rep)["shared-limit"].severity == "error" and not rep.ok
    assert rep.occupancy["blocks_per_sm"] == 0
    reasons = prune(None, "sm_80", report=rep).reasons
    assert any("shared memory" in r for r in reasons)
    assert any("cannot reach one block per SM" in r for r in reasons)


def test_32bit_offsets_matter_only_for_large_tensors():
    text = "*fp16:16,*fp16:16,i32:16,BLOCK=1024"
    (small,) = analyze_spec(parse_signature(K.copy_kernel, text, max_elements=1 << 20))
    assert small.facts["offsets_32bit"] == ["out_ptr", "x_ptr"]
    assert "offset-32bit" not in kinds(small)
    (big,) = analyze_spec(parse_signature(K.copy_kernel, text, max_elements=3 << 30))
    f = kinds(big)["offset-32bit"]
    assert f.severity == "warn" and "tl.int64" in f.suggestion
    (unknown,) = analyze_spec(parse_signature(K.copy_kernel, text))
    assert kinds(unknown)["offset-32bit"].severity == "info"


def _rmsnorm_launch(dtype=torch.bfloat16):
    op = ops.get("rmsnorm")
    shape = next(s for s in op.shapes("representative") if s.dims["cols"] == 4096)
    return op, shape, op.launches(shape, dtype)[0]


def test_rmsnorm_default_launch_is_clean_and_int64_indexed():
    _, _, launch = _rmsnorm_launch()
    rep = analyze(launch, "sm_90")
    assert rep.findings == [] and rep.ok
    assert set(rep.facts["loads"]) == {"128"} and rep.facts["spill_bytes"] == 0
    assert rep.facts["offsets_32bit"] == []  # rows are int64 in the kernel
    assert rep.occupancy["occupancy"] > 0
    assert prune(launch, "sm_90", report=rep).keep
    # The same launch without the divisibility Triton would specialise loses its vectors.
    bare = analyze(dataclasses.replace(launch, divisible_16=()), "sm_90")
    assert "vectorisation" in kinds(bare) and "128" not in bare.facts["loads"]


def test_source_key_follows_the_kernel_source(tmp_path):
    from tests.mutants import mutate

    spec = from_launch(_rmsnorm_launch()[2])
    mutant = mutate(spec.kernel, "tl.rsqrt(", "1.0 / tl.sqrt(", tmp_path, count=3)
    assert dataclasses.replace(spec, kernel=mutant).source_key() != spec.source_key()


def test_run_stage_cell(monkeypatch):
    op = ops.get("rmsnorm")
    report = stage([op], None)
    cell = report.cells[("rmsnorm", "kernelab")]
    assert cell.status == "pass", cell.text
    assert "128-bit" in cell.text and "0 spills" in cell.text and "occ" in cell.text


class _MatmulOp:
    """An op-shaped object whose one launch needs more shared memory than sm_90 has."""

    name = "planted_matmul"
    dtypes = (torch.bfloat16,)
    variants: typing.ClassVar[dict] = {}
    tuning_space = None

    def shapes(self, shape_set):
        return [ops.Shape("one tile", {"k": 4096})]

    def inputs(self, *args, **kwargs):
        raise NotImplementedError  # sizes unknown: inspect still runs

    def launches(self, shape, dtype, config=None):
        spec = parse_signature(
            K.matmul_kernel, "*bf16:16,*bf16:16,*fp32:16,i32:16,BM=64,BN=64,BK=128,num_stages=9"
        )
        return [
            ops.Launch(spec.kernel, spec.signature, spec.constexprs, 4, 9, (1,),
                       divisible_16=spec.divisible_16)
        ]  # fmt: skip


def test_run_stage_fails_an_op_that_cannot_launch():
    report = stage([_MatmulOp()], None)
    cell = report.cells[("planted_matmul", "*")]
    assert cell.status == "fail" and "matmul_kernel" in cell.text
    assert "cannot launch" in cell.text


def test_a_type_the_target_lacks_is_not_a_compile_error():
    """fp8 e4m3fn needs sm_89+: on sm_80 the kernel is 'not for this target', not broken."""
    spec = parse_signature(K.copy_kernel, "*fp8e4nv:16,*fp8e4nv:16,i32:16,BLOCK=1024")
    reps = {r.target: r for r in analyze_spec(spec, ("sm_80", "sm_90"))}
    old = reps["sm_80"]
    assert old.error is None and old.ok and old.facts is None
    assert old.unsupported.startswith("sm_80 has no fp8e4nv (it has ")
    assert "fp8e5" in old.unsupported and "not for this target" in old.summary()
    verdict = prune(None, "sm_80", report=old)  # the tuner never times it there
    assert not verdict.keep and "not for this target" in verdict.reasons[0]
    assert reps["sm_90"].unsupported is None and reps["sm_90"].facts["loads"]


def test_a_real_compile_error_names_its_cause():
    spec = parse_signature(K.broken_kernel, "*fp32:16,BLOCK=64")
    (rep,) = analyze_spec(spec, ("sm_90",))
    assert rep.unsupported is None and not rep.ok
    assert rep.error.startswith("CompilationError:") and "…" in rep.error
    assert "undefined_name" in rep.error


def test_the_gate_tells_unsupported_from_regressed():
    from kernelab.inspect import baseline
    from kernelab.inspect.report import KernelReport

    def rep(key, **kw):
        return KernelReport(key, "op", "k", key.split("/")[2], "", "", triton="3.x", **kw)

    facts = {"registers": 32, "spill_bytes": 0, "loads": {"128": 1}, "stores": {"128": 1}}
    base = baseline.build(
        [
            rep("op/k/sm_80/a", unsupported="sm_80 has no fp8e4nv"),
            rep("op/k/sm_90/b", facts=facts),
            rep("op/k/sm_80/c", unsupported="sm_80 has no fp8e4nv"),
        ]
    )
    now = [
        rep("op/k/sm_80/a", unsupported="sm_80 has no fp8e4nv"),  # as before: nothing to say
        rep("op/k/sm_90/b", unsupported="sm_90 has no fp8e4b8"),  # compiled before: regression
        rep("op/k/sm_80/c", facts=facts),  # now compiles there: an improvement
    ]
    cmp = baseline.compare(now, base)
    assert [r.split(":")[0] for r in cmp.regressions] == ["k on sm_90 [op/k/sm_90/b]"]
    assert "no longer for this target" in cmp.regressions[0]
    assert cmp.improvements == ["k on sm_80 [op/k/sm_80/c]: compiles now"] and cmp.failed
