"""Lower a Pallas call for a TPU generation on a machine without a TPU, and read back the Mosaic
module it becomes.

``jax.jit(f).trace(*avals).lower(lowering_platforms=("tpu",))`` needs no TPU. Rules that
depend on the chip (tilings, which primitives lower) read the generation from JAX's device
kind; with no TPU attached it comes from an abstract mesh whose abstract device names the chip
(``jax.sharding.AbstractDevice(device_kind="TPU v6 lite", ...)`` under
``jax.sharding.use_abstract_mesh``), which is what Pallas's ``tpu_info.get_device_kind`` reads
first (jax 0.10.2).

Each ``pallas_call`` lowers to a ``stablehlo.custom_call @tpu_custom_call`` whose
``backend_config`` is JSON: the kernel body is the Mosaic module as MLIR bytecode (base64),
and ``scoped_memory_configs`` carries the VMEM limit when the call asked for one. The body
is parsed back with jaxlib's TPU dialect registered and printed as text; the texts, the JSON
minus the body, and the operand and result types are all that is returned (plain strings and
numbers, nothing jax), for :mod:`kernelab.inspect.mosaic` to read.

Vector layouts and internal scratch are assigned later, inside libtpu, which is not available
here: what this gives is the module as Mosaic receives it.
"""

from __future__ import annotations

import base64
import contextlib

import orjson

from kernelab.hardware.tpu import TPU_LIMITS


def version() -> str:
    import jax

    return jax.__version__


@contextlib.contextmanager
def chip(target: str):
    """Lower as if on ``target`` (a name of :data:`kernelab.hardware.tpu.TPU_LIMITS`)."""
    import jax

    if target not in TPU_LIMITS:
        raise ValueError(f"target: expected one of {list(TPU_LIMITS)}, got {target!r}")
    lim = TPU_LIMITS[target]
    device = jax.sharding.AbstractDevice(
        device_kind=lim.device_kind, num_cores=2 if lim.megacore else 1, platform="tpu"
    )
    mesh = jax.sharding.AbstractMesh((1,), ("chip",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def lower(fn, avals, target: str) -> dict:
    """Lower the jax callable ``fn`` on ``avals`` for ``target``: ``{"target", "jax",
    "calls": [...]}``, one entry per ``tpu_custom_call`` (its kernel name, Mosaic text, backend
    config without the body, operand and result types as MLIR prints them).

    Raises what JAX raises when the call does not lower (the caller records it)."""
    import jax

    with chip(target):
        lowered = jax.jit(fn).trace(*avals).lower(lowering_platforms=("tpu",))
    module = lowered.compiler_ir("stablehlo")
    calls = [_read_call(op) for op in _custom_calls(module.operation)]
    return {"target": target, "jax": jax.__version__, "calls": calls}


def compile_call(call, target) -> dict:
    """Lower one declared Pallas call (``kernelab.core.runtime.pallas.PallasCall``: ``name``,
    ``build(interpret=False)``, ``avals()``) for an inspect target (or its name)."""
    name = getattr(target, "name", target)
    art = lower(call.build(interpret=False), call.avals(), name)
    art["kernel"] = call.name
    return art


def _custom_calls(op):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == "stablehlo.custom_call":
                    target = inner.attributes["call_target_name"]
                    if str(target).strip('"') == "tpu_custom_call":
                        yield inner
                yield from _custom_calls(inner)


def _read_call(op) -> dict:
    from jaxlib.mlir import ir

    config = orjson.loads(ir.StringAttr(op.attributes["backend_config"]).value)
    custom = dict(config.get("custom_call_config") or {})
    body = base64.b64decode(custom.pop("body", ""))
    config["custom_call_config"] = custom
    name = op.attributes.get("kernel_name", None)
    return {
        "name": ir.StringAttr(name).value if name is not None else "",
        "mosaic": _module_text(body),
        "config": config,
        "operands": [str(v.type) for v in op.operands],
        "results": [str(r.type) for r in op.results],
    }


def _module_text(body: bytes) -> str:
    """The Mosaic module in ``body`` (MLIR bytecode as serialised for libtpu) as text."""
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        # The serialised form names the versioned "stable_mosaic" dialect; the deserialising
        # pass turns it back into the TPU dialect.
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(body)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        return str(module)
