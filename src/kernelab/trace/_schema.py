"""The msgspec schema of the trace events this analysis reads: the complete ('X') events with
the args it uses, the ``[memory]`` instants, and an empty struct for every other phase (its
fields skipped in C). Without msgspec the decoders are None and orjson does the work."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from kernelab.trace._events import CATEGORIES, IGNORED

try:  # a faster decoder that skips the fields we do not read; orjson does without it
    import msgspec
except ImportError:  # pragma: no cover - exercised under environments without msgspec
    msgspec = None


#: The category an event of a phase other than 'X' reports: ignored, never counted as unknown.
_NOT_COMPLETE = "(not a complete event)"


#: Event args this analysis reads -> attribute names of the msgspec struct.
_ARG_ATTRS = {
    "correlation": "correlation",
    "device": "device",
    "stream": "stream",
    "registers per thread": "regs",
    "shared memory": "shmem",
    "block": "block",
    "grid": "grid",
    "bytes": "nbytes",
    "Input Dims": "dims",
    "Input type": "types",
}

if msgspec is not None:

    class _Args(msgspec.Struct, gc=False):
        """The args fields read here; the decoder skips every other field in C."""

        correlation: Any = -1
        device: Any = -1
        stream: Any = -1
        regs: Any = msgspec.field(default=-1, name="registers per thread")
        shmem: Any = msgspec.field(default=-1, name="shared memory")
        block: Any = None
        grid: Any = None
        nbytes: Any = msgspec.field(default=-1, name="bytes")
        # Kept as raw JSON (a view, nothing built): only the few shaped ops' are decoded.
        dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")
        types: msgspec.Raw = msgspec.field(default=None, name="Input type")

    class _Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
        """A complete ('X') event: the only phase analysed (fields in the order Kineto writes
        them, which msgspec matches fastest)."""

        cat: Any = None
        name: Any = None
        pid: Any = None
        tid: Any = None
        ts: float | None = None  # ints are accepted; strings or booleans fail the chunk over
        dur: float | None = None
        args: _Args | None = None

    #: Every spelling of a category this analysis knows: decoded as a Literal, a category is
    #: one shared string (no new object, its hash cached) instead of a new string per event.
    _KNOWN_CATEGORY = Literal[
        tuple(sorted({v for k in (*CATEGORIES, *IGNORED) for v in (k, k.capitalize())}))
    ]

    class _KnownEvent(_Event, tag="X"):
        """An :class:`_Event` whose category is a known one (a chunk with another category
        is decoded again as :class:`_Event`)."""

        cat: _KNOWN_CATEGORY | None = None

    # Every other phase of the Chrome trace format decodes to an empty struct: its fields are
    # skipped in C. Its class-level ``cat`` marks it ignored, so a chunk's kinds come from one
    # pass over every event. An unlisted or missing phase fails the chunk over to orjson.
    _SKIPPED = tuple(
        msgspec.defstruct(
            f"_Phase{i}", [], gc=False, tag_field="ph", tag=ph, namespace={"cat": _NOT_COMPLETE}
        )
        for i, ph in enumerate(
            [
                "B",
                "E",
                "i",
                "I",
                "C",
                "b",
                "n",
                "e",
                "s",
                "t",
                "f",
                "P",
                "O",
                "N",
                "D",
                "M",
                "R",
                "c",
                "(",
                ")",
            ]
        )
    )
    _DECODER = msgspec.json.Decoder(list[Union[(_KnownEvent, *_SKIPPED)]])
    _ANY_CATEGORY = msgspec.json.Decoder(list[Union[(_Event, *_SKIPPED)]])

    class _Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
        """An instant ('i') event, decoded only in chunks that hold ``[memory]`` events."""

        name: Any = None
        pid: Any = None
        tid: Any = None
        ts: Any = None
        args: Any = None
        cat: ClassVar[str] = _NOT_COMPLETE  # never a complete event

    _NOT_INSTANT = tuple(x for x in _SKIPPED if x.__struct_config__.tag != "i")
    _MEM_DECODERS = (
        msgspec.json.Decoder(list[Union[(_KnownEvent, _Instant, *_NOT_INSTANT)]]),
        msgspec.json.Decoder(list[Union[(_Event, _Instant, *_NOT_INSTANT)]]),
    )
    _NO_ARGS = _Args()
else:
    _DECODER = _ANY_CATEGORY = None
    _MEM_DECODERS = None
    _NO_ARGS = None
    _Event = _Instant = None  # no struct is ever decoded


def _plain(value):
    """An args value as plain JSON data (raw JSON decoded)."""
    if msgspec is not None and type(value) is msgspec.Raw:
        return msgspec.json.decode(value)
    return value


def _as_dict(event) -> dict:
    """A decoded struct back as the dict the careful path expects."""
    if not isinstance(event, _Event):
        return {"ph": type(event).__struct_config__.tag}
    out = {k: getattr(event, k) for k in ("cat", "name", "ts", "dur", "pid", "tid")}
    out["ph"] = "X"
    a = event.args
    if a is not None:
        out["args"] = {key: _plain(getattr(a, attr)) for key, attr in _ARG_ATTRS.items()}
    return {k: v for k, v in out.items() if v is not None}
