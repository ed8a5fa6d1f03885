"""What one compilation is: a kernel, its argument types, specialisations and launch options.

A :class:`Spec` is built from an op's :class:`kernelab.ops.Launch` or from a user's
``--signature`` string (see :func:`parse_signature`). Its ``identity`` is a stable digest that
names the compilation in caches; it does not depend on the triton version or on Python's hash
seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from kernelab.core.runtime.backends import jit_of, triton_signature

#: Element types a signature may name (Triton's spellings).
SCALAR_TYPES = (
    "i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "fp16", "bf16", "fp32", "fp64",
    "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16",
)  # fmt: skip
_TYPE_BITS = {
    "i1": 8, "i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64,
    "fp16": 16, "bf16": 16, "fp32": 32, "fp64": 64,
    "fp8e4nv": 8, "fp8e5": 8, "fp8e4b15": 8, "fp8e4b8": 8, "fp8e5b16": 8,
}  # fmt: skip


def element_bits(ty: str) -> int | None:
    """Bits of the element a pointer type points to (``*bf16`` → 16); None for non-pointers."""
    if not ty.startswith("*"):
        return None
    return _TYPE_BITS.get(ty.lstrip("*k"))


def kernel_of(obj) -> Any:
    """The Triton JITFunction behind ``obj`` (a JITFunction, or an autotuner/heuristics wrapper)."""
    return jit_of(obj)


@dataclass(frozen=True)
class Spec:
    kernel: Any  # triton JITFunction
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any]
    num_warps: int
    num_stages: int
    divisible_16: tuple[str, ...] = ()
    equal_1: tuple[str, ...] = ()
    #: Largest tensor (elements) this launch touches, when known: for the 2^31 offset check.
    max_elements: int | None = None
    label: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The backend that compiles it (``kernelab.core.runtime.backends``).
    backend: str = "triton"

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def triton_signature(self) -> tuple[dict, dict, dict]:
        """(signature, constexprs, attrs) as ``triton.compiler.ASTSource`` takes them (see
        ``kernelab.core.runtime.backends.triton_signature``)."""
        return triton_signature(self)

    def config_text(self) -> str:
        """A short, stable description: constexprs, warps and stages."""
        consts = " ".join(f"{k}={_short(v)}" for k, v in self.constexprs.items())
        return f"{consts} w{self.num_warps} s{self.num_stages}".strip()

    def identity(self) -> str:
        """Digest of everything that decides the compiled code except source and compiler."""
        payload = {
            "kernel": self.name,
            "signature": dict(self.signature),
            "constexprs": {k: _short(v) for k, v in self.constexprs.items()},
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "divisible_16": sorted(self.divisible_16),
            "equal_1": sorted(self.equal_1),
        }
        if self.backend != "triton":
            payload["backend"] = self.backend
        return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20]

    def source_key(self) -> str:
        """Triton's own key of the kernel source and every helper it calls."""
        return str(self.kernel.cache_key)

    def all_aligned(self) -> Spec:
        """The same compilation with every pointer and integer argument 16-divisible."""
        div = tuple(
            n
            for n, t in self.signature.items()
            if (t.startswith("*") or t in ("i32", "i64", "u32", "u64")) and n not in self.equal_1
        )
        return replace(self, divisible_16=div)

    def missing_alignment(self) -> list[str]:
        return [n for n in self.all_aligned().divisible_16 if n not in self.divisible_16]


def _short(v) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    return str(v)


def from_launch(launch, max_elements: int | None = None, label: str = "") -> Spec:
    """A :class:`Spec` from an op's :class:`kernelab.ops.Launch`; a
    :class:`kernelab.inspect.tpu.TpuSpec` from a declared Pallas call."""
    from kernelab.core.runtime.pallas import PallasCall

    if isinstance(launch, PallasCall):
        from kernelab.inspect.tpu import TpuSpec

        return TpuSpec(launch, label=label, max_elements=max_elements)
    kern = kernel_of(launch.kernel)
    return Spec(
        kernel=kern,
        signature=dict(launch.signature),
        constexprs=dict(launch.constexprs),
        num_warps=int(launch.num_warps),
        num_stages=int(launch.num_stages),
        divisible_16=tuple(launch.divisible_16),
        equal_1=tuple(launch.equal_1),
        max_elements=max_elements,
        label=label,
        backend=getattr(launch, "backend", "triton"),
    )


def spec_json(spec: Spec) -> bytes:
    return orjson.dumps(
        {"identity": spec.identity(), "source": spec.source_key()}, option=orjson.OPT_SORT_KEYS
    )
