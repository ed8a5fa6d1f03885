import json

import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.hardware import detect, lookup, occupancy
from kernelab.hardware.tpu import TPU_LIMITS, native_tile


def test_occupancy_worked_check_from_the_hardware_table():
    # 100 registers, 128 threads, 96 KB shared memory
    h = occupancy("sm_90", 128, 100, 96 * 1024)
    assert (h.blocks_per_sm, h.limiter, h.occupancy) == (2, "shared", 0.125)
    a = occupancy("sm_80", 128, 100, 96 * 1024)
    assert (a.blocks_per_sm, a.limiter) == (1, "shared")


def test_small_kernel_is_warp_limited_at_full_occupancy():
    o = occupancy("sm_90", 128, 20, 0)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (16, "warps", 1.0)


def test_register_limit_rounds_per_warp_allocation():
    # 255 registers: 255*32 -> 8192 per warp; 2 warps per sub-partition -> 8 warps per SM
    o = occupancy("sm_90", 256, 255, 0)
    assert (o.blocks_per_sm, o.limiter) == (1, "registers")


def test_shared_memory_beyond_the_block_limit_cannot_launch():
    o = occupancy("sm_80", 128, 32, 200 * 1024)
    assert o.blocks_per_sm == 0 and o.limiter.startswith("none")


def test_gfx942_from_vgprs_and_lds():
    o = occupancy("gfx942", 256, 128, 16 * 1024)  # 4 waves; 4 waves/SIMD by VGPRs -> 4 blocks
    assert (o.blocks_per_sm, o.limits["shared"]) == (4, 4)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="arch: expected one of"):
        occupancy("sm_75", 128, 32)
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy("sm_90", 128, -1)


def test_lookup_matches_by_name_and_sm_count():
    assert lookup("NVIDIA H100 80GB HBM3", sm_count=132).name == "H100 SXM"
    assert lookup("NVIDIA H100 PCIe", sm_count=114) is None  # not the SXM part
    assert lookup("NVIDIA H200", sm_count=132).hbm_bytes_per_s == 4.8e12
    assert lookup("AMD Instinct MI300X").arch == "gfx942"
    assert lookup("Tesla V100-SXM2-16GB") is None


def test_detect_cpu():
    info = detect("cpu")
    assert info.type == "cpu" and info.threads >= 1
    with pytest.raises(ValueError, match="device: expected"):
        detect("tpu")


def test_tpu_rows_of_the_device_table_carry_their_source():
    v6e = lookup("tpu_v6e")
    assert v6e.peak_for("bf16") == 918e12 and v6e.hbm_bytes_per_s == 1640e9
    assert "cloud.google.com/tpu/docs/v6e" in v6e.source
    assert lookup("TPU v5 lite").name == "TPU v5e" and lookup("ironwood").name == "TPU7x"
    assert lookup("tpu_v5p").peak_for("int8") is None  # not published on its page
    assert lookup("tpu7x").sm_count == 2 and lookup("tpu7x").l2_bytes is None


def test_tpu_limits_and_native_tiles():
    assert [native_tile(b) for b in (32, 16, 8)] == [(8, 128), (16, 128), (32, 128)]
    assert TPU_LIMITS["tpu7x"].vmem_bytes == 64 * 2**20 and not TPU_LIMITS["tpu7x"].megacore
    assert TPU_LIMITS["tpu_v5p"].megacore and TPU_LIMITS["tpu_v5e"].device_kind == "TPU v5 lite"
    for name, lim in TPU_LIMITS.items():  # each chip of the table has its device row
        assert lookup(name).sm_count == lim.tensor_cores


def test_floors_for_a_tpu_are_datasheet_figures():
    result = CliRunner().invoke(app, ["bench", "rmsnorm", "--floors-for", "tpu_v6e", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == "TPU v6e" and data["floors"]
    assert all(
        r["floor_s"] > 0 and "datasheet TPU v6e" in r["ceiling_source"] for r in data["floors"]
    )
