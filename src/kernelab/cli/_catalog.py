"""The ops as ``kernelab ops`` lists them, without importing the ops (torch and Triton take
seconds to load): every op, its declared variants and its calling convention, made from the
registry once and stored in ``kernelab/data/ops_catalog.json``.

A test rebuilds the catalogue from the registry and fails where the stored one differs, so it
cannot drift from the ops; ``python -m kernelab.cli._catalog`` rewrites it. It stores a digest
of the op modules' text: where they changed since (a new op, a variant added), the catalogue
is made from the registry instead, at the registry's cost, until it is rewritten.

What depends on the machine is decided when asked, as the registry decides it: an external
variant is listed only where its package is installed, and whether a variant runs on a device
type is its backend's answer, stored for "cpu" and "cuda" with the packages that answer depends
on (a backend's ``requires``, jax for Pallas) present, and with each of them missing: the
backend's own answers, taken with the package search made to find or miss them. Where a
package search fails here (a finder that raises), :func:`rows` returns None and the caller asks
the registry.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import orjson

PATH = Path(__file__).resolve().parent.parent / "data" / "ops_catalog.json"
#: The device types ``kernelab.hardware.detect`` reports.
DEVICE_TYPES = ("cpu", "cuda")


#: The op modules the catalogue is made from (their digest is stored with it).
OPS_DIR = Path(__file__).resolve().parent.parent / "ops"


def sources_digest() -> str:
    """Digest of every op module's name and text (a few milliseconds: no import)."""
    h = hashlib.sha256()
    for path in sorted(OPS_DIR.rglob("*.py")):
        h.update(path.relative_to(OPS_DIR).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.cache
def load() -> dict:
    """The stored catalogue, or, where an op module changed since it was made (a new op not
    yet in it), one made from the registry now: never a name refused that the registry has."""
    stored = orjson.loads(PATH.read_bytes())
    if stored.get("sources") != sources_digest():
        return build()
    return stored


def op_names() -> list[str]:
    """The registered ops' names, in registry order."""
    return [o["op"] for o in load()["ops"]]


def _present(package: str) -> bool | None:
    """Whether ``package`` is installed; None where the search fails (a finder that raises)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return None


def _answers(backend: dict) -> dict | None:
    """A backend's (runs, note) per device type on this machine; None where unknown."""
    for package in backend["requires"]:
        present = _present(package)
        if present is None:
            return None
        if not present:
            return backend["without"][package]
    return backend["runs_on"]


def rows(device_type: str, names: list[str] | None = None) -> list[dict] | None:
    """``kernelab ops``'s rows for ``names`` (all when None; each must be an op's name) on
    ``device_type``, as :func:`kernelab.cli.ops_cmd.registry_rows` gives them; None where the
    catalogue cannot tell for this machine (then ask the registry)."""
    cat = load()
    if device_type not in DEVICE_TYPES:
        return None
    backends = {name: _answers(b) for name, b in cat["backends"].items()}
    by_name = {o["op"]: o for o in cat["ops"]}
    out = []
    for name in names or list(by_name):
        o = by_name[name]
        variants = []
        for v in o["variants"]:
            if v["requires"] is not None and importlib.util.find_spec(v["requires"]) is None:
                continue  # not installed: the registry leaves it out
            if backends.get(v["kind"]) is None:
                return None
            ok, why = backends[v["kind"]][device_type]
            variants.append(
                {
                    "name": v["name"],
                    "kind": v["kind"],
                    "runs_here": ok,
                    "note": why,
                    "description": v["description"],
                }
            )
        row = {k: o[k] for k in ("op", "description", "dtypes", "inplace", "outputs")}
        out.append({**row, "shape_sets": o["shape_sets"], "variants": variants})
    return out


def calling(name: str) -> dict:
    """The calling convention of op ``name`` (:func:`kernelab.core.calling.calling_convention`)."""
    return next(o["calling"] for o in load()["ops"] if o["op"] == name)


def build() -> dict:
    """The catalogue, made from the registry (imports every op)."""
    from kernelab import ops
    from kernelab.core.calling import calling_convention, op_row
    from kernelab.core.runtime.backends import backends

    def answers(backend, missing: str | None = None) -> dict:
        needed = getattr(backend, "requires", ())
        with _packages_found(needed, missing):
            return {t: list(backend.runs_on(t)) for t in DEVICE_TYPES}

    return {
        "sources": sources_digest(),
        "backends": {
            b.name: {
                "requires": list(getattr(b, "requires", ())),
                "runs_on": answers(b),
                "without": {p: answers(b, p) for p in getattr(b, "requires", ())},
            }
            for b in backends()
        },
        "ops": [
            {
                **op_row(op),
                "variants": [
                    {
                        "name": v.name,
                        "kind": v.kind,
                        "requires": v.requires,
                        "description": v.description,
                    }
                    for v in op.declared_variants
                ],
                "calling": calling_convention(op),
            }
            for op in ops.all_ops()
        ],
    }


@contextlib.contextmanager
def _packages_found(packages, missing: str | None):
    """Package searches for ``packages`` find each (a placeholder spec, nothing imported) but
    ``missing``, which they miss; other searches unchanged."""
    real = importlib.util.find_spec

    def find_spec(name, package=None):
        if name == missing:
            return None
        if name in packages:
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, package)

    importlib.util.find_spec = find_spec
    try:
        yield
    finally:
        importlib.util.find_spec = real


def dumps(catalogue: dict) -> bytes:
    return orjson.dumps(catalogue, option=orjson.OPT_INDENT_2) + b"\n"


if __name__ == "__main__":
    PATH.write_bytes(dumps(build()))
    sys.stdout.write(f"wrote {PATH}\n")
