"""``kernelab model-bench``: a model from a preset (random weights), original vs patched."""

from __future__ import annotations

import click

from kernelab.cli._common import (
    device_option,
    doing,
    dtype_option,
    emit_json,
    json_option,
    kept,
    label_option,
    ledger_option,
    lost,
    no_ledger_option,
    spinner,
    store_run,
    unstored,
    user_errors,
)


def register(app: click.Group) -> None:
    @app.command("model-bench")
    @click.option(
        "--preset", default="tiny-llama", help="Model preset (see kernelab.models.PRESETS)."
    )
    @device_option("cpu or cuda[:N].", default="cpu")
    @dtype_option(
        multiple=False,
        help="fp32, fp16 or bf16, any spelling (default: bf16 on GPUs, fp32 on CPU).",
    )
    @click.option(
        "--prompt-tokens", default=32, type=click.IntRange(min=1), help="Prompt length for prefill."
    )
    @click.option(
        "--decode-tokens", default=16, type=click.IntRange(min=2), help="Tokens to decode."
    )
    @click.option(
        "--repeats",
        default=3,
        type=click.IntRange(min=1),
        help="The fewest timed samples per measurement; each samples on until its median is "
        "known within ±5% or --max-time is spent.",
    )
    @click.option(
        "--max-time",
        default=10.0,
        show_default=True,
        type=click.FloatRange(min=0),
        help="Seconds of sampling per measurement at most (then marked * : noise target not met).",
    )
    @click.option(
        "--quantize",
        help="Also run the linear projections on quantized GEMMs: w4a16, w8a16, fp8, fp8-block, "
        "mxfp4.",
    )
    @click.option(
        "--profile/--no-profile",
        default=True,
        help="Profile one decode step of the eager variants with kernelab trace.",
    )
    @click.option(
        "--profile-dir",
        help="Folder for the decode-step traces (default: a temporary folder).",
    )
    @label_option
    @ledger_option
    @no_ledger_option()
    @json_option
    @user_errors
    def model_bench_command(
        preset,
        device,
        dtype,
        prompt_tokens,
        decode_tokens,
        repeats,
        max_time,
        quantize,
        profile,
        profile_dir,
        label,
        ledger_url,
        no_ledger,
        as_json,
    ):
        """Prefill latency and decode tokens/s of a model, original and patched with kernelab."""
        import torch

        from kernelab.hardware import detect
        from kernelab.models import presets
        from kernelab.workloads import model_bench as bench

        presets.get(preset)
        choices = ("w4a16", "w8a16", "fp8", "fp8-block", "mxfp4")
        if quantize is not None and quantize not in choices:
            raise ValueError(f"quantize: expected one of {', '.join(choices)}, got {quantize!r}")
        torch_dtype = None
        if dtype is not None:
            torch_dtype = getattr(torch, dtype, None)
            if torch_dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {dtype!r}")
        info = detect(device)
        lost("the timings so far" + ("" if no_ledger else ": model-bench stores its run when done"))
        if profile and profile_dir:
            kept(f"the decode-step traces written so far, under {profile_dir}")
        with spinner("building model", disable=as_json) as say:

            def progress(msg: str) -> None:
                say(msg)
                doing(msg)

            rows = bench.run(
                preset,
                device,
                torch_dtype,
                prompt_tokens,
                decode_tokens,
                repeats,
                progress=progress,
                quantize=quantize,
                profile=profile,
                profile_dir=profile_dir,
                max_time_s=max_time,
            )
        rec = None if no_ledger else _store(rows, info, ledger_url, label)
        run_id = rec.run_id if rec is not None else None
        lost(None)
        if as_json:
            emit_json({"device": info.as_dict(), "run_id": run_id, "rows": rows})
            unstored(rec)
            return
        from kernelab.cli._common import console, echo

        model_sheet(preset, info, rows).print(console)
        for note in model_notes(rows):
            echo((note, "dim"))
        for r in rows:
            if "decode_profile" in r:
                _print_profile(r)
        if run_id is not None:
            echo((f"stored as run {run_id}", "dim"))
        unstored(rec)


def _pm(spread: dict) -> str:
    """The median's ~95% interval as ±%, with * where the noise target was not met."""
    return f"±{spread['rel_ci']:.0%}" + ("" if spread["converged"] else "*")


