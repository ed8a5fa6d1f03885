"""Helpers shared by commands: versions, consoles, JSON output, error handling."""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import TYPE_CHECKING

import click
import orjson

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


class SharedOption(click.Option):
    """An option made by one of this module's definitions: ``concept`` names what it stands
    for (one spelling per concept across commands), and ``hidden_aliases`` are old spellings
    that still parse but are not shown in the help."""

    def __init__(self, *decls, concept: str, hidden_aliases: tuple[str, ...] = (), **kw):
        super().__init__(*decls, **kw)
        self.concept = concept
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx):
        saved = self.opts, self.secondary_opts
        self.opts = [o for o in self.opts if o not in self.hidden_aliases]
        self.secondary_opts = [o for o in self.secondary_opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts, self.secondary_opts = saved


def _shared(concept: str, *decls: str, hidden: tuple[str, ...] = (), **kw):
    names = [d for decl in decls for d in decl.split("/") if d.startswith("-")]
    missing = [h for h in hidden if h not in names]
    if missing:
        raise RuntimeError(f"hidden aliases {missing} are not among {names}")
    return click.option(*decls, cls=SharedOption, concept=concept, hidden_aliases=hidden, **kw)


def echo(*parts, err: bool = False, soft_wrap: bool = False) -> None:
    """Print one line made of ``parts``: a str is shown as it is (never read as rich markup
    or as an ``:emoji:`` code; user and op text goes here), a ``(str, style)`` pair styled."""
    from rich.text import Text

    line = Text.assemble(*parts)
    _console("err_console" if err else "console").print(line, highlight=False, soft_wrap=soft_wrap)


def _bad(param: str, message: str):
    """Bad input found while parsing: one line on stderr, exit 2 (as :func:`user_errors`)."""
    echo(("error:", "bold red"), f" {param}: {message}", err=True, soft_wrap=True)
    raise click.exceptions.Exit(2)


def _names(values) -> tuple[str, ...]:
    """Repeated and comma-separated values as one tuple: ``-x a,b -x c`` -> (a, b, c)."""
    if isinstance(values, str):
        values = (values,)
    return tuple(v.strip() for item in values or () for v in item.split(",") if v.strip())


#: Every spelling of a dtype that options accept, to the torch name.
DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
}


def dtype_name(name: str) -> str:
    """The torch name of a dtype spelling (bf16 -> bfloat16); an unknown one is a ValueError."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise ValueError(
            "expected bf16/bfloat16, fp16/half/float16, fp32/float/float32 or "
            f"fp64/double/float64, got {name!r}"
        )
    return DTYPE_NAMES[key]


def _dtypes(ctx, param, value):
    if value is None:
        return None
    try:
        names = tuple(dict.fromkeys(dtype_name(n) for n in _names(value)))
    except ValueError as exc:
        _bad("--dtype", str(exc))
    if param.multiple:
        return names
    if len(names) != 1:
        _bad("--dtype", f"expected one dtype, got {value!r}")
    return names[0]


def _list(ctx, param, value):
    return _names(value)


def dtype_option(multiple: bool = True, default: str | None = None, help: str | None = None):
    """``--dtype``: repeatable (or one), comma lists, any spelling of :data:`DTYPE_NAMES`."""
    if help is None:
        help = "dtype(s): bf16, fp16, fp32 (or bfloat16, half, float, ...); repeatable or "
        help += "comma-separated (default: every dtype the op takes)."
    return _shared(
        "dtype", "--dtype", multiple=multiple, default=default, callback=_dtypes, help=help
    )


def variant_option(help: str | None = None):
    """``--variant``: repeatable and comma lists (``--variants`` still parses)."""
    return _shared(
        "variant",
        "--variant",
        "--variants",
        "variants",
        hidden=("--variants",),
        multiple=True,
        callback=_list,
        help=help or "Variant(s), repeatable or comma-separated (default: all that run here).",
    )


def device_option(help: str | None = None, default: str | None = None):
    return _shared(
        "device",
        "--device",
        default=default,
        help=help or "cpu or cuda[:N] (default: the accelerator if present, else cpu).",
    )


def shape_set_option(multiple: bool = False, help: str | None = None):
    """``--shapes``: the op's shape set(s) by name (representative, edge, ...)."""
    kw = {"multiple": True, "callback": _list} if multiple else {"default": "representative"}
    return _shared(
        "shape set",
        "--shapes",
        "shape_sets" if multiple else "shape_set",
        help=help or "Shape set: representative or edge.",
        **kw,
    )


