"""inspect without compiling: parsers, signature syntax, findings rules, the baseline gate."""

import pytest

from kernelab.hardware.occupancy import occupancy
from kernelab.inspect import baseline as bl
from kernelab.inspect import parse
from kernelab.inspect.findings import findings, narrow_accesses, occupancy_of
from kernelab.inspect.report import KernelReport
from kernelab.inspect.signature import parse_signature
from kernelab.inspect.targets import TARGETS, parse_targets
from tests import inspect_kernels as K

PTX = """
	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
	ld.global.L1::evict_last.v2.b32 { %r5, %r6 }, [ %rd2 + 0 ];
	@%p2 ld.global.b16 { %rs1 }, [ %rd3 + 0 ];
	st.global.v4.b32 [ %rd5 + 0 ], { %r17, %r18, %r19, %r20 };
	cp.async.cg.shared.global [ %r40 + 0 ], [ %rd9 + 0 ], 0x10, %r41;
	cp.async.cg.shared.global [ %r42 + 0 ], [ %rd10 + 0 ], 16, %r43;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 1;
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1];
	ld.shared.v4.b32 { %r1, %r2, %r3, %r4 }, [ %r9 + 0 ];
"""
RES = " Function k:\n  REG:72 STACK:8 SHARED:1024 LOCAL:48 CONSTANT[0]:568 TEXTURE:0"
SASS = "  STL [R1], R4 ;\n  LDL R4, [R1] ;\n  LDG.E.128 R4, desc[UR4][R2.64] ;"
GCN = """
	global_load_dwordx4 v[2:5], v[0:1], off
	buffer_load_dwordx2 v[2:3], v18, s[8:11], 0 offen
	global_load_ushort v1, v[0:1], off
	global_store_short_d16_hi v[0:1], v2, off
	v_mfma_f32_32x32x8_f16 a[0:15], v[2:3], v[4:5], a[0:15]
; TotalNumVgprs: 88
    .private_segment_fixed_size: 16
    .group_segment_fixed_size: 8192
    .sgpr_count:     26
    .vgpr_spill_count: 3
    .vgpr_count:     88
"""
TTIR = (
    '  tt.func public @k(%x_ptr: !tt.ptr<f16> loc("x_ptr"(#loc)), '
    '%y_ptr: !tt.ptr<f16> loc("y"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {'
    """
    %c = arith.constant 1024 : i32 loc(#loc12)
    %pid = tt.get_program_id x : i32 loc(#loc13)
    %o0 = arith.muli %pid, %c : i32 loc(#loc12)
    %r = tt.make_range {end = 1024 : i32, start = 0 : i32} : tensor<1024xi32> loc(#loc14)
    %s = tt.splat %o0 : i32 -> tensor<1024xi32> loc(#loc12)
    %o = arith.addi %s, %r : tensor<1024xi32> loc(#loc12)
    %p = tt.splat %x_ptr : !tt.ptr<f16> -> tensor<1024x!tt.ptr<f16>> loc(#loc5)
    %q = tt.addptr %p, %o : tensor<1024x!tt.ptr<f16>>, tensor<1024xi32> loc(#loc5)
    %py = tt.splat %y_ptr : !tt.ptr<f16> -> tensor<1024x!tt.ptr<f16>> loc(#loc5)
    %qy = tt.addptr %py, %r : tensor<1024x!tt.ptr<f16>>, tensor<1024xi32> loc(#loc5)
    %v = tt.load %q : tensor<1024x!tt.ptr<f16>> loc(#loc7)
    %w = tt.load %x_ptr : !tt.ptr<f16> loc(#loc7)
    %d = tt.dot %v, %v, %v : tensor<16x16xf16> * tensor<16x16xf16> -> tensor<16x16xf32>
"""
)


def test_ptx_and_cuobjdump_facts():
    facts = parse.nvidia({"ptx": PTX, "res_usage": RES, "sass": SASS, "shared": 4096})
    assert facts["loads"] == {"16": 1, "64": 1, "128": 3}  # two 16-byte cp.async copies
    assert facts["stores"] == {"128": 1}
    assert facts["registers"] == 72
    assert facts["spill_bytes"] == 56  # LOCAL + STACK
    assert facts["spill_instructions"] == 2
    assert facts["shared_bytes"] == 4096
    assert facts["tensor_cores"] == {"wgmma": 1}
    assert facts["tma"] == 1


