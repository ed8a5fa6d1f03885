"""The op model, one concept a module: shapes, cost and contract, launches, variants, ops and
their registry. See :mod:`kernelab.ops._model.op` for the calling convention."""

from kernelab.ops._model.contract import DEFAULT_FLOORS, Contract, Cost, changeable, dtype_name
from kernelab.ops._model.launch import Launch
from kernelab.ops._model.op import Op, all_ops, as_tuple, get, register
from kernelab.ops._model.sampling import Sampling
from kernelab.ops._model.shape import SHAPE_SETS, Shape, ShapeSets
from kernelab.ops._model.variant import Variant

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
