"""``--signature``: argument types, constexprs and launch options of a user's kernel, as text.

Grammar (items separated by commas; spaces ignored)::

    item      := TYPE | NAME=TYPE | NAME=VALUE | num_warps=INT | num_stages=INT
    TYPE      := ["*"] ELEMENT [":16" | ":1"]
    ELEMENT   := i1 i8 i16 i32 i64 u8 u16 u32 u64 fp16 bf16 fp32 fp64 fp8e4nv fp8e5 ...

- A bare ``TYPE`` is given to the kernel's next runtime (non-constexpr) parameter, in order.
- ``NAME=TYPE`` types a runtime parameter by name; ``NAME=VALUE`` sets a ``tl.constexpr``
  parameter (an int, a float, True/False/None, or a bare word kept as a string).
- ``*T`` is a pointer to T. ``:16`` says the value is divisible by 16 (a 16-byte aligned
  pointer, a size or stride that is a multiple of 16), as Triton specialises at run time;
  ``:1`` says an integer equals 1 (Triton then compiles it as a constant).
- ``num_warps`` (default 4) and ``num_stages`` (default 3) are the launch options.

Example: ``"*fp16:16, *fp16:16, i32:16, BLOCK=1024, num_warps=4"`` for
``add(x_ptr, out_ptr, n, BLOCK: tl.constexpr)``. The text is parsed, never evaluated.
"""

from __future__ import annotations

import inspect
import re

from kernelab.inspect.spec import SCALAR_TYPES, Spec, kernel_of

_TYPE = re.compile(r"^(\*?)([a-z0-9]+)(?::(16|1))?$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def _type(text: str, where: str) -> tuple[str, str | None]:
    m = _TYPE.match(text)
    if not m or m.group(2) not in SCALAR_TYPES:
        raise ValueError(
            f"signature: {where}: expected a type like '*fp16', '*bf16:16', 'i32', 'i32:16' "
            f"or 'fp32' (elements: {', '.join(SCALAR_TYPES)}), got {text!r}"
        )
    ptr, elem, spec = m.groups()
    if spec == "1" and (ptr or not elem.startswith(("i", "u"))):
        raise ValueError(f"signature: {where}: ':1' applies to integers only, got {text!r}")
    return f"{ptr}{elem}", spec


def _value(text: str):
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return {"True": True, "False": False, "None": None}.get(text, text.strip("'\""))


def parse_signature(kernel, text: str, max_elements: int | None = None) -> Spec:
    """A :class:`Spec` for ``kernel`` (a ``@triton.jit`` function) from ``text``."""
    kern = kernel_of(kernel)
    if not isinstance(text, str):
        raise TypeError(f"signature: expected a string, got {type(text).__name__}")
    params = list(kern.params)
    runtime = [p.name for p in params if not p.is_constexpr]
    constexpr = {p.name for p in params if p.is_constexpr}
    sig: dict[str, str] = {}
    consts: dict[str, object] = {}
    div: list[str] = []
    one: list[str] = []
    options = {"num_warps": 4, "num_stages": 3}
    items = [i.strip() for i in text.split(",") if i.strip()]
    positional = iter(runtime)

    def set_type(name: str, tytext: str) -> None:
        if name in sig:
            raise ValueError(f"signature: parameter {name!r} is typed twice")
        ty, spec = _type(tytext, name)
        sig[name] = ty
        if spec == "16":
            div.append(name)
        elif spec == "1":
            one.append(name)

    for item in items:
        name, eq, rhs = item.partition("=")
        name, rhs = name.strip(), rhs.strip()
        if not eq:
            target = next((n for n in positional if n not in sig), None)
            if target is None:
                raise ValueError(
                    f"signature: more types than runtime parameters {runtime}; extra {item!r}"
                )
            set_type(target, item)
        elif name in options:
            if not _INT.match(rhs) or int(rhs) < 1:
                raise ValueError(f"signature: {name}: expected a positive int, got {rhs!r}")
            options[name] = int(rhs)
        elif name in constexpr:
            consts[name] = _value(rhs)
        elif name in runtime:
            set_type(name, rhs)
        else:
            raise ValueError(
                f"signature: {kern.fn.__name__} has no parameter {name!r}; "
                f"runtime {runtime}, constexpr {sorted(constexpr)}"
            )
    missing = [n for n in runtime if n not in sig]
    if missing:
        raise ValueError(f"signature: no type given for runtime parameters {missing}")
    for p in params:
        if p.is_constexpr and p.name not in consts:
            if p.default is inspect.Parameter.empty:
                raise ValueError(f"signature: constexpr {p.name!r} needs a value ({p.name}=...)")
            consts[p.name] = p.default
    ordered_sig = {p.name: ("constexpr" if p.is_constexpr else sig[p.name]) for p in params}
    ordered_consts = {p.name: consts[p.name] for p in params if p.is_constexpr}
    return Spec(
        kernel=kern,
        signature=ordered_sig,
        constexprs=ordered_consts,
        num_warps=options["num_warps"],
        num_stages=options["num_stages"],
        divisible_16=tuple(div),
        equal_1=tuple(one),
        max_elements=max_elements,
        label=text,
    )
