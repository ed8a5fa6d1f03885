"""A verify run as the ledger stores it: one case row per case checked.

Each row keys the case as bench does (op, variant, shape key, dtype, device) with mode
"verify"; its metrics hold the verdict (``passed``, ``failure_class``), the worst error and the
bound it was held to (``error``, ``tolerance``, ``tolerance_source``, their ratio
``worst_ratio``), the shape set, the run seed (with it and the same selection the run repeats
exactly: ``kernelab verify ... --seed S``) and the whole case (``result``: every measure,
failure and trial seed); its flags are the failure classes.
"""

from __future__ import annotations


def ledger_cases(report, device: str) -> list[dict]:
    """The cases of ``report`` (a :class:`kernelab.verify.Report`) as ledger case rows, with
    ``device`` the device key stored for each."""
    cases = []
    for c in report.cases:
        d = c.as_dict()
        worst = max(c.measures.values(), key=lambda m: m.ratio, default=None)
        cases.append(
            {
                "op": c.op,
                "variant": c.variant,
                # a user's op has no sizes: its label names the inputs it was given
                "shape_key": c.shape_key or f"label={c.shape}",
                "shape_label": c.shape,
                "dtype": c.dtype,
                "device": device,
                "mode": "verify",
                "metrics": {
                    "passed": c.passed,
                    "failure_class": c.failure_class,
                    "worst_ratio": d["worst_ratio"],
                    "error": None if worst is None else worst.as_dict()["rel_l2"],
                    "tolerance": None if worst is None else worst.tolerance,
                    "tolerance_source": None if worst is None else worst.tolerance_source,
                    "target": None if worst is None else worst.target,
                    "shape_set": c.shape_set,
                    "seed": report.seed,
                    "seconds": d["seconds"],
                    "result": d,
                },
                "flags": c.classes,
            }
        )
    return cases


def run_provenance(report, **extra) -> dict:
    """What a verify run's provenance holds beside the device and versions: the seed, the
    trials, the shape sets and what was skipped."""
    return {
        "verify": {
            "seed": report.seed,
            "trials": report.trials,
            "shape_sets": list(report.shape_sets),
            "skipped": list(report.skipped),
            **extra,
        }
    }
