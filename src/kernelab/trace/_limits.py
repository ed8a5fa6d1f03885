"""How much of an untrusted trace is read before it is refused: decompressed bytes, events
and nesting depth. Each limit has a default well above real traces, an option and an
environment variable to raise it, and a one-line refusal that names both."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelab import _flags
from kernelab.trace._events import TraceError

#: The deepest nesting a limit may allow: the JSON decoders follow about 1000 levels
#: (msgspec and Python's json by the interpreter's recursion limit, orjson 1024).
DEPTH_CEILING = 900
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Limits:
    """The most a trace may hold. ``max_bytes``: decompressed size (a plain file's size);
    ``max_events``: entries of the event array, of every phase; ``max_depth``: nesting of
    objects and arrays, the top-level value being level 1 (a Kineto event's input shapes
    are at level 6)."""

    #: 40x the largest shared trace (v100_large inflates to 54 MB), 3.6x a 2 M-event
    #: trace written with indent=2 (560 MB).
    max_bytes: int = 2 * 2**30
    #: 23x the largest shared trace (216 k events), 2.5x the 2 M-event benchmark.
    max_events: int = 5_000_000
    #: 20x the deepest real trace (6 levels).
    max_depth: int = 128

    def __post_init__(self):
        for name in ("max_bytes", "max_events", "max_depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a whole number >= 1, got {v!r}")
        if self.max_depth > DEPTH_CEILING:
            raise ValueError(
                f"max_depth: at most {DEPTH_CEILING} (the JSON decoders follow about 1000 "
                f"levels), got {self.max_depth}"
            )

    @classmethod
    def resolve(
        cls,
        max_bytes: int | str | None = None,
        max_events: int | None = None,
        max_depth: int | None = None,
    ) -> Limits:
        """Each limit as given, else from its environment variable, else the default."""
        given = {"bytes": max_bytes, "events": max_events, "depth": max_depth}
        values = {}
        for name, v in given.items():
            source = f"--max-{name}"
            if v is None:
                v, source = _flags.trace_limit(name), f"KERNELAB_TRACE_MAX_{name.upper()}"
            if v is not None:
                values[f"max_{name}"] = parse(v, source, size=name == "bytes")
        return cls(**values)


def parse(value, source: str, size: bool = False) -> int:
    """A limit's value: a whole number, for a size also with a K/M/G/T suffix (powers of
    1024: ``4G``). ValueError naming ``source`` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _SIZE.fullmatch(str(value)) if size else re.fullmatch(r"\s*\d+\s*", str(value))
        if not m:
            what = "a size in bytes (e.g. 4G, 512M)" if size else "a whole number"
            raise ValueError(f"{source}: expected {what}, got {value!r}")
        n = int(m.group(1)) * _UNITS[m.group(2).upper()] if size else int(m.group())
    if n < 1:
        raise ValueError(f"{source}: expected at least 1, got {value!r}")
    return n


class TraceLimitError(TraceError):
    """The trace holds more than a limit allows (``limit``: bytes, events or depth)."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class Exceeded(Exception):
    """Raised while reading, where the path is not known; :func:`refusal` words it."""

    def __init__(self, limit: str, found: int | None = None):
        super().__init__(limit)
        self.limit, self.found = limit, found


def _size(n: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return f"{n} bytes"


def refusal(path: str, exc: Exceeded, limits: Limits) -> TraceLimitError:
    """The one-line error for a trace over a limit: what, the limit, how to raise it."""
    value = "SIZE" if exc.limit == "bytes" else "N"
    how = f"--max-{exc.limit} {value} or KERNELAB_TRACE_MAX_{exc.limit.upper()}={value}"
    if exc.limit == "bytes":
        what = f"decompresses to more than {_size(limits.max_bytes)} (the limit)"
        how += " (e.g. 4G)"
    elif exc.limit == "events":
        what = f"holds more than {limits.max_events} events (the limit)"
    else:
        deep = f"{exc.found} levels" if exc.found else "more levels than the decoders follow"
        what = f"nests its JSON {deep} deep, more than the limit of {limits.max_depth}"
        how += f", N at most {DEPTH_CEILING}"
    return TraceLimitError(f"trace: {path!r} {what}; to read it, raise the limit: {how}", exc.limit)
