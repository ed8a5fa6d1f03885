"""The layers' import rules, read from the source (AST, imports inside functions included), so
they hold as modules are added: the core imports no op family and no instrument; nothing outside
the op families and the core reaches an op family's private module or name; no package reaches
another package's private module, name or attribute (what it needs is exported); no instrument
imports the CLI or the report (what a command and an instrument both use lives below them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kernelab

SRC = Path(kernelab.__file__).parent
#: Packages below the CLI and the report: they may not import ``kernelab.cli``.
BELOW_CLI = ("core", "ops", "hardware", "ledger", "verify", "bench", "inspect", "trace", "tune",
             "sweep", "models", "workloads")  # fmt: skip


def _imported(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every import of a kernelab module in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "kernelab":
                out += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [
                (a.name, None, node.lineno) for a in node.names if a.name.startswith("kernelab")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level:
            pytest.fail(f"{path}:{node.lineno}: a relative import (kernelab imports absolutely)")
    return out


def _modules(package: str = "") -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def _where(path: Path) -> str:
    return str(path.relative_to(SRC.parent))


def _private_of_a_family(module: str, name: str | None) -> bool:
    parts = module.split(".")
    if parts[:2] != ["kernelab", "ops"] or len(parts) < 3:
        return False
    if any(p.startswith("_") for p in parts[2:]):
        return True
    return name is not None and name.startswith("_")


def test_the_core_imports_no_op_family_and_no_instrument():
    bad = [
        f"{_where(p)}:{line}: {module}"
        for p in _modules("core")
        for module, _name, line in _imported(p)
        if module.split(".")[1:2] not in (["core"], ["_flags"], ["_suggest"], ["hardware"], [])
    ]
    assert not bad, "the core reaches up:\n" + "\n".join(bad)


def test_nothing_outside_the_families_reaches_their_privates():
    bad = [
        f"{_where(p)}:{line}: from {module} import {name}"
        for p in _modules()
        if p.relative_to(SRC).parts[0] not in ("ops", "core")
        for module, name, line in _imported(p)
        if _private_of_a_family(module, name)
    ]
    assert not bad, "private op-family names used outside the families:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", BELOW_CLI)
def test_no_instrument_imports_the_cli_or_the_report(package):
    bad = [
        f"{_where(p)}:{line}: {module}"
        for p in _modules(package)
        for module, _name, line in _imported(p)
        if module.split(".")[:2] in (["kernelab", "cli"], ["kernelab", "report"])
    ]
    assert not bad, f"{package} imports the CLI or the report:\n" + "\n".join(bad)


def _package(module: str) -> str | None:
    """``kernelab.trace._limits`` -> ``trace``; None for kernelab itself and its top-level
    modules (``kernelab._flags``, ``kernelab._table``: the shared bottom) and for other
    projects' modules (what kernelab uses of torch's or Triton's privates is not this rule's)."""
    parts = module.split(".")
    if parts[0] != "kernelab" or len(parts) < 2 or parts[1].startswith("_"):
        return None
    return parts[1]


def _reach_ins(path: Path, own: str) -> list[str]:
    """Where ``path`` (in package ``own``) uses another package's private module, name, or
    an underscored attribute of a module it imported from another package."""
    tree = ast.parse(path.read_text(), str(path))
    bad, modules = [], {}  # modules: local name -> the module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            other = _package(node.module)
            for a in node.names:
                modules[a.asname or a.name] = (f"{node.module}.{a.name}", other)
                private = a.name.startswith("_") or any(
                    part.startswith("_") for part in node.module.split(".")[2:]
                )
                if other not in (None, own) and private:
                    bad.append(f"{node.lineno}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                other = _package(a.name)
                if a.asname:
                    modules[a.asname] = (a.name, other)
                if other not in (None, own) and any(
                    part.startswith("_") for part in a.name.split(".")[2:]
                ):
                    bad.append(f"{node.lineno}: import {a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            module, other = modules[node.value.id]
            if other not in (None, own):
                bad.append(f"{node.lineno}: {node.value.id}.{node.attr} (of {module})")
    return bad


def test_no_package_reaches_another_packages_privates():
    bad = [
        f"{_where(p)}:{where}"
        for p in _modules()
        if len(p.relative_to(SRC).parts) > 1
        for where in _reach_ins(p, p.relative_to(SRC).parts[0])
    ]
    assert not bad, "private names used across packages (export them):\n" + "\n".join(bad)


def test_the_rules_see_a_planted_violation(tmp_path):
    # The scanner itself: each rule's predicate fires on the import it is there to catch.
    src = tmp_path / "planted.py"
    src.write_text(
        "def f():\n"
        "    from kernelab.ops.attention._paged import caches\n"
        "    from kernelab.ops.norm import _kernels\n"
        "    import kernelab.cli._common\n"
    )
    found = _imported(src)
    assert [m for m, n, _ in found if _private_of_a_family(m, n)] == [
        "kernelab.ops.attention._paged",
        "kernelab.ops.norm",
    ]
    assert any(m.startswith("kernelab.cli") for m, _, _ in found)
    assert not _private_of_a_family("kernelab.ops", "gemm")
    assert not _private_of_a_family("kernelab.core.runtime.check", "tensor")
    across = tmp_path / "across.py"
    across.write_text(
        "from kernelab.trace._limits import parse\n"
        "from kernelab.inspect import report as r\n"
        "from kernelab import _flags\n"
        "from kernelab.tune.tuner import _fields\n"
        "import kernelab.ledger._base\n"
        "from torch.utils._pytree import tree_map\n"
        "t = r._target('sm_90')\n"
        "ok = r.analyze_jobs\n"
    )
    found = _reach_ins(across, "cli")
    assert [f.split(":")[0] for f in found] == ["1", "4", "5", "7"], found
    # its own package may: the first import is trace's own
    assert [f.split(":")[0] for f in _reach_ins(across, "trace")] == ["4", "5", "7"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's nodes, found once each (depth-first, from its smallest node)."""
    found = []

    def walk(start, node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append([*path, start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


@pytest.mark.parametrize("package", ["cli", "trace", "bench", "verify", "inspect", "tune"])
def test_no_two_modules_of_a_package_import_each_other(package):
    # Imports inside functions count: a circle that only works because one side is lazy is
    # still a circle (what both need belongs in a module below them).
    # (the package's __init__ is left out: it gathers its modules' public names)
    modules = {_module_name(p): p for p in _modules(package) if p.name != "__init__.py"}
    graph = {
        name: {m for m, _n, _l in _imported(path) if m in modules and m != name}
        | {f"{m}.{n}" for m, n, _l in _imported(path) if f"{m}.{n}" in modules}
        for name, path in modules.items()
    }
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _variant_by_name_or_kind(path: Path) -> list[str]:
    """Where ``path`` picks a variant by its name (``op.variants["torch"]``) or compares a
    ``.kind`` with a backend's name: what the instruments ask the variant instead (its
    backend's capabilities: ``by_default``, ``compiles_for``, ``tuned``, ``interpreted``, and
    ``Op.eager`` / ``Op.tuned_variant``)."""
    from kernelab.core.runtime.backends import backends

    names = {b.name for b in backends()}
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [
                c.value
                for x in sides
                for c in ([x] if isinstance(x, ast.Constant) else getattr(x, "elts", []))
                if isinstance(c, ast.Constant)
            ]
            kind = any(isinstance(x, ast.Attribute) and x.attr == "kind" for x in sides)
            if kind and names.intersection(c for c in consts if isinstance(c, str)):
                bad.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "variants"
            and isinstance(node.slice, ast.Constant)
        ):
            bad.append(f"{node.lineno}: {ast.unparse(node)}")
    return bad


def test_the_instruments_ask_a_variant_what_it_can_do_not_its_name():
    bad = [
        f"{_where(p)}:{where}"
        for p in _modules()
        if p.relative_to(SRC).parts[0] not in ("ops", "core")
        for where in _variant_by_name_or_kind(p)
    ]
    assert not bad, "variants picked by name or kind string:\n" + "\n".join(bad)


def test_the_variant_rule_sees_a_planted_lookup(tmp_path):
    src = tmp_path / "planted.py"
    src.write_text(
        "fn = op.variants['kernelab'].fn\n"
        "if v.kind == 'compile' and dev == 'cpu':\n"
        "    pass\n"
        "slow = v.kind in ('triton', 'pallas')\n"
        "fine = v.kind == 'dense' or v.tuned\n"
    )
    assert sorted(b.split(":")[0] for b in _variant_by_name_or_kind(src)) == ["1", "2", "4"]
