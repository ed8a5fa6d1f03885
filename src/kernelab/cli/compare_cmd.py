"""``kernelab compare A B``: two ledger runs case by case; exits 1 on a confirmed regression."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from kernelab.cli._common import (
    csv_option,
    emit_json,
    json_option,
    kind_option,
    ledger_option,
    user_errors,
)

if TYPE_CHECKING:
    from kernelab._table import Sheet

_CSV_COLUMNS = [
    "op",
    "variant",
    "shape_key",
    "shape_label",
    "dtype",
    "device",
    "mode",
    "median_a",
    "median_b",
    "n_a",
    "n_b",
    "ratio",
    "ci_low",
    "ci_high",
    "noise",
    "spread",
    "basis",
    "verdict",
    "regression",
    "note",
]
_STYLE = {
    "faster": "green",
    "slower": "red",
    "ambiguous": "yellow",
    "unreliable": "yellow",
    "invalid": "magenta",
}


def pick_runs(db, refs: list[str], baseline: str | None, kind: str) -> tuple[str, str]:
    """(baseline id, candidate id) from the command's arguments."""
    if len(refs) > 2:
        raise ValueError(f"runs: expected at most two (baseline, candidate), got {len(refs)}")
    if len(refs) == 2:
        if baseline is not None:
            raise ValueError("--baseline: give either two runs or one run and --baseline")
        return db.resolve(refs[0], kind=kind), db.resolve(refs[1], kind=kind)
    candidate = db.resolve(refs[0] if refs else "latest", kind=kind)
    return db.resolve(baseline or "latest", kind=kind, before=candidate), candidate


def compare_sheet(result, threshold: float) -> Sheet:
    """The compare table: one group per op and shape, one row per variant, dtype and mode."""
    from rich.text import Text

    from kernelab._table import Col, Sheet
    from kernelab.report import fmt

    a, b = result.run_a, result.run_b
    sheet = Sheet(
        f"compare: {a['id']} ({a.get('label') or '-'}) → {b['id']} "
        f"({b.get('label') or '-'}), B/A of medians (absolute, or over torch's round by "
        f"round), {result.confidence:.0%} interval",
        [
            Col("variant"),
            Col("dtype"),
            Col("mode", give="drop", step=4),
            Col("A", right=True, give="drop", step=3),
            Col("B", right=True, give="drop", step=2),
            Col("B/A", right=True),
            Col("basis", give="drop", step=5),
            Col("interval", right=True),
            Col("verdict"),
            Col("note", give="below", step=1, hide_empty=True),
        ],
    )
    group = None
    for c in result.cases:
        if (c.op, c.shape_label) != group:
            group = (c.op, c.shape_label)
            sheet.group(*group)
        verdict = c.verdict + (f" > {threshold:.0%}" if c.regression else "")
        sheet.row(
            c.variant,
            c.dtype,
            c.mode,
            fmt.seconds(c.median_a),
            fmt.seconds(c.median_b),
            fmt.ratio(c.ratio),
            c.basis,
            "-" if c.ci_low is None else f"{c.ci_low:.3f}–{c.ci_high:.3f}",
            Text(verdict, style=_STYLE[c.verdict]),
            c.note or "",
        )
    return sheet


def register(app: click.Group) -> None:
    @app.command("compare")
    @click.argument("runs", nargs=-1)
    @click.option(
        "--baseline",
        help="Baseline run when one run (or none) is given; 'latest' (default) is the "
        "newest run recorded before the candidate.",
    )
    @click.option(
        "--threshold",
        default=0.05,
        help="Fail (exit 1) on a confirmed slowdown beyond this fraction.",
    )
    @click.option(
        "--noise",
        default=0.02,
        help="Smallest change ever called faster or slower (fraction): the spread of "
        "timing the same code twice, when the samples do not show a larger one.",
    )
    @click.option("--confidence", default=0.95, help="Confidence of the bootstrap interval.")
    @kind_option
    @ledger_option
    @json_option
    @csv_option
    @user_errors
    def compare_command(
        runs, baseline, threshold, noise, confidence, kind, ledger_url, as_json, as_csv
    ):
        """Compare two runs case by case: ratio of medians with a bootstrap interval, verdict
        faster / slower / ambiguous / unreliable / invalid, and exit status 1 on a confirmed
        regression (a "slower" beyond --threshold; never an unreliable or invalid case).

        A variant timed beside eager torch is judged relative to it, round by round (the
        machine's own moves divide out); a case whose stopping rule did not converge, or whose
        change is within how far the machine moves between rounds, is unreliable.

        RUNS are the baseline then the candidate: run ids (or unique prefixes), labels, or
        'latest'. One run: the candidate, compared with --baseline. None: the latest run.
        """
        from kernelab import ledger
        from kernelab.ledger.compare import compare_runs
        from kernelab.report import fmt

        json, csv = as_json, as_csv
        if json and csv:
            raise ValueError("--json, --csv: choose one output format")
        with ledger.open(ledger_url, readonly=True) as db:
            a_id, b_id = pick_runs(db, list(runs or []), baseline, kind)
            result = compare_runs(db.get_run(a_id), db.get_run(b_id), threshold, confidence, noise)
        if json:
            emit_json(result.as_dict())
        elif csv:
            rows = [vars(c) for c in result.cases]
            sys.stdout.write(fmt.to_csv(rows, _CSV_COLUMNS))
        else:
            from kernelab.cli._common import console, echo

            compare_sheet(result, threshold).print(console)
            for label, missing in (("baseline", result.only_a), ("candidate", result.only_b)):
                for k in missing:
                    echo(
                        f"only in {label}: {k['op']} {k['variant']} {k['shape_label']} "
                        f"{k['dtype']} {k['device']} {k['mode']}"
                    )
            for note in result.notes:
                echo(f"note: {note}")
            n = result.counts()
            echo(
                f"{n['faster']} faster, {n['slower']} slower, {n['ambiguous']} ambiguous, "
                f"{n['unreliable']} unreliable, {n['invalid']} invalid; "
                f"{n['regressions']} regression(s) beyond {threshold:.0%}; "
                f"unmatched: {n['only_a']} baseline, {n['only_b']} candidate"
            )
        if result.regressions:
            raise click.exceptions.Exit(1)
