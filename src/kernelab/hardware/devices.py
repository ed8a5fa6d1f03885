"""Device facts: datasheet peaks and limits, and detection of the device at hand.

Figures are dense (no sparsity) datasheet values, taken from the vendors' product pages as
collected in the project's HARDWARE.md. They are leads: where a device is at hand, measured
ceilings (see ``kernelab ceilings``) replace them, and every report says which it used.

A device is keyed by name + multiprocessor count + memory size, because SKUs of one name
differ (an H100 PCIe has 114 SMs and about 2 TB/s; the SXM part 132 SMs and 3.35 TB/s).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
from dataclasses import dataclass, field

TB = 1e12
TF = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet facts for one GPU model (dense peaks, no sparsity)."""

    name: str
    vendor: str  # "nvidia" | "amd" | "google" | "cpu"
    arch: str  # "sm_80", "sm_90", "sm_100", "gfx942", "tpu_v5e", ..., "cpu"
    sm_count: int  # SMs (NVIDIA), CUs (AMD) or TensorCores per chip (TPU)
    memory_gb: float
    hbm_bytes_per_s: float
    l2_bytes: int | None  # None: the device has no such cache (TPUs)
    peak_flops: dict[str, float] = field(default_factory=dict)  # by compute dtype
    aliases: tuple[str, ...] = ()
    #: Where the figures come from, when not HARDWARE.md (the TPU rows: the vendor's pages).
    source: str = "HARDWARE.md"

    def peak_for(self, dtype: str) -> float | None:
        """Peak FLOP/s for a compute dtype name ("bf16", "fp16", "fp8", "tf32", "fp32")."""
        return self.peak_flops.get(_canonical_dtype(dtype))

    def ridge_point(self, dtype: str = "bf16") -> float | None:
        """FLOP per byte where the roofline bends from memory- to compute-bound."""
        peak = self.peak_for(dtype)
        return None if peak is None else peak / self.hbm_bytes_per_s


# Source: HARDWARE.md (NVIDIA A100/H100/H200/B200 and AMD MI300X datasheets); TPUs below. A
# missing "fp8" or "fp4" entry means no tensor cores of that type (A100: neither; H100, H200,
# MI300X: no fp4): kernels in those formats are emulated there and bound by the rate of what
# they upcast to.
DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        "A100 80GB SXM",
        "nvidia",
        "sm_80",
        108,
        80,
        2.039 * TB,
        40 * 2**20,
        {"bf16": 312 * TF, "fp16": 312 * TF, "tf32": 156 * TF, "fp32": 19.5 * TF},
        aliases=("a100",),
    ),
    DeviceSpec(
        "H100 SXM",
        "nvidia",
        "sm_90",
        132,
        80,
        3.35 * TB,
        50 * 2**20,
        {"bf16": 989 * TF, "fp16": 989 * TF, "fp8": 1979 * TF, "tf32": 495 * TF, "fp32": 67 * TF},
        aliases=("h100",),
    ),
    DeviceSpec(
        "H200 SXM",
        "nvidia",
        "sm_90",
        132,
        141,
        4.8 * TB,
        50 * 2**20,
        {"bf16": 989 * TF, "fp16": 989 * TF, "fp8": 1979 * TF, "tf32": 495 * TF, "fp32": 67 * TF},
        aliases=("h200",),
    ),
    DeviceSpec(
        "B200",
        "nvidia",
        "sm_100",
        148,
        180,
        8.0 * TB,
        126 * 2**20,
        {
            "bf16": 2250 * TF,
            "fp16": 2250 * TF,
            "fp8": 4500 * TF,
            # FP4 tensor cores (block-scaled e2m1: mxfp4, nvfp4), dense: half of NVIDIA's HGX
            # B200 figure of 144 PFLOPS with sparsity for eight GPUs (nvidia.com/en-us/
            # data-center/hgx, HGX B200 specifications). Block-scaled mxfp8 runs at the fp8 rate.
            "fp4": 9000 * TF,
            "tf32": 1100 * TF,
            "fp32": 75 * TF,
        },
        aliases=("b200",),
    ),
    DeviceSpec(
        "MI300X",
        "amd",
        "gfx942",
        304,
        192,
        5.3 * TB,
        32 * 2**20,
        {
            "bf16": 1307 * TF,
            "fp16": 1307 * TF,
            "fp8": 2615 * TF,
            "tf32": 654 * TF,
            "fp32": 163 * TF,
        },
        aliases=("mi300x", "mi300"),
    ),
    # TPUs: per chip, from Google Cloud's system-architecture pages (each row names its page).
    # A figure a page does not publish is left out (None), never filled in from elsewhere.
    # VMEM per TensorCore is not on these pages: see kernelab.hardware.tpu.
    DeviceSpec(
        "TPU v5e",
        "google",
        "tpu_v5e",
        1,
        16,
        819e9,
        None,
        {"bf16": 197 * TF, "int8": 393 * TF},
        aliases=("tpu_v5e", "v5e", "tpu v5 lite", "tpu v5e"),
        source="cloud.google.com/tpu/docs/v5e: peak per chip bf16 197 TFLOPs, int8 393 "
        "TFLOPs; HBM2 16 GB, 819 GBps; one TensorCore per chip; fp8 not published",
    ),
    DeviceSpec(
        "TPU v6e",
        "google",
        "tpu_v6e",
        1,
        32,
        1640e9,
        None,
        {"bf16": 918 * TF, "int8": 1836 * TF, "fp8": 918 * TF},
        aliases=("tpu_v6e", "v6e", "trillium", "tpu v6 lite", "tpu v6e"),
        source="cloud.google.com/tpu/docs/v6e: peak per chip bf16 918 TFLOPs, int8 1836 TOPs; "
        "HBM 32 GB, 1640 GBps per chip; one TensorCore per chip; fp8 918 TFLOPs from "
        "cloud.google.com/tpu/docs/tpu7x (its v6e column)",
    ),
    DeviceSpec(
        "TPU v5p",
        "google",
        "tpu_v5p",
        2,
        95 * 2**30 / 1e9,
        2765e9,
        None,
        {"bf16": 459 * TF, "fp8": 459 * TF},
        aliases=("tpu_v5p", "v5p", "tpu v5p", "tpu v5"),
        source="cloud.google.com/tpu/docs/v5p: peak per chip bf16 459 TFLOPs, fp8 459 TFLOPs; "
        "HBM 95 GiB, 2765 GBps per chip; 2 TensorCores per chip; int8 not published",
    ),
    DeviceSpec(
        "TPU7x",
        "google",
        "tpu7x",
        2,
        192 * 2**30 / 1e9,
        7380e9,
        None,
        {"bf16": 2307 * TF, "fp8": 4614 * TF},
        aliases=("tpu7x", "ironwood", "tpu v7x", "tpu_v7x"),
        source="cloud.google.com/tpu/docs/tpu7x: peak per chip bf16 2307 TFLOPs, fp8 4614 "
        "TFLOPs; HBM 192 GiB, 7380 GB/s per chip; 2 TensorCores per chip; int8 not published",
    ),
)

