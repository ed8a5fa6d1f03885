"""A fresh Python process with only kernelab's sources on the path: for checks of what an
import or a first launch does, which an already-warm test process cannot show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"


def run_python(
    code: str | None = None, script: Path | None = None, **env
) -> subprocess.CompletedProcess:
    """Run ``code`` (or ``script``) in a new interpreter; ``env`` adds variables."""
    args = [sys.executable, str(script)] if script is not None else [sys.executable, "-c", code]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", **env},
        timeout=120,
        check=False,
    )
