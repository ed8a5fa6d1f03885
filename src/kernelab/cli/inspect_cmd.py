"""``kernelab inspect``: what the compiler made of each kernel, per target, without a GPU."""

from __future__ import annotations

import time
from pathlib import Path

import click

from kernelab.cli._common import (
    SharedOption,
    doing,
    dtype_option,
    echo,
    emit_json,
    json_option,
    kept,
    op_names,
    plain_progress,
    select_ops,
    target_option,
    user_errors,
)

_SEV = {"error": "bold red", "warn": "yellow", "info": "cyan"}


def register(app: click.Group) -> None:
    @app.command("inspect")
    @click.argument("ops", nargs=-1, callback=op_names)
    @target_option(
        "Comma-separated: sm_80,sm_90,sm_100,gfx942 (Triton kernels), tpu_v5e,tpu_v6e,tpu7x "
        "(Pallas calls, lowered to Mosaic); default: all."
    )
    @click.option("--space", is_flag=True, help="Every config of the tuning space.")
    @dtype_option()
    @click.option("--kernel", help="A user's kernel: path/to/file.py:kernel (@triton.jit).")
    @click.option(
        "--signature",
        help="With --kernel: types, constexprs and options, e.g. "
        "'*fp16:16,*fp16:16,i32:16,BLOCK=1024,num_warps=4' (see kernelab.inspect.signature).",
    )
    @click.option("--check", is_flag=True, help="Fail on regressions vs the baseline.")
    @click.option("--update-baseline", is_flag=True, help="Rewrite the baseline from this run.")
    @click.option(
        "--baseline-file",
        "--baseline",
        "baseline_path",
        cls=SharedOption,
        concept="baseline file",
        hidden_aliases=("--baseline",),
        default="inspect-baseline.json",
        help="Baseline file (JSON) of --check and --update-baseline.",
    )
    @click.option("--jobs", "-j", type=int, help="Compiler processes (default: CPUs).")
    @click.option("--no-cache", is_flag=True, help="Compile even when cached.")
    @click.option(
        "--full",
        is_flag=True,
        help="With --check or --update-baseline: compile every kernel, also those whose "
        "baseline entry has the same cache key (by default they are not compiled again).",
    )
    @click.option("--all", "all_rows", is_flag=True, help="Show every config, not one per kernel.")
    @json_option
    @user_errors
    def inspect_command(
        ops,
        target,
        space,
        dtype,
        kernel,
        signature,
        check,
        update_baseline,
        baseline_path,
        jobs,
        no_cache,
        full,
        all_rows,
        as_json,
    ):
        """Compile kernels for GPU targets on this machine and report registers, spills, shared
        memory, occupancy, load/store widths and tensor-core use, with findings; lower Pallas
        calls for TPU targets and report grid, blocks, semantics and a VMEM estimate.

        OPS are the ops to inspect (default: all).
        """
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from kernelab.cli._common import err_console
        from kernelab.inspect import baseline as bl
        from kernelab.inspect.compile import triton_version
        from kernelab.inspect.report import analyze_spec
        from kernelab.inspect.stage import Inspection, inspect_ops
        from kernelab.inspect.targets import parse_targets

        ops = list(ops)
        targets = parse_targets(target)
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs: expected at least 1, got {jobs}")
        if signature and not kernel:
            raise ValueError("signature: needs --kernel path/to/file.py:kernel")
        if kernel and (check or update_baseline or ops or space):
            raise ValueError("kernel: --kernel inspects one user kernel; drop OPS/--check/--space")
        base = bl.load(baseline_path) if check else None  # a missing baseline fails first
        if update_baseline and not check and not full and Path(baseline_path).is_file():
            base = bl.load(baseline_path)
        if full and not (check or update_baseline):
            raise ValueError("full: goes with --check or --update-baseline")
        # An entry whose cache key is the same as the baseline's is not compiled again: the
        # compilation is deterministic in everything the key covers.
        trust = None if full or no_cache else base
        started = time.perf_counter()
        if kernel:
            from kernelab._loader import load_callable
            from kernelab.inspect.signature import parse_signature

            if not signature:
                raise ValueError("signature: --kernel needs --signature (argument types)")
            spec = parse_signature(
                load_callable(kernel, "kernel", require_callable=False), signature
            )
            if target is None:  # a user's Triton kernel: the GPU targets
                targets = [t for t in targets if not t.is_tpu]
            result = Inspection(
                analyze_spec(spec, targets, use_cache=not no_cache), [], triton_version()
            )
        else:
            selected = select_ops(ops)
            with Progress(
                TextColumn("inspect"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} compiled"),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
                disable=as_json,
            ) as progress:
                task = progress.add_task("compile", total=None)
                if not no_cache:
                    kept("each kernel compiled so far, in the inspect cache (reused next time)")

                plain, tenth = plain_progress(), [-1]

                def tick(d: int, n: int) -> None:
                    progress.update(task, completed=d, total=n)
                    doing(f"compiling: {d}/{n} done")
                    if plain and n and d * 10 // n != tenth[0]:  # a line per tenth done
                        tenth[0] = d * 10 // n
                        echo(f"inspect: {d}/{n} compiled", err=True)

                result = inspect_ops(
                    selected,
                    targets,
                    space=space,
                    dtypes=list(dtype) or None,
                    jobs=jobs,
                    use_cache=not no_cache,
                    progress=tick,
                    trust=trust,
                )
        elapsed = time.perf_counter() - started
        comparison = None
        if check:
            comparison = bl.compare(
                result.reports,
                base,
                ops=[o.name for o in selected],
                targets=[t.name for t in targets],
            )
        if update_baseline:
            subset = bool(ops) or target is not None or bool(dtype) or space
            bl.write(baseline_path, result.reports, merge=subset)
        if as_json:
            emit_json(
                {
                    "triton": result.triton,
                    "seconds": round(elapsed, 2),
                    "skipped": result.skipped,
                    "trusted": result.trusted,
                    "reports": [r.as_dict() for r in result.reports],
                    "check": None if comparison is None else vars(comparison),
                }
            )
        else:
            _print(result, elapsed, all_rows)
            if comparison is not None:
                _print_check(comparison, baseline_path)
            if update_baseline:
                echo(f"baseline written: {baseline_path}")
        if comparison is not None and comparison.failed:
            raise click.exceptions.Exit(1)


