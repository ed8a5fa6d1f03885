"""The tuning loop; see the package docstring."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelab import _flags
from kernelab.bench import integrity
from kernelab.core import dtype_name
from kernelab.core.runtime import tuned as _tuned
from kernelab.ops import Op, Shape
from kernelab.tune.search import Trial, search
from kernelab.tune.static import Analysis, Standing, rank

#: The namespace of tuned configs in the ledger's cache.
NAMESPACE = "tune"

Prune = Callable[[object, str], "str | None"]  # (launch, target) -> reason or None
Measure = Callable[[Op, Shape, torch.dtype, object, int], float]


@dataclass
class TuneResult:
    op: str
    shape: Shape
    dtype: str
    target: str
    space: int
    pruned: Counter = field(default_factory=Counter)  # reason -> count
    strategy: str | None = None
    trials: list[Trial] = field(default_factory=list)
    winner: object = None
    verified: bool | None = None
    stored: bool = False
    note: str = ""
    #: Without timing: the survivors as inspect ranks them, preferred first.
    ranked: list[Standing] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "shape": self.shape.as_dict(),
            "dtype": self.dtype,
            "target": self.target,
            "space": self.space,
            "pruned": dict(self.pruned),
            "survivors": self.space - sum(self.pruned.values()),
            "strategy": self.strategy,
            "winner": config_fields(self.winner),
            "verified": self.verified,
            "stored": self.stored,
            "timed": [
                {"config": config_fields(t.config), "times": t.times, "error": t.error}
                for t in self.trials
            ],
            "note": self.note,
            "ranked": [
                {
                    "config": config_fields(r.config),
                    "spill_bytes": r.spill_bytes,
                    "occupancy": r.occupancy,
                    "widest_bits": r.widest_bits,
                    "registers": r.registers,
                }
                for r in self.ranked
            ],
        }


def config_fields(config) -> dict | int | str | None:
    """A config as JSON: a config class's fields, or a plain value as it is (an op whose
    configs are one number: moe_topk's tokens per program); None for the default config."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, int | str) and not isinstance(config, bool):
        return config
    return dict(config)


def _default_prune() -> Prune | None:
    """inspect's verdict as a reason (its category, for counting) or None to keep."""
    try:
        from kernelab.inspect import prune
    except ImportError:
        return None

    def reason(launch, target):
        verdict = prune(launch, target)
        return None if verdict.keep else _category(verdict.reasons[0])

    return reason


def _category(reason: str) -> str:
    """ "spills 44 bytes per thread" -> "spills bytes per thread": counts group by kind."""
    head = reason.split(":", 1)[0].split("(", 1)[0]
    return " ".join(w for w in head.split() if not w.isdigit()).strip()


def prune_configs(
    op: Op, shape: Shape, dtype, configs, target: str, prune: Prune | None
) -> tuple[list, Counter]:
    kept, reasons = [], Counter()
    for config in configs:
        reason = None
        if prune is not None and op.launches is not None:
            for launch in op.launches(shape, dtype, config):
                reason = prune(launch, target)
                if reason:
                    break
        if reason:
            reasons[reason] += 1
        else:
            kept.append(config)
    return kept, reasons


def verify_config(op: Op, shape: Shape, dtype, config, device, seed: int = 0) -> bool:
    """The op's Triton variant with ``config`` agrees with the float64 reference: bench's
    check (outputs within the contract, in-place arguments within their regions and bitwise
    unchanged outside them)."""
    inputs = op.inputs(shape, dtype, device, seed=seed)
    ref = integrity.Reference.build(op, inputs, dtype)
    cand = integrity.clone_inputs(inputs)
    return ref.check(op.tuned_variant().fn(**cand, config=config), cand) is None


def gpu_measure() -> Measure:
    """Device-event timing of the Triton variant with one config on the current CUDA device:
    three warm-up calls, then ``10 × effort`` calls between two events (GPU only)."""

    def measure(op, shape, dtype, config, effort):
        inputs = op.inputs(shape, dtype, "cuda", seed=0)
        fn = op.tuned_variant().fn
        for _ in range(3):
            fn(**inputs, config=config)
        torch.cuda.synchronize()
        reps = 10 * effort
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn(**inputs, config=config)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    return measure


