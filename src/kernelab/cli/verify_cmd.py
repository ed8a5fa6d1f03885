"""``kernelab verify``: correctness of ops' variants, of a user's kernel, and of the ops'
own contracts (``--audit``). Exit code 0 only if everything passed."""

from __future__ import annotations

import click

from kernelab.cli._common import (
    candidate_option,
    check_custom,
    device_option,
    doing,
    dtype_option,
    emit_json,
    inputs_option,
    json_option,
    label_option,
    ledger_option,
    lost,
    max_rows_option,
    no_ledger_option,
    op_names,
    op_option,
    reference_option,
    shape_set_option,
    spinner,
    store_run,
    unstored,
    user_errors,
    variant_option,
)

SHAPE_CHOICES = ("representative", "edge", "all")


#: Full-size cuts listed one a line up to this many (otherwise counted; --json lists each).
CUT_SHOWN = 10


def _check_options(ops, candidate, op, reference, inputs, audit, shapes) -> None:
    for s in shapes:
        if s not in SHAPE_CHOICES:
            raise ValueError(f"--shapes: expected one of {list(SHAPE_CHOICES)}, got {s!r}")
    if check_custom(candidate, op, ops, reference, inputs):
        pass
    elif candidate is not None and op is None:
        raise ValueError(
            "--candidate: expected --op NAME (a registered op) or --reference and --inputs"
        )
    elif op is not None and candidate is None:
        raise ValueError("--op: expected --candidate file.py:function with it")
    if candidate is not None and ops:
        raise ValueError(f"--candidate: checks one op (--op), not op names {ops}")
    if audit and (candidate is not None):
        raise ValueError("--audit: audits registered ops; not with --candidate")


