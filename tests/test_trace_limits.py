"""Untrusted trace files: nesting depth, decompressed size and event count are capped, and a
trace over a cap is one line naming the limit and how to raise it (exit 2), refused before
it costs minutes or gigabytes; plain and gzip files, on the command line and the API."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.trace import Limits, TraceLimitError, load
from kernelab.trace._events import KERNEL as KERNEL_KIND
from tests.kineto_builder import TraceBuilder

runner = CliRunner()


def write(path, data: bytes):
    """``data`` at ``path``, gzip-compressed when the name ends in .gz."""
    path.write_bytes(gzip.compress(data, 1) if path.name.endswith(".gz") else data)
    return path


def events(n: int) -> list[dict]:
    b = TraceBuilder()
    for i in range(n):
        b.launch(f"k{i % 7}", 10 * i, 2, 10 * i + 3, 4)
    return b.events


def document(evs: list, **fields) -> bytes:
    return orjson.dumps({**fields, "traceEvents": evs})


def nested(depth: int) -> bytes:
    """A JSON value ``depth`` levels deep (arrays and objects by turns)."""
    opens = b"".join(b"[" if i % 2 else b'{"a":' for i in range(depth))
    closes = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opens + b"0" + closes


def deep_event(depth: int) -> bytes:
    return (
        b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,'
        b'"args":{"stream":7,"x":' + nested(depth) + b"}}"
    )


def refused(path, *options, env=None):
    """The command's one line and exit code 2 for a refused trace."""
    result = runner.invoke(app, ["trace", "summary", str(path), "--json", *options], env=env)
    assert result.exit_code == 2, result.output
    assert ("Traceback" not in result.output and result.exception is None) or isinstance(
        result.exception, SystemExit
    )
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("name", ["deep.json", "deep.json.gz"])
def test_args_nested_1100_deep_are_one_line_not_a_traceback(tmp_path, name):
    path = write(tmp_path / name, b'{"traceEvents":[' + deep_event(1100) + b"]}")
    line = refused(path)
    assert "nests its JSON 1104 levels deep, more than the limit of 128" in line
    assert "--max-depth N or KERNELAB_TRACE_MAX_DEPTH=N" in line


@pytest.mark.parametrize("name", ["deep.json", "deep.json.gz"])
def test_a_deep_event_among_megabytes_of_others(tmp_path, name):
    """Past the first chunk (decoded directly, not by the exact bracket count): the decoder
    gives up near 1000 levels and the chunk is measured exactly."""
    evs = [orjson.dumps(e) for e in events(6000)]  # about 2 MB
    evs.insert(4000, deep_event(1200))
    path = write(tmp_path / name, b'{"traceEvents":[' + b",\n".join(evs) + b"]}")
    assert path.stat().st_size > (2**20 if name.endswith(".json") else 0)
    assert "nests its JSON 1204 levels deep" in refused(path)


@pytest.mark.parametrize("where", ["event", "before the events", "after the events"])
def test_the_depth_limit_is_exact_and_can_be_raised(tmp_path, where):
    evs = [orjson.dumps(e) for e in events(3)]
    head, tail = b"", b""
    if where == "event":  # the event is level 3, its args 4, x 5: 12 + 5 = 17... levels
        evs.append(deep_event(12))
    elif where == "before the events":
        head = b'"meta":' + nested(15) + b","
    else:
        tail = b',"meta":' + nested(15)
    data = b"{" + head + b'"traceEvents":[' + b",".join(evs) + b"]" + tail + b"}"
    path = write(tmp_path / "d.json", data)
    deepest = 16  # 15 levels inside the top-level object, or 12 inside an event's args
    if where == "event":
        deepest = 3 + 1 + 12
    assert f"nests its JSON {deepest} levels deep" in refused(path, "--max-depth", "15")
    ok = runner.invoke(app, ["trace", "summary", str(path), "--json", "--max-depth", "16"])
    assert ok.exit_code == 0, ok.output
    env = {"KERNELAB_TRACE_MAX_DEPTH": "15"}
    assert "more than the limit of 15" in refused(path, env=env)


