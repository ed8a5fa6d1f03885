"""``kernelab ops``: the registered ops, their variants, and which can run here."""

from __future__ import annotations

import click

from kernelab.cli._common import device_option, emit_json, json_option, select_ops, user_errors


def describe(device_type: str) -> list[dict]:
    rows = []
    for op in select_ops(None):
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
        rows.append(
            {
                "op": op.name,
                "description": op.description,
                "dtypes": [str(d).removeprefix("torch.") for d in op.dtypes],
                "inplace": list(op.contract.inplace),
                "outputs": list(op.outputs),
                "shape_sets": {name: len(op.shapes(name)) for name in op.shape_sets},
                "variants": variants,
            }
        )
    return rows


def register(app: click.Group) -> None:
    @app.command("ops")
    @device_option(
        "Device to judge availability on (default: the accelerator if present, else cpu)."
    )
    @json_option
    @user_errors
    def ops_command(device, as_json):
        """List ops, their variants, and which variants can run on this machine."""
        from kernelab.hardware import detect

        info = detect(device)
        rows = describe(info.type)
        if as_json:
            emit_json({"device": info.as_dict(), "ops": rows})
            return
        from kernelab.cli._common import console

        ops_sheet(info, rows).print(console)


def ops_sheet(info, rows: list[dict]):
    """One group per op (name, description, dtypes, shape sets, in-place arguments), one row
    per variant."""
    from rich.text import Text

    from kernelab.cli._table import Col, Sheet

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
