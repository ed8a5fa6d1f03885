"""What an op looks like to a caller, read from its declaration: the calling convention of a
candidate (``fn(**inputs)``: arguments, outputs, in-place arguments, the out= rule, an example
signature) and the row ``kernelab ops`` shows. The ops' catalogue stores both, so commands that
do not run a kernel answer without torch."""

from __future__ import annotations


def takes(fn, name: str) -> bool:
    """Whether ``fn`` has a parameter called ``name`` (False when its signature cannot be
    read, as for some builtins)."""
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _kind(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} tensor, {value.dim()}-d"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def calling_convention(op) -> dict:
    """How a candidate for ``op`` is called: ``fn(**inputs)`` with these arguments (read from
    the inputs of every shape of every set, on meta tensors), the outputs it returns, which
    arguments it updates in place, which may be omitted (None in some shapes), and the out=
    rule."""
    args: dict[str, dict] = {}
    first = True
    for shape_set in op.shape_sets:
        for shape in op.shapes(shape_set):
            inputs = op.inputs(shape, op.dtypes[0], "meta")
            later, first = not first, False
            for name in args:
                if name not in inputs:
                    args[name]["optional"] = True
            for name, value in inputs.items():
                entry = args.setdefault(
                    name,
                    {"name": name, "kind": None, "optional": later, "inplace": False},
                )
                if value is None:
                    entry["optional"] = True
                elif entry["kind"] is None:
                    entry["kind"] = _kind(value)
    for name in op.contract.inplace:
        if name in args:
            args[name]["inplace"] = True
    for entry in args.values():
        entry["kind"] = entry["kind"] or "None"
    out = op.out_arg
    if out is None:
        rule = "no out= argument: the candidate allocates its outputs"
    elif isinstance(out, str):
        many = " (a tuple, in the order of the outputs)" if len(op.outputs) > 1 else ""
        rule = (
            f"{out}= may be given a preallocated output{many}: write it and return it; "
            f"verify then passes poisoned buffers with canaries"
        )
    else:
        rule = f"{', '.join(f'{n}=' for n in out)} may each be given a preallocated output"
    return {
        "arguments": list(args.values()),
        "returns": list(op.outputs),
        "inplace": list(op.contract.inplace),
        "out": out,
        "out_rule": rule,
        "example": _example(op, list(args.values())),
    }


def _example(op, args: list[dict]) -> str:
    required = [a["name"] for a in args if not a["optional"]]
    optional = [f"{a['name']}=None" for a in args if a["optional"]]
    outs = []
    if isinstance(op.out_arg, str):
        outs = [f"{op.out_arg}=None"]
    elif op.out_arg:
        outs = [f"{n}=None" for n in op.out_arg]
    params = [*required, *optional, *outs]
    head = f"def my_{op.name}({', '.join(params)}):"
    if len(head) > 76:  # one argument a line, to read at 80 columns
        head = "\n".join([f"def my_{op.name}(", *(f"    {p}," for p in params), "):"])
    body = [head]
    for a in args:
        if a["inplace"]:
            body.append(f"    ...  # update {a['name']} in place")
    ret = ", ".join(op.outputs)
    body.append(f"    ...  # compute {ret}" + (" (into out= when given)" if outs else ""))
    body.append(f"    return {ret}")
    return "\n".join(body)


def op_row(op) -> dict:
    """What ``kernelab ops`` says of an op, its variants aside."""
    return {
        "op": op.name,
        "description": op.description,
        "dtypes": [str(d).removeprefix("torch.") for d in op.dtypes],
        "inplace": list(op.contract.inplace),
        "outputs": list(op.outputs),
        "shape_sets": {name: len(op.shapes(name)) for name in op.shape_sets},
    }