def model_sheet(preset: str, info, rows):
    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab model-bench — {preset} on {info.type}: {info.name}",
        [
            Col("variant"),
            Col("prefill ms", right=True),
            Col("±", right=True),
            Col("×", right=True),
            Col("decode tok/s", right=True),
            Col("±", right=True),
            Col("×", right=True),
            Col("n", right=True),
        ],
    )
    for r in rows:
        p, d = r["prefill_spread"], r["decode_spread"]
        sheet.row(
            r["variant"],
            f"{r['prefill_s'] * 1e3:.2f}",
            _pm(p),
            f"{r['prefill_speedup']:.2f}",
            f"{r['decode_tokens_per_s']:.1f}",
            _pm(d),
            f"{r['decode_speedup']:.2f}",
            f"{p['n']}/{d['n']}",
        )
    return sheet


def model_notes(rows) -> list[str]:
    """What the table's marks mean, when they appear."""
    notes = ["± the median's ~95% interval; × against original; n samples (prefill/decode)"]
    if any(not (r["prefill_spread"]["converged"] and r["decode_spread"]["converged"])
           for r in rows):  # fmt: skip
        notes.append("* noise target (±5%) not met within --max-time: a noisy machine")
    return notes


def _us(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1e3:.2f} ms" if v >= 1000 else f"{v:.1f} µs"


def profile_sheet(row):
    """The CPU ops of one profiled decode step; a long op name moves under its numbers."""
    from kernelab._table import Col, Sheet

    d = row["decode_profile"]
    share = d.get("framework_overhead_share")
    sheet = Sheet(
        f"one decode step — {row['variant']}: {_us(d.get('step_us'))} per step under the "
        "profiler (its own cost included), "
        f"framework overhead {'-' if share is None else f'{share:.0%}'}",
        [
            Col("calls", right=True),
            Col("self", right=True),
            Col("share", right=True),
            Col("CPU op", give="below", step=1),
        ],
    )
    for o in d["top_cpu_ops"]:
        sheet.row(str(o["count"]), _us(o["self_us"]), f"{o['self_share']:.1%}", o["name"])
    return sheet


def _print_profile(row) -> None:
    from kernelab.cli._common import console, echo

    profile_sheet(row).print(console)
    d = row["decode_profile"]
    gpu = d.get("gpu")
    if gpu:
        latency = _us(gpu.get("launch_latency_us_total"))
        p50 = _us(gpu.get("launch_latency_us_p50"))
        short = gpu.get("short_kernel_share") or 0
        echo(
            f"GPU: {gpu.get('kernels')} kernels; launch latency {latency} in total (p50 {p50}); "
            f"short kernels {short:.0%}"
        )
    for finding in d.get("verdicts") or []:
        echo((f"· {finding}", "dim"))
    echo((f"trace: {row['decode_trace']}", "dim"))


def _store(rows, info, url, label=None):
    from kernelab import ledger

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
                "decode_step_s": r["decode_step_s"],
                "prefill_spread": r["prefill_spread"],
                "decode_spread": r["decode_spread"],
                "decode_samples": r["decode_samples"],
                "prefill_speedup": r["prefill_speedup"],
                "decode_speedup": r["decode_speedup"],
                **(
                    {"linear_weight_bytes": r["linear_weight_bytes"]}
                    if "linear_weight_bytes" in r
                    else {}
                ),
            },
            "flags": [f"quantize={r['quantize']}"] if r.get("quantize") else [],
            "samples": r["prefill_samples"],
        }
        for r in rows
    ]
    cases += [
        {
            "op": f"model:{r['preset']}",
            "variant": r["variant"],
            "shape_key": f"prompt={r['prompt_tokens']},decode-step",
            "shape_label": f"{r['preset']} one decode step after {r['prompt_tokens']} tokens",
            "dtype": r["dtype"],
            "device": r["device"],
            "mode": "profile",
            "metrics": {**r["decode_profile"], "trace": r["decode_trace"]},
            "flags": [],
        }
        for r in rows
        if "decode_profile" in r
    ]
    return store_run(url, "model-bench", cases, ledger.provenance(info), label)
