"""Streaming ingestion reads every JSON layout of a Chrome trace exactly as a whole-document
parse does, in bounded memory: compact or indented, one line or many, the event array first,
last or between other fields, a bare array, gzip or not; with separators hidden in strings
and nested args that a guessed cut must not be fooled by."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import orjson
import pytest

from kernelab.trace import _ingest, _scan, load, public, summarize
from kernelab.trace._events import TraceError
from tests.kineto_builder import TraceBuilder

COLUMNS = ("kind", "name", "ts", "dur", "pid", "tid", "corr", "regs", "shmem", "block")
COLUMNS += ("grid", "nbytes")


def tricky() -> TraceBuilder:
    """Events whose text holds what a cut could mistake for a boundary or the array key."""
    b = TraceBuilder()
    for i in range(60):
        t = 100 * i
        b.cpu_op(f'aten::add "}}, {{" #{i}', t, 10, dims=[[4, 8], [4, 8]], types=["float"] * 2)
        corr = b.next_corr()
        b._x(
            "cuda_runtime",
            "cudaLaunchKernel",
            t + 1,
            4,
            4242,
            1,
            {"correlation": corr, "groups": [{"a": i}, {"b": [{"c": "}, {"}]}]},
        )
        b._x(
            "kernel",
            'k\\"traceEvents": [ \\\\' + ("}, {" * (i % 3)) + f"{i}",
            t + 10,
            5,
            0,
            7,
            {"correlation": corr, "device": 0, "stream": 7, "grid": [i + 1, 1, 1]},
        )
    return b


def write(doc: dict, path, layout: str):
    """``doc`` in one of the layouts real tools write."""
    events = doc["traceEvents"]
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}
    rest["note"] = 'a string with "traceEvents": [ in it'
    if layout == "compact":  # one line, array between fields
        text = json.dumps(
            {"note": rest["note"], "traceEvents": events, **rest}, separators=(",", ":")
        )
    elif layout == "events_first":  # minified, deviceProperties' '},{' after the array
        text = json.dumps({"traceEvents": events, **rest}, separators=(",", ":"))
    elif layout == "indent2":  # metadata first
        text = json.dumps({**rest, "traceEvents": events}, indent=2)
    elif layout == "spaced":  # json.dumps' default separators: '}, {'
        text = json.dumps({**rest, "traceEvents": events})
    elif layout == "tabs_crlf":
        text = json.dumps({"traceEvents": events, **rest}, indent="\t").replace("\n", "\r\n")
    elif layout == "bare":
        text = json.dumps(events)
    else:
        raise ValueError(layout)
    data = text.encode()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    path.write_bytes(data)
    return path


LAYOUTS = ["compact", "events_first", "indent2", "spaced", "tabs_crlf", "bare"]


def same(a, b, meta=True) -> None:
    assert a.strings == b.strings
    assert a.shapes == b.shapes
    assert a.malformed == b.malformed and a.unknown_categories == b.unknown_categories
    if meta:
        assert a.meta == b.meta
    for col in COLUMNS:
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few events, so that cuts fall everywhere (inside strings, nested args,
    the top-level fields after the array)."""
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 700)
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 200)
    monkeypatch.setattr(_ingest, "_LOOKAHEAD", 100)


@pytest.fixture
def no_whole_parse(monkeypatch):
    def refuse(path):
        raise AssertionError(f"{path} was parsed whole instead of streamed")

    monkeypatch.setattr(_ingest, "_load_whole", refuse)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_every_layout_streams_to_the_whole_parse(
    tmp_path, monkeypatch, small_chunks, layout, suffix
):
    path = write(tricky().document(), tmp_path / f"t{suffix}", layout)
    whole = _ingest._load_whole(path)
    assert len(whole) == 180
    assert layout == "bare" or whole.meta["note"].startswith("a string")
    monkeypatch.setattr(_ingest, "_load_whole", lambda p: pytest.fail("parsed whole"))
    streamed = load(path)
    same(streamed, whole)
    if hasattr(__import__("os"), "fork"):
        same(load(path, workers=2), whole)


