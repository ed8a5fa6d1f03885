"""Synthetic ledger runs for the report and compare tests (no timing involved)."""

import numpy as np

H200_CEILINGS = {
    "device_key": "NVIDIA H200|132|141GB",
    "bandwidth_bytes_per_s": 4.1e12,
    "bandwidth_source": "measured 2026-11-30 (1 GiB device copy)",
    "flops": {"bfloat16": 7.2e14},
    "flops_source": {"bfloat16": "measured 2026-11-30 (8192³ matmul)"},
}


def provenance(ceilings=H200_CEILINGS, **extra):
    return {
        "device": {"name": "NVIDIA H200", "key": "NVIDIA H200|132|141GB", "spec": "H200 SXM"},
        "versions": {"kernelab": "0.1.0", "torch": "2.x", "triton": "3.x"},
        "git": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
        "bench": {"ceilings": ceilings} if ceilings else {},
        **extra,
    }


def synthetic_cases(seed=0, scale=1.0, op="rmsnorm", variants=("kernelab", "torch", "compile")):
    """An op at four shapes, memory-bound at ~0.5 FLOP/byte, plus a compute-bound op."""
    rng = np.random.default_rng(seed)
    speed = {"kernelab": 1.0, "torch": 2.2, "compile": 1.4}
    cases = []
    for rows in (1, 64, 1024, 8192):
        nbytes = rows * 4096 * 2 * 2 + 4096 * 2
        flops = rows * 4096 * 4.0
        for v in variants:
            t = scale * speed.get(v, 1.2) * (3e-6 + nbytes / 3.2e12)
            s = t * rng.lognormal(0, 0.03, size=40)
            med = float(np.median(s))
            cases.append(
                {
                    "op": op,
                    "variant": v,
                    "shape_key": f"r{rows}c4096",
                    "shape_label": f"rows={rows} cols=4096",
                    "dtype": "bfloat16",
                    "device": "NVIDIA H200|132|141GB",
                    "mode": "cold",
                    "metrics": {
                        "median_s": med,
                        "q1_s": float(np.quantile(s, 0.25)),
                        "q3_s": float(np.quantile(s, 0.75)),
                        "n": 40,
                        "bytes": nbytes,
                        "flops": flops,
                        "gbps": nbytes / med / 1e9,
                        "tflops": flops / med / 1e12,
                        "pct_roofline": 100 * (nbytes / 4.1e12) / med,
                        "bound": "memory",
                        "ceiling_source": "memory: measured; compute: measured",
                    },
                    "flags": [],
                    "samples": s.tolist(),
                }
            )
    for n in (1024, 4096):  # compute-bound: a matmul-like op
        flops, nbytes = 2.0 * n**3, 3 * n * n * 2
        t = flops / 5e14
        s = t * rng.lognormal(0, 0.02, size=30)
        cases.append(
            {
                "op": "gemm",
                "variant": "kernelab",
                "shape_key": f"n{n}",
                "shape_label": f"n={n}",
                "dtype": "bfloat16",
                "device": "NVIDIA H200|132|141GB",
                "mode": "hot",
                "metrics": {"median_s": float(np.median(s)), "bytes": nbytes, "flops": flops},
                "flags": [],
                "samples": s.tolist(),
            }
        )
    return cases
