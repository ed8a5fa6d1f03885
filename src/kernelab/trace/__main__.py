"""``python -m kernelab.trace summary|diff ...``: the trace commands without loading torch
(the full ``kernelab`` CLI imports every command, and with them torch)."""

from __future__ import annotations

import sys

from kernelab.trace.commands import run_diff, run_summary

USAGE = (
    "usage: python -m kernelab.trace summary TRACE [--json] [--top N] [--perfetto OUT]\n"
    "       python -m kernelab.trace diff A B [--json] [--top N]"
)


def main(argv: list[str]) -> int:
    flags = {"--json": False}
    opts: dict[str, str] = {}
    args: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--json":
            flags["--json"] = True
        elif a in ("--top", "--perfetto", "--short-us"):
            opts[a] = next(it, "")
        elif a in ("-h", "--help"):
            print(USAGE)
            return 0
        else:
            args.append(a)
    try:
        top = int(opts.get("--top", "15"))
        if args[:1] == ["summary"] and len(args) == 2:
            return run_summary(
                args[1],
                as_json=flags["--json"],
                top=top,
                short_us=float(opts.get("--short-us", "5")),
                perfetto=opts.get("--perfetto"),
            )
        if args[:1] == ["diff"] and len(args) == 3:
            return run_diff(args[1], args[2], as_json=flags["--json"], top=top)
    except (ValueError, TypeError, FileNotFoundError, PermissionError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
