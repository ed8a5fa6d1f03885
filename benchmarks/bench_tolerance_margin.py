"""Margin of every 16-bit case to verify's derived tolerance, per op and dtype.

    PYTHONPATH=src python benchmarks/bench_tolerance_margin.py [OP ...] [--seed N]
        [--seeds COUNT] [--no-kernel] [--json]

On each op's representative and edge shapes (batch sizes capped as verify caps them on CPU),
the trials verify draws (the same distributions and seeds, NaN/Inf in the last), for bfloat16
and float16: the relative L2 error of eager torch, of kernelab's own kernel (through the
Triton interpreter on CPU) and of each candidate of benchmarks/candidates/narrowed.py, divided
by the derived bound (``kernelab.verify._tolerance``: the reference's own rounding, the op's
declared narrowings and reduction length). Printed per op, dtype and subject: the worst
(largest) ratio, the smallest, and the cases it fails against verify's tolerance (the bound,
or twice eager torch's error where eager is over it: "eager over" counts those cases).

With ``--seeds COUNT``, a census: the run seeds N, N + 1, ..., each as verify draws it, the
rows summed over them (worst ratio of all, cases and failures added up).

A correct subject stays at or below 1.0; a planted one (one rounding of partial results too
many) fails where eager torch is not over the bound.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import triton

from kernelab.hardware import detect
from kernelab.numerics import error
from kernelab.ops import as_tuple, get
from kernelab.verify._case import derive_seed, distributions_of, expected, inject_specials
from kernelab.verify._runner import cpu_threads, reference_too_big, shapes_for
from kernelab.verify._tolerance import derived_bound

OPS = (
    "gemm",
    "w8a16_gemm",
    "w4a16_gemm",
    "fp8_gemm",
    "fp8_block_gemm",
    "mx_gemm",
    "rmsnorm",
    "layernorm",
    "softmax",
    "merge_attention_states",
    "paged_attention",
)
NARROW = (torch.bfloat16, torch.float16)
TRIALS = 2  # verify's default


def _candidates():
    path = Path(__file__).resolve().parent / "candidates" / "narrowed.py"
    spec = importlib.util.spec_from_file_location("narrowed_candidates", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PLANTED, module.HONEST


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _call(fn, inputs: dict, op, prepare=None) -> dict | None:
    """{target: tensor} for the outputs and in-place arguments, or None if the call raised."""
    args = _clone(inputs)
    kwargs = prepare(dict(args)) if prepare is not None else args
    try:
        with np.errstate(all="ignore"):
            outs = as_tuple(fn(**kwargs))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:80]}"}
    names = list(op.outputs) if len(op.outputs) == len(outs) else [f"out{i}" for i in range(99)]
    got = {n: o for n, o in zip(names, outs, strict=False) if isinstance(o, torch.Tensor)}
    got.update({n: args[n] for n in op.contract.inplace if isinstance(args.get(n), torch.Tensor)})
    return got


def measure(op_name: str, seed: int, kernel: bool) -> list[dict]:
    """One row per (dtype, subject): worst and smallest ratio, cases failed, cases."""
    op = get(op_name)
    planted, honest = _candidates()
    subjects = {}
    if kernel and "kernelab" in op.variants and op.variants["kernelab"].runs_on("cpu")[0]:
        subjects["kernelab"] = op.variants["kernelab"]
    cands = {f"planted: {n}": fn for n, fn in planted.get(op_name, {}).items()}
    cands.update({f"honest: {n}": fn for n, fn in honest.get(op_name, {}).items()})
    baseline = op.variants["torch"].fn
    stats = defaultdict(lambda: {"max": 0.0, "min": float("inf"), "fails": 0, "cases": 0})
    over = defaultdict(int)
    offset = 0
    for shape_set in ("representative", "edge"):
        for shape in shapes_for(op, shape_set, "cpu", None):
            for dtype in (d for d in op.dtypes if d in NARROW):
                if reference_too_big(op, shape, dtype):
                    continue
                case = defaultdict(lambda: [0.0, False, False])  # ratio, fails, measured
                for t in range(TRIALS):
                    dists = distributions_of(op)
                    dist = dists[(offset + t) % len(dists)]
                    tseed = derive_seed(seed, op.name, shape.key, str(dtype), t)
                    inputs = op.inputs(shape, dtype, "cpu", seed=tseed, dist=dist)
                    if t == TRIALS - 1:
                        inject_specials(inputs, tseed, op.contract.special_inputs)
                    exp = expected(op, inputs, baseline, dtype, "cpu")
                    runs = {"eager torch": None}
                    for name, variant in subjects.items():
                        if variant.supports is None or not variant.supports(shape):
                            runs[name] = _call(variant.fn, inputs, op, variant.prepare)
                    for name, fn in cands.items():
                        runs[name] = _call(fn, inputs, op)
                    for target, ref, base, (tol, source), _eager in exp.targets:
                        region = exp.regions.get(target)
                        stored = base.dtype if base is not None else dtype
                        on = inputs if target == op.outputs[0] else None  # its spread
                        bound = derived_bound(op.contract, stored, ref, inputs, region, on)
                        if bound is None:
                            continue
                        if source.startswith("2x eager"):
                            over[dtype] += t == 0
                        for name, got in runs.items():
                            value = base if name == "eager torch" else (got or {}).get(target)
                            if got is not None and "error" in got:
                                case[name][1] = case[name][2] = True
                                continue
                            if not isinstance(value, torch.Tensor):
                                continue
                            g, r = value, ref
                            if region is not None:
                                g, r = value.detach().cpu()[region], ref.detach().cpu()[region]
                            err = error(g, r).rel_l2
                            c = case[name]
                            c[0] = max(c[0], err / bound[0] if bound[0] > 0 else 0.0)
                            c[1] = c[1] or not err <= tol
                            c[2] = True
                offset += TRIALS
                for name, (ratio, fails, measured) in case.items():
                    if not measured:
                        continue
                    s = stats[(dtype, name)]
                    s["max"] = max(s["max"], ratio)
                    if ratio > 0:
                        s["min"] = min(s["min"], ratio)
                    s["fails"] += fails
                    s["cases"] += 1
    rows = []
    for (dtype, name), s in stats.items():
        rows.append(
            {
                "op": op_name,
                "dtype": str(dtype).removeprefix("torch."),
                "subject": name,
                "max_ratio": s["max"],
                "min_ratio": s["min"] if s["min"] != float("inf") else 0.0,
                "fails": s["fails"],
                "cases": s["cases"],
                "eager_over_bound": over[dtype],
            }
        )
    return rows


def _census(rows: list[dict]) -> list[dict]:
    """Rows of several seeds as one per (op, dtype, subject): the worst and smallest ratio of
    all, failures and cases added up."""
    out: dict = {}
    for r in rows:
        key = (r["op"], r["dtype"], r["subject"])
        if key not in out:
            out[key] = dict(r)
            continue
        o = out[key]
        o["max_ratio"] = max(o["max_ratio"], r["max_ratio"])
        o["min_ratio"] = min(o["min_ratio"], r["min_ratio"]) if r["min_ratio"] else o["min_ratio"]
        for k in ("fails", "cases", "eager_over_bound"):
            o[k] += r[k]
    return list(out.values())


def _num(x: float) -> str:
    """A ratio in at most 5 characters: 0.91, 1.4, 134, 4e+04."""
    if x >= 1e4:
        return f"{x:.0e}"
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help=f"ops (default: {' '.join(OPS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="run seeds from --seed on")
    parser.add_argument("--no-kernel", action="store_true", help="leave kernelab's kernels out")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        parser.error(f"ops: expected names among {list(OPS)}, got {unknown}")
    info = detect(None)
    load = os.getloadavg()
    header = {
        "machine": f"{info.type} {info.name}, {os.cpu_count()} cores",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
        f"triton {triton.__version__}",
        "load": [round(x, 2) for x in load],
        "seed": args.seed if args.seeds == 1 else f"{args.seed}..{args.seed + args.seeds - 1}",
    }
    started = time.perf_counter()
    rows = []
    with cpu_threads("cpu"):
        for op in args.ops or OPS:
            for seed in range(args.seed, args.seed + args.seeds):
                rows += measure(op, seed, not args.no_kernel)
            if not args.json:
                print(f"... {op} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    rows = _census(rows)
    header["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps({**header, "rows": rows}, indent=2))
        return
    for k, v in header.items():
        print(f"{k}: {v}")
    print("ratio = relative L2 error / derived bound (worst case, smallest case);")
    print("fails = cases out of verify's tolerance; eager over = cases at 2x eager")
    print()
    print(f"{'op':<22} {'dtype':<8} {'subject':<28} {'max':>5} {'min':>5} {'fails':>7}")
    last = None
    for r in rows:
        key = (r["op"], r["dtype"])
        if key != last:
            print(f"{r['op']:<22} {r['dtype']:<8} (eager over the bound: {r['eager_over_bound']})")
            last = key
        fails = f"{r['fails']}/{r['cases']}"
        print(
            f"{'':<22} {'':<8} {r['subject'][:28]:<28} {_num(r['max_ratio']):>5} "
            f"{_num(r['min_ratio']):>5} {fails:>7}"
        )


if __name__ == "__main__":
    main()
