"""The op model: one declaration per op carries everything the instruments need.

An :class:`Op` holds the float64-capable reference, the input generator with named shape sets,
the cost model (FLOPs and minimum bytes), the numerical contract, the arguments it writes in
place, and its variants. Instruments read ops from the registry; they never special-case one.

Calling convention. Inputs are a ``dict`` of argument name → value (tensors, ints, floats,
bools, None), in the op's signature order; every variant is called as ``fn(**inputs)`` and
returns a tensor (single output) or a tuple of tensors (in the order of ``Op.outputs``).
Arguments named in ``Contract.inplace`` are updated in place and are checked like outputs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernelab.ops import _inputs

ShapeSets = Mapping[str, Callable[[], Sequence["Shape"]]]

#: Shape sets every op declares.
SHAPE_SETS = ("representative", "edge")

#: Per-dtype floor of the relative L2 tolerance (METHOD.md: derived tolerance, small floor).
DEFAULT_FLOORS: Mapping[str, float] = {
    "float64": 1e-12,
    "float32": 1e-6,
    "float16": 2e-3,
    "bfloat16": 1e-2,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Shape:
    """One case of a shape set: sizes, options, and a label saying where it comes from.

    ``batch_dim`` names the size (rows, tokens, M) that may be cut down when a kernel runs
    through the interpreter, without changing what each program does. ``reduce_to`` names other
    sizes and the value each is cut to at the same time (a GEMM's N and K, whose full sizes
    would take minutes through the interpreter); empty for most ops.
    """

    label: str
    dims: Mapping[str, int]
    params: Mapping[str, Any] = field(default_factory=dict)
    batch_dim: str | None = None
    reduce_to: Mapping[str, int] = field(default_factory=dict)

    def reduced(self, cap: int) -> Shape:
        """This shape with its batch size at most ``cap`` and the sizes in ``reduce_to`` at most
        their given values (itself if already small enough); the label lists every cut."""
        dims = dict(self.dims)
        cuts = []
        if self.batch_dim is not None and dims[self.batch_dim] > cap:
            dims[self.batch_dim] = cap
            cuts.append(f"{self.batch_dim}→{cap}")
        for name, size in self.reduce_to.items():
            if dims[name] > size:
                dims[name] = size
                cuts.append(f"{name}→{size}")
        if not cuts:
            return self
        return replace(self, dims=dims, label=f"{self.label} [{', '.join(cuts)}]")

    @property
    def key(self) -> str:
        """A stable identity for the ledger: sizes and options, sorted."""
        dims = ",".join(f"{k}={v}" for k, v in self.dims.items())
        params = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{dims};{params}" if params else dims

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "dims": dict(self.dims),
            "params": dict(self.params),
            "batch_dim": self.batch_dim,
            "reduce_to": dict(self.reduce_to),
        }


@dataclass(frozen=True)
class Cost:
    """Work an op must do: FLOPs, and the minimum bytes that must cross device memory."""

    flops: float
    bytes: float

    def floor_seconds(self, peak_flops: float | None, bandwidth: float) -> float:
        """Speed-of-light time: the larger of compute time and memory time."""
        t_mem = self.bytes / bandwidth if bandwidth else 0.0
        t_flop = self.flops / peak_flops if peak_flops else 0.0
        return max(t_mem, t_flop)

    def bound(self, peak_flops: float | None, bandwidth: float) -> str:
        t_mem = self.bytes / bandwidth if bandwidth else 0.0
        t_flop = self.flops / peak_flops if peak_flops else 0.0
        return "compute" if t_flop > t_mem else "memory"


@dataclass(frozen=True)
class Launch:
    """One kernel launch an op would make for a shape: what static analysis compiles.

    ``signature`` maps every kernel argument to its Triton type ("*bf16", "i32", "i64", "fp32",
    or "constexpr"); ``constexprs`` gives the constexpr values. ``divisible_16`` lists the
    arguments Triton would specialise as 16-divisible at run time (16-byte aligned pointers,
    sizes and strides divisible by 16); ``equal_1`` those it would specialise as the constant 1.
    """

    kernel: Any
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any]
    num_warps: int
    num_stages: int
    grid: tuple[int, ...]
    divisible_16: tuple[str, ...] = ()
    equal_1: tuple[str, ...] = ()
    config: Any = None

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", None) or self.kernel.fn.__name__


@dataclass(frozen=True)
class Contract:
    """How close to the float64 reference a variant must be (METHOD.md, "Correct first").

    The tolerance on relative L2 error is ``max(k × eager-torch error, floor[dtype])`` unless
    ``tolerance`` fixes it per dtype. ``inplace`` lists arguments the op writes.
    """

    k: float = 2.0
    floors: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOORS))
    tolerance: Mapping[str, float] | None = None
    inplace: tuple[str, ...] = ()
    nondeterministic: bool = False
    #: Inputs that may carry NaN and ±Inf when a check plants special values (None: any
    #: floating-point input). Prepared parameters such as quantization scales are never
    #: infinite in use, and an infinite scale is not a case an op must reproduce.
    special_inputs: tuple[str, ...] | None = None

    def floor(self, dtype: torch.dtype) -> float:
        return self.floors.get(dtype_name(dtype), 1e-6)

    def tolerance_for(self, dtype: torch.dtype, eager_error: float | None) -> tuple[float, str]:
        """The tolerance and a few words on where it came from."""
        name = dtype_name(dtype)
        if self.tolerance is not None and name in self.tolerance:
            return self.tolerance[name], "contract"
        floor = self.floor(dtype)
        if eager_error is None:
            return floor, "floor"
        derived = self.k * eager_error
        if derived >= floor:
            return derived, f"{self.k:g}x eager torch"
        return floor, "floor"


@dataclass(frozen=True)
class Variant:
    """One implementation of an op.

    ``kind``: "triton" (ours), "torch" (eager), "compile" (torch.compile of eager) or
    "external" (a third-party package, listed only when ``requires`` is importable).
    ``prepare`` turns generated inputs into what this variant consumes (packed weights, say);
    it runs once, outside any timed region.
    """

    name: str
    fn: Callable[..., Any]
    kind: str
    requires: str | None = None
    prepare: Callable[[dict], dict] | None = None
    description: str = ""

    def __post_init__(self):
        if self.kind not in ("triton", "torch", "compile", "external"):
            raise ValueError(
                f"kind: expected triton, torch, compile or external, got {self.kind!r}"
            )

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        """Whether this variant can run here, and if not, why (one line)."""
        if not self.installed():
            return False, f"package {self.requires!r} not installed"
        if self.kind == "triton" and device_type == "cpu":
            return True, "interpreter: correctness only"
        if self.kind == "external" and device_type == "cpu":
            return False, "needs a GPU"
        return True, ""

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


class Op:
    """One op, declared once. See the module docstring for the calling convention."""

    def __init__(
        self,
        name: str,
        *,
        description: str,
        reference: Callable[..., Any],
        make_inputs: Callable[..., dict],
        shapes: ShapeSets,
        cost: Callable[[dict], Cost],
        contract: Contract = Contract(),
        dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
        outputs: Sequence[str] = ("out",),
        out_arg: str | None = "out",
        kernels: Sequence[Any] = (),
        launches: Callable[..., list[Launch]] | None = None,
        tuning_space: Callable[[Shape, torch.dtype], list] | None = None,
    ):
        missing = [s for s in SHAPE_SETS if s not in shapes]
        if missing:
            raise ValueError(f"shapes: op {name!r} must declare shape sets {missing}")
        self.name = name
        self.description = description
        self.reference = reference
        self._make_inputs = make_inputs
        self.shape_sets = dict(shapes)
        self.cost = cost
        self.contract = contract
        self.dtypes = tuple(dtypes)
        self.outputs = tuple(outputs)
        self.out_arg = out_arg
        #: The Triton kernels behind the "kernelab" variant (for inspect).
        self.kernels = tuple(kernels)
        #: ``launches(shape, dtype, config=None) -> [Launch, ...]``: what the op would launch
        #: for a shape (with its default config, or ``config``), for static analysis.
        self.launches = launches
        #: ``tuning_space(shape, dtype) -> [config, ...]``: the configs worth trying.
        self.tuning_space = tuning_space
        self.variants: dict[str, Variant] = {}

    def __repr__(self) -> str:
        return f"Op({self.name!r}, variants={list(self.variants)})"

    def add_variant(self, variant: Variant) -> Variant:
        if variant.name in self.variants:
            raise ValueError(
                f"variant: op {self.name!r} already has a variant named {variant.name!r}"
            )
        self.variants[variant.name] = variant
        return variant

    def add_torch(self, fn: Callable[..., Any], *, compile: bool = True) -> None:
        """Register the eager implementation as "torch" and its torch.compile as "compile"."""
        self.add_variant(Variant("torch", fn, "torch", description="eager PyTorch"))
        if compile:
            self.add_variant(
                Variant(
                    "compile",
                    _compiled(fn),
                    "compile",
                    description="torch.compile of eager PyTorch",
                )
            )

    def add_external(
        self,
        name: str,
        requires: str,
        factory: Callable[[], Callable[..., Any]],
        description: str = "",
        prepare=None,
    ) -> None:
        """A third-party implementation, listed only when ``requires`` is importable.

        ``factory`` imports the package and returns the callable; it runs on first use only.
        """
        impl = None

        def call(**inputs):
            nonlocal impl
            if impl is None:
                impl = factory()
            return impl(**inputs)

        variant = Variant(
            name, call, "external", requires=requires, prepare=prepare, description=description
        )
        if variant.installed():
            self.add_variant(variant)

    def shapes(self, shape_set: str) -> list[Shape]:
        if shape_set not in self.shape_sets:
            raise ValueError(
                f"shape_set: expected one of {sorted(self.shape_sets)}, got {shape_set!r}"
            )
        return list(self.shape_sets[shape_set]())

    def inputs(
        self, shape: Shape, dtype: torch.dtype, device="cpu", seed: int = 0, dist: str = "normal"
    ) -> dict:
        """Fresh inputs for ``shape`` in ``dtype`` on ``device``, reproducible from ``seed``."""
        if dtype not in self.dtypes:
            raise TypeError(
                f"dtype: op {self.name!r} takes "
                f"{[dtype_name(d) for d in self.dtypes]}, got {dtype_name(dtype)}"
            )
        gen = _inputs.generator(seed, device)
        return self._make_inputs(shape, dtype, torch.device(device), gen, dist)

    def run_reference(self, inputs: dict) -> tuple[tuple[torch.Tensor, ...], dict]:
        """Run the reference in float64 on the CPU on copies of ``inputs``.

        Returns the outputs and the in-place arguments' final values, all float64 on CPU.
        """
        ref_inputs = {k: _to_f64(v) for k, v in inputs.items()}
        result = as_tuple(self.reference(**ref_inputs))
        return result, {
            name: ref_inputs[name]
            for name in self.contract.inplace
            if ref_inputs.get(name) is not None
        }


def _to_f64(v):
    if isinstance(v, torch.Tensor):
        v = v.detach().to("cpu")
        return v.to(torch.float64) if v.is_floating_point() else v.clone()
    return v


def as_tuple(result) -> tuple:
    if isinstance(result, tuple):
        return result
    if isinstance(result, list):
        return tuple(result)
    return (result,)


# --- the registry -------------------------------------------------------------------------

_REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to the registry; a second op with the same name is an error."""
    if op.name in _REGISTRY:
        raise ValueError(f"op: an op named {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    return op


def get(name: str) -> Op:
    if name not in _REGISTRY:
        raise ValueError(f"op: expected one of {sorted(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name]


def all_ops() -> list[Op]:
    return list(_REGISTRY.values())