def register(app: click.Group) -> None:
    @app.command("verify")
    @click.argument("ops", nargs=-1, callback=op_names)
    @variant_option(
        "Variant(s) to verify, repeatable or comma-separated (default: all that run here, "
        "except compile on CPU)."
    )
    @shape_set_option(
        multiple=True,
        help="representative, edge or all; repeatable or comma-separated (default: "
        "representative and edge).",
    )
    @dtype_option(
        help="dtype(s): bf16, fp16, fp32 (or bfloat16, half, float, ...); repeatable or "
        "comma-separated (default: the op's)."
    )
    @device_option()
    @click.option("--seed", type=int, help="Run seed, to repeat a run exactly (default: new).")
    @click.option("--trials", type=int, help="Trials per shape and dtype (default: 2).")
    @max_rows_option(
        "Largest batch size (rows, tokens); 0 for none (default on CPU: 4 for "
        "representative, 32 otherwise; none on GPUs).",
        hidden=("--cap",),
    )
    @candidate_option("Your callable, path/to/file.py:function (with --op or --reference).")
    @op_option("The registered op --candidate implements.")
    @reference_option()
    @inputs_option()
    @click.option(
        "--audit", is_flag=True, help="Check that null kernels fail for every op (the contracts)."
    )
    @click.option(
        "--quick",
        is_flag=True,
        help="The report card's quick tier: every edge shape and the smallest and largest "
        "representative one, each on one dtype (the dtypes in turn).",
    )
    @click.option("--show", default=10, help="Failing cases to detail.")
    @label_option
    @no_ledger_option()
    @ledger_option
    @json_option
    @user_errors
    def verify_command(
        ops,
        variants,
        shape_sets,
        dtype,
        device,
        seed,
        trials,
        max_rows,
        candidate,
        op,
        reference,
        inputs,
        audit,
        quick,
        show,
        label,
        no_ledger,
        ledger_url,
        as_json,
    ):
        """Check variants (or your kernel) against the float64 reference, the hard way.

        OPS are the ops to verify (default: all).
        """
        from kernelab import verify as v
        from kernelab._loader import load_callable

        ops, variant, dtype = list(ops), list(variants), list(dtype)
        shapes = list(shape_sets) or ["representative", "edge"]
        cap = max_rows
        _check_options(ops, candidate, op, reference, inputs, audit, shapes)
        if trials is None:
            trials = v.DEFAULT_TRIALS
        if seed is None:
            from kernelab.verify import new_seed

            seed = new_seed()
        lost(f"the cases checked so far (stored when all are done); repeat with --seed {seed}")
        if device is not None:
            from kernelab.hardware import detect

            detect(device)  # one clear line for a bad or absent device
        with spinner(disable=as_json) as say:

            def tick(msg: str) -> None:
                say(msg)
                doing(msg)

            common = {"device": device, "seed": seed, "trials": trials, "progress": tick}
            if audit:
                report = v.audit(ops or None, cap=cap, **common)
            elif reference is not None:
                fn = load_callable(candidate, "candidate")
                ref = load_callable(reference, "reference")
                gen = load_callable(inputs, "inputs")
                name = candidate.rpartition(":")[2]
                report = v.verify_custom(fn, ref, gen, name=name, **common)
            elif candidate is not None:
                fn = load_callable(candidate, "candidate")
                report = v.verify_candidate(
                    fn,
                    op,
                    shape_sets=shapes,
                    dtypes=dtype or None,
                    cap=cap,
                    name=candidate.rpartition(":")[2],
                    **common,
                )
            else:
                report = v.verify(
                    ops or None,
                    variants=variant or None,
                    shape_sets=shapes,
                    dtypes=dtype or None,
                    cap=cap,
                    tier="quick" if quick else "full",
                    **common,
                )
        if not audit and not report.cases:
            told = "; ".join(dict.fromkeys(report.skipped)) or "no case"
            raise ValueError(f"verify: nothing selected can be checked here ({told})")
        rec = None
        if not audit and not no_ledger:
            again = repeat_command(ops, variant, shapes, dtype, device, trials, max_rows,
                                   candidate, op, reference, inputs, seed)  # fmt: skip
            rec = _record(report, label, ledger_url, again)
        run_id = rec.run_id if rec is not None else None
        if as_json:
            unrecorded = None if rec is None or rec.path is None else str(rec.path)
            emit_json({**report.as_dict(), "run_id": run_id, "unrecorded": unrecorded})
        elif audit:
            _print_audit(report)
        else:
            _print_report(report, show)
            if run_id is not None:
                from kernelab.cli._common import echo

                echo((f"ledger run {run_id} (kernelab report {run_id} --kind verify)", "dim"))
        unstored(rec)
        if not report.passed:
            raise click.exceptions.Exit(1)


def repeat_command(ops, variants, shape_sets, dtypes, device, trials, max_rows, candidate, op,
                   reference, inputs, seed) -> str:  # fmt: skip
    """The command that repeats a verify run exactly (the same selection and seed)."""
    parts = ["kernelab", "verify", *ops]
    for flag, values in (("--variant", variants), ("--shapes", shape_sets), ("--dtype", dtypes)):
        parts += [f"{flag} {v}" for v in values]
    for flag, value in (
        ("--device", device),
        ("--trials", trials),
        ("--max-rows", max_rows),
        ("--candidate", candidate),
        ("--op", op),
        ("--reference", reference),
        ("--inputs", inputs),
        ("--seed", seed),
    ):
        if value is not None:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def _record(report, label, ledger_url, repeat: str):
    """The run into the ledger, every case with its verdict, error, bound and seed (or kept
    beside the ledger when it cannot take it)."""
    from kernelab import ledger
    from kernelab.hardware import detect
    from kernelab.verify import ledger_cases, run_provenance

    info = detect(report.device)
    cases = ledger_cases(report, info.key)
    prov = ledger.provenance(info, **run_provenance(report, repeat=repeat))
    return store_run(ledger_url, "verify", cases, prov, label)


def _ratio(r: float) -> str:
    return f"{r:.2f}×" if r < 1e4 else f"{r:.1e}×"


