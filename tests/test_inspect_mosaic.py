"""The Mosaic reader on handwritten text and the gate's TPU entries: no jax needed."""

from __future__ import annotations

import pytest

from kernelab.inspect import baseline as bl
from kernelab.inspect import mosaic as mp
from kernelab.inspect.findings import Finding
from kernelab.inspect.report import KernelReport

MIB = 2**20


# --- the Mosaic reader on its own (no jax) ----------------------------------------------------

TEXT = """module attributes {stable_mosaic.version = 11 : i64} {
  func.func @k(%arg0: i32, %arg1: memref<4xi32, #tpu.memory_space<smem>>, %arg2: memref<64x128xf32, #tpu.memory_space<any>>, %arg3: memref<16x256xbf16, #tpu.memory_space<vmem>>, %arg4: memref<16x256xbf16, #tpu.memory_space<vmem>>, %arg5: memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>, %arg6: memref<3x100xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: 6>, scalar_prefetch = 1 : i64, scratch_operands = 2 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{}, {pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_1, window_bounds = array<i64: 16, 256>}, {transform_indices = @transform_2, window_bounds = array<i64: 16, 256>}]} {
    return
  }
  func.func @transform_1(%arg0: i32, %arg1: memref<4xi32, #tpu.memory_space<smem>>) -> (i32, i32) {
    return %arg0, %arg0 : i32, i32
  }
}"""  # noqa: E501


def test_reader_on_a_handwritten_module():
    call = {
        "mosaic": TEXT,
        "config": {"scoped_memory_configs": [{"memory_space": 1, "offset": 0, "size": 1 << 20}]},
        "operands": ["tensor<4xi32>", "tensor<64x128xf32>", "tensor<96x256xbf16>"],
        "results": ["tensor<96x256xbf16>"],
    }
    f = mp.parse_call(call)
    assert (f["kernel"], f["grid"], f["semantics"]) == ("k", [6], ["arbitrary"])
    hbm, x, out = f["windows"]
    assert (hbm["memory"], hbm["block"], hbm["array"]) == ("any", None, [64, 128])
    assert (x["buffers"], x["array"], out["role"], out["buffers"]) == (1, [96, 256], "out", 2)
    sem, buf = f["scratch"]
    assert sem["dtype"] == "semaphore" and sem["vmem_bytes"] == 0
    assert buf["vmem_bytes"] == 8 * 128 * 4  # 3×100 f32 padded to one 8×128 tile
    assert f["vmem_estimate_bytes"] == 16 * 256 * 2 * (1 + 2) + 8 * 128 * 4
    assert f["vmem_limit_bytes"] == 1 << 20 and f["step_bytes"] == 16 * 256 * 2


@pytest.mark.parametrize(
    "text, match",
    [
        ("module {}", "no kernel function"),
        (TEXT.replace("scratch_operands = 2", "scratch_operands = 5"), "do not cover"),
        (TEXT.replace("16x256xbf16", "?x256xbf16", 1), "dynamic or unknown shape"),
        (TEXT.replace("16x256xbf16", "16x256xq7", 1), "element type 'q7'"),
    ],
)
def test_reader_refuses_text_it_does_not_understand(text, match):
    with pytest.raises(mp.MosaicParseError, match=match):
        mp.parse_call({"mosaic": text})


def test_padding_to_the_native_tile():
    assert mp.padded_bytes([1, 4096], 32) == 8 * 4096 * 4
    assert mp.padded_bytes([8, 128], 16) == 16 * 128 * 2
    assert mp.padded_bytes([32, 256], 8) == 32 * 256
    assert mp.split_top("a<b, c>, d -> e, f(g, h)") == ["a<b, c>", "d -> e", "f(g, h)"]


# --- the gate --------------------------------------------------------------------------------