def test_default_chunk_sizes_stream_too(tmp_path, no_whole_parse):
    b = tricky()
    ref = load(b.write(tmp_path / "k.json"))
    for layout in ("compact", "events_first", "bare"):
        same(load(write(b.document(), tmp_path / f"{layout}.json", layout)), ref, meta=False)


def test_structure_finds_exact_boundaries():
    text = b'{"a":"}, {\\"x"},{"b":[{"c":1},{"d":"\\\\"}]} , {"e":2}\n]'
    ends, close, _ = _scan.structure(bytearray(text), 0, len(text))
    assert [text[e - 1 : e] for e in ends] == [b"}", b"}", b"}"]
    assert close == len(text) - 1
    assert json.loads(b"[" + text[: ends[-1]] + b"]") == [
        {"a": '}, {"x'},
        {"b": [{"c": 1}, {"d": "\\"}]},
        {"e": 2},
    ]
    # A slice that ends inside an event: no close, the complete ones only.
    ends, close, _ = _scan.structure(bytearray(text), 0, 20)
    assert close == -1 and len(ends) == 1


@pytest.mark.parametrize("layout", ["kineto", "compact"])
def test_nan_and_infinity_tokens_mark_their_events_malformed(
    tmp_path, small_chunks, no_whole_parse, layout
):
    b = tricky()
    good = load(b.write(tmp_path / "good.json"))
    for e in b.events[5:8]:
        e["dur"] = "__NAN__"
    b.events[20]["args"]["correlation"] = "__INF__"
    path = tmp_path / "nan.json"
    (b.write(path) if layout == "kineto" else write(b.document(), path, "compact"))
    text = path.read_text().replace('"__NAN__"', "NaN").replace('"__INF__"', "-Infinity")
    path.write_text(text)
    t = load(path)
    assert t.malformed == 4
    assert len(t) == len(good) - 4


def test_truncated_or_broken_streams_give_one_line(tmp_path):
    path = write(tricky().document(), tmp_path / "c.json", "compact")
    data = path.read_bytes()
    for bad in (data[: len(data) // 2], data.replace(b'"ph":"X"', b'"ph":X', 1)):
        (tmp_path / "bad.json").write_bytes(bad)
        with pytest.raises(TraceError, match="not valid JSON") as exc:
            load(tmp_path / "bad.json")
        assert "\n" not in str(exc.value)


# --- the real trace in each layout: same summary, memory bounded by the native layout's ---

_MEASURE = """
import hashlib, json, resource, sys
from kernelab.trace import public, summarize
s = public(summarize(sys.argv[1], workers=1))
s.pop("trace"), s.pop("ingest")
print(hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
@pytest.mark.shared
def test_v100_large_in_every_layout(shared_dir, tmp_path):
    src = shared_dir / "traces" / "v100_large.json.gz"
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    layouts = {
        "native.json.gz": None,
        "compact.json.gz": orjson.dumps({"traceEvents": events, **doc}),
        "indent2.json.gz": orjson.dumps({**doc, "traceEvents": events}, option=orjson.OPT_INDENT_2),
        "metadata_first_one_line.json.gz": json.dumps({**doc, "traceEvents": events}).encode(),
        "uncompressed.json": json.dumps({"traceEvents": events, **doc}).encode(),
    }
    del events
    results = {}
    for name, data in layouts.items():
        path = src
        if data is not None:
            path = tmp_path / name
            path.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else data)
        out = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True
        ).stdout.split()
        results[name] = (out[0], int(out[1]))
    digest, native_rss = results["native.json.gz"]
    for name, (d, rss) in results.items():
        assert d == digest, f"{name}: a different summary"
        assert rss <= 1.5 * native_rss, f"{name}: peak RSS {rss} KB vs native {native_rss} KB"


def test_summaries_of_layouts_agree(tmp_path):
    b = tricky()
    ref = public(summarize(b.write(tmp_path / "k.json")))
    for layout in ("indent2", "bare"):
        s = public(summarize(write(b.document(), tmp_path / f"{layout}.json", layout)))
        assert s["gpu"] == ref["gpu"] and s["cpu"] == ref["cpu"]
