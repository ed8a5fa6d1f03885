"""``kernelab tune``: prune statically, search, verify and store launch configs."""

from __future__ import annotations

from pathlib import Path

import click

from kernelab.cli._common import (
    device_option,
    dtype_option,
    emit_json,
    json_option,
    kept,
    op_names,
    select_ops,
    shape_set_option,
    spinner,
    target_option,
    user_errors,
)


def register(app: click.Group) -> None:
    @app.command("tune")
    @click.argument("op", required=False, callback=op_names)
    @shape_set_option()
    @dtype_option(multiple=False, default="bfloat16", help="bf16, fp16 or fp32 (any spelling).")
    @device_option()
    @target_option("Compile target for pruning (default: the device's, sm_90 on a CPU).")
    @click.option(
        "--limit",
        default=0,
        type=click.IntRange(min=0),
        help="Tune at most this many shapes (0: all).",
    )
    @click.option(
        "--export",
        type=click.Path(path_type=Path),
        help="Write the tuned configs (this device's) to this file for shipping, and exit.",
    )
    @json_option
    @user_errors
    def tune_command(op, shape_set, dtype, device, target, limit, export, as_json):
        """Tune an op's launch configs. On a CPU it prunes and reports without timing.

        OP is the op to tune.
        """
        import torch

        from kernelab import tune
        from kernelab.hardware import detect

        if export is not None:
            from kernelab.cli._common import echo

            n = tune.export(export, detect(device).key if device else None)
            echo(f"wrote {n} tuned config(s) to {export}")
            return
        if op is None:
            raise ValueError("op: expected the name of an op to tune")
        (selected,) = select_ops([op])
        torch_dtype = getattr(torch, dtype, None)
        if torch_dtype not in selected.dtypes:
            raise ValueError(
                f"dtype: {op!r} takes "
                f"{[str(d).removeprefix('torch.') for d in selected.dtypes]}, "
                f"got {dtype!r}"
            )
        cases = selected.shapes(shape_set)
        if limit:
            cases = cases[:limit]
        info = detect(device)
        measure = store = None
        if info.type == "cuda":
            measure = tune.gpu_measure()
            save = tune.store_winner(selected, _ledger())

            def store(result, device_key):
                save(result, device_key)
                kept(f"tuned config for {result.shape.label} ({dtype}, {device_key})")

        analysis = []
        with spinner(disable=as_json) as say:
            results = tune.tune(
                selected,
                cases,
                torch_dtype,
                device or info.type,
                target=target,
                measure=measure,
                store=store,
                progress=say,
                analysis=analysis,
            )
        gpu_command = _gpu_command(op, shape_set, dtype, limit, target)
        static = None
        if analysis:
            a = analysis[0]
            static = {"compiled": a.compiled, "cached": a.cached, "seconds": round(a.seconds, 3)}
        if as_json:
            emit_json(
                {
                    "device": info.as_dict(),
                    "results": [r.as_dict() for r in results],
                    "static": static,
                    "gpu_command": gpu_command if info.type != "cuda" else None,
                }
            )
            return
        from kernelab.cli._common import console, echo

        tune_sheet(op, info, results).print(console)
        if static is not None:
            echo(f"ranked statically by inspect for {results[0].target if results else target}:")
            echo(
                f"  {static['compiled']} compiled, {static['cached']} read from the cache, "
                f"in {static['seconds']:.1f} s"
            )
        if info.type != "cuda":
            echo("to time and store winners, on a GPU run:")
            echo(f"  {gpu_command}")


def _gpu_command(op, shape_set, dtype, limit, target) -> str:
    """The command that times these configs on a GPU (the same selection)."""
    parts = ["kernelab", "tune", op, "--shapes", shape_set, "--dtype", dtype]
    if limit:
        parts += ["--limit", str(limit)]
    return " ".join(parts)


def config_text(config) -> str:
    """``block_m=4 block_n=256 w2 s1``: a config's fields, warps and stages compactly."""
    from kernelab.tune.tuner import config_fields

    fields = config_fields(config)
    if fields is not None and not isinstance(fields, dict):  # a plain value (moe_topk's)
        return str(fields)
    fields = dict(fields or {})
    tail = [
        f"w{fields.pop(k)}" if k == "num_warps" else f"s{fields.pop(k)}"
        for k in ("num_warps", "num_stages")
        if k in fields
    ]
    return " ".join([*(f"{k}={v}" for k, v in fields.items()), *tail])


def tune_sheet(op: str, info, results):
    """One group per shape: its space, what pruning left and why, the winner (or, untimed,
    the configs inspect prefers)."""
    from kernelab._table import Col, Sheet
    from kernelab.tune.static import PREFERRED

    sheet = Sheet(
        f"kernelab tune {op} — {info.type}: {info.name}",
        [
            Col("space", right=True),
            Col("left", right=True),
            Col("pruned (why)", give="wrap", step=2),
            Col("winner", give="below", step=1),
        ],
    )
    for r in results:
        why = ", ".join(f"{n} {k}" for k, n in r.pruned.most_common()) or "—"
        left = r.space - sum(r.pruned.values())
        ranked = getattr(r, "ranked", None) or []
        if r.winner is not None:
            winner = config_text(r.winner)
        elif ranked:
            best = "; ".join(
                f"{n}) {config_text(s.config)}: {s.summary()}"
                for n, s in enumerate(ranked[:PREFERRED], 1)
            )
            winner = f"not timed; inspect prefers {best}"
        else:
            winner = r.note
        sheet.group(r.shape.label)
        sheet.row(str(r.space), str(left), why, winner)
    return sheet


def _ledger():
    try:
        from kernelab import ledger
    except ImportError:
        return None
    return ledger.open()
