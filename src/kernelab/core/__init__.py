"""The public op core, the layer under the op families and the instruments: the op model, one
concept a module (shapes, cost and contract, launches, variants, ops and their registry; see
:mod:`kernelab.core.op` for the calling convention), and :mod:`kernelab.core.runtime`, what
runs them (backends, the Triton decorator and interpreter, launch plans, Pallas calls, argument
checks, input generation, tuned configs). It imports no op family: families register their ops
here, and the instruments import this and the public op functions, never a family's privates.

The registry holds the ops whose modules were imported: :func:`kernelab.ops.get` and
:func:`kernelab.ops.all_ops` (the public names) import every family first."""

from kernelab.core.contract import DEFAULT_FLOORS, Contract, Cost, changeable, dtype_name
from kernelab.core.launch import Launch
from kernelab.core.op import Op, all_ops, as_tuple, get, register
from kernelab.core.sampling import Sampling
from kernelab.core.shape import SHAPE_SETS, Shape, ShapeSets
from kernelab.core.variant import Variant

__all__ = [
    "DEFAULT_FLOORS",
    "SHAPE_SETS",
    "Contract",
    "Cost",
    "Launch",
    "Op",
    "Sampling",
    "Shape",
    "ShapeSets",
    "Variant",
    "all_ops",
    "as_tuple",
    "changeable",
    "dtype_name",
    "get",
    "register",
]
