"""``kernelab model-cost``: what a model (or a change to it) costs on a device, from the ops'
cost models and the device's peaks; nothing runs."""

from __future__ import annotations

import click

from kernelab.cli._common import device_option, emit_json, json_option, user_errors


def _sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"set: expected KEY=VALUE (num_key_value_heads=4), got {text!r}")
        if key.strip() in out:
            raise ValueError(f"set: {key.strip()} is given twice")
        out[key.strip()] = value.strip()
    return out


def _batches(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"batch: expected integers separated by commas, got {text!r}") from None
    if not out or any(b <= 0 for b in out):
        raise ValueError(f"batch: expected positive integers separated by commas, got {text!r}")
    return out


def register(app: click.Group) -> None:
    @app.command("model-cost")
    @click.argument("configs", nargs=-1, required=True)
    @device_option("A device of the hardware table (h200, h100, b200, mi300x, ...).", "h200")
    @click.option("--batch", default="1", help="Decode batch sizes, comma-separated (1,64).")
    @click.option("--context", default=8192, type=click.IntRange(min=1), help="Keys per sequence.")
    @click.option("--prefill", default=2048, type=click.IntRange(min=1), help="Prompt tokens.")
    @click.option("--recipe", default="bf16", help="GEMMs: bf16, fp8, w4a16, w8a16 or mxfp4.")
    @click.option("--kv", default="bf16", help="KV cache: bf16 or fp8.")
    @click.option(
        "--set",
        "sets",
        multiple=True,
        help="KEY=VALUE for the second side (a config field, or recipe, kv); repeatable.",
    )
    @click.option(
        "--check-profile",
        is_flag=True,
        help="Profile a prefill of a tiny preset on the CPU and check the prediction against it.",
    )
    @json_option
    @user_errors
    def model_cost_command(
        configs, device, batch, context, prefill, recipe, kv, sets, check_profile, as_json
    ):
        """Per-op FLOPs, bytes and floors of a model's prefill and decode step.

        CONFIGS: one or two presets or config.json paths. With two, or with --set, the
        second is shown beside the first with the ratio per op and in total.
        """
        from dataclasses import replace

        from kernelab.workloads import model_cost as mc

        if len(configs) > 2:
            raise ValueError(f"configs: expected one or two, got {len(configs)}")
        if check_profile:
            _check_profile(configs, prefill, sets, as_json)
            return
        changes = _sets(sets)
        results = []
        for b in _batches(batch):
            work = mc.Workload(batch=b, context=context, prefill=prefill, recipe=recipe, kv=kv)
            a = mc.cost(configs[0], device, work)
            other = None
            if len(configs) == 2 or changes:
                cfg = mc.load_config(configs[-1])
                wset = {k: v for k, v in changes.items() if k in mc.WORKLOAD_KEYS}
                cset = {k: v for k, v in changes.items() if k not in mc.WORKLOAD_KEYS}
                if cset:
                    cfg = cfg.with_values(cset)
                if wset:
                    work = work.with_values(wset)
                    label = ", ".join(f"{k}={v}" for k, v in wset.items())
                    cfg = replace(cfg, name=f"{cfg.name} ({label})")
                other = mc.cost(cfg, device, work)
            results.append((a, other))
        if as_json:
            emit_json([_json(a, b) for a, b in results])
            return
        for k, (a, b) in enumerate(results):
            if b is None:
                _print_one(a, k == 0)
            else:
                _print_pair(a, b, k == 0)


