"""What an op must cost and how close it must be: the cost model and the numerical contract."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

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
class Cost:
    """Work an op must do: FLOPs, and the minimum bytes that must cross device memory.

    ``compute`` names the format the multiplies run in when it is not the case's dtype (the
    e4m3 operands of a GEMM with bfloat16 output: ``"float8_e4m3fn"``; e2m1 operands:
    ``"float4_e2m1fn_x2"``), so that the compute floor comes from that format's peak. A
    weight-only kernel upcasts its weights and multiplies in the activations' dtype: None.
    """

    flops: float
    bytes: float
    compute: str | None = None

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
class Contract:
    """How close to the float64 reference a variant must be (METHOD.md, "Correct first").

    The tolerance on relative L2 error is ``max(k × eager-torch error, floor[dtype])`` unless
    ``tolerance`` fixes it per dtype. ``inplace`` lists arguments the op writes.

    ``regions`` narrows what a call may write in an in-place argument: ``regions[name](inputs)``
    returns a boolean mask of that argument's shape, computed from the call's inputs before the
    call (the cache slots of this step, say). verify compares the masked elements against the
    reference (relative L2 and the NaN/Inf pattern) and requires every other element to be
    bitwise unchanged. An in-place argument without a region is compared whole.

    ``distributions`` adds input distributions for this op's trials.

    ``reduction(inputs) -> n`` declares the op's reduction length (K for a GEMM, the row
    length for a norm or a softmax, the keys for attention) and ``narrowings`` how many times
    its honest algorithm rounds intermediate results to the output's format before the final
    rounding (paged attention rounds P once before P·V). With a reduction declared, a
    bfloat16/float16 target's tolerance is derived from the case (the float64 reference
    rounded once to the format, the narrowings and n: ``kernelab.verify._tolerance``) instead
    of the fixed floor, so that one more rounding of partial results fails.

    ``amplified(inputs) -> tensor`` (with a reduction) declares, per element of the op's
    first output, the spread (absolute, float64) that float32 rounding inside the honest
    algorithm leaves where a later step amplifies it: a softmax turns a score's absolute
    error into a relative error of its weight, and float32 scores of magnitude 10⁴ err by
    about 10⁻³, whatever the format of the output. The derived bound adds its relative L2
    norm (``kernelab.verify._tolerance``).

    ``intermediate_dtype`` names the input whose dtype the op's honest algorithm stores an
    intermediate in, a rounding every real implementation makes (a fused MoE's silu(gate)·up,
    the 16-bit operand of its second GEMM, as vLLM and transformers hold it). The float64
    copies the reference runs on no longer carry that dtype, so ``Op.run_reference`` passes it
    to the reference as ``intermediate_dtype=``: the reference rounds there too, and verify
    expects the values and the overflow to ±Inf that the format gives at that step.
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
    #: The inputs that carry per-call data (activations, states, a KV cache, positions), as
    #: opposed to prepared parameters made once from other values and reused (a quantized
    #: weight with its scales, a per-tensor scale, a rotary table): the only inputs a partial
    #: update may change (bench's rotating input sets and verify's partial-update trial take
    #: a few of their elements from another draw of the op's inputs; changing a scale without
    #: the values it was derived with would leave an input set no real caller holds; see
    #: :func:`changeable`). None: every floating-point
    #: input. An integer input named here must be valid element by element (any element may
    #: take any value another draw gives it, whatever the others hold: positions, not block
    #: tables or expert ids).
    data_inputs: tuple[str, ...] | None = None
    regions: Mapping[str, Callable[[dict], torch.Tensor]] = field(default_factory=dict)
    #: Input distributions verify draws from for this op beside every op's
    #: (``kernelab.core.runtime.inputs.EXTRA_DISTRIBUTIONS``): "offset" for an op that
    #: subtracts a mean, where a one-pass variance cancels catastrophically.
    distributions: tuple[str, ...] = ()
    reduction: Callable[[dict], int] | None = None
    narrowings: int = 0
    amplified: Callable[[dict], torch.Tensor] | None = None
    intermediate_dtype: str | None = None

    def __post_init__(self):
        from kernelab.core.runtime.inputs import EXTRA_DISTRIBUTIONS

        unknown = [d for d in self.distributions if d not in EXTRA_DISTRIBUTIONS]
        if unknown:
            raise ValueError(
                f"distributions: expected names from {EXTRA_DISTRIBUTIONS}, got {unknown}"
            )
        if isinstance(self.narrowings, bool) or not isinstance(self.narrowings, int):
            raise TypeError(f"narrowings: expected an int, got {self.narrowings!r}")
        if self.narrowings < 0:
            raise ValueError(f"narrowings: expected >= 0, got {self.narrowings}")
        if self.intermediate_dtype is not None and not isinstance(self.intermediate_dtype, str):
            raise TypeError(
                f"intermediate_dtype: expected an input name, got {self.intermediate_dtype!r}"
            )
        for field_name in ("special_inputs", "data_inputs"):
            names = getattr(self, field_name)
            if names is not None and (
                isinstance(names, str) or not all(isinstance(n, str) for n in names)
            ):
                raise TypeError(f"{field_name}: expected a tuple of input names, got {names!r}")
        if self.reduction is not None and not callable(self.reduction):
            raise TypeError(f"reduction: expected a callable of the inputs, got {self.reduction!r}")
        if self.amplified is not None and not callable(self.amplified):
            raise TypeError(f"amplified: expected a callable of the inputs, got {self.amplified!r}")
        if self.amplified is not None and self.reduction is None:
            raise ValueError(
                "amplified: declared without a reduction (it adds to the derived bound)"
            )
        stray = [name for name in self.regions if name not in self.inplace]
        if stray:
            raise ValueError(
                f"regions: {stray} are not in-place arguments (inplace={list(self.inplace)})"
            )

    def region(self, name: str, inputs: dict) -> torch.Tensor | None:
        """The mask of elements of in-place argument ``name`` the call may write (a CPU bool
        tensor of its shape), or None when the whole argument may change."""
        fn = self.regions.get(name)
        arg = inputs.get(name)
        if fn is None or not isinstance(arg, torch.Tensor):
            return None
        mask = fn(inputs)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"regions[{name!r}]: expected a bool tensor, got {mask!r:.60}")
        if tuple(mask.shape) != tuple(arg.shape):
            raise ValueError(
                f"regions[{name!r}]: expected a mask of shape {tuple(arg.shape)}, "
                f"got {tuple(mask.shape)}"
            )
        return mask.detach().cpu()

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


def changeable(op, inputs: dict) -> list[str]:
    """The non-empty tensor inputs a partial update may change: those ``op`` declares as data
    (``Contract.data_inputs``), or every floating-point one when it declares none."""
    declared = getattr(op.contract, "data_inputs", None)
    if declared is None:
        return [
            n for n, t in inputs.items()
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()
        ]  # fmt: skip
    unknown = [n for n in declared if n not in inputs]
    if unknown:
        raise ValueError(
            f"data_inputs: op {op.name!r} declares {unknown}, not among its inputs {list(inputs)}"
        )
    return [n for n in declared if isinstance(inputs[n], torch.Tensor) and inputs[n].numel()]