def _print(result, elapsed: float, all_rows: bool) -> None:
    from kernelab.cli._common import console

    reps = [r for r in result.reports if r.trusted is None]
    if not all_rows:
        # One row per op/kernel/target: the one with the most findings, then lowest occupancy.
        best: dict[tuple, object] = {}
        for r in reps:
            k = (r.op, r.kernel, r.target)
            score = (len(r.findings) + (10 if not r.ok else 0),
                     -((r.occupancy or {}).get("occupancy", 1.0)))  # fmt: skip
            if k not in best or score > best[k][0]:
                best[k] = (score, r)
        shown = [v[1] for v in best.values()]
    else:
        shown = reps
    gpu = [r for r in shown if not r.is_tpu]
    tpus = [r for r in shown if r.is_tpu]
    if gpu or not (tpus or result.trusted):
        inspect_sheet(result, gpu).print(console)
    if tpus:
        tpu_sheet(tpus).print(console)
    lines = []
    for r in shown:
        for fd in r.findings:
            lines.append(
                [
                    "  ",
                    (fd.severity, _SEV[fd.severity]),
                    f" {r.kernel} {r.target} ",
                    (r.label, "dim"),
                    f": {fd.message}" + (f" → {fd.suggestion}" if fd.suggestion else ""),
                ]
            )
    if lines:
        echo("Findings:")
        for line in lines:
            echo(*line)
    for line in result.skipped:
        echo(("skipped:", "yellow"), f" {line}")
    cached = sum(r.cached for r in reps)
    jax = sorted({(r.facts or {}).get("jax") for r in reps if r.is_tpu} - {None})
    if result.trusted:
        echo(
            (
                f"{result.trusted} of {len(result.reports)} kernel×target×config unchanged since "
                "the baseline (same cache key: kernel source, launch, target, compiler): not "
                "compiled (--full compiles them)",
                "dim",
            )
        )
    echo(
        (
            f"{len(reps)} kernel×target×config, {cached} from cache, {elapsed:.1f} s, "
            f"compiled by triton {result.triton}" + (f", lowered by jax {jax[0]}" if jax else ""),
            "dim",
        )
    )
    if any(r.is_tpu for r in reps):
        echo((TPU_NOTE, "dim"))


