"""Ceilings, floors and the roofline: datasheet vs measured, and which one a result used."""

import pytest
import torch

from kernelab.bench import floors, roofline
from kernelab.hardware import DEVICES, detect, lookup
from kernelab.ops import RMSNORM, Cost

H200 = lookup("h200")


def test_datasheet_ceilings_of_h200():
    c = roofline.datasheet(H200)
    assert c.bandwidth == pytest.approx(4.8e12)
    assert c.peak(torch.bfloat16) == (pytest.approx(989e12), "datasheet H200 SXM")
    assert c.peak("float32")[0] == pytest.approx(67e12)
    assert not c.measured and "datasheet H200 SXM" in c.source(torch.bfloat16)


def test_measured_ceilings_replace_datasheet_and_say_so():
    info = detect("cpu")
    stored = {
        roofline.COPY: {"value": 1e10, "unit": "B/s", "source": "copy", "measured": "2026-01-02"},
        roofline.MATMUL + "float32": {
            "value": 2e11,
            "unit": "FLOP/s",
            "source": "matmul",
            "measured": "2026-01-02",
        },
    }
    c = roofline.resolve(info, stored)
    assert c.bandwidth == 1e10 and c.measured
    assert c.peak(torch.float32) == (2e11, "measured 2026-01-02 (matmul)")
    assert c.peak(torch.bfloat16) == (None, "none")
    bare = roofline.resolve(info)
    assert bare.bandwidth is None and bare.bandwidth_source == "none"


def test_roofline_numbers_and_bound():
    c = roofline.Ceilings("d", 1e12, "sheet", {"float32": 1e13}, {"float32": "sheet"})
    mem = roofline.roofline(Cost(flops=1e6, bytes=1e9), 2e-3, c, torch.float32)
    assert mem["bound"] == "memory" and mem["floor_s"] == pytest.approx(1e-3)
    assert mem["gbps"] == pytest.approx(500.0) and mem["pct_roofline"] == pytest.approx(50.0)
    assert not mem["below_floor"]
    comp = roofline.roofline(Cost(flops=1e11, bytes=1e6), 5e-3, c, torch.float32)
    assert comp["bound"] == "compute" and comp["tflops"] == pytest.approx(20.0)
    assert comp["below_floor"]  # 5 ms for work that needs 10 ms at the peak


def test_below_floor_slack_only_for_measured_ceilings():
    cost = Cost(flops=0, bytes=1e9)
    sheet = roofline.Ceilings("d", 1e12, "datasheet X")
    measured = roofline.Ceilings("d", 1e12, "measured now")
    assert roofline.roofline(cost, 0.95e-3, sheet, torch.float32)["below_floor"]
    assert not roofline.roofline(cost, 0.95e-3, measured, torch.float32)["below_floor"]
    assert roofline.roofline(cost, 0.8e-3, measured, torch.float32)["below_floor"]
    # hot data that fits in cache is held to the compute term only
    assert not roofline.roofline(cost, 1e-6, sheet, torch.float32, in_cache=True)["below_floor"]


def test_no_ceiling_means_no_floor():
    r = roofline.roofline(Cost(1e6, 1e6), 1e-3, roofline.Ceilings("cpu"), torch.float32)
    assert r["floor_s"] is None and r["pct_roofline"] is None and not r["below_floor"]
    assert r["gbps"] == pytest.approx(1.0)
    assert r["ceiling_source"] == "memory: none; compute: none"


def test_h200_floors_for_every_representative_shape():
    rows = floors(H200, [RMSNORM], dtypes=(torch.bfloat16,))
    assert len(rows) == len(RMSNORM.shapes("representative"))
    for r, shape in zip(rows, RMSNORM.shapes("representative"), strict=True):
        n = shape.dims["rows"] * shape.dims["cols"]
        nbytes = 2 * n * 2 + shape.dims["cols"] * 2 + (2 * n * 2 if shape.params["residual"] else 0)
        assert r["bytes"] == nbytes and r["bound"] == "memory"
        assert r["floor_s"] == pytest.approx(nbytes / 4.8e12)
        assert r["shape_label"] == shape.label