def test_amdgcn_facts():
    facts = parse.amd({"amdgcn": GCN, "shared": 0})
    assert facts["loads"] == {"16": 1, "64": 1, "128": 1}
    assert facts["stores"] == {"16": 1}
    assert facts["registers"] == 88 and facts["sgprs"] == 26
    assert facts["spill_bytes"] == 16 and facts["spill_instructions"] == 3
    assert facts["shared_bytes"] == 8192
    assert facts["tensor_cores"] == {"mfma": 1}


def test_ttir_32bit_offsets_dots_and_scalar_loads():
    facts = parse.ttir(TTIR)
    # x_ptr is offset by pid * 1024 in i32; y_ptr only by an arange (bounded by BLOCK).
    assert facts["offsets_32bit"] == ["x_ptr"]
    assert facts["dots"] == 1
    assert facts["scalar_loads"] == 1 and facts["tensor_loads"] == 1
    old = "tensor<1024xi32> loc(#loc5)\n    %py"
    widened = TTIR.replace(old, old.replace("i32", "i64"))
    assert parse.ttir(widened)["offsets_32bit"] == []


def test_signature_syntax():
    spec = parse_signature(K.copy_kernel, "*fp16:16, *fp16:16, n=i32:16, BLOCK=1024, num_warps=8")
    assert dict(spec.signature) == {
        "x_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr",
    }  # fmt: skip
    assert spec.divisible_16 == ("x_ptr", "out_ptr", "n")
    assert dict(spec.constexprs) == {"BLOCK": 1024}
    assert (spec.num_warps, spec.num_stages) == (8, 3)
    sig, consts, attrs = parse_signature(
        K.copy_kernel, "*bf16,*bf16,i32:1,BLOCK=64"
    ).triton_signature()
    assert sig["n"] == "constexpr" and consts["n"] == 1 and attrs == {}
    # The identity is stable text, not Python's hash: a fixed value.
    assert (
        spec.identity()
        == parse_signature(
            K.copy_kernel, "*fp16:16,*fp16:16,i32:16,BLOCK=1024,num_warps=8"
        ).identity()
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("*fp16,*fp16,i32", "constexpr 'BLOCK' needs a value"),
        ("*fp16,*fp16,BLOCK=64", "no type given for runtime parameters ['n']"),
        ("*fp16,*fp16,i32,i32,BLOCK=64", "more types than runtime parameters"),
        ("*half,*fp16,i32,BLOCK=64", "expected a type like"),
        ("*fp16:1,*fp16,i32,BLOCK=64", "':1' applies to integers only"),
        ("*fp16,*fp16,i32,BLOCK=64,bogus=3", "has no parameter 'bogus'"),
        ("*fp16,*fp16,i32,BLOCK=64,num_warps=0", "num_warps: expected a positive int"),
    ],
)
def test_signature_errors_name_the_problem(text, fragment):
    with pytest.raises(ValueError, match="signature") as exc:
        parse_signature(K.copy_kernel, text)
    assert fragment in str(exc.value)


def test_kernel_must_be_a_triton_function():
    with pytest.raises(TypeError, match=r"kernel: expected a @triton\.jit function"):
        parse_signature(lambda x: x, "i32")


def test_targets():
    assert [t.name for t in parse_targets(None)] == [
        "sm_80", "sm_90", "sm_100", "gfx942", "tpu_v5e", "tpu_v6e", "tpu7x"
    ]  # fmt: skip
    assert [t.is_tpu for t in parse_targets("tpu7x,sm_90")] == [True, False]
    assert [t.name for t in parse_targets("gfx942, sm_90")] == ["gfx942", "sm_90"]
    with pytest.raises(ValueError, match="target: expected"):
        parse_targets("sm_75")


def _facts(**kw):
    base = {
        "registers": 32, "spill_bytes": 0, "spill_instructions": 0, "shared_bytes": 0,
        "loads": {"128": 2}, "stores": {"128": 1}, "tensor_cores": {}, "tma": 0, "dots": 0,
        "scalar_loads": 0, "tensor_loads": 2, "offsets_32bit": [], "num_warps": 4,
        "num_stages": 1, "tmem_bytes": 0,
    }  # fmt: skip
    base.update(kw)
    return base


