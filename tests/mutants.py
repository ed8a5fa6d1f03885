"""Planted defects: copies of a kernel with one textual change, to prove a check catches it.

The mutant is built from the kernel's own source, so tests never keep a hand-copied kernel that
could drift from the real one.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

HEADER = """\
import triton
import triton.language as tl
from kernelab.core.runtime.triton import kernel
"""


def mutate(kern, old: str, new: str, tmp_path: Path, count: int = 1):
    """A new ``@kernel`` whose source is ``kern``'s with ``old`` replaced by ``new``.

    ``old`` must occur exactly ``count`` times, so a refactor of the kernel makes the test fail
    loudly instead of silently testing an unmutated copy.
    """
    src = textwrap.dedent(kern.src)  # the function's source, without its decorator
    found = src.count(old)
    if found != count:
        raise AssertionError(f"mutation target {old!r} occurs {found} times, expected {count}")
    name = kern.fn.__name__
    body = "@kernel\n" + src.replace(old, new)
    path = tmp_path / f"mutant_{name}_{abs(hash((old, new)))}.py"
    path.write_text(HEADER + "\n" + body)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return getattr(module, name)
