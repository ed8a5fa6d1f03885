"""``kernelab ceilings``: measure the device's copy bandwidth and matmul rates, store them."""

from __future__ import annotations

import click

from kernelab.cli._common import (
    device_option,
    emit_json,
    json_option,
    kept,
    ledger_option,
    lost,
    no_ledger_option,
    user_errors,
)


def register(app: click.Group) -> None:
    @app.command("ceilings")
    @device_option()
    @no_ledger_option("--no-store/--store")
    @ledger_option
    @json_option
    @user_errors
    def ceilings_command(device, no_ledger, ledger_url, as_json):
        """Measure copy bandwidth (read + write) and large-matmul rates; store them."""

        from kernelab.bench import open_ledger, roofline
        from kernelab.bench.cache import cache_bytes
        from kernelab.cli._common import console, echo, err_console
        from kernelab.hardware import detect

        info = detect(device)
        lost("the ceilings measured so far: stored when all are measured")
        with console.status("measuring", spinner="dots") if not as_json else _null():
            rows = roofline.measure(
                info, cache_bytes(info)[0], lambda m: err_console.log(m, markup=False, emoji=False)
            )
        db = None if no_ledger else open_ledger(ledger_url)
        if db is not None:
            for r in rows:
                db.put_ceiling(info.key, r["name"], r["value"], r["unit"], r["source"])
                kept(f"ceiling {r['name']} of {info.key}")
        lost(None)
        sheet = roofline.datasheet(info.spec).as_dict() if info.spec is not None else None
        if as_json:
            emit_json(
                {"device": info.as_dict(), "key": info.key, "measured": rows, "datasheet": sheet}
            )
            return
        from kernelab._table import Col, Sheet

        table = Sheet(
            f"ceilings — {info.key}",
            [
                Col("ceiling"),
                Col("measured", right=True),
                Col("datasheet", right=True),
                Col("how", give="wrap", step=1),
            ],
        )
        for r in rows:
            value, ds = r["value"], None
            if sheet is not None:
                if r["name"] == roofline.COPY:
                    ds = sheet["bandwidth_bytes_per_s"]
                else:
                    ds = sheet["flops"].get(r["name"].removeprefix(roofline.MATMUL))
            scale, unit = (1e9, "GB/s") if r["unit"] == "B/s" else (1e12, "TFLOP/s")
            table.row(
                r["name"],
                f"{value / scale:.1f} {unit}",
                "—" if ds is None else f"{ds / scale:.1f} {unit}",
                r["source"],
            )
        table.print(console)
        echo(("stored in the ledger" if db is not None else "not stored", "dim"))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