def tune(
    op: Op,
    shapes: Sequence[Shape],
    dtype: torch.dtype,
    device: str = "cpu",
    *,
    target: str | None = None,
    measure: Measure | None = None,
    prune: Prune | None = None,
    use_inspect: bool = True,
    store: Callable[[TuneResult, str], None] | None = None,
    verify: bool = True,
    progress: Callable[[str], None] | None = None,
    analysis: list[Analysis] | None = None,
) -> list[TuneResult]:
    """Tune ``op`` for each shape; see the package docstring.

    Without a timing function and with inspect's own pruning, every config of every shape
    is compiled in one batch and the survivors are ranked statically
    (:mod:`kernelab.tune.static`); pass a list as ``analysis`` to receive that batch's
    figures (compilations made, read from the cache, seconds)."""
    from kernelab.hardware import detect

    if op.tuning_space is None:
        raise ValueError(f"op: {op.name!r} declares no tuning space")
    info = detect(device)
    if target is None:
        target = info.arch if info.type == "cuda" else "sm_90"
    static = None
    if measure is None and prune is None and use_inspect and op.launches is not None:
        try:
            static = rank(op, shapes, dtype, target, _category, progress)
        except ImportError:  # inspect needs Triton
            static = None
        if static is not None and analysis is not None:
            analysis.append(static)
    if prune is None and use_inspect and static is None:
        prune = _default_prune()
    results = []
    for i, shape in enumerate(shapes):
        if progress and static is None:
            progress(f"tune {op.name} {shape.label}")
        configs = list(op.tuning_space(shape, dtype))
        result = TuneResult(op.name, shape, dtype_name(dtype), target, len(configs))
        if static is not None:
            result.pruned = static.rankings[i].pruned
            result.ranked = static.rankings[i].ranked
            kept = [r.config for r in result.ranked]
        else:
            kept, result.pruned = prune_configs(op, shape, dtype, configs, target, prune)
        if prune is None and static is None:
            result.note = "no static pruning (inspect unavailable)"
        if measure is None:
            result.note = (result.note + "; " if result.note else "") + (
                "not timed: interpreter timings mean nothing on a CPU"
                if info.type == "cpu"
                else "not timed: no timing function"
            )
            results.append(result)
            continue
        result.strategy, result.trials = search(
            kept, lambda c, effort, s=shape: measure(op, s, dtype, c, effort)
        )
        for trial in result.trials:
            if trial.error is not None or not trial.times:
                continue
            ok = not verify or verify_config(op, shape, dtype, trial.config, device)
            if ok:
                result.winner, result.verified = trial.config, verify
                break
            result.verified = False
        if result.winner is not None and store is not None:
            if dataclasses.is_dataclass(result.winner):
                store(result, info.key)
                result.stored = True
            else:  # the ops read tuned configs of a config class only
                result.note = "not stored: a plain-value config is not read from tuned files"
        results.append(result)
    return results


def _entry(result: TuneResult, device_key: str, op: Op) -> dict:
    return {
        "device": device_key,
        "op": result.op,
        "kernel_hash": _tuned.kernel_hash(op.kernels),
        "triton": _tuned.triton_version(),
        "dtype": result.dtype,
        "bucket": _tuned.bucket(result.shape.dims, result.shape.batch_dim),
        "config": config_fields(result.winner),
    }


def store_winner(op: Op, db=None, path: Path | None = None):
    """A ``store`` callback for :func:`tune`: the ledger cache (if ``db``) and the tuned-config
    file the ops read (default: ``<cache dir>/tuned.json``)."""
    path = path or (_flags.cache_dir() / "tuned.json")

    def store(result: TuneResult, device_key: str) -> None:
        entry = _entry(result, device_key, op)
        if db is not None:
            key = "|".join(
                str(entry[k]) for k in ("device", "op", "kernel_hash", "triton", "dtype", "bucket")
            )
            db.cache_put(NAMESPACE, key, entry)
        entries = _tuned.read_file(path) if path.is_file() else []
        same = _tuned.entry_key(
            *(entry[k] for k in ("device", "op", "kernel_hash", "triton", "dtype", "bucket"))
        )
        entries = [
            e
            for e in entries
            if _tuned.entry_key(
                e.get("device"),
                e.get("op"),
                e.get("kernel_hash"),
                e.get("triton"),
                e.get("dtype"),
                e.get("bucket"),
            )
            != same
        ]
        _tuned.write_file(path, [*entries, entry])
        _tuned.reload()  # the ops read the tuned table once: let them see the new winner

    return store


def export(path: Path, device_key: str | None = None, source: Path | None = None) -> int:
    """Write the tuned entries (for one device, or all) to ``path`` for shipping; returns how
    many were written."""
    source = source or (_flags.cache_dir() / "tuned.json")
    entries = _tuned.read_file(source) if source.is_file() else []
    if device_key is not None:
        entries = [e for e in entries if e.get("device") == device_key]
    _tuned.write_file(Path(path), entries)
    _tuned.reload()  # the export may be a file the ops read (kernelab/data/tuned/)
    return len(entries)
