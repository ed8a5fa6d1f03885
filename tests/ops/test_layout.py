"""The ops package's layout rules, read from the source (AST), so they stay true as ops are added.

- one folder per family; the op model and the runtime the families share live below them, in
  the public core (``kernelab/core/``);
- a module without a leading underscore is one op: it registers exactly one;
- ``_kernels.py`` holds only Triton kernels (and the constants they use);
- no family imports another family's private modules or names, and no op module imports
  another op module's private names;
- a kernel's argument list is written once, in the kernel: its arguments are bound in one
  place (a launch plan), and no family module spells Triton signatures or launches a kernel
  by hand;
- tests mirror the tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kernelab.ops

OPS = Path(kernelab.ops.__file__).parent
CORE = OPS.parent / "core"
TESTS = Path(__file__).parent
FAMILIES = sorted(p.name for p in OPS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
#: Triton's type spellings: a family module that writes them is writing a signature by hand.
TRITON_TYPES = {"*fp16", "*bf16", "*fp32", "*fp8e4nv", "*fp8e4b8", "*i8", "*u8", "*i32", "i32"}


def _modules(family: str) -> list[Path]:
    return sorted((OPS / family).glob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _is_kernel(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("kernel", "jit"):
            return True
    return False


def test_families_and_shared_folders_exist():
    assert set(FAMILIES) >= {"norm", "matmul", "quant", "activation", "rotary", "logits"}
    assert (CORE / "__init__.py").is_file() and (CORE / "runtime" / "__init__.py").is_file()
    private = [p.name for p in OPS.iterdir() if p.is_dir() and p.name.startswith("_")]
    assert not [p for p in private if p != "__pycache__"], f"private folders in ops/: {private}"
    stray = [p.name for p in OPS.glob("*.py") if p.name != "__init__.py"]
    assert not stray, f"modules outside a family folder: {stray}"


def test_no_family_name_shadows_an_exported_name():
    # ``kernelab.ops.<family>`` must stay the package, never a function of the same name.
    for family in FAMILIES:
        assert not hasattr(kernelab.ops, family) or isinstance(
            getattr(kernelab.ops, family), type(kernelab.ops)
        ), family


@pytest.mark.parametrize("family", FAMILIES)
def test_each_public_module_registers_exactly_one_op(family):
    for path in _modules(family):
        if path.name.startswith("_"):
            continue
        calls = [
            n
            for n in ast.walk(_tree(path))
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register"
        ]
        assert len(calls) == 1, f"{family}/{path.name} registers {len(calls)} ops, not one"


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_modules_hold_only_kernels(family):
    path = OPS / family / "_kernels.py"
    assert path.is_file(), f"{family} has no _kernels.py"
    allowed = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Expr)
    for node in _tree(path).body:
        if isinstance(node, ast.FunctionDef):
            assert _is_kernel(node), f"{family}/_kernels.py: {node.name} is not a kernel"
        else:
            assert isinstance(node, allowed), f"{family}/_kernels.py: {ast.dump(node)[:80]}"
    for path in _modules(family):
        if path.name == "_kernels.py":
            continue
        kernels = [
            n.name for n in _tree(path).body if isinstance(n, ast.FunctionDef) and _is_kernel(n)
        ]
        assert not kernels, f"{family}/{path.name} defines kernels {kernels}: they go in _kernels"


def _imports(path: Path):
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernelab"):
            for alias in node.names:
                yield node.module, alias.name


def _family_of(module: str) -> tuple[str | None, str | None]:
    parts = module.split(".")
    if parts[:2] == ["kernelab", "core"]:
        return "core", ".".join(parts[2:]) or None
    if len(parts) >= 3 and parts[:2] == ["kernelab", "ops"]:
        return parts[2], parts[3] if len(parts) > 3 else None
    return None, None


@pytest.mark.parametrize("family", FAMILIES)
def test_no_private_names_cross_a_family_or_an_op_module(family):
    for path in _modules(family):
        own = path.stem
        for module, name in _imports(path):
            fam, mod = _family_of(module)
            if fam is None:
                continue
            where = f"{family}/{path.name}: from {module} import {name}"
            if fam == "core":
                assert not name.startswith("_"), f"{where} (a private name of the core)"
            elif fam != family:
                assert mod is not None and not mod.startswith("_"), f"{where} (another family)"
                assert not name.startswith("_"), f"{where} (another family's private name)"
            elif mod is None:
                # ``from kernelab.ops.<family> import _kernels``: the family's own modules.
                assert own.startswith("_") or name.startswith("_"), where
            elif not mod.startswith("_") and mod != own:
                assert not name.startswith("_"), f"{where} (another op module's private name)"


def _launched_kernels(family: str) -> list[str]:
    """The family's kernels that are launched (device helpers are called from other kernels)."""
    body = _tree(OPS / family / "_kernels.py").body
    called = {
        n.func.id
        for fn in body
        if isinstance(fn, ast.FunctionDef)
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    return [
        n.name
        for n in body
        if isinstance(n, ast.FunctionDef) and _is_kernel(n) and n.name not in called
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_kernel_argument_list_is_bound_in_exactly_one_place(family):
    # A KernelCall binds every argument of its kernel by name (it refuses a missing or unknown
    # one), and the launcher and inspect both use it: one construction per launched kernel.
    calls = [
        f"{p.name}:{n.lineno}"
        for p in _modules(family)
        if p.name != "_kernels.py"
        for n in ast.walk(_tree(p))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "KernelCall"
    ]
    kernels = _launched_kernels(family)
    assert len(calls) == len(kernels), f"{family}: kernels {kernels}, bound at {calls}"
    for path in _modules(family):
        for node in ast.walk(_tree(path)):
            name = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
            assert name != "Launch", f"{family}/{path.name}:{node.lineno} writes a Launch by hand"


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_module_writes_a_signature_or_launches_by_hand(family):
    for path in _modules(family):
        if path.name == "_kernels.py":
            continue
        tree = _tree(path)
        literals = {n.value for n in ast.walk(tree) if isinstance(getattr(n, "value", None), str)}
        assert not literals & TRITON_TYPES, f"{family}/{path.name}: {literals & TRITON_TYPES}"
        for node in ast.walk(tree):
            # kern[grid](...): a launch outside KernelCall.run
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                pytest.fail(f"{family}/{path.name}:{node.lineno} launches a kernel directly")
            if isinstance(node, ast.Attribute) and node.attr == "arg_names":
                pytest.fail(f"{family}/{path.name}:{node.lineno} reads arg_names by hand")


def test_tests_mirror_the_tree():
    for family in FAMILIES:
        modules = {p.stem.lstrip("_") for p in _modules(family)} - {"init", "common"}
        public = {p.stem for p in _modules(family) if not p.name.startswith("_")}
        tests = {p.stem.removeprefix("test_") for p in (TESTS / family).glob("test_*.py")}
        assert public <= tests, f"{family}: op modules without a test file: {public - tests}"
        assert tests <= modules, f"{family}: test files named after no module: {tests - modules}"


# --- Pallas kernels -------------------------------------------------------------------------


def _pallas_kernels(path: Path) -> list[str]:
    return [
        n.name
        for n in _tree(path).body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("_") and n.name.endswith("_kernel")
    ]


def _top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in _tree(path).body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_pallas_kernels_live_in_pallas_modules_each_declared_once(family):
    # Pallas kernels (``_<name>_kernel`` functions of refs) and their PallasCall declarations
    # live in the family's ``_pallas.py``; one declaration per kernel, as for KernelCall.
    for path in _modules(family):
        declared = [
            n.lineno
            for n in ast.walk(_tree(path))
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "PallasCall"
        ]
        if path.name == "_pallas.py":
            kernels = _pallas_kernels(path)
            assert len(declared) == len(kernels), f"{family}: {kernels}, declared at {declared}"
        else:
            assert not declared, f"{family}/{path.name} declares a Pallas call outside _pallas.py"


def test_no_ops_module_imports_jax_at_import_time():
    # ``import kernelab`` never imports jax (seconds, and an extra): jax is imported by the
    # Pallas runtime on first use, and kernel bodies import it where they trace.
    for path in sorted(OPS.rglob("*.py")):
        assert not _top_level_imports(path) & {"jax", "jaxlib"}, path.relative_to(OPS)
