"""Declared Pallas launches: what a Pallas variant calls, written once, run or lowered from it.

The contract. A Pallas variant of an op has a *plan* function, the Pallas counterpart of a
Triton family's ``plan`` (``runtime/launch.py``)::

    plan(**inputs, config=None, target=None) -> PallasPlan

It validates the inputs, picks a config (``config``, or the default of its frozen config class
for ``target``, a TPU generation name such as "tpu_v6e"), and returns a :class:`PallasPlan`:
the :class:`PallasCall` s it makes, in order, and a ``finish`` function turning their outputs
into the op's result (copying into ``out=``, updating in-place arguments). The plan runs on
real tensors (the variant calls ``plan(...).run()``) and on meta tensors (static analysis:
:func:`launches` builds them from a shape's meta inputs, nothing allocated, no jax needed).

A :class:`PallasCall` declares one ``pl.pallas_call`` without importing jax:

- ``kernel``: the kernel function, taking refs in Pallas's order (scalar-prefetch operands,
  inputs, outputs, scratch) and the keyword arguments in ``params`` (static values bound with
  ``functools.partial``);
- ``grid`` and ``semantics`` ("parallel" / "arbitrary", one per grid axis);
- ``inputs`` (torch tensors: real, or meta for analysis), the first ``num_scalar_prefetch`` of
  them int32 operands prefetched into SMEM, then one :class:`Block` per remaining input;
- ``outputs``: one :class:`Out` (shape, torch dtype, block) per output;
- ``scratch``: :class:`Scratch` buffers (VMEM, SMEM, DMA semaphores);
- ``vmem_limit_bytes``: the scoped VMEM limit asked of Mosaic (None: its default).

A :class:`Block` is a BlockSpec: block shape (``None`` for a squeezed dimension) and index map
(grid indices, then the scalar-prefetch refs → block indices), in VMEM, SMEM, or left in HBM
(``memory="any"``: the kernel copies from it by DMA, with ``pltpu.make_async_copy``).

From the declaration, one place does everything: :meth:`PallasCall.build` gives the jax
callable, interpreted or native; :meth:`PallasCall.avals` its abstract inputs;
:meth:`PallasCall.lower` the TPU lowering (``jax.jit(f).trace(*avals).lower(
lowering_platforms=("tpu",))``, no TPU needed); :meth:`PallasCall.run` runs it on torch
tensors. On CPU, runs go through the TPU interpreter with race detection and NaN-filled
uninitialised memory (``pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")``;
plain ``interpret=True`` would clamp out-of-bounds accesses silently). A race raises
:class:`PallasRace`, any error inside the interpreter :class:`PallasInterpreterError`; both
carry the ``failure_class`` verify reports.

Tensors cross by DLPack: inputs zero-copy (a non-contiguous one is made contiguous first;
int64 index tensors are checked to fit and passed as int32, jax running without 64-bit
types); outputs come back as torch-owned copies, because a jax buffer is immutable and a
torch view of one must never be written in place. jax is imported on first use only (it takes
seconds); without it, :func:`available` says why and every other part of kernelab works.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: How to get jax for the Pallas variants.
INSTALL = "pip install 'kernelab[tpu]'"
#: Why bench never times a Pallas variant on CPU.
INTERPRETED_TPU = "Pallas TPU interpreter on CPU: correctness only, timing it would be meaningless"
#: TPU generations block configs are chosen for (static analysis targets).
GENERATIONS = ("tpu_v5e", "tpu_v6e", "tpu7x")
#: The generation configs default to when none is named (and no TPU is attached).
DEFAULT_GENERATION = "tpu_v6e"

SEMANTICS = ("parallel", "arbitrary")
MEMORIES = ("vmem", "smem", "any")
SCRATCH_KINDS = ("vmem", "smem", "dma")


class PallasError(RuntimeError):
    """A Pallas run that failed; ``failure_class`` is the class verify reports."""

    failure_class = "interpreter error"


class PallasInterpreterError(PallasError):
    """The TPU interpreter raised (an out-of-bounds block index or read, a bad DMA, ...)."""


class PallasRace(PallasError):
    """The interpreter's race detector saw unordered accesses to one buffer."""

    failure_class = "race"


def available() -> tuple[bool, str]:
    """Whether jax (with Pallas) can be imported here, and if not, why; imports nothing."""
    from kernelab.core.runtime.backends import Pallas

    for name in Pallas.requires:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError) as exc:  # a finder that refuses the name
            return False, f"{name} cannot be imported ({type(exc).__name__}): {INSTALL}"
        if not found:
            return False, f"{name} not installed: {INSTALL}"
    return True, ""


