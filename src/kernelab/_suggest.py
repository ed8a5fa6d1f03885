"""Unknown names, refused with the closest known ones: one wording for every registry and
command that takes a name (ops, variants, backends, shape sets). Imports nothing heavy, so a
command can refuse a misspelt op before it loads torch."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_matches(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name``, case aside (difflib's ratio at least 0.6, best
    first), then any that contain it or that it contains (``norm`` -> rmsnorm, layernorm), for
    a name of three characters or more."""
    by_low = {c.lower(): c for c in choices}
    low = name.lower()
    found = [by_low[c] for c in difflib.get_close_matches(low, list(by_low), n=n, cutoff=0.6)]
    if len(low) >= 3:
        found += [c for k, c in by_low.items() if (low in k or k in low) and c not in found]
    return found[:n]


def unknown_name(argument: str, name, choices: Iterable[str], expected: str = "") -> ValueError:
    """The error for ``name`` not among ``choices``: it names ``argument``, the choices, and the
    closest of them (``did you mean 'rmsnorm'?``) when one is close."""
    choices = sorted(choices)
    message = f"{argument}: expected {expected}one of {choices}, got {name!r}"
    near = close_matches(name, choices) if isinstance(name, str) else []
    if near:
        message += f"; did you mean {' or '.join(repr(c) for c in near)}?"
    return ValueError(message)