def shape_option(help: str | None = None):
    """``--shape``: keep shapes whose label contains this (repeatable)."""
    return _shared(
        "shape",
        "--shape",
        "shapes",
        multiple=True,
        help=help or "Keep shapes whose label contains this (repeatable).",
    )


def target_option(help: str | None = None):
    return _shared(
        "target",
        "--target",
        "-t",
        help=help or "Compile target(s), comma-separated: sm_80, sm_90, sm_100, gfx942.",
    )


def max_rows_option(help: str, hidden: tuple[str, ...] = ()):
    """``--max-rows``: cap the batch dimension (rows, tokens) of the shapes."""
    return _shared(
        "max rows", "--max-rows", *hidden, "max_rows", type=int, hidden=hidden, help=help
    )


#: The ``--ledger`` option of every command that reads or writes the results ledger.
ledger_option = _shared(
    "ledger",
    "--ledger",
    "ledger_url",
    help="Ledger path or URL (default: KERNELAB_LEDGER or the data dir).",
)


def no_ledger_option(*old: str):
    """``--no-ledger``: do not store; ``old`` spellings (``--no-record/--record``) still parse."""
    hidden = tuple(n for o in old for n in o.split("/"))
    return _shared(
        "no ledger",
        "--no-ledger",
        *old,
        "no_ledger",
        is_flag=True,
        default=False,
        hidden=hidden,
        help="Do not store the results in the ledger.",
    )


#: ``--json``: JSON on stdout instead of tables.
json_option = _shared("json", "--json", "as_json", is_flag=True, help="Print JSON instead.")
#: ``--csv``: CSV on stdout instead of tables.
csv_option = _shared("csv", "--csv", "as_csv", is_flag=True, help="Print CSV (a row per case).")
#: ``--label``: a label for the stored run (``compare`` and ``report`` take labels).
label_option = _shared("label", "--label", help="Label the run in the ledger.")
#: ``--kind``: the kind of runs that 'latest' and labels name.
kind_option = _shared(
    "kind", "--kind", default="bench", help="Kind of runs that 'latest' and labels name."
)


def candidate_option(help: str | None = None):
    return _shared(
        "candidate", "--candidate", help=help or "Your callable: path/to/file.py:function."
    )


def op_option(help: str | None = None):
    return _shared(
        "op",
        "--op",
        callback=op_names,
        help=help or "The registered op a --candidate implements.",
    )


def reference_option(help: str | None = None):
    """``--reference``: the user's reference, for a function kernelab has no op for."""
    return _shared(
        "reference",
        "--reference",
        help=help or "Your reference, file.py:function, for an op kernelab does not know.",
    )


def inputs_option(help: str | None = None):
    """``--inputs``: the user's input generator, with ``--reference``."""
    return _shared(
        "inputs",
        "--inputs",
        help=help or "Your input generator, file.py:function(seed, dist, device) -> dict.",
    )


def check_custom(candidate, op, ops, reference, inputs) -> bool:
    """Whether ``--reference``/``--inputs`` name a user's op (then with ``--candidate``, and
    neither ``--op`` nor op names); raises a clear error for an incomplete combination."""
    if reference is None and inputs is None:
        return False
    if reference is None or inputs is None or candidate is None:
        raise ValueError(
            "--reference: expected --candidate, --reference and --inputs together "
            "(for an op kernelab does not know)"
        )
    if op is not None or ops:
        raise ValueError("--reference: not with --op or op names (those ops have one)")
    return True


def custom_op(candidate: str, reference: str, inputs: str, device, dims=()):
    """The user's op from ``--reference`` and ``--inputs`` (``kernelab.verify``'s), named after
    the candidate, with the sizes of ``--shape name=value,...`` if any."""
    from kernelab._loader import load_callable
    from kernelab.verify import user_op

    ref = load_callable(reference, "reference")
    gen = load_callable(inputs, "inputs")
    return user_op(ref, gen, device, name=candidate.rpartition(":")[2], dims=dims)