def _jax():
    """(jax, pl, pltpu), imported on first use."""
    ok, why = available()
    if not ok:
        raise ImportError(f"Pallas variants need jax: {why}")
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return jax, pl, pltpu


def tpu_attached() -> bool:
    """Whether jax sees a TPU (Pallas kernels then run natively); False without jax."""
    if not available()[0]:
        return False
    jax = _jax()[0]
    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


@dataclass(frozen=True)
class Chip:
    """What block choices depend on, per TensorCore: VMEM capacity and the MXU's width (from
    jax 0.10.2's ``jax/_src/pallas/mosaic/tpu_info.py``)."""

    vmem_bytes: int
    mxu: int


CHIPS = {
    "tpu_v5e": Chip(128 << 20, 128),
    "tpu_v6e": Chip(128 << 20, 256),
    "tpu7x": Chip(64 << 20, 256),
}

#: Rows of a native (sublanes × 128 lanes) tile by element size: 8 f32, 16 bf16, 32 int8.
SUBLANES = {4: 8, 2: 16, 1: 32}
LANES = 128


def sublanes(dtype: torch.dtype) -> int:
    return SUBLANES[torch.empty((), dtype=dtype).element_size()]


@dataclass(frozen=True)
class RowBlocks:
    """Blocks of ``block_rows`` whole rows (row-wise kernels: norms, activations).

    The default holds about ``VMEM / 128`` bytes of the widest operand per block (1 MiB on
    v5e/v6e, 512 KiB on TPU7x): in, out and their double buffers stay a small part of VMEM,
    and a step moves enough to amortise its fixed cost. A choice, not a measurement (no TPU
    here): ``tuning_space`` lists the alternatives. Rows are a multiple of the dtype's
    sublane count, or all the rows when there are fewer.
    """

    block_rows: int

    @classmethod
    def default_for(cls, n_rows: int, row_bytes: int, dtype: torch.dtype, target=None):
        chip = CHIPS[generation(target)]
        sub = sublanes(dtype)
        rows = max(sub, (chip.vmem_bytes // 128) // max(row_bytes, 1) // sub * sub)
        rows = min(rows, 1024)
        if n_rows <= rows:
            return cls(max(n_rows, 1))
        return cls(rows)

    @classmethod
    def tuning_space(cls, n_rows: int, row_bytes: int, dtype: torch.dtype, target=None):
        chip = CHIPS[generation(target)]
        sub = sublanes(dtype)
        space = [cls(r) for r in (8, 16, 32, 64, 128, 256, 512, 1024)]

        def keep(c: RowBlocks) -> bool:
            return c.block_rows % sub == 0 and 4 * c.block_rows * row_bytes <= chip.vmem_bytes // 4

        return [c for c in space if keep(c)] or [cls.default_for(n_rows, row_bytes, dtype, target)]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def generation(target: str | None) -> str:
    """The TPU generation a config is chosen for: ``target``, or the default."""
    if target is None:
        return DEFAULT_GENERATION
    if target not in GENERATIONS:
        raise ValueError(f"target: expected one of {list(GENERATIONS)}, got {target!r}")
    return target


# --- the declaration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A BlockSpec: ``shape`` (None entries squeezed) and ``index_map`` (grid indices, then the
    scalar-prefetch refs → block indices), in ``memory`` "vmem", "smem" or "any" (left in HBM:
    no shape or index map, the kernel moves data by DMA)."""

    shape: tuple[int | None, ...] | None = None
    index_map: Callable[..., tuple] | None = None
    memory: str = "vmem"

    def __post_init__(self):
        if self.memory not in MEMORIES:
            raise ValueError(f"memory: expected one of {list(MEMORIES)}, got {self.memory!r}")
        if self.memory == "any" and (self.shape is not None or self.index_map is not None):
            raise ValueError("memory: a block left in HBM ('any') has no shape or index map")
        if self.memory != "any" and (self.shape is None) != (self.index_map is None):
            raise ValueError("shape, index_map: give both (a tiled block) or neither (whole array)")
        for s in self.shape or ():
            if s is not None and (not isinstance(s, int) or s <= 0):
                raise ValueError(f"shape: expected positive ints or None, got {self.shape}")

    def spec(self):
        _, pl, pltpu = _jax()
        space = {"vmem": None, "smem": pltpu.SMEM, "any": pl.ANY}[self.memory]
        if self.shape is None:
            return pl.BlockSpec(memory_space=space) if space is not None else pl.BlockSpec()
        shape = tuple(pl.Squeezed() if s is None else s for s in self.shape)
        if space is None:
            return pl.BlockSpec(shape, self.index_map)
        return pl.BlockSpec(shape, self.index_map, memory_space=space)


@dataclass(frozen=True)
class Out:
    """One output: its full shape, torch dtype, and block."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    block: Block = field(default_factory=Block)


@dataclass(frozen=True)
class Scratch:
    """A scratch buffer: ``kind`` "vmem" / "smem" (``shape``, ``dtype``) or "dma" (``shape``
    DMA semaphores)."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.kind not in SCRATCH_KINDS:
            raise ValueError(f"kind: expected one of {list(SCRATCH_KINDS)}, got {self.kind!r}")

    def jax(self):
        _, _, pltpu = _jax()
        if self.kind == "dma":
            return pltpu.SemaphoreType.DMA(self.shape)
        space = pltpu.VMEM if self.kind == "vmem" else pltpu.SMEM
        return space(self.shape, jax_dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        if self.kind == "dma":
            return 0
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class PallasCall:
    """One ``pl.pallas_call`` with its operands: see the module docstring."""

    kernel: Callable
    grid: tuple[int, ...]
    inputs: tuple[torch.Tensor, ...]
    in_specs: tuple[Block, ...]
    outputs: tuple[Out, ...]
    scratch: tuple[Scratch, ...] = ()
    semantics: tuple[str, ...] = ()
    num_scalar_prefetch: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    config: Any = None
    vmem_limit_bytes: int | None = None

    def __post_init__(self):
        name = self.name
        n_blocked = len(self.inputs) - self.num_scalar_prefetch
        if self.num_scalar_prefetch < 0 or n_blocked < 0:
            raise ValueError(f"{name}: num_scalar_prefetch {self.num_scalar_prefetch} out of range")
        if len(self.in_specs) != n_blocked:
            raise ValueError(
                f"{name}: in_specs: expected {n_blocked} blocks (inputs after the scalar-prefetch "
                f"operands), got {len(self.in_specs)}"
            )
        if not self.outputs:
            raise ValueError(f"{name}: outputs: expected at least one")
        if any(not isinstance(g, int) or g < 1 for g in self.grid):
            raise ValueError(f"{name}: grid: expected positive ints, got {self.grid}")
        if self.semantics and len(self.semantics) != len(self.grid):
            raise ValueError(
                f"{name}: semantics: expected one per grid axis ({len(self.grid)}), "
                f"got {self.semantics}"
            )
        bad = [s for s in self.semantics if s not in SEMANTICS]
        if bad:
            raise ValueError(f"{name}: semantics: expected {list(SEMANTICS)} entries, got {bad}")
        for i, t in enumerate(self.inputs[: self.num_scalar_prefetch]):
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: scalar-prefetch operand {i}: expected int32, {t.dtype}")
        arrays = [
            (f"input {i}", tuple(t.shape), b)
            for i, (t, b) in enumerate(
                zip(self.inputs[self.num_scalar_prefetch :], self.in_specs, strict=True)
            )
        ] + [(f"output {i}", tuple(o.shape), o.block) for i, o in enumerate(self.outputs)]
        for what, shape, block in arrays:
            if block.shape is not None and len(block.shape) != len(shape):
                raise ValueError(
                    f"{name}: {what}: block {block.shape} has {len(block.shape)} dimensions, "
                    f"the array {shape} has {len(shape)}"
                )

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", type(self.kernel).__name__)

    # --- jax ------------------------------------------------------------------------------------

    def build(self, interpret: bool = True) -> Callable:
        """The jax callable ``f(*arrays) -> tuple of arrays``: through the TPU interpreter
        (``interpret``: race detection, NaN-filled uninitialised memory), or native Mosaic."""
        jax, pl, pltpu = _jax()
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=self.num_scalar_prefetch,
            grid=self.grid,
            in_specs=[b.spec() for b in self.in_specs],
            out_specs=[o.block.spec() for o in self.outputs],
            scratch_shapes=[s.jax() for s in self.scratch],
        )
        params = {}
        if self.semantics:
            params["dimension_semantics"] = self.semantics
        if self.vmem_limit_bytes is not None:
            params["vmem_limit_bytes"] = self.vmem_limit_bytes
        kernel = functools.partial(self.kernel, **self.params) if self.params else self.kernel
        return pl.pallas_call(
            kernel,
            grid_spec=grid_spec,
            out_shape=[jax.ShapeDtypeStruct(o.shape, jax_dtype(o.dtype)) for o in self.outputs],
            compiler_params=pltpu.CompilerParams(**params),
            interpret=interpret_params() if interpret else False,
            name=self.name,
        )

    def avals(self) -> list:
        """The abstract inputs (``jax.ShapeDtypeStruct``) of :meth:`build`'s callable."""
        jax = _jax()[0]
        return [
            jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(_passed_dtype(t))) for t in self.inputs
        ]

    def lower(self, platform: str = "tpu"):
        """The call lowered for ``platform`` (no device of that kind needed)."""
        jax = _jax()[0]
        fn = jax.jit(self.build(interpret=False))
        return fn.trace(*self.avals()).lower(lowering_platforms=(platform,))

    def key(self) -> tuple:
        """What makes two calls the same program: kernel, params, grid, blocks, avals."""
        return (
            _fn_key(self.kernel),
            tuple(sorted((k, _value_key(v)) for k, v in self.params.items())),
            self.grid,
            self.semantics,
            self.num_scalar_prefetch,
            tuple(_block_key(b) for b in self.in_specs),
            tuple((o.shape, o.dtype, _block_key(o.block)) for o in self.outputs),
            tuple((s.kind, s.shape, s.dtype) for s in self.scratch),
            tuple((tuple(t.shape), _passed_dtype(t)) for t in self.inputs),
            self.vmem_limit_bytes,
        )

    def run(self) -> tuple[torch.Tensor, ...]:
        """Run on the (real) input tensors; the outputs as torch-owned tensors on the inputs'
        device. Raises :class:`PallasRace` / :class:`PallasInterpreterError`."""
        native = tpu_attached()
        fn = _compiled(self, interpret=not native)
        args = [to_jax(t, f"{self.name}: input {i}") for i, t in enumerate(self.inputs)]
        device = self.inputs[0].device if self.inputs else torch.device("cpu")
        if native:
            return tuple(to_torch(a, device) for a in fn(*args))
        return _interpreted(self.name, fn, args, device)