def verify_sheet(report):
    """One group per op and shape set, one row per variant."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab verify — {report.device}, seed {report.seed}, {report.trials} trial(s) per case",
        [
            Col("variant"),
            Col("cases", right=True),
            Col("result", give="wrap", step=2),
            Col("worst err / tol", right=True),
            Col("tolerance", give="below", step=1),
        ],
    )
    group = None
    for (op, variant, shape_set), cases in report.groups().items():
        if (op, shape_set) != group:
            group = (op, shape_set)
            sheet.group(op, f"{shape_set} shapes")
        failed = [c for c in cases if not c.passed]
        worst_case = max(cases, key=lambda c: c.worst_ratio)
        worst_m = max(worst_case.measures.values(), key=lambda m: m.ratio, default=None)
        tol = f"{worst_m.tolerance:.1e} ({worst_m.tolerance_source})" if worst_m else "—"
        if failed:
            classes = list(dict.fromkeys(k for c in failed for k in c.classes))
            result = Text(f"fail: {', '.join(classes)} ({len(failed)})", style="bold red")
        else:
            result = Text("pass", style="green")
        sheet.row(variant, str(len(cases)), result, _ratio(worst_case.worst_ratio), tol)
    return sheet


def _print_report(report, show: int) -> None:
    from kernelab.cli._common import console, echo

    verify_sheet(report).print(console)
    failing = [c for c in report.cases if not c.passed]
    for case in failing[:show]:
        echo(
            ("✗", "bold red"),
            f" {case.op}/{case.variant} {case.shape_set} {case.shape} {case.dtype}",
        )
        for f in case.failures:
            echo(f"    {f.line(case.trial_of(f))} ", (f"(trial {f.trial}, {f.call} call)", "dim"))
    if len(failing) > show:
        echo((f"… {len(failing) - show} more failing case(s); --json has all", "dim"))
    notes = list(dict.fromkeys(n for c in report.cases for n in c.notes))
    if any("→" in c.shape for c in report.cases):
        notes.append(
            "batch sizes were capped for the interpreter (labels show [rows→N]); --max-rows 0 for "
            "none"
        )
    warned = report.warnings_note()
    if warned:
        notes.append(warned)
    for line in notes:
        echo(("note:", "yellow"), f" {line}")
    for line in dict.fromkeys(report.skipped):
        echo(("skipped:", "yellow"), f" {line}")
    cut = list(dict.fromkeys(getattr(report, "cut", ())))
    for line in cut if len(cut) <= CUT_SHOWN else ():
        echo(("cut:", "yellow"), f" {line}")
    if len(cut) > CUT_SHOWN:
        echo(
            ("cut:", "yellow"),
            f" {len(cut)} full-size cases ran smaller than declared (too big to be cheap; "
            "labels say [full size; cut ...], --json lists each)",
        )
    verdict = ("all passed", "green") if report.passed else ("FAILED", "bold red")
    echo(
        verdict,
        f" — {len(report.cases)} case(s) in {report.seconds:.1f} s; "
        f"repeat with --seed {report.seed}",
    )


def audit_sheet(report):
    """One group per op, one row per null candidate and dtype."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab verify --audit — {report.device}, seed {report.seed}",
        [
            Col("null candidate"),
            Col("spoils"),
            Col("dtype"),
            Col("verdict"),
            Col("note", give="below", step=1, hide_empty=True),
        ],
    )
    group = None
    for a in report.audit:
        if a.op != group:
            group = a.op
            sheet.group(a.op)
        if not a.caught:
            verdict = Text("PASSED: broken op definition", style="bold red")
        elif a.failure_class is None:
            verdict = Text("n/a", style="dim")
        else:
            verdict = Text.assemble(("rejected", "green"), f" ({a.failure_class})")
        sheet.row(a.null, a.target, a.dtype, verdict, a.note)
    return sheet


def _print_audit(report) -> None:
    from kernelab.cli._common import console, echo

    audit_sheet(report).print(console)
    ops = list(dict.fromkeys(a.op for a in report.audit))
    broken = report.broken_ops
    for op in ops:
        if op in broken:
            echo(
                (f"✗ {op}: broken op definition", "bold red"),
                " — a null kernel passes its checks; tighten its contract (tolerance) or its "
                "inputs",
            )
        else:
            echo((f"✓ {op}: sound", "green"), " — every null kernel is rejected")