def test_occupancy_worked_checks_through_inspect():
    # HARDWARE.md: 100 registers, 128 threads, 96 KB shared -> 2 blocks on sm_90, 1 on sm_80.
    f = _facts(registers=100, shared_bytes=96 * 1024, num_warps=4)
    assert occupancy_of(f, TARGETS["sm_90"]).blocks_per_sm == 2
    assert occupancy_of(f, TARGETS["sm_80"]).blocks_per_sm == 1
    o = occupancy_of(f, TARGETS["sm_90"])
    assert o.limiter == "shared" and o.occupancy == pytest.approx(0.125)
    # 20 registers, 128 threads, no shared memory: warp-limited at 16 blocks, 100%.
    o = occupancy("sm_90", 128, 20, 0)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (16, "warps", 1.0)


def test_occupancy_findings_suggest_the_change_that_lifts_it():
    f = _facts(registers=100, shared_bytes=96 * 1024, num_warps=4)
    t = TARGETS["sm_90"]
    out = findings(f, t, occupancy_of(f, t), [])
    occ = [x for x in out if x.kind == "occupancy"]
    assert occ and "limited by shared memory" in occ[0].message
    # The suggested size really fits one more block.
    kb = float(occ[0].suggestion.split("≤")[1].split(" KB")[0])
    assert occupancy("sm_90", 128, 100, int(kb * 1024)).blocks_per_sm == 3
    f = _facts(registers=168, num_warps=8)
    out = findings(f, t, occupancy_of(f, t), [])
    regs = next(x for x in out if x.kind == "occupancy")
    r = int(regs.suggestion.split("≤")[1].split(" ")[0])
    assert "registers" in regs.message
    assert occupancy("sm_90", 256, r).blocks_per_sm > occupancy("sm_90", 256, 168).blocks_per_sm


def test_vectorisation_finding_needs_the_aligned_counterfactual():
    t = TARGETS["sm_90"]
    scalar = _facts(loads={"16": 8}, stores={"16": 8})
    aligned = _facts(loads={"128": 1}, stores={"128": 1})
    out = findings(scalar, t, occupancy_of(scalar, t), ["x_ptr"], aligned)
    vec = [x for x in out if x.kind == "vectorisation"]
    assert vec and vec[0].severity == "warn" and "x_ptr" in vec[0].message
    assert "128-bit" in vec[0].message
    assert not [x for x in findings(aligned, t, None, []) if x.kind == "vectorisation"]
    # Scalar loads of single values are not vectorisation losses.
    assert narrow_accesses(_facts(loads={"32": 1, "128": 2}, scalar_loads=1)) == 0


def _report(key="op/k/sm_90/bf16/n=1", triton="3.9.0", **facts):
    return KernelReport(key, "op", "k", key.split("/")[2], "", "", _facts(**facts), triton=triton)


def test_gate_catches_planted_regressions_and_names_them():
    base = bl.build([_report(), _report("op/k/gfx942/bf16/n=1", tensor_cores={"mfma": 4})])
    bad = [
        _report(spill_bytes=64, registers=255, loads={"16": 8}),
        _report("op/k/gfx942/bf16/n=1"),
    ]
    c = bl.compare(bad, base)
    text = "\n".join(c.regressions)
    assert c.failed
    assert "k on sm_90" in text and "spills 0 → 64" in text
    assert "lost vectorisation: widest load 128 → 16 bits" in text
    assert "registers 32 → 255" in text
    assert "k on gfx942" in text and "lost tensor cores: mfma → none" in text
    assert not bl.compare([_report(), _report("op/k/gfx942/bf16/n=1", tensor_cores={"mfma": 4})],
                          base).failed  # fmt: skip


def test_gate_registers_threshold_and_other_triton_versions():
    base = bl.build([_report(registers=100)])
    assert not bl.compare([_report(registers=110)], base).failed  # within 10%
    assert bl.compare([_report(registers=111)], base).failed
    other = bl.compare([_report(registers=200, triton="3.6.0")], base)
    assert not other.failed and "registers not compared" in other.notes[0]
    assert bl.compare([_report(registers=200, spill_bytes=8, triton="3.6.0")], base).failed


def test_gate_new_and_missing_keys_do_not_fail():
    base = bl.build([_report(), _report("op/k/sm_90/bf16/n=2")])
    c = bl.compare([_report(), _report("op/k/sm_90/bf16/n=3")], base)
    assert not c.failed
    assert c.new == ["op/k/sm_90/bf16/n=3"] and c.missing == ["op/k/sm_90/bf16/n=2"]