def _console(name: str) -> Console:
    """``console`` (stdout) or ``err_console`` (stderr), made (with rich) on first use: a
    command printing JSON never loads rich. A new one is made when ``COLUMNS`` changes (rich
    reads it once), so tables are laid out for the width asked for."""
    key = (name, os.environ.get("COLUMNS"))
    if key not in _CONSOLES:
        from rich.console import Console

        _CONSOLES[key] = Console(stderr=name == "err_console")
    return _CONSOLES[key]


_CONSOLES: dict[tuple[str, str | None], Console] = {}


def __getattr__(name: str) -> Console:
    if name in ("console", "err_console"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def package_version(name: str) -> str:
    """The version of an installed package: the module's own where it is loaded already, else
    its distribution's metadata (no import: torch alone takes seconds); "not installed"."""
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(device: str | None = None) -> dict[str, str]:
    """kernelab's, torch's, triton's and python's versions and the device, importing neither
    torch nor Triton where the device is known to be the CPU without them."""
    import kernelab
    from kernelab.hardware import detect

    info = detect(device, quick=True)
    dev = info.name if info.type == "cpu" else f"{info.name} ({info.arch}, {info.sm_count} SMs)"
    return {
        "kernelab": kernelab.__version__,
        "torch": package_version("torch"),
        "triton": package_version("triton"),
        "python": platform.python_version(),
        "device": f"{info.type}: {dev}",
    }


def emit_json(data) -> None:
    """Write ``data`` as JSON to stdout (for programs)."""
    sys.stdout.write(
        orjson.dumps(
            data,
            option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            default=str,
        ).decode()
    )
    sys.stdout.write("\n")


class Kept:
    """What a command has stored or written so far, and what an interrupt would lose: what
    Ctrl-C reports. Commands call :func:`kept` and :func:`lost` as they go."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.lost: list[str] = []
        self.doing: str | None = None


_KEPT = Kept()


def kept(line: str) -> None:
    """Record something stored or written (``ledger run 1a2b3c: 36 cases``)."""
    _KEPT.kept.append(line)


def lost(line: str | None) -> None:
    """Say what an interrupt now would lose (None: nothing); replaces the previous line."""
    _KEPT.lost = [] if line is None else [line]


def doing(line: str | None) -> None:
    """What the command is doing now (reported on Ctrl-C)."""
    _KEPT.doing = line


def store_run(db, kind: str, cases: list, provenance, label=None, what: str = "case(s)"):
    """Record a run (:func:`kernelab.ledger.record_or_keep`: the ledger ``db``, a path, a URL
    or None for the default; a file beside it when the ledger fails) and note what was kept.
    Returns the :class:`kernelab.ledger.Recorded`; its ``error`` is for the command to print."""
    from kernelab import ledger

    rec = ledger.record_or_keep(db, kind, cases, provenance, label)
    if rec.run_id is not None:
        kept(f"ledger run {rec.run_id}: {len(cases)} {what}")
    elif rec.path is not None:
        kept(f"{rec.path}: {len(cases)} {what} the ledger could not store")
    return rec


def record_bench(db, info, result, label):
    """Store a bench run (:func:`store_run`), with its config and ceilings in the provenance:
    (run id, None, None) or, when the ledger cannot, (None, the file keeping it or None, the
    error line to print). ``bench`` and its ``--sweep`` both record through it."""
    from kernelab import ledger

    about = {"config": result.config, "ceilings": result.ceilings}
    if result.interrupted:
        about["interrupted"] = True
    prov = ledger.provenance(info, bench=about)
    rec = store_run(db, "bench", result.cases, prov, label)
    return rec.run_id, rec.path, rec.error


def unstored(rec) -> None:
    """After a command's output: a run the ledger could not store (:func:`store_run`) is one
    line on stderr saying where it is kept, and exit 1."""
    if rec is not None and rec.error:
        click.echo(rec.error, err=True)
        raise click.exceptions.Exit(1)


def interrupt_status() -> int:
    """The exit status of an interrupted command: 143 after SIGTERM, else 130 (Ctrl-C)."""
    from kernelab import _workers

    return 128 + signal.SIGTERM if _workers.terminated() else 128 + signal.SIGINT


def _interrupted() -> None:
    from kernelab import _workers

    k = _KEPT
    what = "terminated (SIGTERM)" if _workers.terminated() else "interrupted"
    head = what + (f" while {k.doing}" if k.doing else "")
    echo((head, "bold yellow"), err=True)
    if k.kept:
        echo("kept:", err=True)
        for line in k.kept:
            echo(f"  • {line}", err=True)
    else:
        echo("kept: nothing (nothing was stored or written)", err=True)
    for line in k.lost:
        echo(f"not kept: {line}", err=True)


def user_errors(fn: Callable) -> Callable:
    """Turn bad input (ValueError, TypeError, FileNotFoundError) into one line and exit 2, and
    Ctrl-C into what was kept (cases stored, files written) and exit 130. SIGTERM means what
    Ctrl-C means (:func:`kernelab._workers.sigterm_as_interrupt`), and exits 143."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        from kernelab import _workers

        global _KEPT
        _KEPT = Kept()
        with _workers.sigterm_as_interrupt():
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError, FileNotFoundError, PermissionError) as exc:
                echo(("error:", "bold red"), f" {exc}", err=True, soft_wrap=True)
                raise click.exceptions.Exit(2) from None
            except KeyboardInterrupt:
                _interrupted()
                raise click.exceptions.Exit(interrupt_status()) from None

    return wrapper


