"""One spelling per concept across every command, from one definition (cli/_common.py)."""

import click
import pytest
from click.testing import CliRunner

from kernelab.cli import COMMANDS, app
from kernelab.cli._common import DTYPE_NAMES, SharedOption

runner = CliRunner()

#: Flag -> the concept its shared definition stands for.
SHARED = {
    "--device": "device",
    "--variant": "variant",
    "--dtype": "dtype",
    "--shapes": "shape set",
    "--shape": "shape",
    "--target": "target",
    "--max-rows": "max rows",
    "--ledger": "ledger",
    "--no-ledger": "no ledger",
    "--json": "json",
    "--csv": "csv",
    "--label": "label",
    "--kind": "kind",
    "--candidate": "candidate",
    "--op": "op",
}
#: Old spellings: still parsed where they were, never shown.
RETIRED = {"--variants", "--no-record", "--record", "--no-store", "--store", "--cap"}
#: Words that mark an option as one of the shared concepts, whatever its spelling.
CONCEPT_WORDS = ("dtype", "variant", "ledger", "device", "record", "store", "json", "csv")
#: Other concepts that carry one of those words: the one variant that speedups are against.
OTHER_CONCEPTS = {"--baseline-variant"}


def commands():
    """(path, command) of every command and subcommand."""
    ctx = click.Context(app)
    out = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])
        else:
            out.append((" ".join(path), cmd))

    walk(app, [])
    assert {p.split()[0] for p, _ in out} == set(COMMANDS)
    return out


def options(cmd):
    return [p for p in cmd.params if isinstance(p, click.Option) and p.name != "help"]


def test_every_command_spells_shared_concepts_from_one_definition():
    wrong = []
    for path, cmd in commands():
        for opt in options(cmd):
            names = opt.opts + opt.secondary_opts
            for name in names:
                if name in SHARED and getattr(opt, "concept", None) != SHARED[name]:
                    wrong.append(f"{path} {name}: not the shared definition")
            marked = any(w in n for n in names if n not in OTHER_CONCEPTS for w in CONCEPT_WORDS)
            if marked and not isinstance(opt, SharedOption):
                wrong.append(f"{path} {names}: a shared concept spelled on its own")
            help_record = opt.get_help_record(click.Context(cmd))
            shown = help_record[0] if help_record else ""
            for old in RETIRED:
                if old in shown.replace(",", " ").split():
                    wrong.append(f"{path}: shows the retired spelling {old}")
    assert not wrong, "\n".join(wrong)


def _args(path: str) -> list[str]:
    """Required arguments of a command, as dummies (nothing runs: only parsing)."""
    return {"profile": ["x.py"], "trace summary": ["t.json"], "trace diff": ["a", "b"]}.get(
        path, []
    )


def _parse(path, cmd, args):
    return cmd.make_context(path, [*_args(path), *args]).params


@pytest.mark.parametrize(
    "spelling,name", [("bf16", "bfloat16"), ("half", "float16"), ("float", "float32")]
)
def test_every_dtype_option_takes_the_aliases(spelling, name):
    with_dtype = [(p, c) for p, c in commands() if any(o.name == "dtype" for o in options(c))]
    assert {p for p, _ in with_dtype} >= {"verify", "bench", "inspect", "tune", "history"}
    for path, cmd in with_dtype:
        value = _parse(path, cmd, ["--dtype", spelling])["dtype"]
        assert value in (name, (name,)), (path, value)
    assert DTYPE_NAMES["fp32"] == "float32" and DTYPE_NAMES["fp16"] == "float16"


def test_variant_is_repeatable_with_comma_lists_everywhere():
    with_variant = [(p, c) for p, c in commands() if any(o.name == "variants" for o in options(c))]
    assert {p for p, _ in with_variant} >= {"verify", "bench", "run", "history"}
    for path, cmd in with_variant:
        params = _parse(path, cmd, ["--variant", "kernelab,torch", "--variant", "compile"])
        assert params["variants"] == ("kernelab", "torch", "compile"), path


@pytest.mark.parametrize(
    "path,args,param,value",
    [
        ("bench", ["--variants", "torch"], "variants", ("torch",)),
        ("bench", ["--no-record"], "no_ledger", True),
        ("ceilings", ["--no-store"], "no_ledger", True),
        ("verify", ["--cap", "3"], "max_rows", 3),
        ("inspect", ["--baseline", "b.json"], "baseline_path", "b.json"),
    ],
)
def test_old_spellings_still_parse(path, args, param, value):
    cmd = dict(commands())[path]
    assert _parse(path, cmd, args)[param] == value


def test_a_bad_dtype_is_one_line_and_exit_2():
    result = runner.invoke(app, ["bench", "rmsnorm", "--dtype", "bf17", "--no-ledger"])
    assert result.exit_code == 2
    assert "--dtype: expected bf16/bfloat16" in result.output
    assert "Traceback" not in result.output and "Usage" not in result.output


def test_run_takes_the_variant_its_output_asks_for():
    # verify's stage tells the user "ask for it with --variant compile"
    result = runner.invoke(app, ["run", "--help"])
    assert "--variant" in result.output
