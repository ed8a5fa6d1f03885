"""Tables designed for 80 columns first, with more columns on wider terminals.

A :class:`Sheet` is laid out for the console's width. Each column says how it gives way when
the table is too wide, and in which order (``step``, lowest first):

- ``drop``: left out (a line under the table names what was left out);
- ``below``: moved, whole, to a line of its own under each row (``header: value``);
- ``wrap``: free text, wrapped at spaces within a narrower column;
- ``spill``: keeps its column at the width left over (at least :data:`SPILL_MIN`, and wide
  enough for most rows), and a value wider than that moves, whole, to a line under its own
  row (a table of kernel names shows the short ones in their column and the few long ones
  below); with less room left over, the column moves below every row as ``below`` does.

Columns that give no way are never narrowed; if the table is still too wide, the rightmost
columns move below their rows. No value is ever cut: words are never split, and identifiers
(run ids, ops, variants, shape labels, kernel names) either keep their column, move below
their row, or head a group of rows (:meth:`Sheet.group`), so each appears whole on one line.
The one exception is a word wider than a whole line (a mangled kernel name of a thousand
characters): it continues on the next lines, every character kept. Cells are plain text
(never rich markup) unless given as :class:`rich.text.Text`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text

GAP = 2  #: spaces between columns
INDENT = 2  #: rows under a group header
_EMPTY = ("", "-", "—")
SPILL_MIN = 24  #: the narrowest a ``spill`` column stays in the table


@dataclass(frozen=True)
class Col:
    header: str
    right: bool = False
    give: str | None = None  # "drop", "below", "wrap" or "spill"; None: always shown as it is
    step: int = 0  # columns give way in increasing step
    hide_empty: bool = False  # left out when no row has a value

    def __post_init__(self):
        if self.give not in (None, "drop", "below", "wrap", "spill"):
            raise ValueError(f"give: expected drop, below, wrap, spill or None, got {self.give!r}")


def _text(value, style: str | None = None) -> Text:
    if isinstance(value, Text):
        return value if style is None else Text.assemble(value, style=style)
    return Text("" if value is None else str(value), style=style or "")


def _width(t: Text) -> int:
    return max((cell_len(line) for line in t.plain.split("\n")), default=0)


def _words(t: Text) -> list[Text]:
    return [w for w in t.split(" ") if w.plain]


def _chop(t: Text, width: int) -> list[Text]:
    """``t`` in pieces of at most ``width`` cells, every character kept (a kernel name of
    a thousand characters continues on the next lines rather than running past the edge)."""
    width = max(width, 2)  # a wide character needs two cells
    offsets, used = [], 0
    for k, ch in enumerate(t.plain):
        w = cell_len(ch)
        if used + w > width:
            offsets.append(k)
            used = 0
        used += w
    return list(t.divide(offsets)) if offsets else [t]


def pack(parts: list[Text], width: int, sep: str = "  ") -> list[Text]:
    """Parts on lines of at most ``width`` cells, broken only between parts; a part wider than
    ``width`` is broken between its words, and a word wider than the line continues on the
    next (its first piece starts a line of its own)."""
    pieces: list[tuple[Text, str]] = []
    for part in parts:
        if _width(part) <= width:
            pieces.append((part, sep))
            continue
        for k, word in enumerate(_words(part)):
            if _width(word) <= width:
                pieces.append((word, " " if k else sep))
                continue
            for n, chunk in enumerate(_chop(word, width)):
                pieces.append((chunk, None if n else " " if k else sep))
    lines: list[Text] = []
    line: Text | None = None
    for piece, joiner in pieces:
        if (
            line is not None
            and joiner is not None
            and cell_len(line.plain) + len(joiner) + _width(piece) <= width
        ):
            line.append(joiner)
            line.append_text(piece)
        else:
            if line is not None:
                lines.append(line)
            line = piece.copy()
    if line is not None:
        lines.append(line)
    return lines or [Text("")]


class Sheet:
    """Rows (optionally in groups under a header line) laid out for a width."""

    def __init__(self, title: str | Text | None, cols: list[Col]):
        self.title = title
        self.cols = list(cols)
        #: (group header parts or None, rows)
        self.blocks: list[tuple[list[Text] | None, list[list[Text]]]] = []
        self._details: dict[int, list[Text]] = {}

    def group(self, *parts, style: str = "bold", detail: list | None = None) -> None:
        """Start a group of rows under one header line, then one line of ``detail`` parts;
        lines break between parts, and inside one only when it is wider than the line."""
        self.blocks.append(([_text(p, style) for p in parts if p not in (None, "")], []))
        if detail:
            self._details[len(self.blocks) - 1] = [_text(d) for d in detail]

    def row(self, *cells, style: str | None = None) -> None:
        if len(cells) != len(self.cols):
            raise ValueError(f"row: expected {len(self.cols)} cells, got {len(cells)}")
        if not self.blocks:
            self.blocks.append((None, []))
        self.blocks[-1][1].append([_text(c, style) for c in cells])

    @property
    def rows(self) -> list[list[Text]]:
        return [r for _, rows in self.blocks for r in rows]

    # -- layout ---------------------------------------------------------------------------

    def _indent(self) -> int:
        return INDENT if any(h for h, _ in self.blocks) else 0

    def layout(self, width: int) -> tuple[list[int], dict[int, int], list[int], list[int]]:
        """(shown column indices, their widths, columns moved below, columns dropped). A
        column both shown and below (``spill``) moves below only the rows too wide for it."""
        rows = self.rows
        shown = [
            i
            for i, c in enumerate(self.cols)
            if not (c.hide_empty and all(r[i].plain.strip() in _EMPTY for r in rows))
        ]
        widths = {
            i: max([cell_len(self.cols[i].header)] + [_width(r[i]) for r in rows]) for i in shown
        }
        below: list[int] = []
        dropped: list[int] = []

        def total() -> int:
            return self._indent() + sum(widths[i] for i in shown) + GAP * max(len(shown) - 1, 0)

        for i in sorted((i for i in shown if self.cols[i].give), key=lambda i: self.cols[i].step):
            excess = total() - width
            if excess <= 0:
                break
            give = self.cols[i].give
            if give == "wrap":
                longest = max(
                    [cell_len(w.plain) for r in rows for w in _words(r[i])]
                    + [cell_len(self.cols[i].header), 8]
                )
                widths[i] = max(longest, widths[i] - excess)
                continue
            left = widths[i] - excess
            if give == "spill" and left >= max(SPILL_MIN, cell_len(self.cols[i].header)):
                fit = [_width(r[i]) for r in rows if _width(r[i]) <= left]
                if 2 * len(fit) >= len(rows):  # most rows keep their value in the column
                    widths[i] = max([cell_len(self.cols[i].header), *fit])
                    below.append(i)
                    continue
            shown.remove(i)
            (dropped if give == "drop" else below).append(i)
        while total() > width and len(shown) > 1:  # the last resort: the rightmost go below
            i = shown.pop()
            if i not in below:
                below.append(i)
        return shown, widths, sorted(below), sorted(dropped)

    def fits(self, width: int) -> bool:
        """Whether every column is shown as it is, within ``width``."""
        shown, widths, below, dropped = self.layout(width)
        natural = self.layout(10**6)[1]
        if below or dropped or any(widths[i] != natural[i] for i in shown):
            return False
        return self._indent() + sum(widths.values()) + GAP * max(len(shown) - 1, 0) <= width

    def lines(self, width: int) -> list[Text]:
        shown, widths, below, dropped = self.layout(width)
        indent = self._indent()
        out: list[Text] = []
        if self.title:
            out.extend(pack([_text(self.title, "bold")], width))
        header = Text(" " * indent)
        for n, i in enumerate(shown):
            header.append_text(self._cell(Text(self.cols[i].header), widths[i], i, n == 0))
        out.append(Text(header.plain.rstrip(), style="bold"))
        rule = indent + sum(widths[i] for i in shown) + GAP * max(len(shown) - 1, 0)
        out.append(Text("─" * rule, style="dim"))
        in_table = {i: widths[i] for i in shown}
        for b, (head, rows) in enumerate(self.blocks):
            if head:
                out.extend(pack(head, width))
            if b in self._details:
                lines = pack(self._details[b], width - indent, sep="; ")
                out.extend(Text(" " * indent) + line for line in lines)
            for cells in rows:
                out.extend(self._row(cells, shown, widths, indent if head else 0))
                pad = (indent if head else 0) + 4
                out.extend(
                    Text(" " * pad) + line
                    for line in self._below(cells, below, width - pad, in_table)
                )
        if dropped:
            names = ", ".join(self.cols[i].header for i in dropped)
            note = f"left out at {width} columns: {names} (a wider terminal or --json has them)"
            out.extend(pack([Text(note, style="dim")], width))
        return out

    def _kept(self, i: int, value: Text, widths: dict) -> bool:
        """Whether a ``spill`` column's value stays in its column (it fits there)."""
        return i in widths and self.cols[i].give == "spill" and _width(value) <= widths[i]

    def _below(self, cells: list[Text], below: list[int], width: int, widths: dict) -> list[Text]:
        """The ``header: value`` lines under a row. A value too wide to follow its header
        starts a line of its own (so an identifier that fits a line is never broken)."""
        out: list[Text] = []
        together: list[Text] = []
        for i in below:
            value = cells[i]
            if value.plain.strip() in _EMPTY or self._kept(i, value, widths):
                continue
            header = Text(f"{self.cols[i].header}:", style="dim")
            part = Text.assemble(header, " ", value)
            if _width(part) <= width:
                together.append(part)
                continue
            if together:
                out.extend(pack(together, width, sep="  ·  "))
                together = []
            out.append(header)
            out.extend(Text("  ") + line for line in pack([value], width - 2))
        if together:
            out.extend(pack(together, width, sep="  ·  "))
        return out

    def _cell(self, t: Text, w: int, i: int, first: bool) -> Text:
        pad = " " * max(w - cell_len(t.plain), 0)
        cell = Text(pad) + t if self.cols[i].right else t + Text(pad)
        return cell if first else Text(" " * GAP) + cell

    def _row(self, cells: list[Text], shown: list[int], widths: dict, indent: int) -> list[Text]:
        wrapped = {}
        for i in shown:
            lines: list[Text] = []
            if self.cols[i].give == "spill" and _width(cells[i]) > widths[i]:
                wrapped[i] = [Text("")]  # moved below this row
                continue
            for part in cells[i].split("\n") or [Text("")]:
                if _width(part) > widths[i]:
                    lines.extend(pack(_words(part) or [part], widths[i], " "))
                else:
                    lines.append(part)
            wrapped[i] = lines
        height = max((len(v) for v in wrapped.values()), default=1)
        out = []
        for k in range(height):
            line = Text(" " * indent)
            for n, i in enumerate(shown):
                t = wrapped[i][k] if k < len(wrapped[i]) else Text("")
                line.append_text(self._cell(t, widths[i], i, n == 0))
            line.rstrip()
            out.append(line)
        return out

    def print(self, console) -> None:
        for line in self.lines(console.width):
            console.print(line, soft_wrap=True, highlight=False)
