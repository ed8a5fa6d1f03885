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


def _verify_case(op, variant, label, dtype, ratio, classes=(), message="values differ"):
    """A verify case as ``kernelab sweep`` records it (``kernelab.sweep.work._verify``)."""
    failures = [
        {"class": c, "target": "out", "message": message, "indices": [[0, 3]], "got": [1.5],
         "expected": [1.0], "trial": 0, "call": "first"}
        for c in classes
    ]  # fmt: skip
    result = {
        "op": op, "variant": variant, "shape_set": "edge", "shape": label,
        "shape_key": label.replace(" ", "").replace("=", ""), "dtype": dtype,
        "passed": not classes, "failure_class": classes[0] if classes else None,
        "classes": list(classes), "worst_ratio": ratio, "trials": [], "measures": [],
        "failures": failures, "notes": [], "seconds": 0.01,
    }  # fmt: skip
    return {
        "op": op,
        "variant": variant,
        "shape_key": result["shape_key"],
        "shape_label": label,
        "dtype": dtype,
        "device": "cpu",
        "mode": "verify",
        "metrics": {
            "passed": not classes,
            "failure_class": result["failure_class"],
            "worst_ratio": ratio,
            "result": result,
        },
        "flags": list(classes),
    }


def verify_cases(op="rmsnorm", variant="candidate", label_prefix=""):
    """rmsnorm: kernelab passes its four shapes; the candidate fails two of them, one with
    wrong values (ratio 3.25), one with a NaN mismatch and wrong values (ratio NaN).
    softmax: kernelab passes its two shapes."""
    failing = {
        "rows=7": (("wrong values",), 3.25),
        "rows=64": (("NaN mismatch", "wrong values"), "nan"),
    }
    cases = []
    for v in ("kernelab", variant):
        for label in ("rows=1", "rows=7", "rows=64", "rows=0"):
            classes, ratio = failing.get(label, ((), 0.125)) if v == variant else ((), 0.125)
            cases.append(_verify_case(op, v, label_prefix + label, "bfloat16", ratio, classes))
    for label in ("rows=1", "rows=33"):
        cases.append(_verify_case("softmax", "kernelab", label, "float16", 0.5))
    return cases


def _inspect_case(op, kernel, label, target, registers, spills, shared, occ, findings=()):
    """An inspect case as ``kernelab sweep`` records it (``kernelab.sweep.work._inspect``)."""
    found = [{"kind": k, "severity": s, "message": m, "suggestion": ""} for s, k, m in findings]
    report = {
        "key": f"{op}/{kernel}/{target}", "op": op, "kernel": kernel, "target": target,
        "label": label, "config": {"BLOCK": 1024, "num_warps": 4},
        "facts": {"registers": registers, "spill_bytes": spills, "shared_bytes": shared},
        "occupancy": {"occupancy": occ}, "findings": found, "error": None,
        "unsupported": False, "triton": "3.x",
    }  # fmt: skip
    return {
        "op": op,
        "variant": "kernelab",
        "shape_key": label.replace(" ", "").replace("=", ""),
        "shape_label": label,
        "dtype": "bfloat16",
        "device": target,
        "mode": "static",
        "metrics": {
            "kernel": kernel,
            "registers": registers,
            "spill_bytes": spills,
            "shared_bytes": shared,
            "occupancy": occ,
            "report": report,
        },
        "flags": [f"{s}:{k}" for s, k, _ in findings],
    }


def inspect_cases(op="rmsnorm", kernel="_rmsnorm_kernel"):
    """rmsnorm on sm_90 at two shapes (the large one spills) and on sm_80; a clean gemm."""
    spill = ("warn", "spills", "spills 96 bytes per thread")
    return [
        _inspect_case(op, kernel, "rows=64 cols=4096", "sm_90", 40, 0, 0, 1.0),
        _inspect_case(op, kernel, "rows=8 cols=65536", "sm_90", 255, 96, 2048, 0.25, [spill]),
        _inspect_case(op, kernel, "rows=64 cols=4096", "sm_80", 42, 0, 0, 0.75),
        _inspect_case("gemm", "_gemm_kernel", "n=4096", "sm_90", 168, 0, 98304, 0.125,
                      [("info", "occupancy", "occupancy 12% is limited by registers")]),
    ]  # fmt: skip
