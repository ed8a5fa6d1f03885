"""``kernelab model-bench``: a model from a preset (random weights), original vs patched."""

from __future__ import annotations

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernelab.cli._common import console, emit_json, err_console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("model-bench")
    @user_errors
    def model_bench_command(
        preset: str = typer.Option(
            "tiny-llama", help="Model preset (see kernelab.models.PRESETS)."
        ),
        device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
        dtype: str = typer.Option(
            None, help="float32, float16 or bfloat16 (default: bfloat16 on GPUs, float32 on CPU)."
        ),
        prompt_tokens: int = typer.Option(32, min=1, help="Prompt length for prefill."),
        decode_tokens: int = typer.Option(16, min=2, help="Tokens to decode."),
        repeats: int = typer.Option(3, min=1, help="Timed repetitions per measurement."),
        ledger: str = typer.Option(
            None, help="Ledger to store the run in (default: KERNELAB_LEDGER or the user ledger)."
        ),
        no_ledger: bool = typer.Option(False, "--no-ledger", help="Do not store the run."),
        json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ):
        """Prefill latency and decode tokens/s of a model, original and patched with kernelab."""
        import torch

        from kernelab.hardware import detect
        from kernelab.models import bench, presets

        presets.get(preset)
        torch_dtype = None
        if dtype is not None:
            torch_dtype = getattr(torch, dtype, None)
            if torch_dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {dtype!r}")
        info = detect(device)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=json,
        ) as progress:
            task = progress.add_task("building model", total=None)
            rows = bench.run(
                preset,
                device,
                torch_dtype,
                prompt_tokens,
                decode_tokens,
                repeats,
                progress=lambda m: progress.update(task, description=m),
            )
        run_id = None if no_ledger else _store(rows, info, ledger)
        if json:
            emit_json({"device": info.as_dict(), "run_id": run_id, "rows": rows})
            return
        table = Table(title=f"kernelab model-bench — {preset} on {info.type}: {info.name}")
        for col in ("variant", "prefill ms", "prefill ×", "decode tok/s", "decode ×"):
            table.add_column(col, justify="right" if col != "variant" else "left")
        for r in rows:
            table.add_row(
                r["variant"],
                f"{r['prefill_s'] * 1e3:.2f}",
                f"{r['prefill_speedup']:.2f}",
                f"{r['decode_tokens_per_s']:.1f}",
                f"{r['decode_speedup']:.2f}",
            )
        console.print(table)
        if run_id is not None:
            console.print(f"[dim]stored as run {run_id}[/]")


def _store(rows, info, url):
    try:
        from kernelab import ledger
    except ImportError:
        return None
    cases = [
        {
            "op": f"model:{r['preset']}",
            "variant": r["variant"],
            "shape_key": f"prompt={r['prompt_tokens']},decode={r['decode_tokens']}",
            "shape_label": f"{r['preset']} prompt {r['prompt_tokens']} decode {r['decode_tokens']}",
            "dtype": r["dtype"],
            "device": r["device"],
            "mode": "end-to-end",
            "metrics": {
                "median_s": r["prefill_s"],
                "prefill_s": r["prefill_s"],
                "decode_tokens_per_s": r["decode_tokens_per_s"],
                "prefill_speedup": r["prefill_speedup"],
                "decode_speedup": r["decode_speedup"],
            },
            "flags": [],
            "samples": r["prefill_samples"],
        }
        for r in rows
    ]
    db = ledger.open(url)
    return db.record_run(kind="model-bench", cases=cases, provenance=ledger.provenance(info))
