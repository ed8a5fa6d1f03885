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


def _kind(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} tensor, {value.dim()}-d"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def calling_convention(op) -> dict:
    """How a candidate for ``op`` is called: ``fn(**inputs)`` with these arguments (read from
    the inputs of every shape of every set, on meta tensors), the outputs it returns, which
    arguments it updates in place, which may be omitted (None in some shapes), and the out=
    rule."""
    args: dict[str, dict] = {}
    first = True
    for shape_set in op.shape_sets:
        for shape in op.shapes(shape_set):
            inputs = op.inputs(shape, op.dtypes[0], "meta")
            later, first = not first, False
            for name in args:
                if name not in inputs:
                    args[name]["optional"] = True
            for name, value in inputs.items():
                entry = args.setdefault(
                    name,
                    {"name": name, "kind": None, "optional": later, "inplace": False},
                )
                if value is None:
                    entry["optional"] = True
                elif entry["kind"] is None:
                    entry["kind"] = _kind(value)
    for name in op.contract.inplace:
        if name in args:
            args[name]["inplace"] = True
    for entry in args.values():
        entry["kind"] = entry["kind"] or "None"
    out = op.out_arg
    if out is None:
        rule = "no out= argument: the candidate allocates its outputs"
    elif isinstance(out, str):
        many = " (a tuple, in the order of the outputs)" if len(op.outputs) > 1 else ""
        rule = (
            f"{out}= may be given a preallocated output{many}: write it and return it; "
            f"verify then passes poisoned buffers with canaries"
        )
    else:
        rule = f"{', '.join(f'{n}=' for n in out)} may each be given a preallocated output"
    return {
        "arguments": list(args.values()),
        "returns": list(op.outputs),
        "inplace": list(op.contract.inplace),
        "out": out,
        "out_rule": rule,
        "example": _example(op, list(args.values())),
    }


def _example(op, args: list[dict]) -> str:
    required = [a["name"] for a in args if not a["optional"]]
    optional = [f"{a['name']}=None" for a in args if a["optional"]]
    outs = []
    if isinstance(op.out_arg, str):
        outs = [f"{op.out_arg}=None"]
    elif op.out_arg:
        outs = [f"{n}=None" for n in op.out_arg]
    params = [*required, *optional, *outs]
    head = f"def my_{op.name}({', '.join(params)}):"
    if len(head) > 76:  # one argument a line, to read at 80 columns
        head = "\n".join([f"def my_{op.name}(", *(f"    {p}," for p in params), "):"])
    body = [head]
    for a in args:
        if a["inplace"]:
            body.append(f"    ...  # update {a['name']} in place")
    ret = ", ".join(op.outputs)
    body.append(f"    ...  # compute {ret}" + (" (into out= when given)" if outs else ""))
    body.append(f"    return {ret}")
    return "\n".join(body)


def op_row(op) -> dict:
    """What ``kernelab ops`` says of an op, its variants aside."""
    return {
        "op": op.name,
        "description": op.description,
        "dtypes": [str(d).removeprefix("torch.") for d in op.dtypes],
        "inplace": list(op.contract.inplace),
        "outputs": list(op.outputs),
        "shape_sets": {name: len(op.shapes(name)) for name in op.shape_sets},
    }


def registry_rows(device_type: str, names=None) -> list[dict]:
    """The rows of ``kernelab ops`` from the registry (imports every op, torch and Triton)."""
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
