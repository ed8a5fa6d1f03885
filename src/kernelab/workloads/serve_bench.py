"""A continuous-batching workload on transformers' own serving loop (``ContinuousBatchingManager``,
paged KV cache), run with the model's own attention and with kernelab's.

N requests with prompt and output lengths drawn from a seeded distribution (or given), arriving
all at once or at a rate; greedy decoding, so the two runs' tokens can be compared one by one.
Per run: output tokens/s, time to first token and inter-token latency (p50, p99, from
transformers' per-token timestamps), KV-cache blocks used (mean and peak over steps) and the
internal fragmentation of the blocks the step's requests hold (unused slots of partly filled
blocks), and attention's share of one profiled step (the step's forward under the PyTorch
profiler in the serving thread, the attention calls annotated, the trace read by
``kernelab.trace``). Both runs build their manager with the same configuration (no compile, no
CUDA graphs: kernelab's path takes sdpa's masks and transformers then skips graphs for both).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelab.models import presets


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float


def draw_requests(
    n: int, vocab: int, prompt_len: int, output_len: int, seed: int = 0,
    rate: float | None = None, lengths: list[tuple[int, int]] | None = None,
) -> list[Request]:  # fmt: skip
    """``n`` requests: prompt lengths uniform in [prompt_len / 4, 7·prompt_len / 4] and output
    lengths in [output_len / 2, 3·output_len / 2] (so some finish early and free their blocks),
    or ``lengths`` as given; arrivals at ``rate`` per second (Poisson), or all at once."""
    if n < 1:
        raise ValueError(f"requests: expected at least 1, got {n}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate: expected a positive number of requests per second, got {rate}")
    gen = torch.Generator().manual_seed(seed)
    if lengths is None:
        lo_p, hi_p = max(1, prompt_len // 4), max(1, prompt_len * 7 // 4)
        lo_o, hi_o = max(1, output_len // 2), max(1, output_len * 3 // 2)
        p = torch.randint(lo_p, hi_p + 1, (n,), generator=gen).tolist()
        o = torch.randint(lo_o, hi_o + 1, (n,), generator=gen).tolist()
        lengths = list(zip(p, o, strict=True))
    if len(lengths) != n:
        raise ValueError(f"lengths: expected {n} (prompt, output) pairs, got {len(lengths)}")
    out, t = [], 0.0
    for prompt, new in lengths:
        if prompt < 1 or new < 1:
            raise ValueError(f"lengths: expected positive lengths, got ({prompt}, {new})")
        ids = torch.randint(1, vocab, (prompt,), generator=gen).tolist()
        out.append(Request(tuple(ids), int(new), t))
        if rate is not None:
            t += float(torch.empty(1).exponential_(rate, generator=gen))
    return out


def read_lengths(path: str) -> list[tuple[int, int]]:
    """A file of lengths: one ``prompt output`` pair of integers per line ('#' comments)."""
    pairs = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"lengths file {path}, line {i}: expected two integers, got {line!r}")
        pairs.append((int(parts[0]), int(parts[1])))
    if not pairs:
        raise ValueError(f"lengths file {path}: no lengths")
    return pairs


def _pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


class _StepSampler:
    """A forward pre/post hook pair on the model: per step, the blocks the paged cache holds
    and the slots the step's requests leave unused in their last blocks; one chosen step runs
    under the profiler (in the serving thread) with the attention calls annotated."""

    def __init__(self, model, profile_step: int | None, folder: Path):
        self.model, self.profile_step, self.folder = model, profile_step, folder
        self.steps, self.blocks, self.frag = 0, [], []
        self.trace, self._prof, self._restore = None, None, None

    def pre(self, module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        allocs = getattr(cache, "cache_allocators", None)
        if allocs:
            full = next(iter(allocs.values()))
            page = int(full.tokens_per_page)
            self.blocks.append(sum(len(b) for b in full.block_table.values()))
            cu = kwargs.get("cu_seq_lens_k")
            cu = next(iter(cu.values())) if isinstance(cu, dict) else cu
            if cu is not None:
                lens = (cu[1:] - cu[:-1]).tolist()
                slots = sum(-(-n // page) * page for n in lens if n)
                self.frag.append((slots - sum(lens)) / slots if slots else 0.0)
        if self.steps == self.profile_step:
            self._start()
        return None

    def post(self, module, args, kwargs, output):
        if self._prof is not None:
            self._stop()
        self.steps += 1
        return None

    def _start(self):
        from torch.profiler import ProfilerActivity, profile, record_function

        from kernelab.trace.profile import quiet_profiler

        quiet_profiler()
        from transformers.modeling_utils import AttentionInterface

        name = self.model.config._attn_implementation
        mapping = AttentionInterface._global_mapping
        original = mapping.get(name)
        if original is not None:

            def annotated(*a, **k):
                with record_function("serve::attention"):
                    return original(*a, **k)

            mapping[name] = annotated
            self._restore = (mapping, name, original)
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=acts)
        self._prof.__enter__()

    def _stop(self):
        prof, self._prof = self._prof, None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        if self._restore is not None:
            mapping, name, original = self._restore
            mapping[name] = original
            self._restore = None
        self.trace = str(self.folder / f"step-{self.model.config._attn_implementation}.json")
        prof.export_chrome_trace(self.trace)


def _attention_share(trace: str | None) -> dict:
    if trace is None:
        return {"attention_share": None, "step_us": None}
    from kernelab.trace import summarize

    cpu = summarize(trace, top=10).get("cpu") or {}
    window = cpu.get("window_us")
    attn = _annotated_us(trace, "serve::attention")
    return {
        "attention_share": round(attn / window, 4) if window else None,
        "step_us": window,
        "attention_us": round(attn, 3),
        "trace": trace,
    }


def _annotated_us(trace: str, name: str) -> float:
    """Total duration of the user annotations ``name`` in a Chrome trace (parsed as JSON)."""
    import json

    data = json.loads(Path(trace).read_text())
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return float(sum(
        float(e.get("dur", 0)) for e in events
        if isinstance(e, dict) and e.get("name") == name and e.get("ph") == "X"
    ))  # fmt: skip


@torch.no_grad()
def run_once(model, requests, page_size: int, num_blocks: int | None, max_batch_tokens: int,
             profile_dir: Path, progress=None, profile: bool = True) -> dict:  # fmt: skip
    """One run of the workload on ``model`` as it is (its current attention)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=1)
    cb = ContinuousBatchingConfig(
        page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens
    )
    # profile a step in the thick of it: after the first prefills, while requests decode
    profile_dir.mkdir(parents=True, exist_ok=True)
    sampler = _StepSampler(model, profile_step=2 if profile else None, folder=profile_dir)
    handles = [
        model.register_forward_pre_hook(sampler.pre, with_kwargs=True),
        model.register_forward_hook(sampler.post, with_kwargs=True),
    ]
    gc.collect()
    gc.freeze()  # transformers' manager collects on stop: keep that to what the run made
    try:
        manager = model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cb
        )
        manager.start()
        t0 = time.perf_counter()
        ids = {}
        for i, r in enumerate(requests):
            wait = t0 + r.arrival_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            rid = manager.add_request(list(r.prompt), request_id=f"req_{i}",
                                      max_new_tokens=r.max_new_tokens,
                                      record_timestamps=True)  # fmt: skip
            ids[rid] = i
        results = {}
        while len(results) < len(requests):
            out = manager.get_result(timeout=600)
            if out is None:
                raise RuntimeError("serve-bench: no result from the serving loop in 600 s")
            if out.is_finished():
                results[out.request_id] = out
                if progress:
                    progress(f"{len(results)}/{len(requests)} requests done")
        elapsed = time.perf_counter() - t0
        manager.stop(block=True)
    finally:
        for h in handles:
            h.remove()
        gc.unfreeze()
    tokens, ttft, itl = {}, [], []
    for rid, out in results.items():
        if out.error:
            raise RuntimeError(f"serve-bench: request {rid} failed: {out.error}")
        tokens[ids[rid]] = list(out.generated_tokens)
        stamps = out.timestamps or []
        if stamps:
            ttft.append(stamps[0] - out.created_time)
            itl += [b - a for a, b in itertools.pairwise(stamps)]
    n_out = sum(len(t) for t in tokens.values())
    return {
        "tokens": [tokens[i] for i in range(len(requests))],
        "output_tokens": n_out,
        "elapsed_s": elapsed,
        "output_tokens_per_s": n_out / elapsed if elapsed > 0 else None,
        "ttft_s": {"p50": _pct(ttft, 50), "p99": _pct(ttft, 99)},
        "itl_s": {"p50": _pct(itl, 50), "p99": _pct(itl, 99)},
        "steps": sampler.steps,
        "blocks": {
            "mean": statistics.fmean(sampler.blocks) if sampler.blocks else None,
            "peak": max(sampler.blocks) if sampler.blocks else None,
        },
        "fragmentation": statistics.fmean(sampler.frag) if sampler.frag else None,
        **_attention_share(sampler.trace),
    }