def _check_profile(configs, prefill, sets, as_json) -> None:
    from kernelab.models import presets
    from kernelab.workloads import cost_check
    from kernelab.workloads import model_cost as mc

    name = configs[0]
    # dense ones: transformers runs a mixture's experts as a loop over the experts hit, which
    # the op-by-op comparison does not yet match to the fused_moe row; and Llama's block (not
    # Gemma-2's: four norms a layer, eager attention, which the profile shows as loose ops)
    from kernelab.models import ARCHITECTURES

    tiny = sorted(
        n
        for n, p in presets.PRESETS.items()
        if p.tiny and not mc.load_config(n).moe_layers and p.model_type in ARCHITECTURES
    )
    if len(configs) != 1 or sets or name not in tiny:
        raise ValueError(
            f"check-profile: builds the model on the CPU: one tiny preset ({', '.join(tiny)}), "
            f"no --set; got {' '.join(configs)}"
        )
    if prefill > 512:
        raise ValueError(f"prefill: --check-profile profiles at most 512 tokens, got {prefill}")
    import torch

    model = presets.build(name, dtype=torch.float32)
    work = mc.Workload(batch=1, context=prefill + 1, prefill=prefill)
    predicted = mc.cost(name, "h200", work)
    results = [
        (predicted.prefill, cost_check.profile_prefill(model, prefill)),
        (predicted.decode, cost_check.profile_decode(model, prefill + 1)),
    ]
    failed, report = [], []
    for step, events in results:
        checks, unchecked = cost_check.check(step, events)
        failed += [c for c in checks if not c.ok]
        report.append((step, checks, unchecked))
    if as_json:
        from dataclasses import asdict

        emit_json({
            step.phase: {"checks": [asdict(c) for c in checks], "unchecked": unchecked}
            for step, checks, unchecked in report
        } | {"ok": not failed})  # fmt: skip
    else:
        from kernelab._table import Col, Sheet
        from kernelab.cli._common import console, echo

        for step, checks, unchecked in report:
            what = (f"a prefill of {step.tokens} tokens" if step.phase == "prefill"
                    else f"a decode step over {step.context} keys")  # fmt: skip
            sheet = Sheet(
                f"{name}: model-cost against a profile of {what}",
                [Col("op"), Col("what"), Col("predicted", right=True),
                 Col("traced", right=True), Col("ok"),
                 Col("note", give="below", step=1, hide_empty=True)],
            )  # fmt: skip
            for c in checks:
                sheet.row(c.name, c.what, f"{c.predicted:,.0f}", f"{c.traced:,.0f}",
                          "yes" if c.ok else "NO", c.note,
                          style=None if c.ok else "bold red")  # fmt: skip
            sheet.print(console)
            echo(("not checked (several small ops or none in the trace): ", "dim"),
                 ", ".join(unchecked))  # fmt: skip
            echo("")
        echo(("every check passed" if not failed else f"{len(failed)} check(s) failed", "bold"))
    if failed:
        raise click.exceptions.Exit(1)


def _json(a, b) -> dict:
    from kernelab.workloads import model_cost as mc

    if b is None:
        return a.as_dict()
    return {
        "a": a.as_dict(),
        "b": b.as_dict(),
        "prefill": mc.diff(a, b, "prefill"),
        "decode": mc.diff(a, b, "decode"),
    }


def _num(x: float, scale: float = 1.0) -> str:
    """A number in a column: never an exponent, about three significant digits."""
    v = x / scale
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def _us(s: float) -> str:
    return _num(s, 1e-6)


def _ms(s: float) -> str:
    return _num(s, 1e-3)


def _step_sheet(cost, step):
    from kernelab._table import Col, Sheet

    what = (
        f"prefill of {step.tokens} tokens"
        if step.phase == "prefill"
        else f"decode step, batch {step.batch}, context {step.context}"
    )
    layers = cost.config.num_hidden_layers
    sheet = Sheet(
        f"{cost.config.name} · {what} · {cost.workload.recipe}, KV {cost.workload.kv} · "
        f"{cost.device} · per layer × {layers}, ms per step",
        [
            Col("op"),
            Col("kernelab op", give="below", step=3),
            Col("GFLOP", right=True, give="drop", step=1),
            Col("MB", right=True),
            Col("floor µs", right=True),
            Col("bound"),
            Col("ms", right=True),
            Col("%", right=True),
        ],
    )
    total = step.floor_s
    for o in step.ops:
        sheet.row(
            o.name,
            o.op or "(no op)",
            _num(o.flops, 1e9),
            _num(o.bytes, 1e6),
            _us(o.floor_s),
            o.bound,
            _ms(o.total_s),
            f"{100 * o.total_s / total:.0f}" if total else "—",
        )
    return sheet