def inspect_sheet(result, shown):
    """One group per kernel, one row per target and launch, named by its shape and dtype; the
    shape and the config (long: every constexpr) go under the row when the terminal is
    narrow. The title names the dtypes shown."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    dtypes = [r.key.split("/")[3] for r in result.reports if r.op and r.key.count("/") >= 4]
    dtypes = list(dict.fromkeys(dtypes))
    sheet = Sheet(
        f"kernelab inspect (triton {result.triton})"
        + (f" — dtypes: {', '.join(dtypes)}" if dtypes else ""),
        [
            Col("target"),
            Col("shape, dtype", give="below", step=2),
            Col("regs", right=True),
            Col("spill B", right=True),
            Col("smem KB", right=True),
            Col("occupancy"),
            Col("ld/st bits"),
            Col("tensor cores", give="below", step=4, hide_empty=True),
            Col("config", give="below", step=1),
            Col("note", give="below", step=3, hide_empty=True),
        ],
    )
    group = None
    for r in shown:
        name = f"{r.op}/{r.kernel}" if r.op else r.kernel
        if name != group:
            group = name
            sheet.group(name)
        f = r.facts or {}
        occ = r.occupancy
        if r.error or r.unsupported:
            note = Text(r.error, style="red") if r.error else Text(r.unsupported, style="dim")
            sheet.row(r.target, r.label, "", "", "", "", "", "", r.config, note)
            continue
        sheet.row(
            r.target,
            r.label,
            str(f.get("registers")),
            str(f.get("spill_bytes") or 0),
            f"{f.get('shared_bytes', 0) / 1024:.1f}",
            f"{occ['occupancy']:.0%} {occ['limiter']}" if occ else "?",
            _widths(f),
            "+".join(f"{k}×{v}" for k, v in sorted((f.get("tensor_cores") or {}).items()))
            + (" tma" if f.get("tma") else ""),
            r.config,
            "",
        )
    return sheet


#: What the TPU VMEM column is, printed under the TPU table.
TPU_NOTE = (
    "VMEM ≥: blocks double-buffered (once when Mosaic marks them synchronous) + scratch, padded "
    "to the native tile; Mosaic's internal scratch and the layouts libtpu assigns (not "
    "available here) come on top. Limit: the call's vmem_limit_bytes (-: XLA's default)."
)


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _blocks(f: dict) -> str:
    parts = []
    for w in f.get("windows", []):
        shape = "×".join(str(d) for d in w["block"]) if w.get("block") else "HBM"
        parts.append(f"{'in' if w['role'] == 'in' else 'out'} {shape} {w['dtype']}")
    return ", ".join(parts)


_SEM = {"parallel": "par", "arbitrary": "arb", "core_parallel": "core"}


def tpu_sheet(shown):
    """One group per kernel, one row per TPU target and launch: grid, semantics, blocks, the
    VMEM estimate and limit (MiB)."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    sheet = Sheet(
        "kernelab inspect — Pallas calls lowered for TPU (Mosaic)",
        [
            Col("target"),
            Col("shape, dtype", give="below", step=2),
            Col("grid", right=True),
            Col("semantics", give="below", step=3),
            Col("VMEM ≥ MiB", right=True),
            Col("limit", right=True),
            Col("blocks", give="below", step=1),
            Col("note", give="below", step=4, hide_empty=True),
        ],
    )
    group = None
    for r in shown:
        name = f"{r.op}/{r.kernel}" if r.op else r.kernel
        if name != group:
            group = name
            sheet.group(name)
        f = r.facts or {}
        if r.error:
            sheet.row(r.target, r.label, "", "", "", "", "", Text(r.error, style="red"))
            continue
        sheet.row(
            r.target,
            r.label,
            "×".join(str(g) for g in f.get("grid", [])) or "1",
            ",".join(_SEM.get(x, x) for x in f.get("semantics", [])) or "-",
            _mib(f.get("vmem_estimate_bytes")),
            _mib(f.get("vmem_limit_bytes")),
            _blocks(f),
            "",
        )
    return sheet


def _widths(f: dict) -> str:
    def fmt(d):
        return ",".join(d) or "-"

    return f"{fmt(f.get('loads', {}))}/{fmt(f.get('stores', {}))}"


def _print_check(c, path: str) -> None:

    for note in c.notes:
        echo((note, "dim"))
    if c.new:
        echo((f"{len(c.new)} not in the baseline (new)", "cyan"))
    if c.missing:
        echo((f"{len(c.missing)} in the baseline but not inspected now", "yellow"))
    for line in c.improvements:
        echo(("improved:", "green"), f" {line}")
    if c.regressions:
        echo((f"{len(c.regressions)} regression(s) against {path}:", "bold red"))
        for line in c.regressions:
            echo("  ", ("✗", "red"), f" {line}")
    else:
        echo((f"✓ no regressions against {path}", "green"))
