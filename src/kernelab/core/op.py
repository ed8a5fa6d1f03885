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

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelab.core.calling import takes
from kernelab.core.contract import Contract, Cost, dtype_name
from kernelab.core.launch import Launch
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import registry
from kernelab.core.sampling import Sampling
from kernelab.core.shape import SHAPE_SETS, Shape, ShapeSets
from kernelab.core.variant import Variant, _compiled


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
        contract: Contract = Contract(),  # noqa: B008 (frozen, never mutated)
        dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
        outputs: Sequence[str] = ("out",),
        out_arg: str | None = "out",
        kernels: Sequence[Any] = (),
        plan: Callable[..., Any] | None = None,
        launches: Callable[..., list[Launch]] | None = None,
        tuning_space: Callable[[Shape, torch.dtype], list] | None = None,
        sampling: Sampling | None = None,
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
        #: ``plan(**inputs, config=None) -> LaunchPlan``: the kernel launches the "kernelab"
        #: variant makes for these inputs (``kernelab.core.runtime.launch``). The launcher runs
        #: it; static analysis describes it, from meta tensors of a shape's inputs. A plan that
        #: also takes ``target=`` (a compile target's name, "sm_90") chooses its default config
        #: as it would on that target (TMA on Hopper, the LDS budget on gfx942), so static
        #: analysis describes each target's launch as it runs there.
        self.plan = plan
        self.plans_per_target = plan is not None and takes(plan, "target")
        if plan is not None and launches is not None:
            raise ValueError(f"plan: op {name!r} gives both plan and launches; give one")
        #: ``launches(shape, dtype, config=None, target=None) -> [Launch, ...]``: what the op
        #: would launch for a shape (with its default config, or ``config``), for static
        #: analysis (on ``target`` where the plan takes one). Derived from ``plan`` when the
        #: op has one.
        self.launches = self._planned_launches if plan is not None else launches
        #: ``tuning_space(shape, dtype) -> [config, ...]``: the configs worth trying.
        self.tuning_space = tuning_space
        #: Which outputs are row-independent (rows × columns for a GEMM): verify checks a
        #: full-size call on a sample of them (``kernelab.core.sampling``). None: none.
        if sampling is not None and not isinstance(sampling, Sampling):
            raise TypeError(f"sampling: expected a Sampling, got {type(sampling).__name__}")
        self.sampling = sampling
        self.variants: dict[str, Variant] = {}
        #: Every variant declared, in order, including external ones whose package is not
        #: installed (those are not in ``variants``): what a listing made once for every
        #: machine names (``kernelab ops`` reads one, ``kernelab.cli._catalog``).
        self.declared_variants: list[Variant] = []

    def _planned_launches(
        self, shape: Shape, dtype: torch.dtype, config=None, target: str | None = None
    ) -> list[Launch]:
        # Meta tensors: shapes, strides and dtypes of the real inputs, nothing allocated.
        inputs = self.inputs(shape, dtype, "meta")
        where = {"target": target} if target is not None and self.plans_per_target else {}
        return self.plan(**inputs, config=config, **where).describe()

    def __repr__(self) -> str:
        return f"Op({self.name!r}, variants={list(self.variants)})"

    def add_variant(self, variant: Variant) -> Variant:
        if variant.name in self.variants:
            raise ValueError(
                f"variant: op {self.name!r} already has a variant named {variant.name!r}"
            )
        self.variants[variant.name] = variant
        self.declared_variants.append(variant)
        return variant

    @property
    def eager(self) -> Variant | None:
        """The op's eager PyTorch variant (``add_torch``'s; the baseline verify derives its
        tolerance from and bench's integrity checks compare with), None if it has none."""
        return next((v for v in self.variants.values() if v.backend.name == "torch"), None)

    def tuned_variant(self) -> Variant:
        """The variant the op's tuning space configures (``Variant.tuned``: it takes
        ``config=``). ValueError naming the op when none does."""
        for v in self.variants.values():
            if v.tuned:
                return v
        raise ValueError(f"op: {self.name} has no variant that takes a tuning config")

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
        elif any(v.name == name for v in self.declared_variants):
            raise ValueError(f"variant: op {self.name!r} already has a variant named {name!r}")
        else:
            self.declared_variants.append(variant)

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
        With ``contract.intermediate_dtype``, the reference also gets that input's dtype as
        ``intermediate_dtype=`` (its copy here is float64).
        """
        ref_inputs = {k: _to_f64(v) for k, v in inputs.items()}
        held = self.contract.intermediate_dtype
        if held is not None:
            if not isinstance(inputs.get(held), torch.Tensor):
                raise ValueError(
                    f"intermediate_dtype: op {self.name!r} names {held!r}, not a tensor input"
                )
            ref_inputs["intermediate_dtype"] = inputs[held].dtype
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
    return registry.add(_REGISTRY, op.name, op, "an op")


def get(name: str) -> Op:
    return registry.lookup(_REGISTRY, name, "op")


def all_ops() -> list[Op]:
    return list(_REGISTRY.values())