def run(preset: str, device: str = "cpu", dtype=None, requests: int = 8, prompt_len: int = 48,
        output_len: int = 8, seed: int = 0, rate: float | None = None, lengths=None,
        page_size: int = 16, num_blocks: int | None = None, max_batch_tokens: int = 256,
        patch: bool = False, interpret: bool = False, profile_dir=None,
        progress=None) -> dict:  # fmt: skip
    """The workload with the model's own attention, then with kernelab's (and with ``patch``,
    kernelab's norms and MLP too); the JSON-ready result."""
    import os

    from kernelab.models import patch as _patch_model
    from kernelab.models import serving
    from kernelab.models import unpatch as _unpatch

    p = presets.get(preset)
    say = progress or (lambda msg: None)
    head_dim = 64 if p.tiny else None  # the attention kernels' smallest head size
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    say(f"building {preset}")
    model = presets.build(preset, dtype=dtype, device=dev, head_dim=head_dim)
    reqs = draw_requests(requests, model.config.vocab_size, prompt_len, output_len, seed, rate,
                         lengths)  # fmt: skip
    folder = Path(profile_dir) if profile_dir else Path(tempfile.mkdtemp(prefix="kernelab-serve-"))
    folder.mkdir(parents=True, exist_ok=True)
    if num_blocks is None:  # room for every request at once, and a margin
        num_blocks = sum(-(-(len(r.prompt) + r.max_new_tokens) // page_size) for r in reqs) + 4
    runs = {}
    baseline = model.config._attn_implementation
    # Untimed warm-ups: the whole workload once before the first timed run (the first pass
    # through each step shape pays for allocations and the CPU GEMM library's per-shape set-up,
    # measured at seconds per run on CPU), then two requests before kernelab's (its kernels'
    # compilation); the shapes are the same in both runs.
    warm = reqs[: min(2, len(reqs))]
    say(f"run 1/2: transformers' {baseline} (warm-up, then timed)")
    run_once(model, reqs, page_size, num_blocks, max_batch_tokens, folder, profile=False)
    runs[baseline] = run_once(model, reqs, page_size, num_blocks, max_batch_tokens,
                              folder / "baseline", lambda m: say(f"{baseline}: {m}"))  # fmt: skip
    old = os.environ.get("KERNELAB_INTERPRET")
    if interpret:
        os.environ["KERNELAB_INTERPRET"] = "1"
    try:
        say("registering kernelab attention (parity check)")
        serving.register_attention(model)
        if patch:
            _patch_model(model)  # norms, fused residual, MLP, RoPE; parity-checked
        name = "kernelab" + ("+patch" if patch else "")
        say(f"run 2/2: {name} (warm-up, then timed)")
        run_once(model, warm, page_size, num_blocks, max_batch_tokens, folder, profile=False)
        runs[name] = run_once(model, reqs, page_size, num_blocks, max_batch_tokens,
                              folder / "kernelab", lambda m: say(f"{name}: {m}"))  # fmt: skip
    finally:
        if patch:
            _unpatch(model)
        serving.unregister_attention(model)
        if interpret:
            if old is None:
                os.environ.pop("KERNELAB_INTERPRET", None)
            else:
                os.environ["KERNELAB_INTERPRET"] = old
    note = None
    if serving.eager_paged_is_wrong(model, baseline):
        # transformers 5.24 runs an eager model's continuous batching on "paged|eager", which
        # ignores the attention softcap (serving's note): its tokens are not the model's
        note = (f"transformers' continuous batching runs {baseline!r} as 'paged|eager', which "
                "ignores the attention softcap: the baseline's tokens are those of the model "
                "without its cap, kernelab's apply it (tests/test_models_serving_gemma2.py "
                "compares them with generate's)")  # fmt: skip
    (_, ra), (_, rb) = runs.items()
    same = [x == y for x, y in zip(ra["tokens"], rb["tokens"], strict=True)]
    base_tps = ra["output_tokens_per_s"]
    return {
        "preset": preset,
        "dtype": str(dtype).removeprefix("torch."),
        "head_dim": model.config.head_dim,
        "kernels": "triton" if dev.type == "cuda" else (
            "triton interpreter" if interpret else "torch (CPU)"),
        "requests": [{"prompt": len(r.prompt), "output": r.max_new_tokens,
                      "arrival_s": r.arrival_s} for r in reqs],
        "page_size": page_size,
        "num_blocks": num_blocks,
        "tokens_identical": all(same),
        "requests_identical": sum(same),
        "runs": [
            {"attention": k, **{x: y for x, y in r.items() if x != "tokens"},
             "speedup": (r["output_tokens_per_s"] / base_tps) if base_tps else None}
            for k, r in runs.items()
        ],
        "baseline_note": note,
        "first_difference": next(
            ({"request": i, "baseline": ra["tokens"][i], "kernelab": rb["tokens"][i]}
             for i, s in enumerate(same) if not s), None),
    }  # fmt: skip