@dataclass(frozen=True)
class PallasPlan:
    """What a Pallas variant does for its inputs: ``calls`` in order, then ``finish`` (given
    each call's outputs, a list of tuples) returns the op's result. No call: ``result``."""

    calls: tuple[PallasCall, ...] = ()
    finish: Callable[[list[tuple[torch.Tensor, ...]]], Any] | None = None
    result: Any = None

    def run(self):
        outs = [c.run() for c in self.calls]
        return self.finish(outs) if self.finish is not None else self.result

    def describe(self) -> list[PallasCall]:
        return list(self.calls)


def launches(op, shape, dtype, config=None, target=None, variant: str = "pallas"):
    """The :class:`PallasCall` s ``op``'s Pallas ``variant`` makes for ``shape`` (meta inputs:
    nothing allocated, jax not imported), with its default config for ``target`` or
    ``config``."""
    v = op.variants.get(variant)
    if v is None or v.kind != "pallas" or v.plan is None:
        raise ValueError(f"variant: op {op.name!r} has no Pallas variant named {variant!r}")
    inputs = op.inputs(shape, dtype, "meta")
    if v.prepare is not None:
        inputs = v.prepare(inputs)
    return v.plan(**inputs, config=config, target=target).describe()


# --- running ------------------------------------------------------------------------------------