def _print_one(cost, first: bool) -> None:
    from kernelab.cli._common import console, echo

    for step in (cost.prefill, cost.decode) if first else (cost.decode,):
        _step_sheet(cost, step).print(console)
        echo("")
    p, d, fit = cost.prefill, cost.decode, cost.fit
    echo(("totals", "bold"))
    echo(f"  prefill floor {p.floor_s * 1e3:.3g} ms for {p.tokens} tokens")
    echo(
        f"  decode step floor {d.floor_s * 1e3:.3g} ms at batch {d.batch}: "
        f"at most {d.tokens_per_s:,.0f} tokens/s"
    )
    echo(
        f"  weights {cost.weight_bytes / 1e9:.3g} GB; KV cache "
        f"{cost.kv_bytes_per_token / 1024:.4g} KiB per token ({cost.workload.kv})"
    )
    gib = fit["memory_bytes"] / 2**30
    if not fit["weights_fit"]:
        echo(
            (f"  the weights alone ({cost.weight_bytes / 2**30:.1f} GiB) do not fit in "
             f"{gib:.0f} GiB: no room for a KV cache", "bold red")
        )  # fmt: skip
    else:
        echo(f"  fits beside the weights in {gib:.0f} GiB: {fit['kv_tokens']:,} tokens of KV")
        echo(
            f"    = batch {fit['max_batch_at_context']} at context {cost.workload.context:,}, "
            f"or context {fit['max_context_at_batch']:,} at batch {cost.workload.batch}"
        )
    echo(("  (activations, workspace and fragmentation not counted)", "dim"))
    echo((f"ceiling: {cost.ceiling_source}", "dim"))


def _pair_sheet(a, b, phase: str):
    from kernelab._table import Col, Sheet
    from kernelab.workloads import model_cost as mc

    d = mc.diff(a, b, phase)
    step = getattr(b, phase)
    what = (
        f"prefill of {step.tokens} tokens"
        if phase == "prefill"
        else f"decode step, batch {step.batch}, context {step.context}"
    )
    sheet = Sheet(
        f"{what} · {b.device}",
        [
            Col("op"),
            Col("A ms", right=True),
            Col("B ms", right=True),
            Col("B/A", right=True),
            Col("Δ ms", right=True),
            Col("A MB", right=True, give="drop", step=1),
            Col("B MB", right=True, give="drop", step=1),
        ],
    )
    for r in d["ops"]:
        sheet.row(
            r["name"],
            _ms(r["a_s"]),
            _ms(r["b_s"]),
            "—" if r["ratio"] is None else f"{r['ratio']:.2f}",
            ("+" if r["delta_s"] > 0 else "") + _ms(r["delta_s"]),
            _num(r["a_bytes"], 1e6),
            _num(r["b_bytes"], 1e6),
        )
    ratio = d["ratio"]
    sheet.row(
        "total",
        _ms(d["a_floor_s"]),
        _ms(d["b_floor_s"]),
        "—" if ratio is None else f"{ratio:.2f}",
        ("+" if d["b_floor_s"] > d["a_floor_s"] else "") + _ms(d["b_floor_s"] - d["a_floor_s"]),
        _num(getattr(a, phase).bytes, 1e6),
        _num(step.bytes, 1e6),
        style="bold",
    )
    return sheet, d["summary"]


def _print_pair(a, b, first: bool) -> None:
    from kernelab.cli._common import console, echo

    if first:
        echo(("A: ", "bold"), a.config.name, f" ({a.workload.recipe}, KV {a.workload.kv})")
        echo(("B: ", "bold"), b.config.name, f" ({b.workload.recipe}, KV {b.workload.kv})")
    for phase in ("prefill", "decode") if first else ("decode",):
        sheet, summary = _pair_sheet(a, b, phase)
        sheet.print(console)
        echo((summary, "bold"))
        echo("")
    echo(
        f"KV per token {a.kv_bytes_per_token / 1024:.4g} → {b.kv_bytes_per_token / 1024:.4g} KiB;"
        f" weights {a.weight_bytes / 1e9:.3g} → {b.weight_bytes / 1e9:.3g} GB; "
        f"tokens of KV that fit {a.fit['kv_tokens']:,} → {b.fit['kv_tokens']:,}"
    )
    echo((f"ceiling: {b.ceiling_source}", "dim"))
