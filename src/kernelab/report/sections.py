"""The report's sections for runs that time nothing: verify (correctness) and inspect (what
the compiler made of each kernel). Cases are as ``kernelab.sweep.work`` records them; every
string from a run is escaped.
"""

from __future__ import annotations

import math
from collections import Counter

from kernelab.report import fmt
from kernelab.report.svg import esc

#: Finding severities that mark a kernel as needing attention (``info`` does not).
_SERIOUS = ("error", "warn", "warning")


def _table(head: list[str], rows: list[list[tuple[object, str]]], cls: str = "") -> str:
    """A table: ``rows`` of ``(value, css class)`` cells; values escaped here."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{k}">{esc(v)}</td>' if k else f"<td>{esc(v)}</td>" for v, k in row)
        + "</tr>"
        for row in rows
    )
    c = f' class="{esc(cls)}"' if cls else ""
    return f"<table{c}><tr>{th}</tr>{body}</table>"


def _groups(cases: list[dict], *fields: str) -> dict[tuple, list[dict]]:
    """Cases by the values of ``fields``, in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for c in cases:
        out.setdefault(tuple(c.get(f) for f in fields), []).append(c)
    return out


# --- verify -------------------------------------------------------------------------------


def ratio_of(case: dict) -> float | None:
    """A verify case's worst error / tolerance: a float, ``inf`` or ``nan`` (the JSON form
    stores non-finite values as strings), None when the case measured nothing."""
    v = case["metrics"].get("worst_ratio")
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _worst(ratios: list[float | None]) -> float | None:
    """The worst of some ratios: NaN (an error that could not be measured) beats any number."""
    known = [r for r in ratios if r is not None]
    if any(math.isnan(r) for r in known):
        return math.nan
    return max(known, default=None)


def _ratio_text(r: float | None) -> str:
    if r is None:
        return "-"
    if math.isnan(r) or math.isinf(r):
        return str(r)
    return fmt.number(r)


def _passed(case: dict) -> bool:
    return case["metrics"].get("passed") is True


def _classes(case: dict) -> list[str]:
    """The failure classes a case showed: its flags, else its one recorded class."""
    flags = [str(f) for f in case.get("flags") or []]
    cls = case["metrics"].get("failure_class")
    return flags or ([str(cls)] if cls else [])


def _first_failure(case: dict) -> str:
    result = case["metrics"].get("result")
    failures = result.get("failures") if isinstance(result, dict) else None
    if not failures or not isinstance(failures[0], dict):
        return "-"
    f = failures[0]
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"{f.get('class')}: {f.get('target')}: {f.get('message')}{more}"


def verify_outcome(run: dict) -> str:
    n = len(run["cases"])
    return f"{sum(_passed(c) for c in run['cases'])} of {n} passed"


def verify(run: dict) -> str:
    """Pass/fail per op × variant (cases passed, the worst error / tolerance ratio, the
    failure classes seen and in how many cases), then every failing case."""
    cases = run["cases"]
    prov = (run.get("provenance") or {}).get("verify") or {}
    out = [f'<p class="muted">{esc(verify_outcome(run))}']
    if prov.get("seed") is not None:
        out.append(f" · seed {esc(prov['seed'])}")
    if prov.get("trials") is not None:
        out.append(f" · {esc(prov['trials'])} trial(s) per case")
    out.append(" · ratio: worst error / tolerance (above 1 fails)</p>")
    rows = []
    for (op, variant), group in _groups(cases, "op", "variant").items():
        passed = sum(_passed(c) for c in group)
        worst = _worst([ratio_of(c) for c in group])
        seen = Counter(cls for c in group for cls in _classes(c))
        bad = passed < len(group)
        rows.append(
            [
                (op, ""),
                (variant, ""),
                (", ".join(dict.fromkeys(str(c["dtype"]) for c in group)), ""),
                (f"{passed} / {len(group)}", "n flag" if bad else "n"),
                (_ratio_text(worst), "n flag" if worst is not None and not worst <= 1 else "n"),
                ("; ".join(f"{k} ×{v}" for k, v in seen.items()) or "-", "flag" if seen else ""),
            ]
        )
    head = ["op", "variant", "dtypes", "passed", "worst ratio", "failure classes (cases)"]
    out.append(_table(head, rows, "verify"))
    failing = [c for c in cases if not _passed(c)]
    if failing:
        out.append(f"<h3>failing cases ({len(failing)})</h3>")
        rows = [
            [
                (c["op"], ""),
                (c["variant"], ""),
                (c.get("shape_label") or c["shape_key"], ""),
                (c["dtype"], ""),
                (c["metrics"].get("failure_class") or "-", "flag"),
                (", ".join(_classes(c)) or "-", ""),
                (_ratio_text(ratio_of(c)), "n"),
                (_first_failure(c), ""),
            ]
            for c in failing
        ]
        head = ["op", "variant", "shape", "dtype", "class", "all classes", "ratio", "first failure"]
        out.append(_table(head, rows, "failing"))
    skipped = prov.get("skipped") or []
    if skipped:
        items = "".join(f"<li>{esc(s)}</li>" for s in skipped)
        out.append(f'<h3>skipped ({len(skipped)})</h3><ul class="muted">{items}</ul>')
    return "".join(out)


