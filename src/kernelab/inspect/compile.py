"""Compile a :class:`Spec` for a target, on a machine without the device: the spec's backend
does it (``kernelab.core.runtime.backends``; Triton runs its whole pipeline for any target on a
CPU — Triton IR, PTX and a cubin through the ptxas in its wheel, AMDGCN and an HSA code
object for AMD; Pallas calls lower to Mosaic for TPU generations). The artifacts are text and
small numbers only, so they pickle across
processes and parse into a report (:mod:`kernelab.inspect.parse`) without the compiler.
"""

from __future__ import annotations

from kernelab.core.runtime.backends import get_backend
from kernelab.inspect.spec import Spec
from kernelab.inspect.targets import Target


def backend_version(name: str = "triton") -> str:
    """The version of the compiler behind a backend (part of inspect's cache key)."""
    return get_backend(name).version()


def triton_version() -> str:
    return backend_version("triton")


def compile_artifacts(spec: Spec, target: Target) -> dict:
    """Compile ``spec`` for ``target`` with its backend; the texts and metadata inspect parses.

    Raises whatever the compiler raises when the kernel does not compile (the caller records
    it), and ValueError when the backend does not compile for this target.
    """
    backend = get_backend(spec.backend)
    if target.name not in backend.targets:
        raise ValueError(
            f"target: backend {backend.name!r} compiles for {list(backend.targets)}, "
            f"not {target.name!r}"
        )
    # A Triton spec is its own launch; a TPU spec carries the declared Pallas call.
    return backend.compile(getattr(spec, "call", spec), target)