def check_op_names(names, argument: str = "op") -> None:
    """Refuse an unknown op name before anything heavy loads (the ops' catalogue, no torch):
    a ValueError naming ``argument``, the ops, and the closest of them (did you mean). An op
    registered in this process and not in the catalogue (one declared by the caller, the CLI
    run in-process) is known too: the registry is read where it is already loaded."""
    from kernelab._suggest import unknown_name
    from kernelab.cli._catalog import op_names as known

    ops = known()
    for name in names:
        if name not in ops:
            registry = getattr(sys.modules.get("kernelab.core.op"), "_REGISTRY", {})
            if name in registry:
                continue
            raise unknown_name(argument, name, sorted({*ops, *registry}))


def op_names(ctx, param, value):
    """Click callback for an argument or option of op names (one, several, comma lists):
    refuses an unknown one at once (exit 2, did you mean); the value passes unchanged."""
    if value is None or ctx.resilient_parsing:
        return value
    label = param.opts[0] if isinstance(param, click.Option) else "op"
    try:
        check_op_names(_names(value), label)
    except ValueError as exc:
        echo(("error:", "bold red"), f" {exc}", err=True, soft_wrap=True)
        raise click.exceptions.Exit(2) from None
    return value


def select_ops(names: list[str] | None):
    """Ops by name (all when none given); an unknown name is an error naming the choices and
    the closest of them, refused before the ops are imported."""
    if names:
        check_op_names(names)
    from kernelab import ops

    if not names:
        return ops.all_ops()
    return [ops.get(n) for n in names]


def transient_progress(disable: bool = False) -> Progress:
    """A spinner with a message and the elapsed time, on stderr, gone when done."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        TimeElapsedColumn(),
        console=_console("err_console"),
        transient=True,
        disable=disable,
    )


def progress_key(msg: str) -> str:
    """What a progress message is about: its first two words, the second cut at '/'
    ("bench rmsnorm ...", "verify rmsnorm/torch ..." -> one op; "inspect: compiled 3/18")."""
    words = msg.split()
    return " ".join(words[:1] + [w.split("/")[0] for w in words[1:2]])


def plain_progress() -> bool:
    """Whether progress is written as plain lines: stderr is not a terminal (piped, logged)."""
    return not _console("err_console").is_terminal


@contextmanager
def spinner(first: str = "starting", disable: bool = False) -> Iterator[Callable[[str], None]]:
    """``with spinner() as say: ... say("message")`` — long work shows what it is doing: a
    spinner on a terminal (none if ``disable``), else one plain line on stderr per op or stage
    (:func:`progress_key`), with the time since the start."""
    if plain_progress():
        started, last = time.perf_counter(), [None]

        def say(msg: str) -> None:
            key = progress_key(msg)
            if key != last[0]:
                last[0] = key
                echo(f"[{time.perf_counter() - started:6.1f} s] {msg}", err=True)

        yield say
        return
    with transient_progress(disable) as progress:
        task = progress.add_task(first, total=None)
        yield lambda msg: progress.update(task, description=msg)