def test_baseline_is_deterministic_and_parsed_not_executed(tmp_path):
    reps = [_report("op/k/sm_90/bf16/n=2"), _report(), _report("op/k/sm_80/bf16/n=1")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    bl.write(a, reps)
    bl.write(b, list(reversed(reps)))
    assert a.read_bytes() == b.read_bytes()
    assert list(bl.load(a)["entries"]) == sorted(r.key for r in reps)
    bad = tmp_path / "bad.json"
    bad.write_text("__import__('os').system('false')")
    with pytest.raises(ValueError, match=r"baseline: .* is not valid JSON"):
        bl.load(bad)
    bad.write_text('{"format": 99, "entries": {}}')
    with pytest.raises(ValueError, match="format: expected 1"):
        bl.load(bad)
    with pytest.raises(FileNotFoundError, match="baseline: no such file"):
        bl.load(tmp_path / "none.json")


def test_partial_update_keeps_entries_not_inspected(tmp_path):
    path = tmp_path / "b.json"
    bl.write(path, [_report(), _report("op/k/gfx942/bf16/n=1")])
    bl.write(path, [_report(registers=40)], merge=True)
    entries = bl.load(path)["entries"]
    assert entries["op/k/sm_90/bf16/n=1"]["registers"] == 40
    assert "op/k/gfx942/bf16/n=1" in entries
    bl.write(path, [_report()])
    assert list(bl.load(path)["entries"]) == ["op/k/sm_90/bf16/n=1"]


HELPER_FILE = """
import triton
import triton.language as tl


@triton.jit
def helper(x):
    return x + {step}


@triton.jit
def k(p):
    tl.store(p, helper(tl.load(p)))
"""


def test_cache_key_covers_called_helpers(tmp_path):
    import importlib.util

    def load(step):
        path = tmp_path / f"helper_{step}.py"
        path.write_text(HELPER_FILE.format(step=step))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return parse_signature(module.k, "*fp32")

    one, two = load(1), load(2)
    assert one.kernel.src == two.kernel.src  # the kernel itself is the same text
    assert one.identity() == two.identity()
    assert one.source_key() != two.source_key()  # its helper is not


def test_autotuned_kernels_are_unwrapped():
    spec = parse_signature(K.tuned_copy_kernel, "*fp16,*fp16,i32,BLOCK=64")
    assert spec.name == "copy_kernel" and spec.kernel is K.copy_kernel


BLOCK_SCALED_PTX = """
	tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32 [%r1], %rd2, %rd3, %r4, [%r5], [%r6];
	tcgen05.mma.cta_group::1.kind::f16 [%r1], %rd2, %rd3, %r4, %p1;
"""


def test_block_scaled_mma_is_named_and_told_from_emulation():
    facts = parse.nvidia({"ptx": BLOCK_SCALED_PTX, "res_usage": RES, "sass": "", "shared": 0})
    assert facts["tensor_cores"] == {"tcgen05": 2, "tcgen05_block_scale": 1}
    assert facts["mma_instructions"] == [
        "tcgen05.mma.cta_group::1.kind::f16",
        "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32",
    ]
    assert parse.nvidia({"ptx": PTX, "res_usage": RES})["mma_instructions"] == [
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"
    ]
    native = _facts(
        scaled_dots=1, dots=1, **{k: facts[k] for k in ("tensor_cores", "mma_instructions")}
    )
    out = [x for x in findings(native, TARGETS["sm_100"], None, []) if x.kind == "dot-scaled"]
    assert len(out) == 1 and "native" in out[0].message and "mxf4.block_scale" in out[0].message
    wgmma = ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"]
    emulated = _facts(scaled_dots=1, dots=1, tensor_cores={"wgmma": 4}, mma_instructions=wgmma)
    out = [x for x in findings(emulated, TARGETS["sm_90"], None, []) if x.kind == "dot-scaled"]
    assert len(out) == 1 and "emulated on sm_90" in out[0].message and wgmma[0] in out[0].message
    plain = _facts(dots=1, tensor_cores={"wgmma": 4}, mma_instructions=wgmma)
    assert not [x for x in findings(plain, TARGETS["sm_90"], None, []) if x.kind == "dot-scaled"]