def bomb(inflated: int, isize: int | None = None) -> bytes:
    """A small gzip trace that inflates to about ``inflated`` bytes of tiny events
    (compressed from one repeated block, so it costs little to make); ``isize``: the size
    its trailer claims instead of the real one."""
    block = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1},' * 2000
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [c.compress(b'{"traceEvents":[')]
    out += [c.compress(block) for _ in range(inflated // len(block))]
    out += [c.compress(b'{"ph":"i","name":"end"}]}'), c.flush()]
    data = b"".join(out)
    if isize is not None:
        data = data[:-4] + isize.to_bytes(4, "little")
    return data


def inflated(monkeypatch) -> list[int]:
    """The decompressed bytes the reader takes from the stream, summed."""
    from kernelab.trace import _ingest

    total, real = [0], _ingest._pieces

    def counted(*args, **kwargs):
        for piece in real(*args, **kwargs):
            total[0] += len(piece)
            yield piece

    monkeypatch.setattr(_ingest, "_pieces", counted)
    return total


def test_a_gzip_bomb_is_refused_as_it_inflates(tmp_path, monkeypatch):
    """A trailer that lies (says 1 KB): the stream is inflated and refused at the cap."""
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(bomb(64 * 2**20, isize=1024))
    assert path.stat().st_size < 2**20  # 64 MB of events in well under 1 MB
    total = inflated(monkeypatch)
    line = refused(path, "--max-bytes", "8M")
    assert total[0] <= 8 * 2**20  # the piece that passes the limit is refused, not taken
    assert "decompresses to more than 8M (the limit)" in line
    assert "--max-bytes SIZE or KERNELAB_TRACE_MAX_BYTES=SIZE" in line


def test_a_gzip_claiming_more_than_the_cap_is_refused_before_inflating(tmp_path, monkeypatch):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(bomb(2**20, isize=3 * 2**30))  # the trailer says 3 GiB: over 2G
    total = inflated(monkeypatch)
    assert "decompresses to more than 2G (the limit)" in refused(path)
    assert total[0] == 0
    ok = runner.invoke(app, ["trace", "summary", str(path), "--json", "--max-bytes", "4G"])
    assert "decompresses" not in ok.output  # raised: read (and found corrupt: exit 2)


@pytest.mark.parametrize("name", ["big.json", "big.json.gz"])
def test_the_size_cap_holds_for_plain_and_gzip_files(tmp_path, name):
    path = write(tmp_path / name, document(events(3000)))  # about 1 MB inflated
    line = refused(path, env={"KERNELAB_TRACE_MAX_BYTES": "256K"})
    assert "decompresses to more than 256K (the limit)" in line
    ok = runner.invoke(app, ["trace", "summary", str(path), "--json", "--max-bytes", "2M"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("name", ["many.json", "many.json.gz"])
def test_too_many_events(tmp_path, name):
    evs = events(4000)  # 12000 entries (runtime, kernel, two flow events per launch)
    path = write(tmp_path / name, document(evs))
    line = refused(path, "--max-events", "10000")
    assert "holds more than 10000 events (the limit)" in line
    assert "--max-events N or KERNELAB_TRACE_MAX_EVENTS=N" in line
    env = {"KERNELAB_TRACE_MAX_EVENTS": str(len(evs))}
    ok = runner.invoke(app, ["trace", "summary", str(path), "--json"], env=env)
    assert ok.exit_code == 0, ok.output


def test_tiny_events_by_the_million_are_refused_early(tmp_path, monkeypatch):
    """The shape of a bomb of tiny events: refused once the count passes the cap, before
    the rest is read."""
    path = tmp_path / "tiny.json.gz"
    path.write_bytes(bomb(64 * 2**20))  # about 940 k events
    total = inflated(monkeypatch)
    assert "more than 100000 events" in refused(path, "--max-events", "100000")
    assert total[0] < 16 * 2**20  # 100 k events are 7 MB: refused within a chunk or two


@pytest.mark.parametrize("workers", [1, 2])
def test_the_api_raises_a_limit_error(tmp_path, workers):
    path = write(tmp_path / "t.json", document(events(4000)))
    with pytest.raises(TraceLimitError) as err:
        load(path, workers=workers, limits=Limits(max_events=5000))
    assert err.value.limit == "events"
    assert len(load(path, workers=workers, limits=Limits(max_events=20000))) == 8000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-depth", "1000"], "max_depth: at most 900"),
        (["--max-depth", "deep"], "--max-depth: expected a whole number"),
        (["--max-bytes", "lots"], "--max-bytes: expected a size in bytes"),
        (["--max-events", "0"], "--max-events: expected at least 1"),
    ],
)
def test_bad_limits_are_one_line(tmp_path, options, message):
    path = write(tmp_path / "t.json", document(events(3)))
    assert message in refused(path, *options)


def test_defaults_and_units():
    assert Limits() == Limits(max_bytes=2 * 2**30, max_events=5_000_000, max_depth=128)
    assert Limits.resolve(max_bytes="512M").max_bytes == 512 * 2**20
    assert Limits.resolve(max_bytes="4GiB").max_bytes == 4 * 2**30


@pytest.mark.parametrize("name", ["deep.json", "deep.json.gz"])
@pytest.mark.parametrize("workers", [1, 2])
def test_the_depth_limit_holds_in_the_middle_of_a_file(tmp_path, name, workers):
    """An event 200 levels deep among megabytes of others: in a chunk the decoders read
    directly (they follow about 1000 levels), refused at the limit all the same."""
    evs = [orjson.dumps(e) for e in events(6000)]  # about 2 MB
    evs.insert(4000, deep_event(200))
    path = write(tmp_path / name, b'{"traceEvents":[' + b",\n".join(evs) + b"]}")
    with pytest.raises(TraceLimitError, match="nests its JSON 204 levels deep") as err:
        load(path, workers=workers)
    assert err.value.limit == "depth"
    assert "nests its JSON 204 levels deep" in refused(path)
    assert len(load(path, workers=workers, limits=Limits(max_depth=204))) >= 12000


def test_the_depth_limit_holds_where_the_document_is_read_whole(tmp_path, monkeypatch):
    """Where the event array is not found early (here: past a shortened look), the whole
    document is parsed instead; the limit holds there too."""
    from kernelab.trace import _ingest

    monkeypatch.setattr(_ingest, "_HEAD_LIMIT", 1)
    evs = [orjson.dumps(e) for e in events(3)]
    data = b'{"meta":"' + b"m" * 2**17 + b'","traceEvents":[' + b",".join(evs)
    path = write(tmp_path / "whole.json", data + b"," + deep_event(200) + b"]}")
    assert "nests its JSON 204 levels deep" in refused(path)
    write(path, data + b"]}")
    assert len(load(path)) == 6


def test_nested_strings_and_escapes_do_not_count_as_levels(tmp_path):
    """Brackets inside strings, escaped quotes and backslashes are not nesting."""
    evs = events(3000)
    evs[1500]["name"] = "[" * 300 + '\\"' + "{" * 300 + "\\\\"
    evs[2500]["args"] = {"note": "}" * 300 + '"' + "[" * 300}
    path = write(tmp_path / "strings.json", document(evs))
    assert path.stat().st_size > 2**20
    assert len(load(path, limits=Limits(max_depth=5))) == 2 * len(evs) // 4


def scanned(monkeypatch) -> list[int]:
    """The bytes the reader's scans (blanks, separators, bracket counts) look at, summed."""
    from kernelab.trace import _scan

    total = [0]
    skip, guess, structure = _scan.skip_blanks, _scan.Cutter.guess, _scan.structure

    def counted_skip(buf, pos):
        end = skip(buf, pos)
        total[0] += end - pos
        return end

    def counted_guess(self, buf, lo, hi):
        total[0] += max(hi - lo, 0)
        return guess(self, buf, lo, hi)

    def counted_structure(buf, lo, hi):
        total[0] += max(hi - lo, 0)
        return structure(buf, lo, hi)

    monkeypatch.setattr(_scan, "skip_blanks", counted_skip)
    monkeypatch.setattr(_scan.Cutter, "guess", counted_guess)
    monkeypatch.setattr(_scan, "structure", counted_structure)
    return total


KERNEL = b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":{}}'


@pytest.mark.parametrize(
    ("before", "after", "kernels"),
    [
        (b'{"traceEvents":[' + KERNEL, b"]}", 1),  # after the last event
        (b'{"traceEvents":[' + KERNEL + b",", KERNEL + b"]}", 2),  # after a comma
        (b'{"traceEvents":[' + KERNEL, b"," + KERNEL + b"]}", 2),  # before a comma
        (b'{"traceEvents":[', KERNEL + b"]}", 1),  # after the array opens
        (b"", b'{"traceEvents":[' + KERNEL + b"]}", 1),  # before the document
        (b'{"traceEvents":[' + KERNEL + b"]", b"}", 1),  # after the array
    ],
)
def test_a_long_run_of_blanks_is_scanned_once(tmp_path, monkeypatch, before, after, kernels):
    """16 MB of blanks between two tokens of a gzip trace: each blank is looked at a bounded
    number of times (a rescan of the whole run per piece read took minutes for 96 MB)."""
    run = 16 * 2**20
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    blank = b" \n" * 2**19
    data = [c.compress(before), *(c.compress(blank) for _ in range(run // len(blank)))]
    path = tmp_path / "blank.json.gz"
    path.write_bytes(b"".join([*data, c.compress(after), c.flush()]))
    total = scanned(monkeypatch)
    trace = load(path)
    assert int((trace.kind == KERNEL_KIND).sum()) == kernels
    assert total[0] < 3 * run
