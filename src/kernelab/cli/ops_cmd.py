"""``kernelab ops``: the registered ops, their variants, and which can run here."""

from __future__ import annotations

import click

from kernelab.cli._common import emit_json, select_ops, user_errors


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
    @click.option(
        "--device",
        help="Device to judge availability on (default: the accelerator if present, else cpu).",
    )
    @click.option("--json", "json", is_flag=True, help="Print JSON instead of a table.")
    @user_errors
    def ops_command(device, json):
        """List ops, their variants, and which variants can run on this machine."""
        from kernelab.hardware import detect

        info = detect(device)
        rows = describe(info.type)
        if json:
            emit_json({"device": info.as_dict(), "ops": rows})
            return
        from rich.table import Table

        from kernelab.cli._common import console

        table = Table(title=f"kernelab ops — on {info.type}: {info.name}")
        for col in ("op", "variants (runs here?)", "dtypes", "shapes", "in place"):
            table.add_column(col)
        for r in rows:
            parts = []
            for v in r["variants"]:
                mark = "[green]✓[/]" if v["runs_here"] else "[red]✗[/]"
                note = f" [dim]({v['note']})[/]" if v["note"] else ""
                parts.append(f"{mark} {v['name']}{note}")
            shapes = ", ".join(f"{k} {n}" for k, n in r["shape_sets"].items())
            table.add_row(
                f"[bold]{r['op']}[/]\n[dim]{r['description']}[/]",
                "\n".join(parts),
                ", ".join(r["dtypes"]),
                shapes,
                ", ".join(r["inplace"]) or "—",
            )
        console.print(table)