def interpret_params():
    """The TPU interpreter's settings for verification: races detected, uninitialised memory
    NaN (an unwritten accumulator shows), out-of-bounds reads raised (never clamped)."""
    _, _, pltpu = _jax()
    return pltpu.InterpretParams(
        detect_races=True, uninitialized_memory="nan", out_of_bounds_reads="raise"
    )


#: The interpreter keeps module-level state (simulated memory, the race flag): one run at a time.
_LOCK = threading.Lock()
#: Jitted callables by :meth:`PallasCall.key` (jax caches per function object: a plan builds new
#: index-map closures each call, so without this every call would trace and compile again).
_CACHE: OrderedDict[tuple, Callable] = OrderedDict()
_CACHE_SIZE = 64


def _compiled(call: PallasCall, interpret: bool) -> Callable:
    key = (call.key(), interpret)
    fn = _CACHE.get(key)
    if fn is None:
        jax = _jax()[0]
        fn = jax.jit(call.build(interpret=interpret))
        _CACHE[key] = fn
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return fn


def _interpreter_state():
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as state
    except ImportError as exc:  # the interpreter moved: race detection would be silently off
        raise PallasInterpreterError(
            f"cannot read the TPU interpreter's race detector in this jax ({exc}); "
            "kernelab reads jax 0.10's"
        ) from exc
    return state