def test_every_table_device_gives_ceilings():
    for spec in DEVICES:
        c = roofline.datasheet(spec)
        assert c.bandwidth > 0 and c.peak("bfloat16")[0] > 0
        if spec.vendor == "google":  # no fp32 peak is published (the MXU multiplies bf16)
            assert c.peak("float32") == (None, "none"), spec.name
        else:
            assert c.peak("bfloat16")[0] > c.peak("float32")[0] > 0, spec.name


def test_measure_ceilings_on_cpu_with_small_sizes():
    bw = roofline.measure_copy("cpu", 1 << 20, samples=3)
    fl = roofline.measure_matmul("cpu", 64, torch.float32, samples=3)
    assert bw > 0 and fl > 0


def test_cpu_ceilings_are_the_best_of_stored_and_measured_now(tmp_path, monkeypatch):
    """A CPU ceiling stored in a slow moment would mark honest runs below the floor: a CPU is
    measured at each call and the better value wins (and is stored); a better stored one stays."""
    from kernelab import ledger
    from kernelab.bench import api

    fresh = {"copy_bytes_per_s": 2e10, "matmul_flops_float32": 1e11}
    rows = [{"name": k, "value": v, "unit": "x", "source": "test"} for k, v in fresh.items()]
    monkeypatch.setattr(api.roofline, "measure", lambda info, cache, progress=None: rows)
    info = detect("cpu")
    db = ledger.open(url=str(tmp_path / "l.db"))
    c, note = api.ceilings_for(info, db)
    assert c.bandwidth == 2e10 and "measured them now" in note
    db.put_ceiling(info.key, "copy_bytes_per_s", 3e9, "B/s", "a slow moment")
    db.put_ceiling(info.key, "matmul_flops_float32", 5e11, "FLOP/s", "a fast moment")
    c, note = api.ceilings_for(info, db)
    assert c.bandwidth == 2e10 and c.peak("float32")[0] == 5e11
    assert "higher than stored: copy_bytes_per_s" in note
    assert db.ceilings(info.key)["copy_bytes_per_s"]["value"] == 2e10
    assert db.ceilings(info.key)["matmul_flops_float32"]["value"] == 5e11
    # Not measuring: the stored values as they are.
    c, note = api.ceilings_for(info, db, measure_if_missing=False)
    assert c.bandwidth == 2e10 and note == ""


@pytest.mark.parametrize("shape_set", ["representative", "edge"])
def test_floors_from_shapes_alone_for_every_op(shape_set):
    """Floors come from meta inputs: no op's cost model may read data off a meta tensor."""
    from kernelab import ops

    for op in ops.all_ops():
        rows = floors(H200, [op], shape_set)
        assert len(rows) == len(op.shapes(shape_set)) * len(op.dtypes), op.name
        for r in rows:
            assert r["bytes"] >= 0 and r["flops"] >= 0, (op.name, r["shape_label"])
            assert r["floor_s"] is not None and r["floor_s"] >= 0, (op.name, r["shape_label"])


def test_block_sparse_floor_on_meta_counts_the_same_work_as_real_inputs():
    """The block mask skips work by its data: meta inputs carry it (on the CPU), so the floor
    from shapes alone is the floor of the inputs a bench run times."""
    from kernelab.ops import ATTENTION_PREFILL as op

    (shape,) = [s for s in op.shapes("edge") if s.params.get("block_sparse")]
    meta = op.inputs(shape, torch.float16, "meta")
    real = op.inputs(shape, torch.float16, "cpu")
    assert meta["q"].is_meta and not meta["block_mask"].is_meta
    assert torch.equal(meta["block_mask"], real["block_mask"])
    assert op.cost(meta) == op.cost(real)
    dense = op.cost({**real, "block_mask": None})
    assert op.cost(meta).flops < dense.flops  # the mask's skipped blocks are counted


def _meta_cost(op_name: str, params: dict | None = None):
    from kernelab.core import Shape
    from kernelab.ops import get

    op = get(op_name)
    shape = Shape("big", {"M": 4096, "N": 4096, "K": 4096}, params or {}, batch_dim="M")
    return op.cost(op.inputs(shape, torch.bfloat16, "meta", seed=0))


