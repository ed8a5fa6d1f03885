"""Variants: the implementations of an op."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kernelab.core.runtime.backends import Backend, get_backend


@dataclass(frozen=True)
class Variant:
    """One implementation of an op.

    ``kind`` names the backend it runs on (``kernelab.core.runtime.backends``): "triton"
    (ours), "torch" (eager), "compile" (torch.compile of eager), "external" (a third-party
    package, listed only when ``requires`` is importable), or any registered backend.
    ``prepare`` turns generated inputs into what this variant consumes (packed weights, say);
    it runs once, outside any timed region. ``plan`` (Pallas variants) declares the launches
    for given inputs (``kernelab.core.runtime.pallas``). ``supports(shape)`` returns None when
    the variant handles a shape, or why not (a feature it leaves out): verify and bench then
    skip the case and say so, rather than judge a result the variant never claimed.
    ``configure(inputs, target)`` (Triton variants that are the op's plan under a config of
    their own, a persistent GEMM say): the config this variant runs ``inputs`` with on
    ``target`` (None: the inputs' device); ``fn`` must launch the op's plan with it, and static
    analysis describes the variant's launches from it, per target.
    """

    name: str
    fn: Callable[..., Any]
    kind: str
    requires: str | None = None
    prepare: Callable[[dict], dict] | None = None
    description: str = ""
    plan: Callable[..., Any] | None = None
    supports: Callable[[Any], str | None] | None = None
    configure: Callable[[dict, str | None], Any] | None = None

    def __post_init__(self):
        get_backend(self.kind)  # raises, naming the registered backends

    @property
    def backend(self) -> Backend:
        return get_backend(self.kind)

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        """Whether this variant can run here, and if not, why (one line)."""
        if not self.installed():
            return False, f"package {self.requires!r} not installed"
        return self.backend.runs_on(device_type)

    def timed_on(self, device_type: str) -> tuple[bool, str]:
        """Whether bench may time this variant here, and if not, why (one line)."""
        return self.backend.timed_on(device_type)

    def by_default(self, device_type: str) -> tuple[bool, str]:
        """Whether verify, bench and sweep take this variant here when none is named, and if
        not, why (one line; its backend's ``by_default``, taken when it has none)."""
        ask = getattr(self.backend, "by_default", None)
        return (True, "") if ask is None else ask(device_type)

    @property
    def interpreted(self) -> bool:
        """Whether an interpreter runs this variant's kernels on CPU tensors."""
        return bool(getattr(self.backend, "interpreted", False))

    @property
    def tuned(self) -> bool:
        """Whether the op's tuning space configures this variant (it takes ``config=``)."""
        return bool(getattr(self.backend, "tuned", False))

    def compiles_for(self, target: str) -> bool:
        """Whether static analysis can compile this variant's launches for ``target``."""
        return target in self.backend.targets

    def unsupported(self, shape) -> str | None:
        """Why this variant leaves ``shape`` out (None: it handles it)."""
        return None if self.supports is None else self.supports(shape)

    def __call__(self, **inputs):
        return self.fn(**inputs)


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile of ``fn``, compiled lazily on first call (nothing compiles at import)."""
    compiled = None

    def call(**inputs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=False)
        return compiled(**inputs)

    call.__name__ = f"compile_{getattr(fn, '__name__', 'fn')}"
    return call