def _rep(key="op/k/tpu_v6e/bfloat16/s", vmem=MIB, findings=(), error=None):
    facts = None
    if error is None:
        facts = {"grid": [4], "semantics": ["parallel"], "vmem_estimate_bytes": vmem}
    return KernelReport(key, "op", "k", "tpu_v6e", "s", "", facts, None, list(findings), error)


_SMALL = Finding("small-blocks", "warn", "m")
_VMEM = Finding("vmem", "error", "m")


@pytest.mark.parametrize(
    "now, regression",
    [
        (_rep(error="does not lower: ValueError: rule"), "no longer lowers: does not lower"),
        (_rep(vmem=int(1.2 * MIB)), "VMEM estimate 1.00 → 1.20 MiB"),
        (_rep(findings=[_SMALL]), "small-blocks findings 0 → 1"),
        (_rep(findings=[_VMEM]), "can no longer run"),
    ],
)
def test_gate_fails_on_tpu_regressions(now, regression):
    base = bl.build([_rep()])
    c = bl.compare([now], base)
    assert c.failed and any(regression in r for r in c.regressions), c.regressions


def test_gate_passes_unchanged_and_improved_tpu_entries():
    base = bl.build([_rep(vmem=2 * MIB, findings=[_SMALL])])
    assert base["entries"]["op/k/tpu_v6e/bfloat16/s"]["findings"] == {"small-blocks": 1}
    assert base["triton"] == []  # TPU entries bring no triton version
    assert not bl.compare([_rep(vmem=int(2.1 * MIB), findings=[_SMALL])], base).failed
    c = bl.compare([_rep(vmem=MIB)], base)
    assert not c.failed and c.improvements
    broken = bl.build([_rep(error="does not lower: x")])
    assert bl.compare([_rep()], broken).improvements == [
        "k on tpu_v6e [op/k/tpu_v6e/bfloat16/s]: lowers now"
    ]


def test_adding_tpu_entries_keeps_the_triton_entries_and_their_version(tmp_path):
    path = tmp_path / "baseline.json"
    facts = {"registers": 32, "loads": {"128": 1}, "stores": {"128": 1}}
    triton = KernelReport(
        "op/k/sm_90/bfloat16/s", "op", "k", "sm_90", "s", "", facts, triton="3.9.0"
    )
    bl.write(path, [triton])
    bl.write(path, [_rep()], merge=True)
    data = bl.load(path)
    assert data["triton"] == "3.9.0"
    assert sorted(data["entries"]) == ["op/k/sm_90/bfloat16/s", "op/k/tpu_v6e/bfloat16/s"]


def test_without_jax_the_tpu_targets_say_why_and_the_gpu_ones_still_plan(monkeypatch):
    from kernelab import ops
    from kernelab.core.runtime import pallas
    from kernelab.inspect.ops import plan
    from kernelab.inspect.targets import parse_targets

    monkeypatch.setattr(
        pallas, "available", lambda: (False, "jax not installed: " + pallas.INSTALL)
    )
    p = plan([ops.get("rmsnorm")], parse_targets("sm_90,tpu_v5e"), dtypes=["bfloat16"])
    assert p.jobs and {j.target.name for j in p.jobs} == {"sm_90"}
    assert any("Pallas variants not lowered: jax not installed" in s for s in p.skipped)


def test_a_tampered_tpu_entry_is_read_as_zero_not_a_crash():
    base = bl.build([_rep()])
    entry = base["entries"]["op/k/tpu_v6e/bfloat16/s"]
    entry["vmem_estimate_bytes"], entry["findings"] = "lots", {"small-blocks": "x"}
    c = bl.compare([_rep(findings=[_SMALL])], base)
    where = "k on tpu_v6e [op/k/tpu_v6e/bfloat16/s]"
    assert c.regressions == [  # fails safe: the junk counts as nothing
        f"{where}: VMEM estimate 0.00 → 1.00 MiB (more than 10%)",
        f"{where}: small-blocks findings 0 → 1",
    ]