_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "e4m3": "fp8",
    # block-scaled formats run at their element type's tensor-core rate where it is native
    "mxfp8": "fp8",
    "e2m1": "fp4",
    "mxfp4": "fp4",
    "nvfp4": "fp4",
    "tf32": "tf32",
    "int8": "int8",
}


def _canonical_dtype(dtype) -> str:
    text = str(dtype).removeprefix("torch.")
    return _DTYPE_ALIASES.get(text, text)


def lookup(name: str, sm_count: int | None = None, memory_gb: float | None = None):
    """Find the table entry for a device name as drivers and traces spell it.

    ``"NVIDIA H100 80GB HBM3"`` with 132 SMs is the H100 SXM; with 114 SMs it is a PCIe part
    that the table does not hold, and ``None`` is returned rather than a wrong peak.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: expected a device name, got {name!r}")
    text = name.lower()
    for spec in DEVICES:
        keys = (spec.name.lower(), *spec.aliases)
        if not any(re.search(rf"\b{re.escape(k)}\b", text) for k in keys):
            continue
        if sm_count is not None and sm_count != spec.sm_count:
            continue
        if memory_gb is not None and abs(memory_gb - spec.memory_gb) > 0.15 * spec.memory_gb:
            continue
        return spec
    return None


@dataclass(frozen=True)
class DeviceInfo:
    """The device a run happens on, as detected (not necessarily in the table)."""

    type: str  # "cuda" (NVIDIA or ROCm through torch) | "cpu"
    name: str
    vendor: str
    arch: str
    sm_count: int
    memory_gb: float
    spec: DeviceSpec | None  # the datasheet entry, when the table knows this device
    index: int = 0
    threads: int = 0  # host threads torch uses (CPU runs)

    @property
    def key(self) -> str:
        """Stable identity: name + multiprocessor count + memory size."""
        return f"{self.name}|{self.sm_count}|{round(self.memory_gb)}GB"

    def as_dict(self) -> dict:
        return {
            "type": self.type,
            "name": self.name,
            "vendor": self.vendor,
            "arch": self.arch,
            "sm_count": self.sm_count,
            "memory_gb": round(self.memory_gb, 1),
            "spec": None if self.spec is None else self.spec.name,
            "index": self.index,
            "threads": self.threads,
        }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


#: Device nodes a CUDA or ROCm device needs on Linux, one at least: NVIDIA's driver, AMD's KFD,
#: WSL's GPU paravirtualisation.
_ACCELERATOR_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def accelerator_possible() -> bool:
    """Whether torch might see a CUDA/ROCm device here. False only where that is known without
    importing torch: Linux with none of the device nodes a GPU driver makes."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(p) for p in _ACCELERATOR_NODES)


def _cpu_info(threads: int) -> DeviceInfo:
    mem = 0.0
    with contextlib.suppress(ValueError, OSError, AttributeError):
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return DeviceInfo(
        "cpu", _cpu_name(), "cpu", "cpu", os.cpu_count() or 1, mem, None, threads=threads
    )


def detect(device: str | None = None, *, quick: bool = False) -> DeviceInfo:
    """Describe ``device`` ("cpu", "cuda", "cuda:1"; default: the accelerator if any).

    ``quick``: where the answer is the CPU and that is known without torch (``device`` "cpu",
    or none given and no accelerator possible), do not import torch for it; ``threads`` is
    then 0 (unknown) unless torch is loaded already. Commands that run no kernel use it.
    """
    if quick and (device == "cpu" or (device is None and not accelerator_possible())):
        torch = sys.modules.get("torch")
        return _cpu_info(torch.get_num_threads() if torch is not None else 0)
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type == "cpu":
        return _cpu_info(torch.get_num_threads())
    if dev.type != "cuda":
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} was asked for but no CUDA/ROCm device is present")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    is_hip = getattr(torch.version, "hip", None) is not None
    if is_hip:
        arch = getattr(props, "gcnArchName", "gfx").split(":")[0]
        vendor = "amd"
    else:
        arch = f"sm_{props.major}{props.minor}"
        vendor = "nvidia"
    mem_gb = props.total_memory / 2**30
    spec = lookup(props.name, props.multi_processor_count) if props.name else None
    return DeviceInfo(
        "cuda",
        props.name,
        vendor,
        arch,
        props.multi_processor_count,
        mem_gb,
        spec,
        index=index,
        threads=torch.get_num_threads(),
    )
