"""Explicit registries (ops, backends): a duplicate name is an error, never a silent override."""

from __future__ import annotations

from typing import TypeVar

from kernelab._suggest import unknown_name

T = TypeVar("T")


def add(table: dict[str, T], name: str, value: T, what: str) -> T:
    """Register ``value`` under ``name``; ``what`` names the kind in the error ("an op")."""
    if name in table:
        raise ValueError(f"{what.split()[-1]}: {what} named {name!r} is already registered")
    table[name] = value
    return value


def lookup(table: dict[str, T], name: str, argument: str, expected: str = "") -> T:
    """The value under ``name``; a ValueError naming ``argument``, the registered names and the
    closest of them."""
    if name not in table:
        raise unknown_name(argument, name, table, expected)
    return table[name]
