"""``kernelab serve-bench``: transformers' continuous batching, its attention vs kernelab's."""

from __future__ import annotations

import click

from kernelab.cli._common import (
    device_option,
    doing,
    dtype_option,
    emit_json,
    json_option,
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
    @app.command("serve-bench")
    @click.option("--preset", default="tiny-llama", help="Model preset (kernelab.models.PRESETS).")
    @device_option("cpu or cuda[:N].", default="cpu")
    @dtype_option(multiple=False, help="fp32, fp16 or bf16 (default: bf16 on GPUs, fp32 on CPU).")
    @click.option("--requests", default=8, type=click.IntRange(min=1), help="Requests.")
    @click.option("--prompt-len", default=48, type=click.IntRange(min=1),
                  help="Mean prompt length (drawn in [1/4, 7/4] of it).")  # fmt: skip
    @click.option("--output-len", default=8, type=click.IntRange(min=1),
                  help="Mean output length (drawn in [1/2, 3/2] of it).")  # fmt: skip
    @click.option("--lengths", "lengths_file", type=click.Path(exists=True, dir_okay=False),
                  help="A file of 'prompt output' length pairs, one request a line.")  # fmt: skip
    @click.option("--rate", type=float, help="Arrivals per second (Poisson; default: all at once).")
    @click.option("--seed", default=0, type=int, help="Seed of the lengths, prompts and arrivals.")
    @click.option("--page-size", default=16, type=click.IntRange(min=1), help="KV page size.")
    @click.option("--num-blocks", type=click.IntRange(min=1),
                  help="KV-cache blocks (default: room for every request at once).")  # fmt: skip
    @click.option("--max-batch-tokens", default=256, type=click.IntRange(min=1),
                  help="Tokens per step.")  # fmt: skip
    @click.option("--patch/--no-patch", default=False,
                  help="Also run kernelab's norms, MLP and RoPE in the kernelab run.")  # fmt: skip
    @click.option("--interpret/--no-interpret", default=False,
                  help="On CPU, the Triton kernels through the interpreter (slow).")  # fmt: skip
    @click.option("--profile-dir", help="Folder for the profiled steps' traces.")
    @label_option
    @ledger_option
    @no_ledger_option()
    @json_option
    @user_errors
    def serve_bench_command(preset, device, dtype, requests, prompt_len, output_len, lengths_file,
                            rate, seed, page_size, num_blocks, max_batch_tokens, patch, interpret,
                            profile_dir, label, ledger_url, no_ledger, as_json):  # fmt: skip
        """A continuous-batching workload on transformers' serving loop, run with the model's
        own attention and with kernelab's (greedy; tokens compared): output tokens/s, TTFT, ITL,
        KV blocks, fragmentation and attention's share of a profiled step."""
        import torch

        from kernelab.hardware import detect
        from kernelab.models import presets
        from kernelab.workloads import serve_bench as serve

        presets.get(preset)
        torch_dtype = None
        if dtype is not None:
            torch_dtype = getattr(torch, dtype, None)
            if torch_dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {dtype!r}")
        if rate is not None and not rate > 0:
            raise ValueError(f"rate: expected a positive number of requests per second, got {rate}")
        lengths = serve.read_lengths(lengths_file) if lengths_file else None
        if lengths is not None:
            requests = len(lengths)
        info = detect(device)
        lost("the runs so far" + ("" if no_ledger else ": serve-bench stores its result when done"))
        with spinner("building model", disable=as_json) as say:

            def progress(msg: str) -> None:
                say(msg)
                doing(msg)

            result = serve.run(
                preset, device, torch_dtype, requests, prompt_len, output_len, seed, rate,
                lengths, page_size, num_blocks, max_batch_tokens, patch, interpret, profile_dir,
                progress=progress,
            )  # fmt: skip
        rec = None if no_ledger else _store(result, info, ledger_url, label)
        run_id = rec.run_id if rec is not None else None
        lost(None)
        if as_json:
            emit_json({"device": info.as_dict(), "run_id": run_id, **result})
            unstored(rec)
            return
        from kernelab.cli._common import console, echo

        serve_sheet(result, info).print(console)
        same = result["tokens_identical"]
        n = len(result["requests"])
        echo((f"tokens identical in all {n} requests" if same else
              f"tokens differ: {n - result['requests_identical']} of {n} requests "
              f"(first: request {result['first_difference']['request']})",
              "green" if same else "red"))  # fmt: skip
        if result.get("baseline_note"):
            echo((f"note: {result['baseline_note']}", "yellow"))
        echo((f"kernels: {result['kernels']}; {result['dtype']}, head_dim {result['head_dim']}, "
              f"pages of {result['page_size']}, {result['num_blocks']} blocks", "dim"))  # fmt: skip
        if run_id is not None:
            echo((f"stored as run {run_id}", "dim"))
        unstored(rec)


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def serve_sheet(result, info):
    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab serve-bench — {result['preset']}, {len(result['requests'])} requests on "
        f"{info.type}: {info.name}",
        [
            Col("attention"),
            Col("tok/s", right=True),
            Col("×", right=True),
            Col("TTFT p50/p99 ms", right=True),
            Col("ITL p50/p99 ms", right=True),
            Col("blocks peak", right=True),
            Col("frag", right=True),
            Col("attn", right=True),
        ],
    )
    for r in result["runs"]:
        share = r.get("attention_share")
        frag = r.get("fragmentation")
        sheet.row(
            r["attention"],
            f"{r['output_tokens_per_s']:.1f}",
            f"{r['speedup']:.2f}" if r.get("speedup") else "-",
            f"{_ms(r['ttft_s']['p50'])}/{_ms(r['ttft_s']['p99'])}",
            f"{_ms(r['itl_s']['p50'])}/{_ms(r['itl_s']['p99'])}",
            str(r["blocks"]["peak"]),
            "-" if frag is None else f"{frag:.0%}",
            "-" if share is None else f"{share:.0%}",
        )
    return sheet


def _store(result, info, url, label=None):
    from kernelab import ledger

    n = len(result["requests"])
    cases = [
        {
            "op": f"serve:{result['preset']}",
            "variant": r["attention"],
            "shape_key": f"requests={n},page={result['page_size']},blocks={result['num_blocks']}",
            "shape_label": f"{result['preset']} continuous batching, {n} requests",
            "dtype": result["dtype"],
            "device": info.name,
            "mode": "end-to-end",
            "metrics": {
                "median_s": r["elapsed_s"],
                "output_tokens_per_s": r["output_tokens_per_s"],
                "speedup": r["speedup"],
                "ttft_p50_s": r["ttft_s"]["p50"],
                "ttft_p99_s": r["ttft_s"]["p99"],
                "itl_p50_s": r["itl_s"]["p50"],
                "itl_p99_s": r["itl_s"]["p99"],
                "blocks_mean": r["blocks"]["mean"],
                "blocks_peak": r["blocks"]["peak"],
                "fragmentation": r["fragmentation"],
                "attention_share": r.get("attention_share"),
                "tokens_identical": result["tokens_identical"],
            },
            "flags": [f"kernels={result['kernels']}"],
        }
        for r in result["runs"]
    ]
    return store_run(url, "serve-bench", cases, ledger.provenance(info), label)
