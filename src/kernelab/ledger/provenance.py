"""Provenance of a run: where, when and with what code a result was produced."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from kernelab.ledger._sqlite import now_iso


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_info(path: str | Path | None = None) -> dict | None:
    """Commit and dirty state of the git checkout holding ``path`` (default: kernelab's own
    sources); None outside a checkout or without git. Never raises."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        branch = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--abbrev-ref", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not commit:
        return None
    return {"commit": commit, "dirty": bool(status.strip()), "branch": branch or None}


def _device_dict(device_info: Any) -> dict:
    from kernelab.hardware import DeviceInfo, detect

    if device_info is None or isinstance(device_info, str):
        device_info = detect(device_info)
    if isinstance(device_info, DeviceInfo):
        out = device_info.as_dict()
        out["key"] = device_info.key
        return out
    if isinstance(device_info, dict):
        return dict(device_info)
    raise TypeError(
        "device_info: expected None, a device string, a DeviceInfo or a dict, got "
        f"{type(device_info).__name__}"
    )


def provenance(device_info: Any = None, **extra: Any) -> dict:
    """Everything needed to say where a result came from.

    ``device_info``: None (detect the default device), a device string ("cpu", "cuda:0"), a
    :class:`kernelab.hardware.DeviceInfo` or a ready dict. ``extra`` entries (seeds, ceilings,
    clocks, settings) are added as given.
    """
    import kernelab

    out: dict[str, Any] = {
        "time": now_iso(),
        "git": git_info(),
        "versions": {
            "kernelab": kernelab.__version__,
            "torch": _version("torch"),
            "triton": _version("triton"),
            "numpy": _version("numpy"),
            "python": platform.python_version(),
        },
        "device": _device_dict(device_info),
        "host": {
            "name": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "pid": os.getpid(),
        },
        "argv": list(sys.argv),
    }
    out.update(extra)
    return out