def _interpreted(name: str, fn, args, device) -> tuple[torch.Tensor, ...]:
    _, _, pltpu = _jax()
    state = _interpreter_state()
    printed = io.StringIO()
    with _LOCK:
        pltpu.reset_tpu_interpret_mode_state()  # a fresh race flag, and state left by a failure
        try:
            with contextlib.redirect_stdout(printed):
                outs = fn(*args)
                for o in outs:
                    o.block_until_ready()
        except Exception as exc:
            pltpu.reset_tpu_interpret_mode_state()
            text = _first_line(exc)
            raise PallasInterpreterError(f"{name}: {type(exc).__name__}: {text}") from exc
        races = getattr(state, "races", None)
        if races is None or not hasattr(races, "races_found"):
            raise PallasInterpreterError(f"{name}: the race detector left no state to read")
        if races.races_found:
            where = next((ln for ln in printed.getvalue().splitlines() if "read of" in ln), "")
            seen = f": {where.strip()}" if where else ""
            raise PallasRace(f"{name}: the TPU interpreter detected a race{seen}")
    return tuple(to_torch(o, device) for o in outs)


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


# --- tensors across -----------------------------------------------------------------------------


def _passed_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.int32 if t.dtype == torch.int64 else t.dtype


def jax_dtype(dtype: torch.dtype):
    """The jax (numpy) dtype of a torch dtype."""
    import jax.numpy as jnp

    table = {
        torch.float32: jnp.float32,
        torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16,
        torch.int8: jnp.int8,
        torch.uint8: jnp.uint8,
        torch.int32: jnp.int32,
        torch.bool: jnp.bool_,
    }
    if dtype not in table:
        raise TypeError(f"dtype: no Pallas equivalent of {dtype} (expected one of {list(table)})")
    return table[dtype]


def to_jax(t: torch.Tensor, what: str = "tensor"):
    """``t`` as a jax array, zero-copy when it is contiguous (DLPack); int64 as int32."""
    jax = _jax()[0]
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{what}: expected a CPU tensor (TPU buffers come from jax), got {t.device}"
        )
    t = t.detach()
    if t.dtype == torch.int64:
        if t.numel() and (int(t.min()) < -(2**31) or int(t.max()) >= 2**31):
            raise ValueError(f"{what}: int64 values outside int32, which jax runs here")
        t = t.to(torch.int32)
    if not t.is_contiguous():
        t = t.contiguous()
    return jax.dlpack.from_dlpack(t)


def to_torch(a, device=None) -> torch.Tensor:
    """A torch-owned copy of jax array ``a`` (read through DLPack, never written)."""
    jax = _jax()[0]
    if a.size == 0:
        return torch.empty(a.shape, dtype=_torch_dtype(a.dtype), device=device)
    view = torch.from_dlpack(jax.device_get(a) if _on_accelerator(a) else a)
    return view.clone() if device is None else view.to(device, copy=True)


def _on_accelerator(a) -> bool:
    return any(d.platform != "cpu" for d in getattr(a, "devices", lambda: ())())


def _torch_dtype(dtype) -> torch.dtype:
    import jax.numpy as jnp

    table = {
        jnp.dtype(jnp.float32): torch.float32,
        jnp.dtype(jnp.float16): torch.float16,
        jnp.dtype(jnp.bfloat16): torch.bfloat16,
        jnp.dtype(jnp.int8): torch.int8,
        jnp.dtype(jnp.int32): torch.int32,
    }
    return table[jnp.dtype(dtype)]


# --- cache keys ---------------------------------------------------------------------------------


def _fn_key(f) -> tuple:
    """Functions with the same code, defaults and closure values compute the same thing."""
    if isinstance(f, functools.partial):
        return (
            "partial",
            _fn_key(f.func),
            tuple(_value_key(a) for a in f.args),
            tuple(sorted((k, _value_key(v)) for k, v in f.keywords.items())),
        )
    code = getattr(f, "__code__", None)
    if code is None:
        return ("object", id(f))
    cells = tuple(_value_key(c.cell_contents) for c in (f.__closure__ or ()))
    return (code, tuple(_value_key(d) for d in (f.__defaults__ or ())), cells)


def _value_key(v):
    if callable(v) and not isinstance(v, type):
        return _fn_key(v)
    if isinstance(v, list | tuple):
        return tuple(_value_key(x) for x in v)
    try:
        hash(v)
    except TypeError:
        return ("unhashable", id(v))
    return v


def _block_key(b: Block) -> tuple:
    return (b.shape, b.memory, None if b.index_map is None else _fn_key(b.index_map))
