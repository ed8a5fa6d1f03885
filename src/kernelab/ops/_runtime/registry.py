"""Explicit registries (ops, backends): a duplicate name is an error, never a silent override."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def add(table: dict[str, T], name: str, value: T, what: str) -> T:
    """Register ``value`` under ``name``; ``what`` names the kind in the error ("an op")."""
    if name in table:
        raise ValueError(f"{what.split()[-1]}: {what} named {name!r} is already registered")
    table[name] = value
    return value


def lookup(table: dict[str, T], name: str, argument: str, expected: str = "") -> T:
    """The value under ``name``; a ValueError naming ``argument`` and the registered names."""
    if name not in table:
        raise ValueError(f"{argument}: expected {expected}one of {sorted(table)}, got {name!r}")
    return table[name]