# --- inspect ------------------------------------------------------------------------------


def _serious(flag: str) -> bool:
    return str(flag).split(":", 1)[0] in _SERIOUS


def _findings(case: dict) -> str:
    """The case's flags, each with the finding's message where the report kept it."""
    report = case["metrics"].get("report")
    found = report.get("findings") if isinstance(report, dict) else None
    messages = {}
    for f in found or []:
        if isinstance(f, dict):
            messages.setdefault(f"{f.get('severity')}:{f.get('kind')}", f.get("message"))
    parts = []
    for flag in case.get("flags") or []:
        msg = messages.get(flag)
        if flag == "error" and isinstance(report, dict) and report.get("error"):
            msg = report["error"]
        parts.append(f"{flag} ({msg})" if msg else str(flag))
    return "; ".join(parts) or "-"


def _occupancy(v) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return "-"
    return fmt.percent(100 * v)


def _config(case: dict) -> str:
    report = case["metrics"].get("report")
    config = report.get("config") if isinstance(report, dict) else None
    if isinstance(config, dict):
        return " ".join(f"{k}={v}" for k, v in config.items()) or "default"
    return str(config) if config else "default"


def inspect_outcome(run: dict) -> str:
    cases = run["cases"]
    serious = sum(any(_serious(f) for f in c.get("flags") or []) for c in cases)
    spilling = sum(_spills(c) for c in cases)
    out = f"{len(cases)} kernel(s), {serious} with warnings or errors"
    return out + (f", {spilling} spilling" if spilling else "")


def _spills(case: dict) -> bool:
    v = case["metrics"].get("spill_bytes")
    return isinstance(v, int | float) and v > 0


def inspect(run: dict) -> str:
    """Per op and target, one row per kernel × shape (× config): registers per thread, spill
    bytes, shared memory, occupancy and the findings."""
    cases = run["cases"]
    out = [f'<p class="muted">{esc(inspect_outcome(run))}</p>']
    head = ["kernel", "variant", "shape", "dtype", "config", "registers", "spill bytes",
            "shared memory", "occupancy", "findings"]  # fmt: skip
    for (op, target), group in _groups(cases, "op", "device").items():
        out.append(f"<h3>{esc(op)} · {esc(target)}</h3>")
        rows = []
        for c in group:
            m = c["metrics"]
            serious = any(_serious(f) for f in c.get("flags") or [])
            rows.append(
                [
                    (m.get("kernel") or "-", ""),
                    (c["variant"], ""),
                    (c.get("shape_label") or c["shape_key"], ""),
                    (c["dtype"], ""),
                    (_config(c), ""),
                    (fmt.count(m.get("registers")), "n"),
                    (fmt.count(m.get("spill_bytes")), "n flag" if _spills(c) else "n"),
                    (fmt.nbytes(m.get("shared_bytes")), "n"),
                    (_occupancy(m.get("occupancy")), "n"),
                    (_findings(c), "flag" if serious else ""),
                ]
            )
        out.append(_table(head, rows, "inspect"))
    return "".join(out)
