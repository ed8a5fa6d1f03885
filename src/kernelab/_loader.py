"""Load a user's callable from ``path/to/file.py:function`` (or ``package.module:function``).

The named file is imported as Python code: running a user's own kernel is its purpose. Nothing
else kernelab reads (traces, configs, ledgers) is ever executed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path


def load_callable(spec: str, argname: str = "candidate", require_callable: bool = True) -> Callable:
    """Import ``file.py:function`` or ``module:function`` and return the function.

    ``require_callable=False`` also accepts objects launched otherwise (a Triton autotuner).

    Errors are ``ValueError`` (bad form, missing function, not callable) or
    ``FileNotFoundError`` (no such file), each one line naming ``argname``.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(
            f"{argname}: expected 'path/to/file.py:function' or 'module:function', got {spec!r}"
        )
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise ValueError(f"{argname}: expected 'path/to/file.py:function', got {spec!r}")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{argname}: no such file {str(path)!r}")
        module_name = f"kernelab_user_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"{argname}: cannot import {str(path)!r} as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ValueError(
                f"{argname}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ValueError(
                f"{argname}: cannot import module {target!r}: {type(exc).__name__}: {exc}"
            ) from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{argname}: {target!r} has no attribute {name!r}")
    if require_callable and not callable(fn):
        raise ValueError(f"{argname}: {target}:{name} is not callable")
    return fn


def check_signature(fn: Callable, names, argname: str = "candidate") -> None:
    """Check that ``fn`` can be called with keyword arguments ``names``; one-line error if not."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and extensions without a signature: trust the call to tell
    params = sig.parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in names if n not in params]
    required = [
        n
        for n, p in params.items()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and n not in names
    ]
    if missing or required:
        parts = []
        if missing:
            parts.append(f"does not accept {missing}")
        if required:
            parts.append(f"requires {required}, which the op does not pass")
        raise ValueError(
            f"{argname}: signature {getattr(fn, '__name__', fn)}{sig} "
            f"{' and '.join(parts)}; expected parameters {list(names)}"
        )
