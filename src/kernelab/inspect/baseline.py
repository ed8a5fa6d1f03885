"""The CI gate: compare reports with a committed baseline file, and rewrite it.

The baseline is JSON (parsed, never executed): per key (op/kernel/target/dtype/shape) the
registers, spilled bytes, shared memory, load and store widths and tensor-core instructions,
plus the triton version that compiled them. ``--update-baseline`` writes it sorted and indented
so the same reports always give the same bytes.

What is compared, and when:
- spills (new or more local memory), vectorisation (more global accesses narrower than 128
  bits, or a narrower widest load), tensor cores (a kind that was there is gone), and the
  ability to launch (shared memory or registers beyond the target's limit): always, since a
  newer Triton should not lose these;
- registers (more than ``REGISTER_SLACK``): only when the same triton version compiled both,
  since register allocation legitimately moves between compiler versions.

TPU targets (Pallas calls lowered to Mosaic) have entries of their own: whether the call
lowers, its grid and semantics, the VMEM estimate and its findings by kind. Gated always (the
lowering does not depend on a Triton version): a call that no longer lowers, a VMEM estimate
grown by more than ``VMEM_SLACK``, a finding of a kind more often than before (tiling, vmem,
no-parallel-axis, small-blocks), and a call that could run before and cannot now (VMEM).
TPU entries are added without touching the Triton ones:
``kernelab inspect -t tpu_v5e,tpu_v6e,tpu7x --update-baseline`` (a subset of targets merges).

Keys in the baseline but not in the reports, and new keys, are listed but do not fail.

A GPU entry also keeps what a report shows of itself (its warps, its warnings and errors: not
gated), so that a report trusted from the baseline (:func:`trust`, same cache key) reads
as the compiled one would: the report card (:func:`kernelab.inspect.stage`) takes those
instead of compiling them again. Entries written before carry none and are compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from kernelab.inspect import runner
from kernelab.inspect.findings import VECTOR_BITS, Finding, narrow_accesses, occupancy_of
from kernelab.inspect.report import KernelReport

FORMAT = 1
DEFAULT_PATH = "inspect-baseline.json"


#: Growth of a TPU call's VMEM estimate the gate lets pass (layouts and scratch sizes move).
VMEM_SLACK = 0.10


def register_slack(base: int) -> int:
    """Registers a kernel may grow before the gate fails: 8, or 10% for large kernels."""
    return max(8, base // 10)


def tpu_entry(rep: KernelReport) -> dict:
    f = rep.facts or {}
    kinds: dict[str, int] = {}
    for x in rep.findings:
        kinds[x.kind] = kinds.get(x.kind, 0) + 1
    return {
        "lowers": True,
        "grid": f.get("grid", []),
        "semantics": f.get("semantics", []),
        "vmem_estimate_bytes": f.get("vmem_estimate_bytes", 0),
        "findings": dict(sorted(kinds.items())),
        "launchable": rep.ok,
    }


def entry(rep: KernelReport) -> dict:
    """What the baseline keeps of ``rep``: its cache key and the gated facts (a report trusted
    from the baseline is its entry, unchanged)."""
    if rep.trusted is not None:
        return rep.trusted
    out = _facts_entry(rep)
    if rep.cache_key:
        out["cache_key"] = rep.cache_key
    return out


def _facts_entry(rep: KernelReport) -> dict:
    f = rep.facts or {}
    if rep.error:
        return {"error": rep.error}
    if rep.unsupported:
        return {"unsupported": rep.unsupported}
    if rep.is_tpu:
        return tpu_entry(rep)
    return {
        "registers": f.get("registers"),
        "spill_bytes": f.get("spill_bytes") or 0,
        "shared_bytes": f.get("shared_bytes", 0),
        "loads": f.get("loads", {}),
        "stores": f.get("stores", {}),
        "narrow_accesses": narrow_accesses(f),
        "tensor_cores": sorted(f.get("tensor_cores") or {}),
        "launchable": rep.ok,
        # shown, not gated: what trust() gives back so a trusted report reads as this one
        "num_warps": f.get("num_warps"),
        "warnings": [[x.kind, x.severity, x.message] for x in rep.findings if x.severity != "info"],
    }


#: The fields of a GPU entry that describe its report whole (:func:`trust` ``shown=True``).
SHOWN = ("num_warps", "warnings")


def _complete(base: dict, target) -> bool:
    """Whether a GPU entry keeps what its report shows (an error or an unsupported type is
    all a report of those shows); TPU entries keep counts of findings, not their words."""
    if target.is_tpu:
        return False
    return bool(base.get("error") or base.get("unsupported")) or all(k in base for k in SHOWN)


def _shown(base: dict, target) -> dict:
    """The report fields a GPU entry with :data:`SHOWN` gives back: the facts as far as the
    entry keeps them, the occupancy they give on ``target``, the warnings and errors."""
    facts = {
        k: base.get(k) for k in ("registers", "spill_bytes", "shared_bytes", "loads", "stores")
    }
    facts["num_warps"] = base["num_warps"]
    facts["tensor_cores"] = {k: 1 for k in base.get("tensor_cores") or ()}
    findings = [Finding(k, s, m) for k, s, m in base["warnings"]]
    occ = occupancy_of(facts, target) if facts["num_warps"] else None
    return {"facts": facts, "occupancy": occ and occ.as_dict(), "findings": findings}


def trust(
    jobs: Sequence, baseline: dict | None, shown: bool = False
) -> tuple[list[KernelReport | None], int]:
    """Reports for the jobs whose compilation the baseline already describes: its entry under
    the job's key holds the job's cache key (the kernel's source and every helper it calls,
    its launch, target, compiler and parser versions), so compiling it again would give the
    same entry. One slot per job, None where it must be compiled; and how many were trusted.
    ``shown``: only GPU entries that also keep what their report shows (:data:`SHOWN`), those
    reports filled in with it (facts, occupancy, findings), for a reader of the reports."""
    entries = (baseline or {}).get("entries") or {}
    triton = (baseline or {}).get("triton")
    out: list[KernelReport | None] = []
    for job in jobs:
        base = entries.get(job.key)
        key = base.get("cache_key") if isinstance(base, dict) else None
        if (
            not key
            or (shown and not _complete(base, job.target))
            or key != runner.cache_key(job.spec, job.target)
        ):
            out.append(None)
            continue
        fields = {} if not shown or "warnings" not in base else _shown(base, job.target)
        out.append(
            job.report(
                error=base.get("error"),
                unsupported=base.get("unsupported"),
                triton=None if job.target.is_tpu or not isinstance(triton, str) else triton,
                cache_key=key,
                trusted=base,
                **fields,
            )
        )
    return out, sum(r is not None for r in out)


def build(reports: Sequence[KernelReport]) -> dict:
    versions = sorted({r.triton for r in reports if r.triton and not r.is_tpu})
    return {
        "format": FORMAT,
        "triton": versions[0] if len(versions) == 1 else versions,
        "entries": {r.key: entry(r) for r in sorted(reports, key=lambda r: r.key)},
    }


def dumps(data: dict) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write(path: str | Path, reports: Sequence[KernelReport], merge: bool = False) -> dict:
    """Write the baseline for ``reports``; with ``merge``, keep entries of keys not inspected
    now (e.g. when only some ops or targets were inspected)."""
    data = build(reports)
    if merge and Path(path).exists():
        old = load(path)
        entries = dict(old["entries"])
        entries.update(data["entries"])
        data["entries"] = dict(sorted(entries.items()))
        if not data["triton"]:  # only TPU lowerings now: the Triton entries keep their version
            data["triton"] = old.get("triton", [])
    Path(path).write_bytes(dumps(data))
    return data


def project_path() -> Path | None:
    """The committed baseline of the checkout kernelab runs from (``src/kernelab`` two levels
    below it), or None for an installed package."""
    import kernelab

    p = Path(kernelab.__file__).resolve().parents[2] / DEFAULT_PATH
    return p if p.is_file() else None


def load(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"baseline: no such file {str(p)!r} (write one: --update-baseline)")
    try:
        data = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"baseline: {str(p)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError(f"baseline: {str(p)!r} has no 'entries' object")
    if data.get("format") != FORMAT:
        raise ValueError(f"baseline: format: expected {FORMAT}, got {data.get('format')!r}")
    return data


@dataclass
class Comparison:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.regressions)


def _widest(d: dict) -> int:
    return max((int(k) for k in d), default=0)


def compare(
    reports: Sequence[KernelReport],
    baseline: dict,
    ops: Sequence[str] | None = None,
    targets: Sequence[str] | None = None,
) -> Comparison:
    """Regressions of ``reports`` against ``baseline``. Baseline keys of ``ops`` on
    ``targets`` (default: those in the reports) that were not inspected are listed missing."""
    out = Comparison()
    entries = baseline["entries"]
    base_version = baseline.get("triton")
    versions = {r.triton for r in reports if r.triton}
    same_version = isinstance(base_version, str) and versions == {base_version}
    if versions and not same_version:  # (a run of TPU targets only compiles no Triton)
        out.notes.append(
            f"baseline compiled by triton {base_version}, now {', '.join(sorted(versions))}: "
            "registers not compared (spills, vectorisation, tensor cores and launchability are)"
        )
    seen = set()
    for rep in sorted(reports, key=lambda r: r.key):
        seen.add(rep.key)
        base = entries.get(rep.key)
        if base is None:
            out.new.append(rep.key)
            continue
        now = entry(rep)
        where = f"{rep.kernel} on {rep.target} [{rep.key}]"
        if "error" in now:
            if "error" not in base:
                verb = "no longer lowers" if rep.is_tpu else "no longer compiles"
                out.regressions.append(f"{where}: {verb}: {now['error']}")
            continue
        if "unsupported" in now:
            if "unsupported" not in base and "error" not in base:
                out.regressions.append(f"{where}: no longer for this target: {now['unsupported']}")
            continue
        if "error" in base or "unsupported" in base:
            out.improvements.append(f"{where}: {'lowers' if rep.is_tpu else 'compiles'} now")
            continue
        if rep.is_tpu:
            _compare_tpu(out, where, base, now)
            continue
        if now["spill_bytes"] > base.get("spill_bytes", 0):
            out.regressions.append(
                f"{where}: spills {base.get('spill_bytes', 0)} → {now['spill_bytes']} "
                "bytes per thread"
            )
        b_narrow, b_wide = base.get("narrow_accesses", 0), _widest(base.get("loads", {}))
        n_wide = _widest(now["loads"])
        if now["narrow_accesses"] > b_narrow or (n_wide < b_wide and n_wide < VECTOR_BITS):
            out.regressions.append(
                f"{where}: lost vectorisation: widest load {b_wide} → {n_wide} bits, accesses "
                f"narrower than 128 bits {b_narrow} → {now['narrow_accesses']}"
            )
        lost = [k for k in base.get("tensor_cores", []) if k not in now["tensor_cores"]]
        if lost:
            out.regressions.append(
                f"{where}: lost tensor cores: {'+'.join(base.get('tensor_cores', []))} → "
                f"{'+'.join(now['tensor_cores']) or 'none'}"
            )
        if base.get("launchable", True) and not now["launchable"]:
            out.regressions.append(f"{where}: can no longer launch (shared memory or registers)")
        b_regs, n_regs = base.get("registers"), now["registers"]
        if same_version and b_regs is not None and n_regs is not None:
            if n_regs > b_regs + register_slack(b_regs):
                out.regressions.append(f"{where}: registers {b_regs} → {n_regs} per thread")
            elif n_regs < b_regs - register_slack(b_regs):
                out.improvements.append(f"{where}: registers {b_regs} → {n_regs}")
    ops_in = set(ops) if ops is not None else {r.op for r in reports}
    targets_in = set(targets) if targets is not None else {r.target for r in reports}

    def in_scope(key: str) -> bool:
        parts = key.split("/")
        return len(parts) > 2 and parts[0] in ops_in and parts[2] in targets_in

    out.missing = sorted(k for k in entries if k not in seen and in_scope(k))
    return out


def _count(value) -> int:
    """A non-negative count or size from the baseline file (0 for anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _compare_tpu(out: Comparison, where: str, base: dict, now: dict) -> None:
    b_vmem, n_vmem = _count(base.get("vmem_estimate_bytes")), int(now["vmem_estimate_bytes"])
    if n_vmem > b_vmem * (1 + VMEM_SLACK):
        out.regressions.append(
            f"{where}: VMEM estimate {b_vmem / 2**20:.2f} → {n_vmem / 2**20:.2f} MiB "
            f"(more than {VMEM_SLACK:.0%})"
        )
    elif n_vmem < b_vmem * (1 - VMEM_SLACK):
        out.improvements.append(
            f"{where}: VMEM estimate {b_vmem / 2**20:.2f} → {n_vmem / 2**20:.2f} MiB"
        )
    b_kinds = base.get("findings") or {}
    if not isinstance(b_kinds, dict):
        b_kinds = {}
    for kind, n in now["findings"].items():
        if n > _count(b_kinds.get(kind)):
            out.regressions.append(f"{where}: {kind} findings {_count(b_kinds.get(kind))} → {n}")
    if base.get("launchable", True) and not now["launchable"]:
        out.regressions.append(f"{where}: can no longer run (VMEM)")
