"""``kernelab ops``: the registered ops, their variants, and which can run here."""

from __future__ import annotations

import click

from kernelab.cli import _catalog
from kernelab.cli._common import (
    check_op_names,
    device_option,
    emit_json,
    json_option,
    op_names,
    select_ops,
    user_errors,
)


def registry_rows(device_type: str, names=None) -> list[dict]:
    """The rows of ``kernelab ops`` from the registry (imports every op, torch and Triton)."""
    from kernelab.core.calling import op_row

    rows = []
    for op in select_ops(names):
        variants = []
        for v in op.variants.values():
            ok, why = v.runs_on(device_type)
            variants.append(
                {
                    "name": v.name,
                    "kind": v.kind,
                    "runs_here": ok,
                    "note": why,
                    "description": v.description,
                }
            )
        rows.append({**op_row(op), "variants": variants})
    return rows


def describe(device_type: str, names=None) -> list[dict]:
    """The rows of ``kernelab ops``: from the stored catalogue where it can tell for this
    machine (no torch), else from the registry; an unknown name is a ValueError."""
    check_op_names(names or ())
    rows = _catalog.rows(device_type, names)
    return rows if rows is not None else registry_rows(device_type, names)


def register(app: click.Group) -> None:
    @app.command("ops")
    @click.argument("op", required=False, callback=op_names)
    @device_option(
        "Device to judge availability on (default: the accelerator if present, else cpu)."
    )
    @json_option
    @user_errors
    def ops_command(op, device, as_json):
        """List ops, their variants, and which variants can run on this machine.

        OP (optional): one op, with the calling convention a candidate for it follows.
        """
        from kernelab.hardware import detect

        info = detect(device, quick=True)
        rows = describe(info.type, [op] if op else None)
        calling = _catalog.calling(op) if op else None
        if as_json:
            emit_json({"device": info.as_dict(), "ops": rows, "calling": calling})
            return
        from kernelab.cli._common import console, echo

        ops_sheet(info, rows).print(console)
        if calling is not None:
            _print_calling(op, calling, echo)


def _print_calling(name: str, c: dict, echo) -> None:
    echo((f"calling convention of {name}", "bold"), ": fn(**inputs), with")
    for a in c["arguments"]:
        marks = [m for m, on in (("in place", a["inplace"]), ("may be None", a["optional"])) if on]
        echo(f"  {a['name']}: {a['kind']}" + (f" ({', '.join(marks)})" if marks else ""))
    echo(f"returns: {', '.join(c['returns'])}")
    echo(f"outputs: {c['out_rule']}")
    echo("example candidate:")
    for line in c["example"].splitlines():
        echo(f"  {line}")


def ops_sheet(info, rows: list[dict]):
    """One group per op (name, description, dtypes, shape sets, in-place arguments), one row
    per variant."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab ops — on {info.type}: {info.name}",
        [
            Col("variant"),
            Col("runs here"),
            Col("kind"),
            Col("note", give="wrap", step=1, hide_empty=True),
        ],
    )
    for r in rows:
        shapes = ", ".join(f"{k} {n}" for k, n in r["shape_sets"].items())
        detail = [
            Text.assemble(("dtypes ", "dim"), ", ".join(r["dtypes"])),
            Text.assemble(("shapes ", "dim"), shapes),
            Text.assemble(("in place ", "dim"), ", ".join(r["inplace"]) or "—"),
        ]
        sheet.group(r["op"], Text(r["description"], style="dim"), detail=detail)
        for v in r["variants"]:
            here = Text("✓ yes", style="green") if v["runs_here"] else Text("✗ no", style="red")
            sheet.row(v["name"], here, v["kind"], v["note"] or "")
    return sheet