@pytest.mark.parametrize(
    ("op_name", "params", "device", "peak"),
    [
        ("fp8_gemm", {}, "h200", 1979e12),
        ("fp8_block_gemm", {}, "h200", 1979e12),
        ("mx_gemm", {"fmt": "mxfp8", "quantize_a": True}, "b200", 4500e12),
        ("mx_gemm", {"fmt": "mxfp4", "quantize_a": True}, "b200", 9000e12),
        ("nvfp4_gemm", {"quantize_a": True}, "b200", 9000e12),
        # no fp4 tensor cores on an H200: e2m1 converts exactly to e4m3, the fp8 rate bounds
        ("nvfp4_gemm", {"quantize_a": True}, "h200", 1979e12),
        # weight-only: the weights are upcast, the multiplies run in bfloat16
        ("mx_gemm", {"fmt": "mxfp4"}, "b200", 2250e12),
        ("nvfp4_gemm", {}, "b200", 2250e12),
    ],
)
def test_low_precision_gemms_are_bounded_by_their_operands_format(op_name, params, device, peak):
    """A bfloat16-output GEMM on e4m3 or e2m1 operands runs at that format's rate: its compute
    floor is read there, so an honest time between the fp8 and the bf16 floor stays plausible."""
    cost = _meta_cost(op_name, params)
    c = roofline.datasheet(lookup(device))
    got, _ = c.compute_peak(cost, torch.bfloat16)
    assert got == pytest.approx(peak)
    floor = roofline.roofline(cost, 1.0, c, torch.bfloat16)["floor_s"]
    assert floor == pytest.approx(max(cost.flops / peak, cost.bytes / c.bandwidth))
    # the time of a kernel at 90 % of its format's peak is no impossible time
    honest = roofline.roofline(cost, cost.flops / (0.9 * peak), c, torch.bfloat16)
    assert honest["below_floor"] is False


def test_a_cost_without_compute_format_keeps_the_case_dtype():
    c = roofline.datasheet(H200)
    assert c.compute_peak(Cost(1e12, 1e9), torch.bfloat16) == (pytest.approx(989e12), "bfloat16")
    assert c.compute_peak(Cost(1e12, 1e9, "float4_e2m1fn_x2"), "bfloat16")[1] == "float8_e4m3fn"


class _FakeCopy:
    """A host copy on a fake clock: each chunk takes ``ns_per_byte`` (by thread count) except
    every ``preempt``-th, which is cut by a time slice of another process (100x longer)."""

    def __init__(self, n, ns_per_byte, preempt=0):
        self.n, self.ns_per_byte, self.preempt = n, ns_per_byte, preempt
        self.now, self.chunks = 0, 0

    def numel(self):
        return self.n

    def __getitem__(self, sl):
        return self

    def copy_(self, other):
        self.chunks += 1
        per = self.ns_per_byte[torch.get_num_threads() == 1]
        slow = 100 if self.preempt and self.chunks % self.preempt == 0 else 1
        self.now += int(roofline.COPY_CHUNK * per * slow)

    def clock(self):
        return self.now


def _fake_rate(monkeypatch, ns_per_byte, preempt=0, threads=2):
    fake = _FakeCopy(64 * roofline.COPY_CHUNK, ns_per_byte, preempt)
    monkeypatch.setattr(roofline.time, "perf_counter_ns", fake.clock)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rate = roofline._host_copy_rate(fake, fake, passes=2)
        assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    return rate


def test_cpu_copy_ceiling_ignores_chunks_cut_by_other_processes(monkeypatch):
    """One chunk in three preempted (a loaded host): the rate is the unpreempted chunks', where
    the whole copy's would be ~34x lower."""
    rate = _fake_rate(monkeypatch, (0.1, 0.1), preempt=3)
    assert rate == pytest.approx(2 / 0.1 * 1e9)


def test_cpu_copy_ceiling_is_the_best_of_all_threads_and_one(monkeypatch):
    """With another process busy on a core, a copy split over both waits for its slowest part
    while a one-thread kernel is not slowed: the ceiling takes the better of the two."""
    rate = _fake_rate(monkeypatch, (0.4, 0.1))  # (all threads, one thread) ns per byte
    assert rate == pytest.approx(2 / 0.1 * 1e9)
